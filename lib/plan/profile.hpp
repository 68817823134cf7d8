// An acceptance profile: how often a drafter's drafts are accepted, without the traces behind it
// (a published curve, or what `mtplab plan` derived from replay results). Written and read as one
// documented JSON file (docs/planning.md, "The acceptance profile"), schema
// `mtplab-acceptance-profile` version 1.
//
// Definitions (one chain of k_max drafts; a = the accepted drafts of a step):
// - accepted_length[k-1] = tau(k) = E[a] + 1 at draft length k (the bonus token counted), as
//   measured at each k (a published curve measures each k separately);
// - marginal_rates[i-1] = r_i = P(a >= i): the chance that drafts 1..i are all accepted (what
//   vLLM's synthetic acceptance mode takes as `synthetic_acceptance_rates`);
// - conditional_rates[i-1] = r_i / r_{i-1} (r_0 = 1): draft i accepted given drafts before it were;
// - accepted_length_histogram[j] = P(a = j) = r_j - r_{j+1} at k = k_max, j = 0..k_max.
// One chain gives tau(k) = 1 + r_1 + ... + r_k. A profile holds accepted lengths, marginal rates or
// both; the marginal rates, when not given, are the increments tau(k) - tau(k-1) of the accepted
// lengths.
//
// Invariants:
// - Marginal rates are in [0, 1]. Rates that rise with the position (r_{i+1} > r_i: a curve whose
//   lengths were measured at each k separately) cannot be one chain's: the derived figures
//   (conditional rates, histogram, the vLLM list) then use the running minimum of the rates, and
//   the profile's notes say which positions were lowered and from what.
// - Reading a file recomputes the derived figures from the primary ones; a derived key present in
//   the file that disagrees (beyond 1e-9) is an error naming the file and the key, so a
//   hand-edited file cannot carry two different curves.
#pragma once
#include <array>
#include <string>
#include <vector>

namespace mtplab::plan {

inline constexpr const char* kProfileSchema = "mtplab-acceptance-profile";
inline constexpr int kProfileSchemaVersion = 1;

struct AcceptanceProfile {
  std::string description;              ///< what was measured: model, drafter, data, sampling
  std::string source;                   ///< where the figures come from (a publication, results files)
  std::vector<double> accepted_length;  ///< tau(k), k = 1..; may be empty
  std::vector<std::array<double, 2>> accepted_length_ci;  ///< empty, or one (lo, hi) per length
  std::vector<double> marginal_rates;                     ///< r_i, i = 1..; may be empty
  std::vector<std::array<double, 2>> marginal_rates_ci;   ///< empty, or one (lo, hi) per rate
  /// What the figures were averaged over ("16 sequences of results/r.h5"); "" when unknown. A
  /// profile file carries no units themselves, so a plan cannot resample it.
  std::string units;
  std::vector<std::string> notes;

  /// The longest draft length the profile describes: max(accepted lengths, marginal rates).
  int k_max() const;
  /// tau(k) for k = 1..k_max(): the accepted length when given, else 1 + r_1 + ... + r_k.
  double tau(int k) const;
  /// The marginal rates r_1..r_k_max: as given, else the increments of the accepted lengths.
  std::vector<double> marginal() const;
  /// The running minimum of marginal() (equal to it when the rates never rise).
  std::vector<double> chain_marginal() const;
  std::vector<double> conditional() const;  ///< from chain_marginal()
  std::vector<double> histogram() const;    ///< P(a = j), j = 0..k_max, from chain_marginal()
  /// The notes on positions whose rate rises (what chain_marginal() lowered); empty when none.
  std::vector<std::string> monotonicity_notes() const;
  /// Checks ranges and sizes; throws naming `where` and the key.
  void validate(const std::string& where) const;
};

/// The profile as its JSON file (derived figures included, `vllm_synthetic_acceptance_rates` =
/// chain_marginal()).
std::string profile_json(const AcceptanceProfile& p);
/// Reads and checks a profile file (strict JSON, core/json.hpp); errors name the file and key.
AcceptanceProfile read_profile(const std::string& path);
/// The same from text; `name` stands for the file in messages.
AcceptanceProfile parse_profile(const std::string& text, const std::string& name);

/// A number as JSON: the shortest text that reads back as the same double; NaN / Inf as null.
std::string json_number(double v);
/// A string as a JSON string literal (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s);

}  // namespace mtplab::plan
