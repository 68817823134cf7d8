// The acceptance side of a plan: tau(k) for k = 1..k_max with how it can be resampled, from replay
// results files or from an acceptance profile (profile.hpp).
//
// From results files (schema v3, harness/results.hpp): every selected point contributes its draft
// length k and, per sequence of repeat 0, its steps and the sums over its steps of
// prod_{j<=i} a_j for i = 1..k (a_j: steps' accept_prob), so that tau(k) = 1 + sum_i sum_s m_{s,i} /
// sum_s steps_s is the point's expected_tau, and tau(j) for j < k is the same sum cut at j (the
// first j drafts of a chain of k are the chain of j). A draft length without a point of its own
// takes the cut of the shortest longer point, and says so. Replay and online points alike; a point
// of draft_len 0 (MTP off) has no drafts to accept and is skipped (tau(0) = 1), named in the input.
//
// Invariants:
// - A point whose acceptance is not meaningful (synthetic weights: acceptance_meaningful 0, or,
//   in a file that predates the attribute, `weights: synthetic` in its config) is refused, naming
//   the file and the point. So is a file of another schema or version.
// - Two selected points of one draft length are an error naming both (select with `points:`).
// - The tau computed from the steps must equal the point's expected_tau attribute (1e-9 relative):
//   a file whose steps and figures disagree is refused.
// - Resampling is a percentile bootstrap over sequences, the units uncertainty.hpp uses: within
//   one results file every point is resampled with the same draws of sequences (paired: the
//   points replayed the same trace), points of different files independently. A profile has no
//   units: its tau is the same in every resample, and the curve says so.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "harness/uncertainty.hpp"
#include "plan/profile.hpp"

namespace mtplab::plan {

/// Which results points to read: every completed point of the files, or those named ("p8",
/// "p0008" or "8").
struct ResultsSelection {
  std::vector<std::string> files;
  std::vector<std::string> points;
};

/// "p8", "p0008" or "8" -> 8; anything else is an error naming `key` (the plan key that gave it).
int64_t parse_point_index(const std::string& name, const std::string& key);
/// 8 -> "p0008", the name of a results file's point group.
std::string point_name(int64_t index);

class AcceptanceCurve {
 public:
  static AcceptanceCurve from_profile(const std::string& path);
  static AcceptanceCurve from_profile(const AcceptanceProfile& profile, const std::string& name);
  static AcceptanceCurve from_results(const ResultsSelection& sel);

  int k_max() const { return static_cast<int>(tau_.size()) - 1; }
  /// tau(k), k = 0..k_max (tau(0) = 1).
  double tau(int k) const { return tau_.at(static_cast<size_t>(k)); }
  /// 95% percentile interval of tau(k) from `resamples` draws (NaN bounds without units).
  harness::Interval tau_interval(int k) const { return tau_ci_.at(static_cast<size_t>(k)); }
  /// Where tau(k) comes from ("p0008 of r.h5 (draft_len 3)", "cut at 2 of p0008 ...",
  /// "profile F: accepted_length[1]").
  const std::string& origin(int k) const { return origin_.at(static_cast<size_t>(k)); }
  bool has_units() const { return has_units_; }
  /// How tau is resampled, for the output ("bootstrap over sequences: ..." or "none: ...").
  const std::string& interval_method() const { return interval_method_; }
  /// Each input, named with its provenance (file, points, commit, devices).
  const std::vector<std::string>& inputs() const { return inputs_; }
  const std::vector<std::string>& notes() const { return notes_; }

  /// tau[r][k] for r < resamples, k = 0..k_max, seeded: the same seed gives the same draws. Also
  /// sets the intervals of tau(k) and of the marginal rates from these draws.
  std::vector<std::vector<double>> resample(int resamples, uint64_t seed);

  /// The profile of this curve up to k_max: accepted lengths (with intervals once resampled) and,
  /// from results, the marginal rates of the longest point.
  AcceptanceProfile profile() const;

 private:
  // One results point: per unit (sequence) of its file, steps and m[i][u].
  struct Point {
    std::string label;  // "p0008 of FILE (draft_len 3)"
    int k = 0;
    std::vector<double> steps;               // [units of the file]
    std::vector<std::vector<double>> depth;  // [k][units]: sum over steps of prod_{j<=i} a_j
  };
  struct File {
    std::string path;
    size_t units = 0;
    std::vector<Point> points;
  };
  // tau(k) from file f, point p, cut at depth k.
  struct Source {
    int file = -1, point = -1;
  };

  std::vector<double> tau_;
  std::vector<harness::Interval> tau_ci_;
  std::vector<std::string> origin_;
  std::vector<Source> source_;
  std::vector<File> files_;
  bool has_units_ = false;
  std::string interval_method_;
  std::vector<std::string> inputs_, notes_;
  AcceptanceProfile profile_;     // from a profile; the description and source for results
  std::vector<double> marginal_;  // results: of the longest point
  std::vector<harness::Interval> marginal_ci_;
  std::string units_text_;
};

}  // namespace mtplab::plan
