// The plan's computation and its printed tables (planner.hpp).
#include "plan/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numbers>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/stats.hpp"
#include "core/str.hpp"

namespace mtplab::plan {

namespace {

// A standard normal from two uniforms of the stream (Box-Muller, the cosine half): the same state
// gives the same value on every platform (std::normal_distribution's algorithm is the library's).
double standard_normal(uint64_t& state) {
  const double u1 = (static_cast<double>(splitmix64_next(state) >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
  const double u2 = static_cast<double>(splitmix64_next(state) >> 11) * 0x1.0p-53;
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
}

Band band(double value, std::vector<double> draws) {
  std::sort(draws.begin(), draws.end());
  return {value, quantile_sorted(draws, 0.025), quantile_sorted(draws, 0.975)};
}

std::string fixed(double v, int digits) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string banded(const Band& b, int digits) {
  return str(fixed(b.value, digits), " [", fixed(b.lo, digits), ", ", fixed(b.hi, digits), "]");
}

std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], r[c].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c)
      line += r[c] + (c + 1 < r.size() ? std::string(width[c] - r[c].size() + 2, ' ') : "");
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::vector<ScheduleEntry> PlanResult::schedule() const {
  std::vector<ScheduleEntry> s;
  for (const auto& b : best) s.push_back({b.batch, b.k});
  return s;
}

PlanResult run_plan(const PlanSpec& spec) {
  PlanResult res;
  res.spec = spec;
  AcceptanceCurve curve = spec.profile.empty() ? AcceptanceCurve::from_results(spec.results)
                                               : AcceptanceCurve::from_profile(spec.profile);
  const CostBook book = CostBook::load(spec.costs);
  const ModelShape& model = spec.model;

  res.batch = spec.batch.empty() ? book.batches() : spec.batch;
  MTP_REQUIRE(!res.batch.empty(),
              spec.costs.online_all
                  ? "no batch size with an online point at k = 0 and one at some k >= 1; give batch"
                  : "no batch size with a layer row at R = 1 and a draft row in the cost files; give batch");
  for (int B : res.batch)
    book.step_terms(B, 0, model);  // MTP off: the layer at R = 1 and the head over B rows
  if (spec.k_max > 0) {
    MTP_REQUIRE(spec.k_max <= curve.k_max(), "k_max ", spec.k_max, ": the acceptance source covers k = 1..",
                curve.k_max());
    res.k_max = spec.k_max;
  } else {
    // The largest k that the acceptance and the costs cover at every planned B, every shorter k too.
    int k = 0;
    while (k < curve.k_max()) {
      bool all = true;
      for (int B : res.batch) all = all && book.covers(B, k + 1, model);
      if (!all) break;
      ++k;
    }
    if (k == 0)
      for (int B : res.batch) book.step_terms(B, 1, model);  // the first point k = 1 lacks, as an error
    res.k_max = k;
  }
  const int nk = res.k_max + 1;
  const size_t nb = res.batch.size();

  // The terms of every (B, k): looked up once (a missing point is an error here, before any resample).
  std::vector<std::vector<CostTerm>> terms(nb * static_cast<size_t>(nk));
  std::map<int, std::vector<int>> scaled;  // k -> B where draft(B, k) = k x draft(B, 1)
  for (size_t b = 0; b < nb; ++b)
    for (int k = 0; k < nk; ++k) {
      terms[b * static_cast<size_t>(nk) + static_cast<size_t>(k)] = book.step_terms(res.batch[b], k, model);
      if (k > 1 && !book.draft_measured(res.batch[b], k)) scaled[k].push_back(res.batch[b]);
    }
  for (const auto& [k, bs] : scaled)
    res.notes.push_back(str("draft(B, ", k, ") = ", k, " x draft(B, 1) at B = ", join(bs, ", "),
                            ": the step files hold no row at k = ", k,
                            " (a draft step is k chained forwards of one row per sequence)"));

  res.inputs.push_back(str("model ", model.name, ": ", model.layers, " layer(s) (",
                           model.layers - model.dense_layers, " MoE, ", model.dense_layers, " dense-MLP); ",
                           model.gpus, " GPU(s) per instance"));
  for (const auto& s : curve.inputs()) res.inputs.push_back(s);
  for (const auto& s : book.inputs()) res.inputs.push_back(s);
  res.warnings = book.disagreements(model);
  for (const auto& n : curve.notes()) res.notes.push_back(n);
  for (const auto& n : book.notes()) res.notes.push_back(n);
  if (spec.costs.online_all)
    res.notes.push_back(
        "costs from online points: the layers column is the target's whole verify forward at k + 1 rows a "
        "sequence (its layers, norm and head: the points' verify_ms) and the head column 0; the draft is the "
        "drafter's whole part of a step (draft_ms: propose, trim, catch-up)");
  if (!spec.costs.fixed_us && book.fixed_origin().starts_with("not given"))
    res.notes.push_back(
        "fixed cost c not given: 0 us per step (sampling, scheduling and launch overheads outside "
        "the measured forwards count for nothing; c > 0 raises every k > 0's speedup toward tau)");
  size_t no_spread = 0;
  for (const auto& p : book.points())
    if (!p.has_spread() && p.label != "fixed") ++no_spread;
  if (no_spread)
    res.notes.push_back(
        str(no_spread, " cost point(s) without p10 / p90 (held at their median in every resample): ", [&] {
          std::vector<std::string> w;
          for (const auto& p : book.points())
            if (!p.has_spread() && p.label != "fixed") w.push_back(p.label);
          if (w.size() > 6) {
            w.resize(6);
            w.push_back("...");
          }
          return join(w, ", ");
        }()));

  // Resamples: tau by the curve's bootstrap, every cost point from its normal.
  const int R = spec.resamples;
  const std::vector<std::vector<double>> tau_r = curve.resample(R, spec.seed);
  const std::vector<CostPoint>& pts = book.points();
  std::vector<double> cost_r(static_cast<size_t>(R) * pts.size());
  uint64_t state = splitmix64_mix(spec.seed ^ fnv1a64("plan cost resample"));
  for (int r = 0; r < R; ++r)
    for (size_t p = 0; p < pts.size(); ++p) {
      const double z = standard_normal(state);
      cost_r[static_cast<size_t>(r) * pts.size() + p] =
          std::max(0.0, pts[p].median_us + pts[p].sigma_us() * z);
    }
  res.tau_interval = curve.interval_method();
  res.cost_interval =
      str("each cost point drawn from a normal of its median and sigma = (p90 - p10) / 2.563, "
          "truncated at 0 (points without p10 / p90 held; an online point: its mean and the mean's standard "
          "error over its steps); ",
          R, " joint resamples of tau and costs, seed ", spec.seed,
          "; intervals are the 2.5% and 97.5% percentiles");
  for (int k = 0; k < nk; ++k) {
    res.tau.push_back(curve.tau(k));
    res.tau_ci.push_back(k == 0 ? harness::Interval{1, 1} : curve.tau_interval(k));
    res.tau_origin.push_back(curve.origin(k));
  }
  res.cost_points = pts;

  auto step_time = [&](size_t b, int k, int r) {
    double t = 0;
    for (const CostTerm& term : terms[b * static_cast<size_t>(nk) + static_cast<size_t>(k)])
      t += term.times * (r < 0
                             ? pts[static_cast<size_t>(term.point)].median_us
                             : cost_r[static_cast<size_t>(r) * pts.size() + static_cast<size_t>(term.point)]);
    return t;
  };
  for (size_t b = 0; b < nb; ++b) {
    const int B = res.batch[b];
    // Point estimates.
    std::vector<double> speed(static_cast<size_t>(nk));
    const double t0 = step_time(b, 0, -1);
    for (int k = 0; k < nk; ++k) {
      PlanCell c;
      c.batch = B;
      c.k = k;
      c.tau = res.tau[static_cast<size_t>(k)];
      c.tau_lo = res.tau_ci[static_cast<size_t>(k)].lo;
      c.tau_hi = res.tau_ci[static_cast<size_t>(k)].hi;
      for (const CostTerm& term : terms[b * static_cast<size_t>(nk) + static_cast<size_t>(k)]) {
        const double v = term.times * pts[static_cast<size_t>(term.point)].median_us;
        (term.part == "draft"   ? c.draft_us
         : term.part == "head"  ? c.head_us
         : term.part == "fixed" ? c.fixed_us
                                : c.layers_us) += v;
      }
      const double t = step_time(b, k, -1);
      c.step_us.value = t;
      c.user_tps.value = c.tau / t * 1e6;
      c.gpu_tps.value = B * c.tau / t * 1e6 / model.gpus;
      c.speedup.value = c.tau * t0 / t;
      speed[static_cast<size_t>(k)] = c.speedup.value;
      res.cells.push_back(c);
    }
    // Resampled.
    std::vector<std::vector<double>> st(static_cast<size_t>(nk)), ut(static_cast<size_t>(nk)),
        gt(static_cast<size_t>(nk)), sp(static_cast<size_t>(nk));
    std::vector<int> wins(static_cast<size_t>(nk), 0);
    std::vector<int> argmax_r(static_cast<size_t>(R));
    std::vector<std::vector<double>> sp_by_r(static_cast<size_t>(R),
                                             std::vector<double>(static_cast<size_t>(nk)));
    for (int r = 0; r < R; ++r) {
      const double t0r = step_time(b, 0, r);
      int best = 0;
      for (int k = 0; k < nk; ++k) {
        const double tau = tau_r[static_cast<size_t>(r)][static_cast<size_t>(k)];
        const double t = step_time(b, k, r);
        const double s = tau * t0r / t;
        st[static_cast<size_t>(k)].push_back(t);
        ut[static_cast<size_t>(k)].push_back(tau / t * 1e6);
        gt[static_cast<size_t>(k)].push_back(B * tau / t * 1e6 / model.gpus);
        sp[static_cast<size_t>(k)].push_back(s);
        sp_by_r[static_cast<size_t>(r)][static_cast<size_t>(k)] = s;
        if (s > sp_by_r[static_cast<size_t>(r)][static_cast<size_t>(best)]) best = k;
      }
      ++wins[static_cast<size_t>(best)];
      argmax_r[static_cast<size_t>(r)] = best;
    }
    const size_t base = b * static_cast<size_t>(nk);
    for (int k = 0; k < nk; ++k) {
      PlanCell& c = res.cells[base + static_cast<size_t>(k)];
      c.step_us = band(c.step_us.value, st[static_cast<size_t>(k)]);
      c.user_tps = band(c.user_tps.value, ut[static_cast<size_t>(k)]);
      c.gpu_tps = band(c.gpu_tps.value, gt[static_cast<size_t>(k)]);
      c.speedup = band(c.speedup.value, sp[static_cast<size_t>(k)]);
      c.win_fraction = static_cast<double>(wins[static_cast<size_t>(k)]) / R;
    }
    PlanBest best;
    best.batch = B;
    for (int k = 1; k < nk; ++k)
      if (speed[static_cast<size_t>(k)] > speed[static_cast<size_t>(best.k)]) best.k = k;
    for (int k = 0; k < nk; ++k)
      if (k != best.k &&
          (best.runner_up < 0 || speed[static_cast<size_t>(k)] > speed[static_cast<size_t>(best.runner_up)]))
        best.runner_up = k;
    const PlanCell& bc = res.cells[base + static_cast<size_t>(best.k)];
    best.win_fraction = bc.win_fraction;
    for (int k = 0; k < nk; ++k)
      if (res.cells[base + static_cast<size_t>(k)].win_fraction >= 0.025) best.k_set.push_back(k);
    if (best.runner_up >= 0) {
      int beats = 0;
      for (int r = 0; r < R; ++r)
        beats += sp_by_r[static_cast<size_t>(r)][static_cast<size_t>(best.k)] >
                 sp_by_r[static_cast<size_t>(r)][static_cast<size_t>(best.runner_up)];
      best.beats_runner_up = static_cast<double>(beats) / R;
    }
    best.distinguishable = best.win_fraction >= 0.95;
    best.speedup = bc.speedup;
    best.user_tps = bc.user_tps;
    best.gpu_tps = bc.gpu_tps;
    best.step_us = bc.step_us;
    res.best.push_back(best);
  }
  res.profile = curve.profile();
  for (const OnlinePoint& p : book.online_points()) {
    const auto at = std::find(res.batch.begin(), res.batch.end(), p.batch);
    if (at == res.batch.end() || p.k > res.k_max) continue;
    const PlanCell& c = res.cell(static_cast<size_t>(at - res.batch.begin()), p.k);
    OnlineCheck x;
    x.batch = p.batch;
    x.k = p.k;
    x.point = str(p.name, " of ", p.file);
    x.tau = c.tau;
    x.step_us = c.step_us.value;
    x.point_tau = p.tokens_per_row;
    x.point_step_us = mean_of(p.step_us);
    x.predicted = c.user_tps.value;
    x.measured = p.tokens_per_s_per_sequence;
    x.measured_lo = p.tokens_per_s_per_sequence_lo;
    x.measured_hi = p.tokens_per_s_per_sequence_hi;
    res.online_check.push_back(x);
  }
  return res;
}

std::string format_plan(const PlanResult& r) {
  std::string s;
  s += str("mtplab plan", r.spec.file.empty() ? "" : str(" ", r.spec.file), ": k = 0..", r.k_max,
           " at B = ", join(r.batch, ", "), "\n");
  s += "inputs:\n";
  for (const auto& i : r.inputs) s += str("  ", i, "\n");
  for (const auto& w : r.warnings) s += str("warning: ", w, "\n");
  for (const auto& n : r.notes) s += str("note: ", n, "\n");
  s += str("intervals: tau: ", r.tau_interval, "; costs: ", r.cost_interval, "\n");

  std::vector<std::vector<std::string>> t = {{"k", "tau", "95% interval", "from"}};
  for (int k = 0; k <= r.k_max; ++k) {
    const auto& ci = r.tau_ci[static_cast<size_t>(k)];
    t.push_back({str(k), fixed(r.tau[static_cast<size_t>(k)], 3),
                 std::isnan(ci.lo) ? "none" : str("[", fixed(ci.lo, 3), ", ", fixed(ci.hi, 3), "]"),
                 r.tau_origin[static_cast<size_t>(k)]});
  }
  s += "\ntau(k): tokens per sequence per step (accepted drafts + the target's own)\n" + table(t);

  std::vector<std::string> head = {"B"};
  for (int k = 0; k <= r.k_max; ++k) head.push_back(str("k=", k));
  std::vector<std::vector<std::string>> sp = {head};
  for (size_t b = 0; b < r.batch.size(); ++b) {
    std::vector<std::string> row = {str(r.batch[b])};
    for (int k = 0; k <= r.k_max; ++k) {
      const PlanCell& c = r.cell(b, k);
      row.push_back(k == 0 ? "1" : banded(c.speedup, 3) + (r.best[b].k == k ? " *" : ""));
    }
    sp.push_back(row);
  }
  s += "\nspeedup over k = 0 (MTP off), [95% interval]; * the best k\n" + table(sp);

  std::vector<std::vector<std::string>> bt = {{"B", "best k", "wins", "k in 95%", "runner-up", "verdict",
                                               "speedup", "tok/s/user", "tok/s/GPU", "step ms"}};
  for (const auto& b : r.best) {
    bt.push_back({str(b.batch), str(b.k), fixed(b.win_fraction, 3), join(b.k_set, ","),
                  b.runner_up < 0 ? "-" : str(b.runner_up),
                  b.distinguishable ? "distinguishable" : str("indistinguishable from k = ", b.runner_up),
                  banded(b.speedup, 3), banded(b.user_tps, 1), banded(b.gpu_tps, 0),
                  fixed(b.step_us.value / 1000, 2)});
  }
  s += "\nbest k per concurrency: wins = share of resamples in which it is the best; distinguishable when >= "
       "0.95\n" +
       table(bt);
  if (!r.online_check.empty()) {
    std::vector<std::vector<std::string>> oc = {{"B", "k", "point", "tau plan", "tau point", "step ms plan",
                                                 "step ms point", "tok/s/seq plan", "tok/s/seq point [95%]",
                                                 "plan / point"}};
    for (const OnlineCheck& x : r.online_check)
      oc.push_back({str(x.batch), str(x.k), x.point, fixed(x.tau, 3), fixed(x.point_tau, 3),
                    fixed(x.step_us / 1000, 3), fixed(x.point_step_us / 1000, 3), fixed(x.predicted, 1),
                    banded({x.measured, x.measured_lo, x.measured_hi}, 1), fixed(x.ratio(), 3)});
    s += "\nprediction against the online points (costs.online): tokens/s per sequence, tau(k) / T(B, k) "
         "against the point's tokens_per_s_per_sequence\n" +
         table(oc);
  }
  std::vector<std::string> ranges;
  for (const BatchRange& x : schedule_ranges(r.schedule(), r.spec.max_batch))
    ranges.push_back(x.lo == x.hi ? str("B ", x.lo, ": k ", x.k) : str("B ", x.lo, "-", x.hi, ": k ", x.k));
  s += str("\nschedule (a B between planned sizes takes the k of the next planned size above; above ",
           r.batch.back(), " MTP off): ", join(ranges, ", "), "\n");
  return s;
}

}  // namespace mtplab::plan
