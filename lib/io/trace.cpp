// Trace writer and reader over the HDF5 wrapper. Validation messages name the file, the
// sequence and the position inside it (and the global row, which is what h5py users index).
#include "io/trace.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "core/build_info.hpp"
#include "core/error.hpp"

namespace mtplab::io {
namespace {

// Root attribute names (docs/trace-format.md).
constexpr const char* kAttrFormat = "format";
constexpr const char* kAttrVersion = "format_version";
constexpr const char* kAttrHidden = "hidden";
constexpr const char* kAttrVocab = "vocab";
constexpr const char* kAttrNumSequences = "num_sequences";
constexpr const char* kAttrGenerator = "generator";
constexpr const char* kAttrModel = "model";
constexpr const char* kAttrSeed = "seed";
constexpr const char* kAttrCreatedAt = "created_at";
constexpr const char* kAttrGitSha = "git_sha";
constexpr const char* kAttrConfig = "config";
constexpr const char* kAttrSampling = "sampling";
constexpr const char* kAttrTemperature = "temperature";
constexpr const char* kAttrTopK = "top_k";
constexpr const char* kAttrTopP = "top_p";
constexpr const char* kAttrSamplingSeed = "sampling_seed";

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string(buf, n);
}

// BF16 with an all-ones exponent is an infinity or a NaN.
bool finite(bf16 v) { return (v.bits & 0x7f80u) != 0x7f80u; }
bool finite(float v) { return std::isfinite(v); }  // an f32 trace, docs/trace-format.md "Hidden dtype"

// Finds the first non-finite value of [rows, hidden] hiddens; returns false and its row / column.
template <typename T>
bool all_finite(std::span<const T> values, std::int64_t hidden, std::int64_t& row, std::int64_t& col) {
  const auto it = std::find_if(values.begin(), values.end(), [](T v) { return !finite(v); });
  if (it == values.end()) return true;
  const auto i = static_cast<std::int64_t>(it - values.begin());
  row = i / hidden;
  col = i % hidden;
  return false;
}

std::string describe_nonfinite(float f) { return std::isnan(f) ? "NaN" : (f > 0 ? "+inf" : "-inf"); }
std::string describe_nonfinite(bf16 v) { return describe_nonfinite(to_float(v)); }

constexpr const char* kDtypeAttr = "dtype";  // on /hiddens: "bf16" or "f32"
// /routing and its attributes (docs/trace-format.md, "Routing").
constexpr const char* kRouting = "routing";
constexpr const char* kRoutingLayers = "layers";
constexpr const char* kRoutingTopK = "top_k";
constexpr const char* kRoutingExperts = "experts";

// The first id of `ids` ([rows, shape.row_width()]) outside [0, experts) and not -1, or that breaks
// the rule that a layer's slots are all -1 (a dense layer) or all experts: an Error naming `where`,
// the row (first_row + its index) and the layer.
void check_routing(std::span<const std::int32_t> ids, const TraceRouting& shape, const std::string& where,
                   std::int64_t first_row) {
  const std::int64_t K = shape.top_k, W = shape.row_width();
  for (std::size_t i = 0; i < ids.size(); i += static_cast<std::size_t>(K)) {
    const std::int64_t row = first_row + static_cast<std::int64_t>(i) / W;
    const std::int64_t layer = (static_cast<std::int64_t>(i) % W) / K;
    const bool dense = ids[i] == -1;
    for (std::int64_t j = 0; j < K; ++j) {
      const std::int32_t e = ids[i + static_cast<std::size_t>(j)];
      MTP_REQUIRE(dense ? e == -1 : (e >= 0 && e < shape.experts), where, ": routing of position ", row,
                  ", layer ", layer, ": expert id ", e,
                  dense ? " beside -1 (a dense layer's slots are all -1)"
                        : str(" is outside [0, ", shape.experts, ")").c_str());
    }
  }
}

}  // namespace

// ---- sampling attributes ----------------------------------------------------------------------

std::string TraceSampling::describe() const {
  if (!sampled) return "greedy";
  return message("sampling at temperature ", temperature, ", top_k ", top_k, ", top_p ", top_p, " (seed ",
                 seed, ")");
}

void validate(const TraceSampling& s, const std::string& where) {
  if (!s.sampled) return;
  MTP_REQUIRE(std::isfinite(s.temperature) && s.temperature > 0, where, ": ", kAttrTemperature, " ",
              s.temperature, " must be > 0");
  MTP_REQUIRE(s.top_k >= 0, where, ": ", kAttrTopK, " ", s.top_k, " must be >= 0 (0 = off)");
  MTP_REQUIRE(std::isfinite(s.top_p) && s.top_p > 0 && s.top_p <= 1, where, ": ", kAttrTopP, " ", s.top_p,
              " must be in (0, 1] (1 = off)");
}

namespace {

// The sampling attributes of an open trace file (greedy when `sampling` is absent).
TraceSampling read_sampling(const H5File& f) {
  TraceSampling s;
  if (!f.has_attr(kAttrSampling)) return s;
  const std::string mode = f.attr_string(kAttrSampling);
  MTP_REQUIRE(mode == "greedy" || mode == "sampling", f.path(), ": attribute ", kAttrSampling, " is \"", mode,
              "\", expected \"greedy\" or \"sampling\"");
  if (mode == "greedy") return s;
  s.sampled = true;
  for (const char* name : {kAttrTemperature, kAttrTopK, kAttrTopP, kAttrSamplingSeed})
    MTP_REQUIRE(f.has_attr(name), f.path(), ": a sampled trace (", kAttrSampling,
                " = \"sampling\") needs the attribute ", name);
  s.temperature = f.attr_double(kAttrTemperature);
  s.top_k = f.attr_int(kAttrTopK);
  s.top_p = f.attr_double(kAttrTopP);
  s.seed = f.attr_int(kAttrSamplingSeed);
  validate(s, f.path());
  return s;
}

}  // namespace

TraceSampling read_trace_sampling(const std::string& path) {
  const H5File f = H5File::open_read(path);
  MTP_REQUIRE(f.has_attr(kAttrFormat) && f.attr_string(kAttrFormat) == kTraceFormatName, path,
              ": not an mtplab trace (root attribute format != \"", kTraceFormatName, "\")");
  return read_sampling(f);
}

// ---- writer ----------------------------------------------------------------------------------

TraceWriter::TraceWriter(const std::string& path, std::int64_t hidden, std::int64_t vocab,
                         TraceProvenance provenance, const TraceWriterOptions& options)
    : file_(H5File::create(path)), hidden_(hidden), vocab_(vocab), f32_(options.f32_hiddens) {
  MTP_REQUIRE(hidden > 0, path, ": trace hidden size must be positive, got ", hidden);
  MTP_REQUIRE(vocab > 0 && vocab <= INT32_MAX, path, ": trace vocab must be in [1, 2^31), got ", vocab);
  if (provenance.generator.empty()) provenance.generator = "mtplab";
  if (provenance.git_sha.empty()) provenance.git_sha = str(git_sha(), git_dirty() ? "-dirty" : "");
  if (provenance.created_at.empty()) provenance.created_at = utc_now_iso8601();

  file_.set_attr(kAttrFormat, kTraceFormatName);
  file_.set_attr(kAttrVersion, kTraceFormatVersion);
  file_.set_attr(kAttrHidden, hidden);
  file_.set_attr(kAttrVocab, vocab);
  file_.set_attr(kAttrNumSequences, std::int64_t{0});  // rewritten at commit
  file_.set_attr(kAttrGenerator, provenance.generator);
  file_.set_attr(kAttrModel, provenance.model);
  file_.set_attr(kAttrSeed, provenance.seed);
  file_.set_attr(kAttrCreatedAt, provenance.created_at);
  file_.set_attr(kAttrGitSha, provenance.git_sha);
  file_.set_attr(kAttrConfig, provenance.config);

  DatasetOptions token_opts;
  token_opts.extendable = true;
  token_opts.deflate = options.deflate;
  tokens_ = file_.create_dataset("tokens", DType::i32, 0, 0, token_opts);

  DatasetOptions hidden_opts;
  hidden_opts.extendable = true;
  hidden_opts.deflate = options.deflate;
  if (options.chunk_rows > 0) hidden_opts.chunk = {options.chunk_rows, static_cast<std::uint64_t>(hidden)};
  hiddens_ = file_.create_dataset("hiddens", f32_ ? DType::f32 : DType::bf16, 0,
                                  static_cast<std::uint64_t>(hidden), hidden_opts);
  if (f32_) hiddens_.set_attr(kDtypeAttr, "f32");
}

void TraceWriter::check_sequence(std::span<const std::int32_t> tokens, std::size_t hidden_values,
                                 std::int32_t prompt_length) const {
  const std::int64_t s = num_sequences();
  const std::int64_t length = static_cast<std::int64_t>(tokens.size());
  const std::string& path = file_.path();
  MTP_REQUIRE(file_.writable() && !file_.committed(), path, ": trace already committed");
  MTP_REQUIRE(hidden_values == tokens.size() * static_cast<std::size_t>(hidden_), path, ": sequence ", s,
              ": ", hidden_values, " hidden values for ", length, " tokens of hidden ", hidden_);
  MTP_REQUIRE(prompt_length >= 2, path, ": sequence ", s, ": prompt length ", prompt_length,
              " is below 2 (row 0 pairs token 1 with hidden 0)");
  MTP_REQUIRE(prompt_length <= length, path, ": sequence ", s, ": prompt length ", prompt_length,
              " exceeds the sequence length ", length);
  for (std::int64_t t = 0; t < length; ++t) {
    const std::int32_t id = tokens[static_cast<std::size_t>(t)];
    MTP_REQUIRE(id >= 0 && id < vocab_, path, ": sequence ", s, ", position ", t, ": token id ", id,
                " is outside [0, ", vocab_, ")");
  }
}

template <typename T>
void TraceWriter::check_rows(std::span<const std::int32_t> tokens, std::span<const T> hiddens,
                             std::int32_t prompt_length) const {
  check_sequence(tokens, hiddens.size(), prompt_length);
  std::int64_t row = 0, col = 0;
  if (!all_finite(hiddens, hidden_, row, col)) {
    MTP_FAIL(file_.path(), ": sequence ", num_sequences(), ", position ", row, ", element ", col,
             ": hidden is ", describe_nonfinite(hiddens[static_cast<std::size_t>(row * hidden_ + col)]));
  }
}

template <typename T>
void TraceWriter::store(std::span<const std::int32_t> tokens, std::span<const T> hiddens,
                        std::int32_t prompt_length) {
  tokens_.append_rows(tokens);
  hiddens_.append_rows(hiddens);
  offsets_.push_back(offsets_.back() + static_cast<std::int64_t>(tokens.size()));
  prompt_lengths_.push_back(prompt_length);
}

void TraceWriter::add_sequence(std::span<const std::int32_t> tokens, std::span<const bf16> hiddens,
                               std::int32_t prompt_length) {
  check_rows(tokens, hiddens, prompt_length);
  if (f32_) {
    std::vector<float> widened(hiddens.size());
    std::transform(hiddens.begin(), hiddens.end(), widened.begin(), [](bf16 v) { return to_float(v); });
    store(tokens, std::span<const float>(widened), prompt_length);
  } else {
    store(tokens, hiddens, prompt_length);
  }
}

void TraceWriter::add_sequence(std::span<const std::int32_t> tokens, std::span<const float> hiddens,
                               std::int32_t prompt_length) {
  if (f32_) {  // stored as given
    check_rows(tokens, hiddens, prompt_length);
    store(tokens, hiddens, prompt_length);
    return;
  }
  std::vector<bf16> rounded(hiddens.size());
  std::transform(hiddens.begin(), hiddens.end(), rounded.begin(), [](float f) { return to_bf16(f); });
  add_sequence(tokens, std::span<const bf16>(rounded), prompt_length);
}

void TraceWriter::add_sequence(const TraceSequence& seq) {
  MTP_REQUIRE(seq.hidden == hidden_, file_.path(), ": sequence ", num_sequences(), ": hidden size ",
              seq.hidden, ", the trace's is ", hidden_);
  add_sequence(seq.tokens, std::span<const bf16>(seq.hiddens), seq.prompt_length);
  if (routing_shape_.layers > 0) add_routing(seq.routing);
}

void TraceWriter::record_routing(const TraceRouting& shape) {
  const std::string& path = file_.path();
  MTP_REQUIRE(file_.writable() && !file_.committed(), path, ": trace already committed");
  MTP_REQUIRE(num_sequences() == 0, path, ": routing is recorded from the first sequence (", num_sequences(),
              " already written)");
  MTP_REQUIRE(routing_shape_.layers == 0, path, ": routing already recorded");
  MTP_REQUIRE(shape.layers >= 1 && shape.top_k >= 1 && shape.experts >= 1 && shape.experts <= INT32_MAX, path,
              ": routing of ", shape.layers, " layers, top_k ", shape.top_k, ", ", shape.experts,
              " experts (each must be >= 1)");
  DatasetOptions opts;
  opts.extendable = true;
  opts.deflate = 4;
  routing_ =
      file_.create_dataset(kRouting, DType::i32, 0, static_cast<std::uint64_t>(shape.row_width()), opts);
  routing_.set_attr(kRoutingLayers, shape.layers);
  routing_.set_attr(kRoutingTopK, shape.top_k);
  routing_.set_attr(kRoutingExperts, shape.experts);
  routing_shape_ = shape;
}

void TraceWriter::add_routing(std::span<const std::int32_t> routing) {
  const std::string& path = file_.path();
  MTP_REQUIRE(file_.writable() && !file_.committed(), path, ": trace already committed");
  MTP_REQUIRE(routing_shape_.layers > 0, path, ": routing given, but the trace does not record routing");
  const std::int64_t s = num_sequences() - 1;
  MTP_REQUIRE(s >= 0 && routing_rows_ == offsets_[static_cast<std::size_t>(s)], path,
              ": routing given with no sequence waiting for it");
  const std::int64_t length = offsets_.back() - routing_rows_;
  MTP_REQUIRE(static_cast<std::int64_t>(routing.size()) == length * routing_shape_.row_width(), path,
              ": sequence ", s, ": ", routing.size(), " routing ids for ", length, " positions of ",
              routing_shape_.layers, " layers x top_k ", routing_shape_.top_k);
  check_routing(routing, routing_shape_, str(path, ": sequence ", s), 0);
  routing_.append_rows(routing);
  routing_rows_ += length;
}

void TraceWriter::set_sampling(const TraceSampling& sampling) {
  MTP_REQUIRE(file_.writable() && !file_.committed(), file_.path(), ": trace already committed");
  validate(sampling, file_.path());
  file_.set_attr(kAttrSampling, sampling.sampled ? "sampling" : "greedy");
  if (!sampling.sampled) return;
  file_.set_attr(kAttrTemperature, sampling.temperature);
  file_.set_attr(kAttrTopK, sampling.top_k);
  file_.set_attr(kAttrTopP, sampling.top_p);
  file_.set_attr(kAttrSamplingSeed, sampling.seed);
}

void TraceWriter::commit() {
  MTP_REQUIRE(num_sequences() > 0, file_.path(), ": a trace needs at least one sequence");
  MTP_REQUIRE(routing_shape_.layers == 0 || routing_rows_ == offsets_.back(), file_.path(), ": sequence ",
              num_sequences() - 1, " has no routing (the trace records routing)");
  file_.write("seq_offsets", offsets_);
  file_.write("prompt_lengths", prompt_lengths_);
  file_.set_attr(kAttrNumSequences, num_sequences());
  file_.commit();
}

// ---- reader ----------------------------------------------------------------------------------

namespace {

std::string optional_string(const H5File& f, const char* name) {
  return f.has_attr(name) ? f.attr_string(name) : std::string();
}

Dataset open_1d(const H5File& f, const char* name, DType type, std::uint64_t rows) {
  Dataset d = f.open_dataset(name);
  MTP_REQUIRE(d.rank() == 1, f.path(), ": /", name, " must be 1-D, it has rank ", d.rank());
  MTP_REQUIRE(d.dtype() == type, f.path(), ": /", name, " must hold ", dtype_name(type), ", it holds ",
              dtype_name(d.dtype()));
  MTP_REQUIRE(d.rows() == rows, f.path(), ": /", name, " has ", d.rows(), " entries, expected ", rows);
  return d;
}

}  // namespace

TraceReader::TraceReader(const std::string& path, std::int64_t expected_hidden, std::int64_t expected_vocab)
    : file_(H5File::open_read(path)) {
  MTP_REQUIRE(file_.has_attr(kAttrFormat) && file_.attr_string(kAttrFormat) == kTraceFormatName, path,
              ": not an mtplab trace (root attribute format != \"", kTraceFormatName, "\")");
  const std::int64_t version = file_.attr_int(kAttrVersion);
  MTP_REQUIRE(version == kTraceFormatVersion, path, ": trace format version ", version,
              " is not supported (this build reads version ", kTraceFormatVersion, ")");
  hidden_ = file_.attr_int(kAttrHidden);
  vocab_ = file_.attr_int(kAttrVocab);
  const std::int64_t n = file_.attr_int(kAttrNumSequences);
  MTP_REQUIRE(hidden_ > 0, path, ": hidden is ", hidden_);
  MTP_REQUIRE(vocab_ > 0 && vocab_ <= INT32_MAX, path, ": vocab is ", vocab_);
  MTP_REQUIRE(n > 0, path, ": num_sequences is ", n, "; a trace needs at least one sequence");
  MTP_REQUIRE(expected_hidden == 0 || hidden_ == expected_hidden, path, ": trace hidden size ", hidden_,
              " does not match the model's ", expected_hidden);
  MTP_REQUIRE(expected_vocab == 0 || vocab_ == expected_vocab, path, ": trace vocab ", vocab_,
              " does not match the model's ", expected_vocab);
  provenance_ =
      TraceProvenance{optional_string(file_, kAttrGenerator), optional_string(file_, kAttrModel),
                      optional_string(file_, kAttrSeed),      optional_string(file_, kAttrCreatedAt),
                      optional_string(file_, kAttrGitSha),    optional_string(file_, kAttrConfig)};
  sampling_ = read_sampling(file_);

  const auto num = static_cast<std::uint64_t>(n);
  offsets_ = open_1d(file_, "seq_offsets", DType::i64, num + 1).read<std::int64_t>();
  prompt_lengths_ = open_1d(file_, "prompt_lengths", DType::i32, num).read<std::int32_t>();
  MTP_REQUIRE(offsets_[0] == 0, path, ": seq_offsets[0] is ", offsets_[0], ", must be 0");
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int64_t begin = offsets_[static_cast<std::size_t>(s)];
    const std::int64_t end = offsets_[static_cast<std::size_t>(s + 1)];
    MTP_REQUIRE(end > begin, path, ": sequence ", s, ": seq_offsets are not increasing (", begin, " then ",
                end, ")");
  }
  Dataset tokens = file_.open_dataset("tokens");
  MTP_REQUIRE(tokens.rank() == 1 && tokens.dtype() == DType::i32, path, ": /tokens must be 1-D int32");
  const auto total = static_cast<std::uint64_t>(offsets_.back());
  MTP_REQUIRE(tokens.rows() == total, path, ": /tokens has ", tokens.rows(), " rows, seq_offsets end at ",
              total);

  hiddens_ = file_.open_dataset("hiddens");
  MTP_REQUIRE(hiddens_.rank() == 2, path, ": /hiddens must be 2-D, it has rank ", hiddens_.rank());
  hiddens_f32_ = hiddens_.dtype() == DType::f32;
  MTP_REQUIRE(
      hiddens_.dtype() == DType::bf16 || hiddens_f32_, path,
      ": /hiddens must be uint16 with attribute dtype=\"bf16\" or float32 with dtype=\"f32\", it holds ",
      dtype_name(hiddens_.dtype()));
  MTP_REQUIRE(!hiddens_f32_ || (hiddens_.has_attr(kDtypeAttr) && hiddens_.attr_string(kDtypeAttr) == "f32"),
              path, ": /hiddens is float32 but lacks the attribute dtype=\"f32\" (docs/trace-format.md)");
  MTP_REQUIRE(hiddens_.cols() == static_cast<std::uint64_t>(hidden_), path, ": /hiddens has ",
              hiddens_.cols(), " columns, the trace's hidden is ", hidden_);
  MTP_REQUIRE(hiddens_.rows() == total, path, ": /hiddens has ", hiddens_.rows(),
              " rows, seq_offsets end at ", total);

  for (std::int64_t s = 0; s < n; ++s) {
    const std::int32_t p = prompt_lengths_[static_cast<std::size_t>(s)];
    const std::int64_t length = sequence_length(s);
    MTP_REQUIRE(p >= 2, path, ": sequence ", s, ": prompt length ", p,
                " is below 2 (row 0 pairs token 1 with hidden 0)");
    MTP_REQUIRE(p <= length, path, ": sequence ", s, ": prompt length ", p, " exceeds the sequence length ",
                length);
  }

  if (file_.exists(kRouting)) {
    routing_ = file_.open_dataset(kRouting);
    const std::string where = str(path, ": /", kRouting);
    MTP_REQUIRE(routing_.rank() == 2 && routing_.dtype() == DType::i32, where, " must be 2-D int32");
    for (const char* a : {kRoutingLayers, kRoutingTopK, kRoutingExperts})
      MTP_REQUIRE(routing_.has_attr(a), where, " lacks the attribute ", a, " (docs/trace-format.md)");
    routing_shape_ = TraceRouting{routing_.attr_int(kRoutingLayers), routing_.attr_int(kRoutingTopK),
                                  routing_.attr_int(kRoutingExperts)};
    MTP_REQUIRE(routing_shape_.layers >= 1 && routing_shape_.top_k >= 1 && routing_shape_.experts >= 1 &&
                    routing_shape_.experts <= INT32_MAX,
                where, ": layers ", routing_shape_.layers, ", top_k ", routing_shape_.top_k, ", experts ",
                routing_shape_.experts, " (each must be >= 1)");
    MTP_REQUIRE(routing_.cols() == static_cast<std::uint64_t>(routing_shape_.row_width()), where, " has ",
                routing_.cols(), " columns, layers x top_k is ", routing_shape_.row_width());
    MTP_REQUIRE(routing_.rows() == total, where, " has ", routing_.rows(), " rows, seq_offsets end at ",
                total);
  }

  tokens_ = tokens.read<std::int32_t>();
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int64_t begin = offsets_[static_cast<std::size_t>(s)];
    for (std::int64_t t = 0; t < sequence_length(s); ++t) {
      const std::int32_t id = tokens_[static_cast<std::size_t>(begin + t)];
      MTP_REQUIRE(id >= 0 && id < vocab_, path, ": sequence ", s, ", position ", t, " (row ", begin + t,
                  "): token id ", id, " is outside [0, ", vocab_, ")");
    }
  }
}

void TraceReader::require_index(std::int64_t s) const {
  MTP_REQUIRE(s >= 0 && s < num_sequences(), path(), ": sequence ", s, " requested, the trace has ",
              num_sequences());
}

std::int64_t TraceReader::sequence_length(std::int64_t s) const {
  require_index(s);
  return offsets_[static_cast<std::size_t>(s + 1)] - offsets_[static_cast<std::size_t>(s)];
}
std::int64_t TraceReader::sequence_offset(std::int64_t s) const {
  require_index(s);
  return offsets_[static_cast<std::size_t>(s)];
}
std::int32_t TraceReader::prompt_length(std::int64_t s) const {
  require_index(s);
  return prompt_lengths_[static_cast<std::size_t>(s)];
}
std::span<const std::int32_t> TraceReader::tokens(std::int64_t s) const {
  return std::span<const std::int32_t>(tokens_).subspan(static_cast<std::size_t>(sequence_offset(s)),
                                                        static_cast<std::size_t>(sequence_length(s)));
}

void TraceReader::read_hiddens(std::int64_t s, std::span<bf16> out) const {
  const std::int64_t begin = sequence_offset(s);
  const std::int64_t length = sequence_length(s);
  MTP_REQUIRE(out.size() == static_cast<std::size_t>(length * hidden_), path(), ": sequence ", s,
              ": a buffer of ", out.size(), " values for ", length, " rows of hidden ", hidden_);
  if (hiddens_f32_) {
    std::vector<float> stored(out.size());
    read_hiddens_f32(s, stored);
    std::transform(stored.begin(), stored.end(), out.begin(), [](float f) { return to_bf16(f); });
  } else {
    hiddens_.read_rows_into(static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(length), out);
  }
  std::int64_t row = 0, col = 0;  // an f32 value past BF16's range rounds to an infinity
  if (!all_finite(std::span<const bf16>(out), hidden_, row, col)) {
    MTP_FAIL(path(), ": sequence ", s, ", position ", row, " (row ", begin + row, "), element ", col,
             ": hidden is ", describe_nonfinite(out[static_cast<std::size_t>(row * hidden_ + col)]));
  }
}

void TraceReader::read_hiddens_f32(std::int64_t s, std::span<float> out) const {
  const std::int64_t begin = sequence_offset(s);
  const std::int64_t length = sequence_length(s);
  MTP_REQUIRE(out.size() == static_cast<std::size_t>(length * hidden_), path(), ": sequence ", s,
              ": a buffer of ", out.size(), " values for ", length, " rows of hidden ", hidden_);
  if (!hiddens_f32_) {
    std::vector<bf16> stored(out.size());
    read_hiddens(s, stored);
    std::transform(stored.begin(), stored.end(), out.begin(), [](bf16 v) { return to_float(v); });
    return;
  }
  hiddens_.read_rows_into(static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(length), out);
  std::int64_t row = 0, col = 0;
  if (!all_finite(std::span<const float>(out), hidden_, row, col)) {
    MTP_FAIL(path(), ": sequence ", s, ", position ", row, " (row ", begin + row, "), element ", col,
             ": hidden is ", describe_nonfinite(out[static_cast<std::size_t>(row * hidden_ + col)]));
  }
}

std::vector<bf16> TraceReader::hiddens(std::int64_t s) const {
  std::vector<bf16> out(static_cast<std::size_t>(sequence_length(s) * hidden_));
  read_hiddens(s, out);
  return out;
}

TraceSequence TraceReader::sequence(std::int64_t s) const {
  TraceSequence seq;
  seq.index = s;
  seq.prompt_length = prompt_length(s);
  seq.hidden = hidden_;
  const auto toks = tokens(s);
  seq.tokens.assign(toks.begin(), toks.end());
  seq.hiddens = hiddens(s);
  if (has_routing()) seq.routing = routing(s);
  return seq;
}

std::vector<std::int32_t> TraceReader::routing(std::int64_t s) const {
  MTP_REQUIRE(has_routing(), path(), ": the trace records no routing (no /", kRouting,
              " dataset; docs/trace-format.md)");
  const std::int64_t begin = sequence_offset(s);
  std::vector<std::int32_t> ids = routing_.read_rows<std::int32_t>(
      static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(sequence_length(s)));
  check_routing(ids, routing_shape_, str(path(), ": sequence ", s), 0);
  return ids;
}

void TraceReader::check_all_hiddens() const {
  std::vector<bf16> buf;
  for (std::int64_t s = 0; s < num_sequences(); ++s) {
    buf.resize(static_cast<std::size_t>(sequence_length(s) * hidden_));
    read_hiddens(s, buf);
  }
}

}  // namespace mtplab::io
