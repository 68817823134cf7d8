// Online points (`mode: online`, harness/online.hpp) as a cost source of the planner: what a
// serving step of the online loop cost at its batch size B and draft length k, from the results
// file's steps table (docs/results-schema.md, "Online points"):
//
//   draft(B, k)   steps/draft_ms: the drafter's part of a step (propose, statistics pass, trim,
//                 catch-up); steps/propose_ms alone is the work of the benchmark's draft step
//   verify(B, k)  steps/verify_ms: the target's verify forward of k + 1 rows a sequence (every
//                 layer, the norm and the head)
//   step          steps/step_ms: the host wall time of the whole step
//
// and the fixed cost c(B) = step - draft - verify, the time of a step outside the forwards that the
// plan's other terms stand for.
//
// Invariants:
// - A figure is the mean over the point's measured rows (warm-up excluded, every repeat; each row
//   carries its step's times, so a step counts once per sequence in it): the weighting of the
//   point's tokens_per_s_per_sequence, a ratio of sums, which a median would not reproduce. The
//   planner resamples it with the mean's standard error, the steps as units (costs.hpp).
// - Only online points of status ok are read; a selected point that is not one is an error naming
//   the file and the point. Two selected points at one (B, k) are an error naming both.
// - Nothing is interpolated: a (B, k) without its point is missing (CostBook names it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mtplab::plan {

/// Which online points to read: every online point of the files, or those named ("p8", "p0008"
/// or "8").
struct OnlineSelection {
  std::vector<std::string> files;
  std::vector<std::string> points;
};

/// One online point, reduced to its step costs.
struct OnlinePoint {
  std::string file, name, label;  ///< results file, "p0003", the point's label
  int batch = 0, k = 0;           ///< its batch_size and draft_len
  int64_t rows = 0;               ///< measured rows (sequence-steps)
  int64_t full_rows = 0;          ///< of them, rows of steps with batch_size live sequences
  double steps = 0;               ///< measured steps (each row counts 1 / its step's rows)
  /// Per measured row: the step's times in us (draft_ms, propose_ms, verify_ms, step_ms).
  std::vector<double> draft_us, propose_us, verify_us, step_us;
  /// The point's recorded tokens_per_s_per_sequence (and its interval) and its measured tokens
  /// per row (accepted + 1, over the measured rows).
  double tokens_per_s_per_sequence = 0, tokens_per_s_per_sequence_lo = 0, tokens_per_s_per_sequence_hi = 0;
  double tokens_per_row = 0;
  std::string model;      ///< the point's model name
  int target_layers = 0;  ///< online.target_layers
  std::string git;        ///< the file's commit ("-dirty" appended when dirty)
  std::string device;     ///< the device kind of the file's ranks ("cpu", "NVIDIA H200")
  std::string backend;    ///< cpu | cuda
  std::string verify;     ///< greedy | sampling
};

/// The online points of `sel`, in file order then point name order.
std::vector<OnlinePoint> read_online_points(const OnlineSelection& sel);

/// Mean of `v` (0 when empty).
double mean_of(const std::vector<double>& v);

/// "0: NVIDIA H200 (0000:3b:00.0)" -> "NVIDIA H200"; "cpu" stays.
std::string device_kind(const std::string& described);

}  // namespace mtplab::plan
