// `mtplab plan`: the best draft length per concurrency from acceptance (replay or online results,
// or a profile) and costs (benchmark CSVs, online points) for a model (docs/planning.md).
//
// Per planned batch size B and k = 0..k_max (0: MTP off):
//   T(B, k)          the step time of costs.hpp
//   tokens/s/user    = tau(k) / T(B, k)
//   tokens/s/GPU     = B tau(k) / T(B, k) / gpus
//   speedup(B, k)    = tau(k) T(B, 0) / T(B, k)
//   best k(B)        = argmax_k speedup (ties to the smaller k)
// Intervals: `resamples` joint resamples, each drawing tau(k) by the acceptance curve's bootstrap
// (acceptance.hpp) and every cost point from a normal of its median and sigma = (p90 - p10) /
// 2.563, truncated at 0 (costs.hpp); an interval is the 2.5% and 97.5% percentiles. The best k's
// set is every k that wins at least 2.5% of the resamples; the best k is distinguishable from the
// runner-up (the second best by the point estimate) when it wins at least 95% of them. The
// resamples depend on the seed alone: the same plan gives the same figures. With online cost
// points, every planned (B, k) that one ran is set beside it: the prediction tau(k) / T(B, k)
// against the point's measured tokens/s per sequence (OnlineCheck).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan/acceptance.hpp"
#include "plan/costs.hpp"
#include "plan/profile.hpp"
#include "plan/schedule.hpp"

namespace mtplab::plan {

/// A plan's inputs, as the plan YAML (or the flags) give them (docs/planning.md, "The plan file").
struct PlanSpec {
  std::string file;           ///< the plan YAML, "" when only flags were given
  std::string resolved_yaml;  ///< the document after the flags and --set
  ModelShape model;
  std::string profile;       ///< acceptance.profile
  ResultsSelection results;  ///< acceptance.results / points
  CostOptions costs;
  std::vector<int> batch;  ///< empty: every B the cost files hold
  int k_max = 0;           ///< 0: the largest k the acceptance and the costs cover at every B
  int resamples = 2000;
  uint64_t seed = 1;
  int max_batch = 4096;  ///< the schedules' last range ends here
  std::string output;    ///< the plan file (HDF5), "" for none
  std::string exports;   ///< the directory of the engine schedules and the profile, "" for none
};

/// Reads a plan YAML (`path`; "" for an empty document) with `overrides` applied on top: (key
/// path, YAML value) pairs, in order ("costs.fixed_us", "120"), where a value replaces what the
/// file holds at that key. Unknown keys, missing ones and bad values are errors naming the file,
/// line and key (or the override).
PlanSpec load_plan_spec(const std::string& path,
                        const std::vector<std::pair<std::string, std::string>>& overrides);

/// A figure with its 95% interval.
struct Band {
  double value = 0, lo = 0, hi = 0;
};

struct PlanCell {
  int batch = 0, k = 0;
  double tau = 0, tau_lo = 0, tau_hi = 0;                         ///< NaN bounds without units
  double draft_us = 0, layers_us = 0, head_us = 0, fixed_us = 0;  ///< the point estimate's parts
  Band step_us, user_tps, gpu_tps, speedup;
  double win_fraction = 0;  ///< resamples in which this k is the best at this B
};

struct PlanBest {
  int batch = 0, k = 0;
  double win_fraction = 0;
  std::vector<int> k_set;        ///< every k that wins in at least 2.5% of the resamples
  int runner_up = -1;            ///< second best by the point estimate (-1 when k_max = 0)
  double beats_runner_up = 0;    ///< resamples in which k beats the runner-up's speedup
  bool distinguishable = false;  ///< win_fraction >= 0.95
  Band speedup, user_tps, gpu_tps, step_us;
};

/// A planned (B, k) beside the online point that ran it (costs.online): the plan's prediction
/// against what the online loop measured there.
struct OnlineCheck {
  int batch = 0, k = 0;
  std::string point;            ///< "p0003 of FILE"
  double tau = 0, step_us = 0;  ///< the plan's tau(k) and T(B, k)
  double point_tau = 0;         ///< the point's measured tokens per row (accepted + 1)
  double point_step_us = 0;     ///< the point's mean step_ms over its measured rows
  double predicted = 0;         ///< the plan's tokens/s per sequence, tau(k) / T(B, k)
  double measured = 0, measured_lo = 0, measured_hi = 0;  ///< tokens_per_s_per_sequence, its interval
  double ratio() const { return predicted / measured; }
};

struct PlanResult {
  PlanSpec spec;
  std::vector<int> batch;
  int k_max = 0;
  std::vector<PlanCell> cells;  ///< batch-major, k = 0..k_max
  std::vector<PlanBest> best;   ///< one per batch
  std::vector<double> tau;      ///< k = 0..k_max
  std::vector<harness::Interval> tau_ci;
  std::vector<std::string> tau_origin;
  std::string tau_interval;   ///< how tau was resampled
  std::string cost_interval;  ///< how the costs were resampled
  std::vector<CostPoint> cost_points;
  std::vector<std::string> inputs, warnings, notes;
  AcceptanceProfile profile;  ///< what the exports write
  /// Every planned (B, k) that an online cost point ran, in the points' order.
  std::vector<OnlineCheck> online_check;
  const PlanCell& cell(size_t b, int k) const {
    return cells.at(b * static_cast<size_t>(k_max + 1) + static_cast<size_t>(k));
  }
  std::vector<ScheduleEntry> schedule() const;
};

PlanResult run_plan(const PlanSpec& spec);

/// The tables printed on stdout: inputs, warnings and notes, tau(k), the speedup per (B, k), the
/// best k per B, and with online cost points the prediction against them.
std::string format_plan(const PlanResult& r);

/// Writes the plan file (HDF5, schema `mtplab-plan`, its `plan` group; docs/planning.md) at
/// `path`, under the output rule of every writer (an existing plan file replaced only with
/// `force`, any other file never, no input overwritten). `argv` is recorded.
void write_plan_file(const std::string& path, const PlanResult& r, const std::vector<std::string>& argv,
                     bool force);

/// The files write_exports writes, in order: vllm-speculative-config.json,
/// trtllm-speculative-config.yaml, sglang-launch-flags.json, acceptance-profile.json.
std::vector<std::string> export_names();

/// Checks, before anything is computed or written, that the plan file and the exports of `spec` may
/// be written (the rules of write_plan_file and write_exports); throws naming the path.
void check_outputs(const PlanSpec& spec, bool force);

/// Writes the engine schedules and the acceptance profile into `dir` (created): returns the files.
/// An existing file is replaced only with `force`, an input of the plan never.
std::vector<std::string> write_exports(const std::string& dir, const PlanResult& r, bool force);

}  // namespace mtplab::plan
