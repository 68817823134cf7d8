// Experiments: the YAML schema (docs/experiments.md), `--set` overrides and the sweep expansion
// into numbered points, each a fully resolved configuration.
//
// Invariants:
// - Reading is strict: an unknown key or a bad value is an Error naming the file, line, column
//   and key path (core/yaml.hpp); a value that came from `--set` names the override instead.
// - Expansion is deterministic: the points are the cartesian product of sweep.grid in the order
//   the axes are written (the last axis varies fastest), minus the exclude: entries, numbered
//   0..N-1 in that order. The same file, overrides and world size always give the same points.
// - Every point is checked against the world size at expansion, before anything runs; all the
//   points that cannot run are reported together, each with its assignment.
// - PointConfig::canonical is the identity of a point: equal canonical text <=> same run
//   (spelling such as `on` vs `true` does not matter; the resolved model sizes do).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/yaml.hpp"
#include "drafter/options.hpp"
#include "model/config.hpp"
#include "ops/ops.hpp"

namespace mtplab::harness {

/// `weights:` {synthetic: {seed}} or {checkpoint: path}.
struct WeightsSpec {
  bool synthetic = true;
  uint64_t seed = 1;
  std::string checkpoint;
};

/// `trace:` {path: file.h5} or {synthetic: {sequences, prompt_len, new_tokens, seed, layers}}.
struct TraceSpec {
  bool synthetic = false;
  std::string path;
  int sequences = 4;
  int prompt_len = 32;
  int new_tokens = 64;
  uint64_t seed = 1;
  int layers = 2;
};

/// `measure:` how much of the trace a point replays and how its time is summarised.
struct MeasureSpec {
  int warmup_steps = 2;  ///< first steps of a point excluded from latency summaries
  int sequences = 0;     ///< first N sequences of the trace; 0 = all
  int max_steps = 0;     ///< steps per repeat; 0 = no limit
  int repeats = 1;       ///< replays of the same sequences (timing only; acceptance from repeat 0)
};

/// The arms of one point (docs/experiments.md lists values and defaults).
struct Arms {
  drafter::HeadSharding head_sharding = drafter::HeadSharding::none;
  bool head_fp8 = false;
  drafter::ContextRows context_rows = drafter::ContextRows::cache_only;
  drafter::Skip skip = drafter::Skip::none;
  int draft_len = 3;
  drafter::Exchange exchange = drafter::Exchange::packed_u64;
  drafter::DraftRows draft_rows = drafter::DraftRows::rewrite;
  bool batch_qidx = false;
  bool cuda_graph = false;
  ops::KvDtype kv_cache_dtype = ops::KvDtype::bf16;
  bool context_gemm = false;

  drafter::DrafterOptions drafter_options() const;
  /// (name, value) of every arm in schema order, values as the YAML spells them ("on", "vocab").
  std::vector<std::pair<std::string, std::string>> named() const;
};

/// The names of the arms, in schema order.
const std::vector<std::string>& arm_names();

/// One point of the sweep, fully resolved.
struct PointConfig {
  int index = 0;
  /// The sweep coordinates: (axis, canonical value) in axis order.
  std::vector<std::pair<std::string, std::string>> assignment;
  std::string model_spec;  ///< the preset name or path, or "inline"
  model::ModelConfig model;
  WeightsSpec weights;
  TraceSpec trace;
  MeasureSpec measure;
  std::string backend = "auto";  ///< auto | cpu | cuda
  Arms arms;
  std::string canonical;  ///< resolved YAML of this point (its identity)

  /// "p0003".
  std::string name() const;
  /// "head_sharding=vocab head_fp8=on", or "(no sweep)".
  std::string label() const;
};

struct Axis {
  std::string name;                 ///< "head_fp8", "measure.sequences", "model.max_seq_len"
  std::vector<std::string> values;  ///< canonical value text
  std::vector<YamlNode> nodes;      ///< the values as written (for locations)
};

struct Experiment {
  std::string file;           ///< the experiment file
  std::string resolved_yaml;  ///< the document after --set, as YAML
  std::string output;         ///< output: (before any --out)
  int world = 1;              ///< the world size the points were checked for
  std::vector<Axis> axes;
  std::vector<PointConfig> points;
  /// Hash of resolved_yaml without `output`, and the world size: two runs may share a results
  /// file only when their identities are equal.
  std::string identity;

  /// The point whose assignment equals `assignment`; -1 when it was excluded or is not a point.
  int find_point(const std::vector<std::pair<std::string, std::string>>& assignment) const;
};

/// Loads `path`, applies `overrides` ("key.path=value", YAML values) and expands the sweep for
/// `world` ranks. Throws one Error listing every point that cannot run.
Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides, int world);
/// As load_experiment, from text (`name` stands in for the file name in messages).
Experiment parse_experiment(const std::string& text, const std::string& name,
                            const std::vector<std::string>& overrides, int world);

/// Checks that `p` can run with `world` ranks on `backend` ("cpu", "cuda", or "auto" when not yet
/// known); throws naming the key that is wrong.
void check_point_runnable(const PointConfig& p, int world, const std::string& backend);

/// Canonical text of a scalar value: booleans as on/off, everything else as written.
std::string canonical_value(const YamlNode& node);

/// FNV-1a 64 of `text` from mtplab's historical basis (fnv1a64_mtplab_v1, core/hash.hpp), as 16 hex
/// digits: the experiment_identity of schema-v1 results files.
std::string fnv1a_hex(const std::string& text);

}  // namespace mtplab::harness
