// Plans with known answers (plan/planner.hpp): step times, speedup and tokens/s computed by hand,
// intervals and the best k's verdict under resampling, the seed; acceptance from results files with
// its bootstrap over sequences (paired within a file), cuts and refusals; the plan file and the
// exports read back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "common/point_result.hpp"
#include "common/temp_dir.hpp"
#include "harness/experiment.hpp"
#include "harness/results.hpp"
#include "harness/uncertainty.hpp"
#include "io/hdf5.hpp"
#include "plan/planner.hpp"

using namespace mtplab;
using namespace mtplab::plan;
using mtplab::test::error_of;
using mtplab::test::expect_has;

namespace {

std::string write(const test::TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir / name;
  std::ofstream(path) << text;
  return path;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Costs with known sums: L = 2 layers. `spread` adds p10 / p90 of +-spread around each median.
struct Files {
  std::string step, verify, profile;
};
Files known_files(const test::TempDir& dir, double spread = 0) {
  auto row = [&](double m) { return spread > 0 ? str(m, ",", m - spread, ",", m + spread) : str(m, ",,"); };
  const std::string step =
      str("# mtplab_bench_step --batch git 1234567 device NVIDIA H200 preset glm5.3-flash contexts 4096\n"
          "head,cuda_graph,index_share,context,k,B,reps,median_us,p10_us,p90_us\n",
          "bf16,on,off,4096,1,1,20,", row(100), "\n", "bf16,on,off,4096,1,4,20,", row(200), "\n");
  std::string verify =
      "# mtplab_bench_verify git 1234567 device NVIDIA H200 preset glm5.3-flash context 4096\n"
      "part,head,B,R,rows,reps,median_us,p10_us,p90_us\n";
  const std::vector<std::tuple<int, int, double>> layers = {{1, 1, 1000}, {1, 2, 1500}, {1, 3, 2500},
                                                            {4, 1, 2000}, {4, 2, 2400}, {4, 3, 2600}};
  for (const auto& [B, R, us] : layers)
    verify += str("layer,,", B, ",", R, ",", B * R, ",20,", row(us), "\n");
  for (int rows : {1, 2, 3, 4, 8, 12})
    verify += str("head,bf16,,,", rows, ",20,", rows <= 3 ? 300 : 400, ",,\n");
  return {
      write(dir, "step.csv", step), write(dir, "verify.csv", verify),
      write(dir, "profile.json",
            "{\"schema\": \"mtplab-acceptance-profile\", \"schema_version\": 1, \"description\": \"known\", "
            "\"accepted_length\": [1.8, 2.4]}\n")};
}

PlanSpec known_spec(const Files& f, const std::vector<std::pair<std::string, std::string>>& more = {}) {
  std::vector<std::pair<std::string, std::string>> o = {
      {"model", "{preset: glm5.3-flash, layers: 2}"},
      {"gpus", "2"},
      {"acceptance", str("{profile: ", f.profile, "}")},
      {"costs", str("{step: ", f.step, ", verify: ", f.verify, ", fixed_us: 100}")},
      {"resamples", "400"}};
  o.insert(o.end(), more.begin(), more.end());
  return load_plan_spec("", o);
}

}  // namespace

// B = 1: T(0) = 2 x 1000 + 300 + 100 = 2400; T(1) = 100 + 2 x 1500 + 300 + 100 = 3500;
//        T(2) = 2 x 100 + 2 x 2500 + 300 + 100 = 5600: speedups 1.8 x 2400 / 3500, 2.4 x 2400 / 5600.
// B = 4: T(0) = 4000 + 400 + 100 = 4500; T(1) = 200 + 4800 + 400 + 100 = 5500;
//        T(2) = 400 + 5200 + 400 + 100 = 6100.
TEST(PlanPlanner, KnownAnswerWithoutSpread) {
  test::TempDir dir("mtplab-plan");
  const PlanResult r = run_plan(known_spec(known_files(dir)));
  EXPECT_EQ(r.batch, (std::vector<int>{1, 4}));
  EXPECT_EQ(r.k_max, 2);  // the profile and the costs both cover k = 1, 2
  EXPECT_DOUBLE_EQ(r.cell(0, 0).step_us.value, 2400);
  EXPECT_DOUBLE_EQ(r.cell(0, 1).step_us.value, 3500);
  EXPECT_DOUBLE_EQ(r.cell(0, 2).step_us.value, 5600);
  EXPECT_DOUBLE_EQ(r.cell(0, 2).draft_us, 200);
  EXPECT_DOUBLE_EQ(r.cell(0, 2).layers_us, 5000);
  EXPECT_DOUBLE_EQ(r.cell(0, 2).head_us, 300);
  EXPECT_DOUBLE_EQ(r.cell(0, 2).fixed_us, 100);
  EXPECT_DOUBLE_EQ(r.cell(0, 1).speedup.value, 1.8 * 2400 / 3500);
  EXPECT_DOUBLE_EQ(r.cell(0, 2).speedup.value, 2.4 * 2400 / 5600);
  EXPECT_DOUBLE_EQ(r.cell(1, 2).step_us.value, 6100);
  EXPECT_DOUBLE_EQ(r.cell(1, 2).speedup.value, 2.4 * 4500 / 6100);
  EXPECT_DOUBLE_EQ(r.cell(1, 2).user_tps.value, 2.4 / 6100e-6);
  EXPECT_DOUBLE_EQ(r.cell(1, 2).gpu_tps.value, 4 * 2.4 / 6100e-6 / 2);  // 2 GPUs
  EXPECT_DOUBLE_EQ(r.cell(1, 0).speedup.value, 1);
  // Best: k = 1 at B = 1 (1.234 > 1.029), k = 2 at B = 4 (1.770 > 1.473).
  ASSERT_EQ(r.best.size(), 2u);
  EXPECT_EQ(r.best[0].k, 1);
  EXPECT_EQ(r.best[0].runner_up, 2);
  EXPECT_EQ(r.best[1].k, 2);
  EXPECT_EQ(r.best[1].runner_up, 1);
  // Nothing has a spread and the profile no units: every resample is the point estimate.
  for (const auto& b : r.best) {
    EXPECT_EQ(b.win_fraction, 1);
    EXPECT_EQ(b.k_set, (std::vector<int>{b.k}));
    EXPECT_TRUE(b.distinguishable);
    EXPECT_EQ(b.speedup.lo, b.speedup.value);
    EXPECT_EQ(b.speedup.hi, b.speedup.value);
  }
  EXPECT_TRUE(std::isnan(r.tau_ci[1].lo));
  expect_has(r.tau_interval, "none: a profile carries no units");
  EXPECT_EQ(r.schedule(), (std::vector<ScheduleEntry>{{1, 1}, {4, 2}}));
  EXPECT_TRUE(r.warnings.empty());
  // The printed tables say what was found.
  const std::string text = format_plan(r);
  expect_has(text, "1.234 [1.234, 1.234] *");
  expect_has(text, "schedule (");
  expect_has(text, "B 1: k 1, B 2-4: k 2, B 5-4096: k 0");
  expect_has(text, "  acceptance profile ");
}

TEST(PlanPlanner, ExplicitKMaxAndBatchAreChecked) {
  test::TempDir dir("mtplab-plan");
  const Files f = known_files(dir);
  expect_has(error_of([&] {
               run_plan(known_spec(f, {{"k_max", "3"}}));
             }),
             "k_max 3: the acceptance source covers k = 1..2");
  expect_has(error_of([&] {
               run_plan(known_spec(f, {{"batch", "[1, 2]"}}));
             }),
             "no layer row at (B = 2, R = 1)");
  const PlanResult one = run_plan(known_spec(f, {{"k_max", "1"}, {"batch", "[4]"}}));
  EXPECT_EQ(one.k_max, 1);
  EXPECT_EQ(one.best[0].k, 1);
  // The plan file's keys are checked with the file and key in the message.
  expect_has(error_of([&] { known_spec(f, {{"costs.head", "fp16"}}); }), "costs.head");
  expect_has(error_of([&] { known_spec(f, {{"batch", "[4, 1]"}}); }), "batch sizes must increase");
  expect_has(error_of([&] { known_spec(f, {{"resample", "10"}}); }), "resample");
  expect_has(error_of([&] { load_plan_spec("", {{"model", "glm5.3-flash"}}); }), "no acceptance");
}

TEST(PlanPlanner, SpreadGivesIntervalsAndTheSeedFixesThem) {
  test::TempDir dir("mtplab-plan");
  const Files f = known_files(dir, 150);  // sigma = 300 / 2.563 on every step and layer point
  const PlanResult a = run_plan(known_spec(f));
  const PlanResult b = run_plan(known_spec(f));
  const PlanResult c = run_plan(known_spec(f, {{"seed", "2"}}));
  for (size_t i = 0; i < a.cells.size(); ++i) {
    const PlanCell& x = a.cells[i];
    EXPECT_EQ(x.speedup.lo, b.cells[i].speedup.lo);  // the same seed: the same resamples
    EXPECT_EQ(x.speedup.hi, b.cells[i].speedup.hi);
    EXPECT_LE(x.step_us.lo, x.step_us.value);
    EXPECT_GE(x.step_us.hi, x.step_us.value);
    if (x.k > 0) {
      EXPECT_LT(x.speedup.lo, x.speedup.value);
      EXPECT_GT(x.speedup.hi, x.speedup.value);
    }
  }
  EXPECT_NE(a.cell(0, 1).speedup.lo, c.cell(0, 1).speedup.lo);  // another seed, other resamples
  for (size_t bi = 0; bi < a.best.size(); ++bi) {
    double sum = 0;
    for (int k = 0; k <= a.k_max; ++k) sum += a.cell(bi, k).win_fraction;
    EXPECT_NEAR(sum, 1, 1e-12);
    const PlanBest& best = a.best[bi];
    EXPECT_GE(best.beats_runner_up, best.win_fraction);  // winning them all beats the runner-up
    EXPECT_NE(std::find(best.k_set.begin(), best.k_set.end(), best.k), best.k_set.end());
    EXPECT_EQ(best.distinguishable, best.win_fraction >= 0.95);
  }
  // B = 4: 1.770 against 1.473 stands out of a spread of this size; B = 1's k = 1 (1.234) against
  // k = 2 (1.029) too.
  EXPECT_TRUE(a.best[1].distinguishable);
  // A near tie at B = 1: layer(1, 3) = 2033 gives T(1, 2) = 200 + 4066 + 400 = 4666 and a speedup of
  // 2.4 x 2400 / 4666 = 1.23446, against k = 1's 1.8 x 2400 / 3500 = 1.23429: k = 2 is the best by
  // the point estimate and wins about half the resamples.
  std::string verify = read(f.verify);
  const std::string from = "layer,,1,3,3,20,2500,2350,2650";
  ASSERT_NE(verify.find(from), std::string::npos);
  verify.replace(verify.find(from), from.size(), "layer,,1,3,3,20,2033,1883,2183");
  std::ofstream(f.verify) << verify;
  const PlanResult tie = run_plan(known_spec(f));
  EXPECT_EQ(tie.best[0].k, 2);
  EXPECT_EQ(tie.best[0].runner_up, 1);
  EXPECT_GT(tie.best[0].win_fraction, 0.2);
  EXPECT_LT(tie.best[0].win_fraction, 0.8);
  EXPECT_FALSE(tie.best[0].distinguishable);
  // Both win a share; with this spread (sigma 59 us on a 100 us draft step) k = 0 may win a little too.
  EXPECT_NE(std::find(tie.best[0].k_set.begin(), tie.best[0].k_set.end(), 1), tie.best[0].k_set.end());
  EXPECT_NE(std::find(tie.best[0].k_set.begin(), tie.best[0].k_set.end(), 2), tie.best[0].k_set.end());
  expect_has(format_plan(tie), "indistinguishable from k = 1");
}

namespace {

// A results file of two points (draft_len 1 and 3) on two sequences, with fractional acceptance
// probabilities (sampling verification's expected lengths), written by the results writer.
const char* kReplayExperiment = R"(model: {preset: tiny, max_seq_len: 128}
weights: {checkpoint: tiny.safetensors}
trace: {path: tiny-trace.h5}
output: out.h5
backend: cpu
sweep:
  grid:
    draft_len: [1, 3]
)";

harness::PointResult replay_result(int k, const std::vector<std::pair<int32_t, std::vector<float>>>& rows) {
  harness::PointResult r;
  r.k = k;
  r.kernels = {"linear=cpu"};  // the writer takes no point without its kernel record
  r.timing.assign(harness::timing_columns().size(), {});
  for (const auto& [seq, ap] : rows) {
    r.repeat.push_back(0);
    r.sequence.push_back(seq);
    r.position.push_back(static_cast<int32_t>(r.position.size()));
    const double e = harness::expected_accepted(ap);
    r.accepted.push_back(0);
    r.acceptance.add(k, 0, e);
    r.expected_accepted.push_back(e);
    r.accept_prob.insert(r.accept_prob.end(), ap.begin(), ap.end());
    test::add_step_bookkeeping(r, k, 2, 0.0);
    for (int j = 0; j < k; ++j) {
      r.drafts.push_back(1);
      r.targets.push_back(2);
    }
  }
  test::add_two_sequences(r, 8, 24, 0);
  return r;
}

std::string replay_file(const test::TempDir& dir, const std::string& name, const std::string& experiment) {
  const std::string path = dir / name;
  const harness::Experiment ex = harness::parse_experiment(experiment, "exp.yaml", {}, 1);
  harness::RunProvenance prov;
  prov.backend = "cpu";
  prov.hosts = {"host"};
  prov.devices = {"cpu"};
  harness::prepare_results_file(path, ex, prov);
  // k = 1: sequence 0 expects 1 + 0.5 + 1 over 3 steps, sequence 1 expects 0 over 1: tau(1) = 1 + 2.5 / 4.
  harness::append_point(path, ex, ex.points[0],
                        replay_result(1, {{0, {1.f}}, {0, {0.5f}}, {1, {0.f}}, {0, {1.f}}}), prov);
  // k = 3: expected lengths 1.75 and 1 (sequence 0), 0 and 3 (sequence 1): tau(3) = 1 + 5.75 / 4;
  // the first two drafts give 1.5 + 1 + 1 + 1: tau(2) = 1 + 4.5 / 4.
  harness::append_point(
      path, ex, ex.points[1],
      replay_result(
          3, {{0, {1.f, 0.5f, 0.5f}}, {0, {0.5f, 1.f, 0.f}}, {1, {0.f, 1.f, 1.f}}, {1, {1.f, 1.f, 1.f}}}),
      prov);
  return path;
}

}  // namespace

TEST(PlanPlanner, AcceptanceFromResultsFiles) {
  test::TempDir dir("mtplab-plan");
  const std::string path = replay_file(dir, "r.h5", kReplayExperiment);
  AcceptanceCurve c = AcceptanceCurve::from_results({{path}, {}});
  ASSERT_EQ(c.k_max(), 3);
  EXPECT_DOUBLE_EQ(c.tau(1), 1 + 2.5 / 4);
  EXPECT_DOUBLE_EQ(c.tau(2), 1 + 4.5 / 4);
  EXPECT_DOUBLE_EQ(c.tau(3), 1 + 5.75 / 4);
  expect_has(c.origin(2), "the first 2 draft(s) of p0001 of ");
  expect_has(c.origin(3), "p0001 of ");
  EXPECT_TRUE(c.has_units());
  expect_has(c.inputs()[0], "points p0000 (draft_len 1, expected_tau 1.625");
  // Two sequences: a resample draws sequence 0 twice, both, or sequence 1 twice. The points of one
  // file share the draws, so tau(1) and tau(3) move together.
  const std::vector<std::vector<double>> t = c.resample(2000, 7);
  std::set<double> seen3;
  for (const auto& row : t) {
    seen3.insert(row[3]);
    if (row[3] == 1 + 2.75 / 2) {
      EXPECT_DOUBLE_EQ(row[1], 1 + 2.5 / 3);  // sequence 0 only
    }
    if (row[3] == 1 + 3.0 / 2) {
      EXPECT_DOUBLE_EQ(row[1], 1);  // sequence 1 only
    }
  }
  EXPECT_EQ(seen3.size(), 3u);
  EXPECT_DOUBLE_EQ(c.tau_interval(3).lo, 1 + 2.75 / 2);
  EXPECT_DOUBLE_EQ(c.tau_interval(3).hi, 1 + 3.0 / 2);
  EXPECT_DOUBLE_EQ(c.tau_interval(1).lo, 1);
  EXPECT_DOUBLE_EQ(c.tau_interval(1).hi, 1 + 2.5 / 3);
  // The profile: accepted lengths with their intervals, the marginal rates of the longest point.
  const AcceptanceProfile p = c.profile();
  EXPECT_EQ(p.accepted_length.size(), 3u);
  ASSERT_EQ(p.marginal_rates.size(), 3u);
  EXPECT_DOUBLE_EQ(p.marginal_rates[0], 2.5 / 4);
  EXPECT_DOUBLE_EQ(p.marginal_rates[1], 2.0 / 4);
  EXPECT_DOUBLE_EQ(p.marginal_rates[2], 1.25 / 4);
  EXPECT_EQ(p.accepted_length_ci.size(), 3u);
  expect_has(p.units, "2 sequence(s) of ");
  // Selecting points: p0 alone gives k = 1 only.
  EXPECT_EQ(AcceptanceCurve::from_results({{path}, {"p0"}}).k_max(), 1);
  expect_has(error_of([&] {
               AcceptanceCurve::from_results({{path}, {"p7"}});
             }),
             "acceptance.points: p0007 is in none of");
}

TEST(PlanPlanner, ResultsThatCannotBeAcceptanceAreRefused) {
  test::TempDir dir("mtplab-plan");
  // Synthetic weights: the point and the file named.
  std::string synthetic = kReplayExperiment;
  synthetic.replace(synthetic.find("{checkpoint: tiny.safetensors}"), 30, "{synthetic: {seed: 4}}");
  synthetic.replace(synthetic.find("{path: tiny-trace.h5}"), 21,
                    "{synthetic: {sequences: 2, new_tokens: 8}}");
  const std::string syn = replay_file(dir, "syn.h5", synthetic);
  const std::string e = error_of([&] { AcceptanceCurve::from_results({{syn}, {}}); });
  expect_has(e, syn + ": point p0000 (");
  expect_has(e,
             "its acceptance is not meaningful and cannot be a plan's acceptance source: synthetic weights "
             "(seed 4)");
  // A file that predates the attribute: the config's weights decide the same way.
  {
    io::H5File f = io::H5File::open_append(syn);
    io::Group g = f.open_group("points").open_group("p0000");
    g.remove_attr("acceptance_meaningful");
    g.remove_attr("acceptance_note");
    f.commit();
  }
  expect_has(error_of([&] { AcceptanceCurve::from_results({{syn}, {}}); }), "synthetic weights (seed 4)");
  // Steps and figures that disagree.
  const std::string path = replay_file(dir, "r.h5", kReplayExperiment);
  {
    io::H5File f = io::H5File::open_append(path);
    f.open_group("points").open_group("p0001").set_attr("expected_tau", 9.0);
    f.commit();
  }
  expect_has(
      error_of([&] {
        AcceptanceCurve::from_results({{path}, {}});
      }),
      "p0001 of " + path + " (draft_len 3): the steps give tau 2.4375 but the point records expected_tau 9");
  expect_has(error_of([&] {
               AcceptanceCurve::from_results({{dir / "none.h5"}, {}});
             }),
             "none.h5: no such file");
  const std::string not_results = write(dir, "x.h5", "not hdf5");
  expect_has(error_of([&] { AcceptanceCurve::from_results({{not_results}, {}}); }), "x.h5");
}

TEST(PlanPlanner, TwoPointsOfOneDraftLengthNeedASelection) {
  test::TempDir dir("mtplab-plan");
  std::string exp = kReplayExperiment;
  exp.replace(exp.find("draft_len: [1, 3]"), 17, "draft_len: [1, 3]\n    head_fp8: [off, on]");
  const std::string path = dir / "r.h5";
  const harness::Experiment ex = harness::parse_experiment(exp, "exp.yaml", {}, 1);
  harness::RunProvenance prov;
  prov.backend = "cpu";
  prov.hosts = {"host"};
  prov.devices = {"cpu"};
  harness::prepare_results_file(path, ex, prov);
  for (const auto& p : ex.points)
    harness::append_point(
        path, ex, p,
        replay_result(p.arms.drafter.draft_len,
                      {{0, std::vector<float>(static_cast<size_t>(p.arms.drafter.draft_len), 1.f)}}),
        prov);
  const std::string e = error_of([&] { AcceptanceCurve::from_results({{path}, {}}); });
  expect_has(e, "acceptance: two points of draft_len ");
  expect_has(e, "select one per draft length with acceptance.points");
  std::vector<std::string> pick;
  for (const auto& p : ex.points)
    if (p.label().find("head_fp8=off") != std::string::npos) pick.push_back(p.name());
  EXPECT_EQ(AcceptanceCurve::from_results({{path}, pick}).k_max(), 3);
}

TEST(PlanPlanner, PlanFileAndExportsReadBack) {
  test::TempDir dir("mtplab-plan");
  const Files f = known_files(dir, 150);
  const std::string results = replay_file(dir, "r.h5", kReplayExperiment);
  PlanSpec spec = known_spec(f, {{"acceptance", str("{results: [", results, "]}")}});
  const PlanResult r = run_plan(spec);
  EXPECT_EQ(r.k_max, 2);  // the costs stop at R = 3
  EXPECT_FALSE(std::isnan(r.tau_ci[2].lo));
  const std::string out = dir / "plan.h5";
  write_plan_file(out, r, {"mtplab", "plan"}, false);
  {
    const io::H5File h = io::H5File::open_read(out);
    EXPECT_EQ(h.attr_string("schema"), "mtplab-plan");
    EXPECT_EQ(h.attr_int("schema_version"), 1);
    const io::Group g = h.open_group("plan");
    EXPECT_EQ(g.attr_int("inputs_agree"), 1);
    EXPECT_EQ(g.attr_int("layers"), 2);
    const std::vector<std::string> inputs = g.attr_strings("inputs");
    const std::string all = join(inputs, "\n");
    expect_has(all, results);
    expect_has(all, f.step);
    expect_has(all, f.verify);
    expect_has(all, "git 1234567, device NVIDIA H200");
    const io::Group t = g.open_group("table");
    const std::vector<double> speedup = t.open_dataset("speedup").read<double>();
    ASSERT_EQ(speedup.size(), r.cells.size());
    for (size_t i = 0; i < speedup.size(); ++i) EXPECT_EQ(speedup[i], r.cells[i].speedup.value);
    EXPECT_EQ(t.open_dataset("k").read<int64_t>(), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
    const io::Group best = g.open_group("best");
    EXPECT_EQ(best.open_dataset("k").read<int64_t>()[1], r.best[1].k);
    EXPECT_EQ(best.open_dataset("k_set").read_strings()[1], join(r.best[1].k_set, ","));
    const io::Group a = g.open_group("acceptance");
    EXPECT_EQ(a.open_dataset("tau").read<double>(), r.tau);
  }
  // The output rule: an existing plan file only with force, another kind of file never.
  expect_has(error_of([&] { write_plan_file(out, r, {"mtplab", "plan"}, false); }), out);
  write_plan_file(out, r, {"mtplab", "plan"}, true);
  expect_has(error_of([&] { write_plan_file(results, r, {"mtplab", "plan"}, true); }), results);
  // A plan whose inputs disagree says so in the file.
  std::string step = read(f.step);
  step.replace(step.find("git 1234567"), 11, "git 7654321");
  std::ofstream(f.step) << step;
  const PlanResult d = run_plan(spec);
  ASSERT_EQ(d.warnings.size(), 1u);
  expect_has(d.warnings[0], "the cost files disagree on the git commit: 1234567 (");
  write_plan_file(out, d, {"mtplab", "plan"}, true);
  EXPECT_EQ(io::H5File::open_read(out).open_group("plan").attr_int("inputs_agree"), 0);
  expect_has(format_plan(d), "warning: the cost files disagree on the git commit");

  // The exports: each engine's file read back gives the plan's k at every batch size.
  const std::vector<std::string> files = write_exports(dir / "exports", r, false);
  ASSERT_EQ(files.size(), 4u);
  const std::vector<BatchRange> ranges = schedule_ranges(r.schedule(), r.spec.max_batch);
  const std::vector<int> v = vllm_k_per_batch(read(files[0]), files[0], 300);
  const std::vector<int> t = trtllm_k_per_batch(read(files[1]), files[1], 300);
  const std::vector<int> s = sglang_k_per_batch(read(files[2]), files[2], 300);
  for (int B = 1; B <= 300; ++B) {
    EXPECT_EQ(v[static_cast<size_t>(B)], range_k(ranges, B)) << B;
    EXPECT_EQ(t[static_cast<size_t>(B)], range_k(ranges, B)) << B;
    EXPECT_EQ(s[static_cast<size_t>(B)], range_k(ranges, B)) << B;
  }
  const AcceptanceProfile p = read_profile(files[3]);
  ASSERT_EQ(p.accepted_length.size(), 3u);
  EXPECT_DOUBLE_EQ(p.accepted_length[2], 1 + 5.75 / 4);
  expect_has(error_of([&] { write_exports(dir / "exports", r, false); }),
             "exists; --force replaces the exports");
  EXPECT_EQ(write_exports(dir / "exports", r, true).size(), 4u);
}
