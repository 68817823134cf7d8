// The cost side of a plan: the time of one serving step at concurrency B and draft length k,
//
//   T(B, k) = draft(B, k) + (L - D) x layer(B, k + 1) + D x dense_layer(B, k + 1) + head(B (k + 1)) + c
//
// (docs/planning.md; L layers of which the first D have a dense MLP, c the fixed cost per step),
// as a sum of terms, each a measured cost point times a count, so that a resample draws each point
// once and every term that uses it sees the same draw.
//
// Sources: bench_step_batch.csv rows (draft(B, k): the batched draft step of k drafts),
// bench_verify.csv rows (part layer: one target layer over B x R rows; part dense_layer: the same
// for a dense-MLP layer; part head: the head over `rows` rows), and the fixed cost: a number, rows
// of part fixed (one per B, columns as bench_verify's) in a verify-format file, or online points
// (online_costs.hpp). Online points give c(B) = the mean over the measured rows of every selected
// online point at B of step_ms - draft - verify_ms, where draft is what the plan's draft term
// stands for: steps/propose_ms (the benchmark's draft step) beside benchmark files, the drafter's
// whole part steps/draft_ms with `online_all`. With `online_all` the online points give every
// term: draft(B, k) (draft_ms) and verify(B, k) (verify_ms: the target's L layers and head at k + 1
// rows a sequence, one term) of the point at (B, k), and no benchmark file is read:
//
//   T(B, k) = draft(B, k) + verify(B, k) + c(B)
//
// Invariants:
// - No interpolation. draft(B, k) is the step file's row at (B, k); without one, k x the row at
//   (B, 1) (a draft step is k chained forwards of one row per sequence, each the same work; the
//   plan notes every use). Anything else missing is an error naming the files and the key.
// - Rows are selected by their head column (draft_head for the step files, target_head for the
//   head rows) and by `step_select` (column -> value) for the step files; two rows left for one
//   key are an error naming both and the columns in which they differ.
// - A cost point's spread: sigma = (p90 - p10) / 2.563, the normal distribution's p10 - p90 width
//   (2 x 1.2816 sigma). A point without p10 / p90 has no spread and is held at its median. An
//   online point's figure is a mean over many steps: its sigma is the mean's standard error with
//   the steps as units (its p10 / p90, those of the rows, are shown only).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "plan/bench_csv.hpp"
#include "plan/online_costs.hpp"

namespace mtplab::plan {

struct CostPoint {
  std::string label;  ///< "layer(B=8, R=3)", "head(16 rows, bf16)", "draft(B=8, k=1, bf16)"
  std::string where;  ///< "file:line", or the plan key
  double median_us = 0;
  std::optional<double> p10_us, p90_us;
  /// A mean's standard error (an online point's: its median_us is a mean); when set, the sigma.
  std::optional<double> standard_error_us;
  bool has_spread() const { return standard_error_us || (p10_us && p90_us); }
  /// The standard error when given, else (p90 - p10) / 2.563; 0 without a spread.
  double sigma_us() const {
    if (standard_error_us) return *standard_error_us;
    return p10_us && p90_us ? (*p90_us - *p10_us) / 2.563 : 0.0;
  }
};

/// One term of T(B, k): `times` x cost point `point`.
struct CostTerm {
  std::string part;  ///< draft | layer | dense_layer | head | verify | fixed
  int point = -1;
  double times = 1;
};

/// The target's trunk and how many GPUs serve one instance.
struct ModelShape {
  std::string name;      ///< preset name or config path
  std::string config;    ///< the config's own name (a config file's `name:`), "" when not known
  int layers = 0;        ///< L
  int dense_layers = 0;  ///< D: the first D layers have a dense MLP
  int gpus = 1;          ///< GPUs one instance runs on (tokens/s per GPU divides by it)
};

struct CostOptions {
  std::vector<std::string> step_files, verify_files;
  std::map<std::string, std::string> step_select;  ///< bench_step_batch column -> value
  std::string draft_head = "bf16", target_head = "bf16";
  std::optional<double> fixed_us;  ///< c; exclusive with rows of part fixed
  bool dense_as_moe = false;       ///< dense-MLP layers at the MoE layer's cost (no dense rows)
  OnlineSelection online;          ///< online points: c(B), and every term with online_all
  bool online_all = false;         ///< draft and verify from the online points too (no benchmark file)
};

class CostBook {
 public:
  static CostBook load(const CostOptions& opt);

  /// The terms of T(B, k). A missing point is an error naming the files and the key.
  std::vector<CostTerm> step_terms(int B, int k, const ModelShape& model) const;
  /// Whether step_terms(B, k) would find every point (for the default k range).
  bool covers(int B, int k, const ModelShape& model) const;
  /// The draft lengths of step rows at B (for notes).
  bool draft_measured(int B, int k) const { return draft_.count({B, k}) != 0; }

  const std::vector<CostPoint>& points() const { return points_; }
  /// The batch sizes with a layer row at R = 1 and a draft row, ascending.
  std::vector<int> batches() const;
  /// Each file with its provenance and the rows it gave.
  std::vector<std::string> inputs() const;
  /// Where the files disagree: model preset, device, commit; context between step and verify files.
  std::vector<std::string> disagreements(const ModelShape& model) const;
  /// The fixed cost's origin, for the output.
  const std::string& fixed_origin() const { return fixed_origin_; }
  /// The online points read (empty without costs.online).
  const std::vector<OnlinePoint>& online_points() const { return online_; }
  /// What the plan should note about the online points (steps with fewer live sequences than B,
  /// a negative fixed cost).
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  int add(CostPoint p);
  void load_online();
  std::string online_names() const;
  std::string step_names() const;
  std::string verify_names() const;

  CostOptions opt_;
  std::vector<BenchCsv> step_csv_, verify_csv_;
  std::vector<CostPoint> points_;
  std::map<std::pair<int, int>, int> draft_, layer_, dense_, verify_;  // (B, k) / (B, R) -> point
  std::map<int, int> head_, fixed_;                                    // rows / B -> point
  int fixed_constant_ = -1;
  std::string fixed_origin_;
  std::map<std::string, int> rows_used_;  // file -> rows selected
  std::vector<OnlinePoint> online_;
  std::vector<std::string> notes_;
};

}  // namespace mtplab::plan
