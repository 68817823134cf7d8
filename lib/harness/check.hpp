// The input check of an experiment: every input of every point opened and checked before anything
// runs. `mtplab check` prints its report; `mtplab run` runs the same checks before it creates its
// output, so a run that fails on its inputs leaves no results file behind (docs/experiments.md,
// "Checking the inputs").
//
// Invariants:
// - Nothing is written: inputs are opened read-only and the output is only inspected.
// - A problem is anything that would make a point fail, or measure something other than what its
//   configuration says; a warning is documented, logged and lets the run go (a sequence too short
//   for one step at the point's draft_len).
// - Rank-local inputs (traces and checkpoints, which every rank opens itself) are opened on every
//   rank, and their cheap digests (the trace's tokens and offsets, the checkpoint's headers) must
//   equal rank 0's; the scans (every hidden and every tensor the points read: NaN / Inf, and the
//   content fingerprints) run on rank 0, once per input per process (cached). Every rank's problems
//   reach rank 0's report, and every rank learns the total, so all ranks fail together.
// - The fingerprints are pure functions of the inputs' bytes (docs/results-schema.md, "Identity
//   inputs"): the same input gives the same fingerprint on any machine and any rank count.
#pragma once
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "dist/runtime.hpp"
#include "harness/experiment.hpp"
#include "harness/results.hpp"

namespace mtplab::harness {

/// What checking one input found.
struct InputReport {
  std::string label;    ///< "trace data/t.h5", "checkpoint ...", "model tiny", "output results/q.h5"
  std::string summary;  ///< what was checked and found, one line
  std::vector<std::string> problems;
  std::vector<std::string> warnings;
};

struct CheckReport {
  std::vector<InputReport> inputs;
  /// The inputs part of the results file's identity (rank 0's; results.hpp).
  IdentityInputs identity;
  /// The output's resume state (rank 0's): whether it exists, the points already done.
  ResumeState resume;
  /// Problems over every rank (every rank holds the total; rank 0 also holds the messages).
  size_t total_problems = 0;

  size_t problems() const;  ///< problems in `inputs` (this rank's view)
  size_t warnings() const;
  /// One line per input ("ok", "warning" or "PROBLEM", the label, the summary), each problem
  /// and warning indented under its input, then "OK" or "N problem(s)".
  std::string text() const;
};

struct CheckOptions {
  std::string output;           ///< the results file ("" is a problem: nothing to write to)
  std::string backend = "cpu";  ///< resolved: cpu | cuda
  /// Only these points' checkpoints are loaded (empty: every point's). Every input of the
  /// experiment is still opened and fingerprinted: the identity covers them all, so that the task
  /// files of an array job agree.
  std::vector<int> load_points;
  /// Skip the loads of points already in the output (the run: they do not run again).
  bool skip_done = false;
  /// Loads a point's checkpoint shard for `rank` as the run would (names, shapes, dtypes, finite
  /// values at load), throwing on a problem. Empty: model::load_mtp_weights for this process's rank
  /// under a launcher, or for each of the experiment's ranks in turn when the process runs alone.
  /// The run passes its input cache, so that its first load is the run's own.
  std::function<void(const PointConfig& point)> load_weights;
};

/// Checks every input of `ex`'s points (see the file comment). Collective over rt's world.
CheckReport check_inputs(dist::Runtime& rt, const Experiment& ex, const CheckOptions& options);

/// The report of an experiment that did not load: one problem, the loader's message.
CheckReport experiment_failed(const std::string& file, const std::string& message);

/// Content fingerprint of a checkpoint's tensors that `cfg` reads (those under
/// checkpoint.mtp_prefix, checkpoint.embed_tokens and checkpoint.lm_head): FNV-1a 64 over one
/// line "name dtype shape digest" per tensor in name order, digest the FNV-1a 64 of the tensor's
/// bytes as little-endian 64-bit words. Also checks their dtypes and scans them for NaN / Inf;
/// `problems` gets one entry per bad tensor (naming it, its file and its first bad element).
struct CheckpointScan {
  std::string fingerprint;  ///< 16 hex digits
  size_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<std::string> problems;
};
CheckpointScan scan_checkpoint(const model::ModelConfig& cfg, const std::string& path);

/// Content fingerprint of a trace (its sizes, offsets, prompt lengths, tokens and every hidden),
/// with every hidden checked finite; the first bad hidden is `problem`.
struct TraceScan {
  std::string fingerprint;
  int64_t sequences = 0, positions = 0;
  std::string problem;
};
TraceScan scan_trace(const std::string& path);

}  // namespace mtplab::harness
