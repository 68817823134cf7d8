// Experiments: the YAML schema (docs/experiments.md), `--set` overrides and the sweep expansion
// into numbered points, each a fully resolved configuration.
//
// Invariants:
// - Reading is strict: an unknown key or a bad value is an Error naming the file, line, column
//   and key path (core/yaml.hpp); a value that came from `--set` names the override instead.
// - Expansion is deterministic: the points are the cartesian product of sweep.grid in the order
//   the axes are written (the last axis varies fastest), minus the exclude: entries, numbered
//   0..N-1 in that order. The same file, overrides and world size always give the same points.
// - An arm's swept values are checked where they are written, each once (the key, the value and
//   the allowed values). Then every point is read and checked against the world size at
//   expansion, before anything runs: the points with a swept value their key refuses, else the
//   points that cannot run, are reported together, each with its assignment, counted among the
//   points that exclude: leaves.
// - PointConfig::canonical is the identity of a point: equal canonical text <=> same run
//   (spelling such as `on` vs `true` does not matter; the resolved model sizes do).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/yaml.hpp"
#include "harness/arms.hpp"
#include "harness/online.hpp"
#include "io/trace.hpp"
#include "model/config.hpp"
#include "ops/ops.hpp"

namespace mtplab::harness {

/// `weights:` {synthetic: {seed}} or {checkpoint: path}.
struct WeightsSpec {
  bool synthetic = true;
  uint64_t seed = 1;
  std::string checkpoint;
  friend bool operator==(const WeightsSpec&, const WeightsSpec&) = default;
};

/// `trace:` {path: file.h5} or {synthetic: {sequences, prompt_len, new_tokens, seed, layers, batch,
/// sampling, temperature, top_k, top_p, sampling_seed}}.
struct TraceSpec {
  bool synthetic = false;
  std::string path;
  int sequences = 4;
  int prompt_len = 32;
  int new_tokens = 64;
  uint64_t seed = 1;
  int layers = 2;
  /// Sequences the synthetic target generates together (1 .. 128; 1 = one at a time): the same
  /// trace on the CPU backend at every value, on CUDA the same except at near-ties
  /// (drafter::SyntheticTarget::generate_batch), so it is part of the point's configuration.
  int batch = 128;
  /// A synthetic trace's continuation: greedy (default) or sampled at a temperature / top-k /
  /// top-p with a seed (`sampling: sampling`; the other keys are ignored, and normalised, when
  /// greedy). A file's comes from the file (io::TraceReader::sampling).
  io::TraceSampling sampling;
  friend bool operator==(const TraceSpec&, const TraceSpec&) = default;
};

/// `measure:` how much of the trace a point replays and how its time is summarised.
struct MeasureSpec {
  int warmup_steps = 2;  ///< first steps of a point excluded from latency summaries
  int sequences = 0;     ///< first N sequences of the trace; 0 = all
  int max_steps = 0;     ///< steps per repeat; 0 = no limit
  int repeats = 1;       ///< replays of the same sequences (timing only; acceptance from repeat 0)
};

/// One point of the sweep, fully resolved.
struct PointConfig {
  int index = 0;
  /// The sweep coordinates: (axis, canonical value) in axis order.
  std::vector<std::pair<std::string, std::string>> assignment;
  /// The same as the index of each value among its axis' values (0 = the axis' first value).
  std::vector<int64_t> assignment_index;
  std::string model_spec;  ///< the preset name or path, or "inline"
  model::ModelConfig model;
  WeightsSpec weights;
  TraceSpec trace;
  MeasureSpec measure;
  std::string backend = "auto";  ///< auto | cpu | cuda
  /// `mode`: replay the trace, or run the target online from the trace's prompts
  /// (harness/online.hpp). An online point reads only the prompts of its trace: a file's first
  /// prompt_length tokens of each sequence, a synthetic trace's prompts (PromptGenerator(seed),
  /// prompt_len tokens; nothing is generated).
  RunMode mode = RunMode::replay;
  /// `online:` (mode: online only; normalised to its defaults and left out of the canonical text
  /// of a replay point, whose identity is then what it was before online runs existed).
  OnlineOptions online;
  Arms arms;  ///< every arm (harness/arms.hpp)
  /// The kernel-policy fields that MTPLAB_* variables overrode at expansion, as
  /// "field=value (VARIABLE)" (ops::env_overrides); arms.kernels holds the result.
  std::vector<std::string> kernel_env_overrides;
  /// The arms written for this point (in the file, by --set or by the sweep) that are not in effect
  /// under its other arms, as "key (not in effect without verify=sampling)": normalised to their
  /// defaults, so not in its identity, and logged once by load_experiment (e.g. temperature under
  /// verify: greedy).
  std::vector<std::string> ignored_arms;
  std::string canonical;  ///< resolved YAML of this point (its identity)

  /// "p0003".
  std::string name() const;
  /// "head_sharding=vocab head_fp8=on", or "(no sweep)".
  std::string label() const;
};

/// How an axis' values are stored in the results (typed attributes and /index columns):
/// integer arms and axes whose every value is an integer as int64, other all-numeric axes as f64,
/// everything else as text.
enum class ValueType { integer, floating, text };
const char* to_string(ValueType t);
ValueType parse_value_type(const std::string& s);
/// The type of an axis named `name` with canonical `values`: an arm's from the registry, else
/// inferred from the values.
ValueType axis_value_type(const std::string& name, const std::vector<std::string>& values);

struct Axis {
  std::string name;                 ///< "head_fp8", "measure.sequences", "model.max_seq_len"
  std::vector<std::string> values;  ///< canonical value text
  std::vector<YamlNode> nodes;      ///< the values as written (for locations)
  ValueType type = ValueType::text;
};

struct Experiment {
  std::string file;           ///< the experiment file
  std::string resolved_yaml;  ///< the document after --set, as YAML
  std::string output;         ///< output: (before any --out)
  int world = 1;              ///< the world size the points were checked for
  std::vector<Axis> axes;
  std::vector<PointConfig> points;
  int excluded = 0;  ///< combinations of sweep.grid that exclude: removed (not among points)
  /// configuration_text(resolved_yaml, world): what a results file's identity covers of the
  /// experiment (results_identity adds the inputs). Two runs may share a results file only when
  /// their configurations (and inputs) are equal.
  std::string configuration;

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
/// known); throws naming the key that is wrong. A synthetic trace's sampling is checked against
/// the point's verification here; a trace file's when it is opened (check_trace_file).
void check_point_runnable(const PointConfig& p, int world, const std::string& backend);

/// The point's verification against its trace file's sampling attributes (reads only the file's
/// attributes); throws naming the file and both settings. Nothing to check for a synthetic trace.
void check_trace_file(const PointConfig& p);

/// Canonical text of a scalar value: booleans as on/off, everything else as written.
std::string canonical_value(const YamlNode& node);

/// The point's run settings beside the arms, in schema order: `mode`, then the `online:` group's
/// (named online.<key>). Read, recorded (point attributes) and swept through these descriptors.
const std::vector<Setting<PointConfig>>& run_settings();

/// The configuration part of a results file's identity: `resolved_yaml` (an experiment after
/// --set, as Experiment::resolved_yaml holds it and a results file's `experiment_yaml` records it)
/// without its `output` key, re-emitted, then "\nworld=" and the world size.
std::string configuration_text(const std::string& resolved_yaml, int64_t world);

/// Writes `value` at the dotted `path` of `root` (a YAML document), creating mappings on the way; a
/// scalar `model:` met on the way becomes {preset: <scalar>}. `origin` names the override in errors.
void set_yaml_path(YAML::Node root, const std::string& path, const YAML::Node& value,
                   const std::string& origin);

}  // namespace mtplab::harness
