// Trace files: the input of replay. For each sequence, the token ids and the target's
// post-final-norm hidden state at every position, as the target produced them. Format in
// docs/trace-format.md ("mtplab-trace", version 1).
//
// Row convention (what replay relies on): hidden[t] is the target's post-final-norm hidden AFTER
// consuming token[t]; the target's next token is therefore token[t + 1]. Drafter row r pairs
// embed(tokens[r + 1]) with hidden[r]. The last position's hidden has no next token in the trace.
//
// Invariants checked when a trace is written and when it is opened (an Error names the file, the
// sequence and the position): hidden and vocab match what the caller expects; every token id is in
// [0, vocab); 2 <= prompt_length <= sequence length; seq_offsets start at 0, increase strictly and
// end at the number of rows. Hiddens are checked finite per sequence as they are read (a full scan
// of a large trace at open would cost as much as the replay); check_all_hiddens() scans them all.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/numeric.hpp"
#include "io/hdf5.hpp"

namespace mtplab::io {

inline constexpr const char* kTraceFormatName = "mtplab-trace";
inline constexpr std::int64_t kTraceFormatVersion = 1;

/// Free strings stored as root attributes. Empty fields are filled by TraceWriter where it can:
/// generator "mtplab", git_sha this build's commit, created_at the commit time (UTC, ISO 8601).
struct TraceProvenance {
  std::string generator;   ///< what wrote the trace, e.g. "mtplab synth-trace" or a converter
  std::string model;       ///< the target model (name or checkpoint path)
  std::string seed;        ///< the seed of a synthetic trace; empty for a recorded run
  std::string created_at;  ///< ISO 8601 UTC
  std::string git_sha;     ///< commit of the generator
  std::string config;      ///< the resolved configuration that produced the trace (YAML text)
};

/// How the trace's continuation tokens were chosen (root attributes `sampling`, `temperature`,
/// `top_k`, `top_p`, `sampling_seed`; docs/trace-format.md). A trace without the attributes (every
/// trace written before they existed) reads as greedy.
struct TraceSampling {
  bool sampled = false;      ///< `sampling`: "greedy" (argmax, lowest id on ties) or "sampling"
  double temperature = 1.0;  ///< > 0; sampled only
  std::int64_t top_k = 0;    ///< 0 = off; sampled only
  double top_p = 1.0;        ///< (0, 1], 1 = off; sampled only
  std::int64_t seed = 0;     ///< the sampler's seed; sampled only
  /// "greedy" or "sampling at temperature 0.7, top_k 0, top_p 1 (seed 5)", for messages.
  std::string describe() const;
  friend bool operator==(const TraceSampling&, const TraceSampling&) = default;
};

/// Checks a sampling description (temperature > 0 and finite, top_k >= 0, top_p in (0, 1]);
/// throws naming `where` and the attribute.
void validate(const TraceSampling& s, const std::string& where);

struct TraceWriterOptions {
  int deflate = 4;               ///< gzip level of /hiddens and /tokens (0 = off)
  std::uint64_t chunk_rows = 0;  ///< rows per /hiddens chunk; 0 = about 256 KiB per chunk
  bool f32_hiddens = false;      ///< /hiddens as float32 (dtype="f32") instead of BF16 bits
};

/// The shape of a trace's optional /routing dataset (docs/trace-format.md, "Routing"): per
/// position, the routed expert ids each of `layers` target layers chose (top_k per layer, global
/// ids in [0, experts), -1 for every slot of a dense-MLP layer).
struct TraceRouting {
  std::int64_t layers = 0;
  std::int64_t top_k = 0;
  std::int64_t experts = 0;
  std::int64_t row_width() const { return layers * top_k; }
  friend bool operator==(const TraceRouting&, const TraceRouting&) = default;
};

/// One sequence, whole: what TraceReader::sequence() returns and a generator produces.
struct TraceSequence {
  std::int64_t index = 0;
  std::int32_t prompt_length = 0;
  std::int64_t hidden = 0;
  std::vector<std::int32_t> tokens;
  std::vector<bf16> hiddens;  ///< [length, hidden] row-major
  /// The routed experts of every position at every layer ([length, layers * top_k], global ids,
  /// -1 at a dense-MLP layer); empty when the trace records no routing (TraceRouting).
  std::vector<std::int32_t> routing;

  std::int64_t length() const { return static_cast<std::int64_t>(tokens.size()); }
  /// hidden[t]: the target's state after consuming tokens[t].
  std::span<const bf16> hidden_at(std::int64_t t) const {
    return std::span<const bf16>(hiddens).subspan(static_cast<std::size_t>(t * hidden),
                                                  static_cast<std::size_t>(hidden));
  }
};

/// Writes a trace sequence by sequence. Nothing is visible at `path` until commit().
class TraceWriter {
 public:
  TraceWriter(const std::string& path, std::int64_t hidden, std::int64_t vocab, TraceProvenance provenance,
              const TraceWriterOptions& options = {});

  /// Appends one sequence: tokens[L], hiddens[L, hidden] row-major (BF16 bits), prompt length.
  void add_sequence(std::span<const std::int32_t> tokens, std::span<const bf16> hiddens,
                    std::int32_t prompt_length);
  /// As above from fp32 hiddens, rounded to BF16 (nearest even).
  void add_sequence(std::span<const std::int32_t> tokens, std::span<const float> hiddens,
                    std::int32_t prompt_length);

  /// Appends a sequence as a TraceSequence holds it (its hidden must match the trace's; its routing
  /// is written when the trace records routing, and must then be there).
  void add_sequence(const TraceSequence& seq);
  /// Records the routing of every sequence from now on (/routing, docs/trace-format.md): only
  /// before the first sequence; layers, top_k and experts >= 1.
  void record_routing(const TraceRouting& shape);
  /// The routing of the sequence just added by add_sequence(tokens, hiddens, ...): [length,
  /// layers * top_k], every id in [0, experts) or -1. Only when recording routing, once per sequence.
  void add_routing(std::span<const std::int32_t> routing);

  /// How the continuations were chosen (default: greedy). Validated; written at once.
  void set_sampling(const TraceSampling& sampling);

  /// Writes the offsets and counts, and renames the file into place.
  void commit();

  std::int64_t num_sequences() const { return static_cast<std::int64_t>(prompt_lengths_.size()); }
  std::int64_t total_positions() const { return offsets_.back(); }
  std::int64_t hidden() const { return hidden_; }
  std::int64_t vocab() const { return vocab_; }

 private:
  void check_sequence(std::span<const std::int32_t> tokens, std::size_t hidden_values,
                      std::int32_t prompt_length) const;
  /// check_sequence, and every hidden finite (T: bf16 or float).
  template <typename T>
  void check_rows(std::span<const std::int32_t> tokens, std::span<const T> hiddens,
                  std::int32_t prompt_length) const;
  /// Appends a checked sequence, `hiddens` in the stored dtype.
  template <typename T>
  void store(std::span<const std::int32_t> tokens, std::span<const T> hiddens, std::int32_t prompt_length);
  H5File file_;
  Dataset tokens_;
  Dataset hiddens_;
  Dataset routing_;
  TraceRouting routing_shape_;
  std::int64_t routing_rows_ = 0;  ///< rows of /routing written (each sequence's, in order)
  std::int64_t hidden_;
  std::int64_t vocab_;
  bool f32_ = false;  ///< /hiddens stored as float32
  std::vector<std::int64_t> offsets_{0};
  std::vector<std::int32_t> prompt_lengths_;
};

/// Reads the sampling attributes of the trace at `path` without loading it (for checks before a
/// run: an experiment's points against the trace they replay).
TraceSampling read_trace_sampling(const std::string& path);

/// Reads a trace. Tokens, offsets and prompt lengths are loaded and validated at open; hiddens
/// are read one sequence at a time, so a large trace is never loaded whole.
class TraceReader {
 public:
  /// Opens and validates `path`. A non-zero expected_hidden / expected_vocab must match the file's.
  explicit TraceReader(const std::string& path, std::int64_t expected_hidden = 0,
                       std::int64_t expected_vocab = 0);

  const std::string& path() const { return file_.path(); }
  std::int64_t hidden() const { return hidden_; }
  std::int64_t vocab() const { return vocab_; }
  std::int64_t num_sequences() const { return static_cast<std::int64_t>(prompt_lengths_.size()); }
  std::int64_t total_positions() const { return offsets_.back(); }
  const TraceProvenance& provenance() const { return provenance_; }
  /// How the continuations were chosen (greedy when the file has no `sampling` attribute).
  const TraceSampling& sampling() const { return sampling_; }

  std::int64_t sequence_length(std::int64_t s) const;
  std::int64_t sequence_offset(std::int64_t s) const;  ///< its first row in /tokens and /hiddens
  std::int32_t prompt_length(std::int64_t s) const;
  std::span<const std::int32_t> tokens(std::int64_t s) const;

  /// "bf16" or "f32": how /hiddens is stored (docs/trace-format.md, "Hidden dtype").
  const char* hiddens_dtype() const { return hiddens_f32_ ? "f32" : "bf16"; }

  /// The hiddens of sequence s ([length, hidden] BF16), checked finite. An f32 trace's values are
  /// rounded to BF16 (nearest even), what the drafter reads.
  std::vector<bf16> hiddens(std::int64_t s) const;
  /// As hiddens(s), into a caller's buffer of exactly length * hidden values (reused across sequences).
  void read_hiddens(std::int64_t s, std::span<bf16> out) const;
  /// The hiddens of sequence s as stored, widened to fp32 (exact for both dtypes), checked finite.
  void read_hiddens_f32(std::int64_t s, std::span<float> out) const;
  /// The sequence with its hiddens, and its routing when the trace has one.
  TraceSequence sequence(std::int64_t s) const;
  /// Whether the trace records routing (/routing), and its shape (layers 0 when not).
  bool has_routing() const { return routing_shape_.layers > 0; }
  const TraceRouting& routing_shape() const { return routing_shape_; }
  /// The routing of sequence s ([length, layers * top_k]), each id checked in [0, experts) or -1;
  /// an Error naming the file when the trace has none.
  std::vector<std::int32_t> routing(std::int64_t s) const;

  /// Reads every sequence's hiddens and checks them finite (what open does not do).
  void check_all_hiddens() const;

 private:
  void require_index(std::int64_t s) const;
  H5File file_;
  Dataset hiddens_;
  std::int64_t hidden_ = 0;
  std::int64_t vocab_ = 0;
  TraceProvenance provenance_;
  bool hiddens_f32_ = false;
  TraceSampling sampling_;
  Dataset routing_;
  TraceRouting routing_shape_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::int64_t> offsets_;
  std::vector<std::int32_t> prompt_lengths_;
};

}  // namespace mtplab::io
