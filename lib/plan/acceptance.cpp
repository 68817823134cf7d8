// Acceptance curves from profiles and replay results, and their resampling (acceptance.hpp).
#include "plan/acceptance.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/stats.hpp"
#include "core/str.hpp"
#include "harness/results.hpp"
#include "harness/results_format.hpp"
#include "io/hdf5.hpp"

namespace mtplab::plan {

int64_t parse_point_index(const std::string& name, const std::string& key) {
  std::string digits = name;
  if (!digits.empty() && digits[0] == 'p') digits = digits.substr(1);
  const auto i = parse_int64(digits);
  MTP_REQUIRE(i && *i >= 0 && !digits.empty() && digits[0] != '-' && digits[0] != '+', key, ": \"", name,
              "\" is not a point (p8, p0008 or 8)");
  return *i;
}

std::string point_name(int64_t index) {
  std::string n = std::to_string(index);
  while (n.size() < 4) n = "0" + n;
  return "p" + n;
}

namespace {

harness::Interval percentile_interval(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {quantile_sorted(values, 0.025), quantile_sorted(values, 0.975)};
}

}  // namespace

AcceptanceCurve AcceptanceCurve::from_profile(const std::string& path) {
  return from_profile(read_profile(path), path);
}

AcceptanceCurve AcceptanceCurve::from_profile(const AcceptanceProfile& profile, const std::string& name) {
  profile.validate(name);
  AcceptanceCurve c;
  c.profile_ = profile;
  c.tau_.push_back(1);
  c.origin_.push_back("k = 0: MTP off");
  for (int k = 1; k <= profile.k_max(); ++k) {
    c.tau_.push_back(profile.tau(k));
    c.origin_.push_back(static_cast<size_t>(k) <= profile.accepted_length.size()
                            ? str("profile ", name, ": accepted_length[", k - 1, "]")
                            : str("profile ", name, ": 1 + marginal_rates[0..", k - 1, "]"));
  }
  c.tau_ci_.assign(c.tau_.size(), {});
  c.has_units_ = false;
  c.interval_method_ =
      "none: a profile carries no units to resample (tau is held at the profile's value in every resample)";
  c.inputs_.push_back(str("acceptance profile ", name, ": ",
                          profile.description.empty() ? "(no description)" : profile.description,
                          profile.source.empty() ? "" : str("; source: ", profile.source),
                          profile.units.empty() ? "" : str("; over ", profile.units)));
  for (const auto& n : profile.monotonicity_notes()) c.notes_.push_back(str("profile ", name, ": ", n));
  return c;
}

AcceptanceCurve AcceptanceCurve::from_results(const ResultsSelection& sel) {
  MTP_REQUIRE(!sel.files.empty(), "acceptance.results: no results file given");
  std::set<int64_t> wanted;
  for (const auto& p : sel.points) wanted.insert(parse_point_index(p, "acceptance.points"));
  std::set<int64_t> found;
  AcceptanceCurve c;
  c.has_units_ = true;
  std::map<int, std::pair<int, int>> by_k;  // draft length -> (file, point)
  std::vector<std::string> unit_texts;
  for (size_t fi = 0; fi < sel.files.size(); ++fi) {
    const std::string& path = sel.files[fi];
    MTP_REQUIRE(std::filesystem::exists(path), "acceptance.results: ", path, ": no such file");
    const io::H5File f = io::H5File::open_read(path);
    if (const std::string problem = harness::results_format::schema_problem(f, path, "mtplab plan");
        !problem.empty())
      MTP_FAIL("acceptance.results: ", problem);
    File file;
    file.path = path;
    std::map<int32_t, size_t> unit;  // sequence id -> unit, in the order first seen
    struct Raw {
      std::vector<int32_t> seq;
      std::vector<float> ap;
      double expected_tau = 0;  // as the point records it
    };
    std::vector<Raw> raws;
    std::vector<std::string> used, skipped;
    const io::Group points = f.open_group("points");
    for (const auto& name : points.children()) {
      const io::Group g = points.open_group(name);
      const int64_t index = g.attr_int("index");
      if (!wanted.empty() && !wanted.count(index)) continue;
      found.insert(index);
      const std::string where = str(path, ": point ", name);
      MTP_REQUIRE(g.attr_string("status") == "ok", where, ": status \"", g.attr_string("status"),
                  "\", not ok");
      const int k = static_cast<int>(g.attr_int("draft_len"));
      MTP_REQUIRE(k >= 0, where, ": draft_len ", k);
      if (k == 0) {  // MTP off: no draft, nothing accepted; tau(0) = 1 by definition
        skipped.push_back(str(name, " (draft_len 0)"));
        continue;
      }
      const harness::AcceptanceMeaning meaning =
          g.has_attr("acceptance_meaningful")
              ? harness::AcceptanceMeaning{g.attr_int("acceptance_meaningful") != 0,
                                           g.has_attr("acceptance_note") ? g.attr_string("acceptance_note")
                                                                         : ""}
              : harness::acceptance_meaning_of_config(g.attr_string("config"), where);
      MTP_REQUIRE(
          meaning.meaningful, where, " (", g.attr_string("label"),
          "): its acceptance is not meaningful and cannot be a plan's acceptance source: ", meaning.reason,
          ". Take acceptance from replay with a checkpoint's weights, or from a profile "
          "(acceptance.profile)");
      const io::Group steps = g.open_group("steps");
      Raw raw;
      raw.expected_tau = g.attr_double("expected_tau");
      const std::vector<int32_t> repeat = steps.open_dataset("repeat").read<int32_t>();
      const std::vector<int32_t> seq = steps.open_dataset("sequence").read<int32_t>();
      const io::Dataset apd = g.open_dataset("accept_prob");
      MTP_REQUIRE(apd.rows() == seq.size() && apd.cols() == static_cast<uint64_t>(k), where,
                  ": accept_prob is [", apd.rows(), ", ", apd.cols(), "] for ", seq.size(), " steps of ", k,
                  " drafts");
      const std::vector<float> ap = apd.read<float>();
      // Repeat 0, every step (warm-up included), as the point's acceptance figures.
      for (size_t r = 0; r < seq.size(); ++r) {
        if (repeat[r] != 0) continue;
        raw.seq.push_back(seq[r]);
        raw.ap.insert(raw.ap.end(), ap.begin() + static_cast<std::ptrdiff_t>(r * static_cast<size_t>(k)),
                      ap.begin() + static_cast<std::ptrdiff_t>((r + 1) * static_cast<size_t>(k)));
        unit.emplace(seq[r], unit.size());
      }
      Point p;
      p.label = str(name, " of ", path, " (draft_len ", k, ")");
      p.k = k;
      if (by_k.count(k)) {
        const auto [of, op] = by_k[k];
        const std::string other =
            of == static_cast<int>(fi)
                ? file.points[static_cast<size_t>(op)].label
                : c.files_[static_cast<size_t>(of)].points[static_cast<size_t>(op)].label;
        MTP_FAIL("acceptance: two points of draft_len ", k, ": ", other, " and ", p.label,
                 "; select one per draft length with acceptance.points");
      }
      by_k[k] = {static_cast<int>(fi), static_cast<int>(file.points.size())};
      used.push_back(str(name, " (draft_len ", k, ", expected_tau ", g.attr_double("expected_tau"), ", ",
                         g.attr_string("label"), ")"));
      file.points.push_back(std::move(p));
      raws.push_back(std::move(raw));
    }
    file.units = unit.size();
    for (size_t pi = 0; pi < file.points.size(); ++pi) {
      Point& p = file.points[pi];
      const Raw& raw = raws[pi];
      const size_t k = static_cast<size_t>(p.k);
      p.steps.assign(file.units, 0.0);
      p.depth.assign(k, std::vector<double>(file.units, 0.0));
      for (size_t r = 0; r < raw.seq.size(); ++r) {
        const size_t u = unit.at(raw.seq[r]);
        p.steps[u] += 1;
        double prefix = 1;
        for (size_t i = 0; i < k; ++i) {
          const float a = raw.ap[r * k + i];
          MTP_REQUIRE(a >= 0 && a <= 1, path, ": ", p.label, ": accept_prob ", a, " outside [0, 1]");
          prefix *= a;
          p.depth[i][u] += prefix;
        }
      }
      // The steps must give the point's recorded expected_tau.
      double steps = 0, acc = 0;
      for (size_t u = 0; u < file.units; ++u) {
        steps += p.steps[u];
        for (size_t i = 0; i < k; ++i) acc += p.depth[i][u];
      }
      MTP_REQUIRE(steps > 0, path, ": ", p.label, ": no step of repeat 0");
      const double recorded = raw.expected_tau, computed = 1 + acc / steps;
      MTP_REQUIRE(std::fabs(recorded - computed) <= 1e-9 * std::max(1.0, recorded), path, ": ", p.label,
                  ": the steps give tau ", computed, " but the point records expected_tau ", recorded,
                  "; the file's steps and figures disagree");
    }
    const std::string sha = f.has_attr("git_sha") ? f.attr_string("git_sha") : "?";
    const std::vector<std::string> devices =
        f.has_attr("devices") ? f.attr_strings("devices") : std::vector<std::string>{};
    c.inputs_.push_back(
        str("acceptance results ", path, ": git ", sha.substr(0, 12),
            f.has_attr("git_dirty") && f.attr_int("git_dirty") ? " (dirty)" : "", ", backend ",
            f.has_attr("backend") ? f.attr_string("backend") : "?", ", devices ",
            devices.empty() ? std::string("?") : join(devices, "; "), ", ", file.units,
            " sequence(s); points ", used.empty() ? std::string("(none)") : join(used, ", "),
            skipped.empty() ? std::string() : str("; skipped (no drafts to accept): ", join(skipped, ", "))));
    unit_texts.push_back(str(file.units, " sequence(s) of ", path));
    c.files_.push_back(std::move(file));
  }
  for (const int64_t w : wanted)
    MTP_REQUIRE(found.count(w), "acceptance.points: ", point_name(w), " is in none of ",
                join(sel.files, ", "));
  MTP_REQUIRE(!by_k.empty(), "acceptance.results: no point selected in ", join(sel.files, ", "));
  const int k_max = by_k.rbegin()->first;
  c.tau_.assign(static_cast<size_t>(k_max) + 1, 1.0);
  c.origin_.assign(static_cast<size_t>(k_max) + 1, "k = 0: MTP off");
  c.source_.assign(static_cast<size_t>(k_max) + 1, Source{});
  for (int k = 1; k <= k_max; ++k) {
    const auto it = by_k.lower_bound(k);  // the point of draft length k, else the shortest longer one
    const auto [fi, pi] = it->second;
    const Point& p = c.files_[static_cast<size_t>(fi)].points[static_cast<size_t>(pi)];
    double steps = 0, acc = 0;
    for (size_t u = 0; u < p.steps.size(); ++u) {
      steps += p.steps[u];
      for (int i = 0; i < k; ++i) acc += p.depth[static_cast<size_t>(i)][u];
    }
    c.tau_[static_cast<size_t>(k)] = 1 + acc / steps;
    c.source_[static_cast<size_t>(k)] = {fi, pi};
    if (p.k == k) {
      c.origin_[static_cast<size_t>(k)] = p.label;
    } else {
      c.origin_[static_cast<size_t>(k)] = str("the first ", k, " draft(s) of ", p.label);
      c.notes_.push_back(str("tau(", k, ") from the first ", k, " draft(s) of ", p.label,
                             ": no selected point of draft_len ", k));
    }
  }
  // Marginal rates r_i of the longest point.
  const auto [lf, lp] = by_k.rbegin()->second;
  const Point& longest = c.files_[static_cast<size_t>(lf)].points[static_cast<size_t>(lp)];
  double steps = 0;
  for (double s : longest.steps) steps += s;
  for (const auto& d : longest.depth) {
    double m = 0;
    for (double v : d) m += v;
    c.marginal_.push_back(m / steps);
  }
  c.marginal_ci_.assign(c.marginal_.size(), {});
  c.tau_ci_.assign(c.tau_.size(), {});
  c.units_text_ = join(unit_texts, ", ");
  c.profile_.description = "expected accepted lengths of replay results";
  c.profile_.source = join(sel.files, ", ");
  c.interval_method_ =
      "percentile bootstrap over sequences (the units of harness/uncertainty.hpp): the points of one results "
      "file share the draws, files are drawn independently";
  return c;
}

std::vector<std::vector<double>> AcceptanceCurve::resample(int resamples, uint64_t seed) {
  MTP_REQUIRE(resamples >= 1, "resamples: ", resamples);
  std::vector<std::vector<double>> out(static_cast<size_t>(resamples), tau_);
  if (!has_units_) return out;
  const size_t nk = tau_.size();
  std::vector<std::vector<double>> marginal_draws(marginal_.size());
  // The longest point, whose marginal rates get intervals too.
  const Source longest = source_.back();
  for (size_t fi = 0; fi < files_.size(); ++fi) {
    const File& file = files_[fi];
    // The units that carry information: a step in some point of the file.
    std::vector<size_t> units;
    for (size_t u = 0; u < file.units; ++u) {
      bool any = false;
      for (const Point& p : file.points) any = any || p.steps[u] > 0;
      if (any) units.push_back(u);
    }
    // Per draft length sourced from this file: numerator and denominator per unit.
    std::vector<size_t> ks;
    std::vector<std::vector<double>> num, den;
    for (size_t k = 1; k < nk; ++k) {
      if (source_[k].file != static_cast<int>(fi)) continue;
      const Point& p = file.points[static_cast<size_t>(source_[k].point)];
      std::vector<double> n(file.units, 0.0);
      for (size_t u = 0; u < file.units; ++u)
        for (size_t i = 0; i < k; ++i) n[u] += p.depth[i][u];
      ks.push_back(k);
      num.push_back(std::move(n));
      den.push_back(p.steps);
    }
    const bool has_longest = longest.file == static_cast<int>(fi);
    uint64_t state = splitmix64_mix(seed ^ fnv1a64("plan acceptance resample") ^ static_cast<uint64_t>(fi));
    std::vector<double> count(file.units);
    for (int r = 0; r < resamples; ++r) {
      // A draw whose sequences hold no step of some point cannot give that point's tau: drawn again.
      for (int attempt = 0;; ++attempt) {
        MTP_REQUIRE(attempt < 1000, "acceptance: 1000 resamples of ", file.path,
                    " in a row drew no step of one point; too few sequences hold steps");
        std::fill(count.begin(), count.end(), 0.0);
        for (size_t i = 0; i < units.size(); ++i) count[units[splitmix64_next(state) % units.size()]] += 1;
        bool ok = true;
        for (const auto& d : den) {
          double s = 0;
          for (size_t u = 0; u < file.units; ++u) s += count[u] * d[u];
          ok = ok && s > 0;
        }
        if (ok) break;
      }
      for (size_t j = 0; j < ks.size(); ++j) {
        double n = 0, d = 0;
        for (size_t u = 0; u < file.units; ++u) {
          n += count[u] * num[j][u];
          d += count[u] * den[j][u];
        }
        out[static_cast<size_t>(r)][ks[j]] = 1 + n / d;
      }
      if (has_longest) {
        const Point& p = file.points[static_cast<size_t>(longest.point)];
        double d = 0;
        for (size_t u = 0; u < file.units; ++u) d += count[u] * p.steps[u];
        for (size_t i = 0; i < p.depth.size(); ++i) {
          double n = 0;
          for (size_t u = 0; u < file.units; ++u) n += count[u] * p.depth[i][u];
          marginal_draws[i].push_back(n / d);
        }
      }
    }
  }
  for (size_t k = 1; k < nk; ++k) {
    std::vector<double> v;
    for (const auto& row : out) v.push_back(row[k]);
    tau_ci_[k] = percentile_interval(std::move(v));
  }
  for (size_t i = 0; i < marginal_draws.size(); ++i) marginal_ci_[i] = percentile_interval(marginal_draws[i]);
  return out;
}

AcceptanceProfile AcceptanceCurve::profile() const {
  if (!has_units_) return profile_;
  AcceptanceProfile p = profile_;
  p.units = units_text_;
  p.accepted_length.assign(tau_.begin() + 1, tau_.end());
  p.marginal_rates = marginal_;
  p.accepted_length_ci.clear();
  if (!std::isnan(tau_ci_.back().lo))
    for (size_t k = 1; k < tau_.size(); ++k) p.accepted_length_ci.push_back({tau_ci_[k].lo, tau_ci_[k].hi});
  p.marginal_rates_ci.clear();
  if (!marginal_ci_.empty() && !std::isnan(marginal_ci_[0].lo))
    for (const auto& i : marginal_ci_) p.marginal_rates_ci.push_back({i.lo, i.hi});
  for (size_t k = 1; k < origin_.size(); ++k) p.notes.push_back(str("tau(", k, "): ", origin_[k]));
  return p;
}

}  // namespace mtplab::plan
