// The plan file (HDF5, schema mtplab-plan) and the exports directory (planner.hpp).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/str.hpp"
#include "harness/results.hpp"
#include "io/hdf5.hpp"
#include "io/output.hpp"
#include "plan/planner.hpp"

namespace mtplab::plan {

namespace {

std::vector<std::string> input_files(const PlanSpec& s) {
  std::vector<std::string> in = s.costs.step_files;
  in.insert(in.end(), s.costs.verify_files.begin(), s.costs.verify_files.end());
  in.insert(in.end(), s.costs.online.files.begin(), s.costs.online.files.end());
  in.insert(in.end(), s.results.files.begin(), s.results.files.end());
  if (!s.profile.empty()) in.push_back(s.profile);
  if (!s.file.empty()) in.push_back(s.file);
  return in;
}

template <typename F>
std::vector<double> column(const std::vector<PlanCell>& cells, F get) {
  std::vector<double> out;
  for (const auto& c : cells) out.push_back(get(c));
  return out;
}

}  // namespace

void write_plan_file(const std::string& path, const PlanResult& r, const std::vector<std::string>& argv,
                     bool force) {
  const std::string target =
      io::resolve_output("mtplab plan", path, {"plan file", "schema", "mtplab-plan"}, input_files(r.spec),
                         force ? io::OutputMode::replace : io::OutputMode::create);
  const auto parent = std::filesystem::path(target).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  io::H5File f = io::H5File::create(target);
  f.set_attr("schema", "mtplab-plan");
  f.set_attr("schema_version", static_cast<int64_t>(1));
  f.set_attr("mtplab_version", project_version());
  f.set_attr("git_sha", git_sha());
  f.set_attr("git_dirty", git_dirty());
  f.set_attr("created_at", harness::utc_now());
  f.set_attr("argv", argv);
  f.set_attr("plan_file", r.spec.file);
  f.set_attr("plan_yaml", r.spec.resolved_yaml);

  io::Group g = f.create_group("plan");
  g.set_attr("model", r.spec.model.name);
  g.set_attr("layers", static_cast<int64_t>(r.spec.model.layers));
  g.set_attr("dense_layers", static_cast<int64_t>(r.spec.model.dense_layers));
  g.set_attr("gpus", static_cast<int64_t>(r.spec.model.gpus));
  g.set_attr("k_max", static_cast<int64_t>(r.k_max));
  std::vector<int64_t> batch(r.batch.begin(), r.batch.end());
  g.set_attr("batch", batch);
  g.set_attr("resamples", static_cast<int64_t>(r.spec.resamples));
  g.set_attr("seed", static_cast<int64_t>(r.spec.seed));
  g.set_attr("inputs", r.inputs);
  g.set_attr("warnings", r.warnings);
  g.set_attr("inputs_agree", r.warnings.empty());
  g.set_attr("notes", r.notes);
  g.set_attr("tau_interval", r.tau_interval);
  g.set_attr("cost_interval", r.cost_interval);
  g.set_attr(
      "best_k_rule",
      "best k = argmax_k speedup (ties to the smaller k); k_set: every k that wins >= 2.5% of the resamples; "
      "distinguishable: the best k wins >= 95%");

  // One row per (B, k), batch-major.
  io::Group t = g.create_group("table");
  std::vector<int64_t> tb, tk;
  for (const auto& c : r.cells) {
    tb.push_back(c.batch);
    tk.push_back(c.k);
  }
  t.write("batch", tb);
  t.write("k", tk);
  t.write("tau", column(r.cells, [](const PlanCell& c) { return c.tau; }));
  t.write("tau_lo", column(r.cells, [](const PlanCell& c) { return c.tau_lo; }));
  t.write("tau_hi", column(r.cells, [](const PlanCell& c) { return c.tau_hi; }));
  t.write("draft_us", column(r.cells, [](const PlanCell& c) { return c.draft_us; }));
  t.write("layers_us", column(r.cells, [](const PlanCell& c) { return c.layers_us; }));
  t.write("head_us", column(r.cells, [](const PlanCell& c) { return c.head_us; }));
  t.write("fixed_us", column(r.cells, [](const PlanCell& c) { return c.fixed_us; }));
  auto bands = [&](const std::string& name, Band PlanCell::*m) {
    t.write(name, column(r.cells, [&](const PlanCell& c) { return (c.*m).value; }));
    t.write(name + "_lo", column(r.cells, [&](const PlanCell& c) { return (c.*m).lo; }));
    t.write(name + "_hi", column(r.cells, [&](const PlanCell& c) { return (c.*m).hi; }));
  };
  bands("step_us", &PlanCell::step_us);
  bands("tokens_per_s_user", &PlanCell::user_tps);
  bands("tokens_per_s_gpu", &PlanCell::gpu_tps);
  bands("speedup", &PlanCell::speedup);
  t.write("win_fraction", column(r.cells, [](const PlanCell& c) { return c.win_fraction; }));

  // One row per B.
  io::Group b = g.create_group("best");
  std::vector<int64_t> bb, bk, runner, dist;
  std::vector<double> win, beats, sp, sp_lo, sp_hi, ut, ut_lo, ut_hi, gt, gt_lo, gt_hi;
  std::vector<std::string> kset;
  for (const auto& x : r.best) {
    bb.push_back(x.batch);
    bk.push_back(x.k);
    runner.push_back(x.runner_up);
    dist.push_back(x.distinguishable);
    win.push_back(x.win_fraction);
    beats.push_back(x.beats_runner_up);
    kset.push_back(join(x.k_set, ","));
    sp.push_back(x.speedup.value);
    sp_lo.push_back(x.speedup.lo);
    sp_hi.push_back(x.speedup.hi);
    ut.push_back(x.user_tps.value);
    ut_lo.push_back(x.user_tps.lo);
    ut_hi.push_back(x.user_tps.hi);
    gt.push_back(x.gpu_tps.value);
    gt_lo.push_back(x.gpu_tps.lo);
    gt_hi.push_back(x.gpu_tps.hi);
  }
  b.write("batch", bb);
  b.write("k", bk);
  b.write("win_fraction", win);
  b.write_strings("k_set", kset);
  b.write("runner_up", runner);
  b.write("beats_runner_up", beats);
  b.write("distinguishable", dist);
  b.write("speedup", sp);
  b.write("speedup_lo", sp_lo);
  b.write("speedup_hi", sp_hi);
  b.write("tokens_per_s_user", ut);
  b.write("tokens_per_s_user_lo", ut_lo);
  b.write("tokens_per_s_user_hi", ut_hi);
  b.write("tokens_per_s_gpu", gt);
  b.write("tokens_per_s_gpu_lo", gt_lo);
  b.write("tokens_per_s_gpu_hi", gt_hi);

  // tau(k) and where it came from.
  io::Group a = g.create_group("acceptance");
  std::vector<int64_t> ak;
  std::vector<double> lo, hi;
  for (int k = 0; k <= r.k_max; ++k) {
    ak.push_back(k);
    lo.push_back(r.tau_ci[static_cast<size_t>(k)].lo);
    hi.push_back(r.tau_ci[static_cast<size_t>(k)].hi);
  }
  a.write("k", ak);
  a.write("tau", r.tau);
  a.write("tau_lo", lo);
  a.write("tau_hi", hi);
  a.write_strings("origin", r.tau_origin);
  const std::vector<double> marginal = r.profile.marginal();
  a.write("marginal_rates", marginal);
  a.set_attr("units", r.profile.units);

  // The cost points, each with where it was read.
  io::Group c = g.create_group("costs");
  std::vector<std::string> label, where;
  std::vector<double> med, p10, p90, sigma;
  for (const auto& p : r.cost_points) {
    label.push_back(p.label);
    where.push_back(p.where);
    med.push_back(p.median_us);
    p10.push_back(p.p10_us.value_or(std::numeric_limits<double>::quiet_NaN()));
    p90.push_back(p.p90_us.value_or(std::numeric_limits<double>::quiet_NaN()));
    sigma.push_back(p.sigma_us());
  }
  c.write_strings("label", label);
  c.write_strings("where", where);
  c.write("median_us", med);
  c.write("p10_us", p10);
  c.write("p90_us", p90);
  c.write("sigma_us", sigma);

  // The prediction against the online points that ran a planned (B, k).
  if (!r.online_check.empty()) {
    io::Group o = g.create_group("online_check");
    std::vector<int64_t> ob, ok;
    std::vector<std::string> point;
    for (const auto& x : r.online_check) {
      ob.push_back(x.batch);
      ok.push_back(x.k);
      point.push_back(x.point);
    }
    auto col = [&](double OnlineCheck::*m) {
      std::vector<double> v;
      for (const auto& x : r.online_check) v.push_back(x.*m);
      return v;
    };
    o.write("batch", ob);
    o.write("k", ok);
    o.write_strings("point", point);
    o.write("tau", col(&OnlineCheck::tau));
    o.write("point_tau", col(&OnlineCheck::point_tau));
    o.write("step_us", col(&OnlineCheck::step_us));
    o.write("point_step_us", col(&OnlineCheck::point_step_us));
    o.write("predicted", col(&OnlineCheck::predicted));
    o.write("measured", col(&OnlineCheck::measured));
    o.write("measured_lo", col(&OnlineCheck::measured_lo));
    o.write("measured_hi", col(&OnlineCheck::measured_hi));
  }
  f.commit();
}

std::vector<std::string> export_names() {
  return {"vllm-speculative-config.json", "trtllm-speculative-config.yaml", "sglang-launch-flags.json",
          "acceptance-profile.json"};
}

void check_outputs(const PlanSpec& spec, bool force) {
  if (!spec.output.empty())
    io::resolve_output("mtplab plan", spec.output, {"plan file", "schema", "mtplab-plan"}, input_files(spec),
                       force ? io::OutputMode::replace : io::OutputMode::create);
  if (spec.exports.empty()) return;
  const std::vector<std::string> inputs = input_files(spec);
  for (const auto& name : export_names()) {
    const std::string path = (std::filesystem::path(spec.exports) / name).string();
    std::error_code ec;
    for (const auto& in : inputs)
      MTP_REQUIRE(!std::filesystem::exists(in, ec) || !std::filesystem::equivalent(path, in, ec),
                  "mtplab plan: ", path, " is an input of the plan: not overwritten");
    MTP_REQUIRE(force || !std::filesystem::exists(path, ec), "mtplab plan: ", path,
                " exists; --force replaces the exports");
    MTP_REQUIRE(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec),
                "mtplab plan: ", path, " exists and is not a regular file: never replaced");
  }
}

std::vector<std::string> write_exports(const std::string& dir, const PlanResult& r, bool force) {
  PlanSpec spec = r.spec;
  spec.output.clear();
  spec.exports = dir;
  check_outputs(spec, force);
  const std::vector<ScheduleEntry> sched = r.schedule();
  const std::vector<std::string> names = export_names();
  const std::vector<std::string> texts = {
      vllm_schedule_json(sched, r.spec.max_batch), trtllm_schedule_yaml(sched),
      sglang_flags_json(sched, r.spec.max_batch), profile_json(r.profile)};
  std::filesystem::create_directories(dir);
  std::vector<std::string> written;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& text = texts[i];
    const std::string path = (std::filesystem::path(dir) / names[i]).string();
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      MTP_REQUIRE(out, "mtplab plan: cannot write ", tmp);
      out << text;
      out.close();
      MTP_REQUIRE(out, "mtplab plan: cannot write ", tmp, " (disk full?)");
    }
    std::filesystem::rename(tmp, path);
    written.push_back(path);
  }
  return written;
}

}  // namespace mtplab::plan
