// Results schema version 3 and `mtplab upgrade` (docs/results-schema.md):
// - every arm (kernel fields included) round-trips at a value other than its default through the
//   canonical config, its typed point attribute, its /index column and the resume check;
// - a version-2 file (tests/data/results-v2.h5) upgrades into the file a rerun of its experiment
//   would resume: every point's config is the rerun's canonical text and every point is done;
// - a version-1 file (tests/data/seed-ablations-gpu.h5) upgrades: typed assignment, the arms it
//   never had at their defaults (record_margins as recorded), the figures the steps determine,
//   every dataset as it was, /divergence as the old file's;
// - refusals: a version-3 input, an existing output without --force, an input that is not a
//   results file or does not exist, and an older file given to merge or resume (with the advice).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "common/point_result.hpp"
#include "common/temp_dir.hpp"
#include "experiment_text.hpp"
#include "harness/experiment.hpp"
#include "harness/results.hpp"
#include "harness/results_format.hpp"
#include "io/hdf5.hpp"

using namespace mtplab;
using namespace mtplab::harness;
using mtplab::test::TempDir;

namespace {

std::string source_dir() {
  const char* s = std::getenv("MTPLAB_SOURCE_DIR");
  return s ? s : std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}
std::string data(const std::string& name) { return source_dir() + "/tests/data/" + name; }

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in:\n" << text;
}

// A point result of `rows` steps (repeat 0, each its own step) with drafts equal to the targets.
PointResult result_of(int k, int rows) {
  PointResult r;
  r.k = k;
  r.kernels = {"head_argmax_batch=cpu", "linear=cpu"};
  r.timing.assign(timing_columns().size(), {});
  for (int i = 0; i < rows; ++i) {
    r.repeat.push_back(0);
    r.sequence.push_back(i % 2);
    r.position.push_back(8 + i / 2);
    r.accepted.push_back(k);
    r.acceptance.add(k, k);
    r.expected_accepted.push_back(k);
    test::add_step_bookkeeping(r, k, 2, 0.5);  // batch step i: the steps are rows 0 .. rows - 1
    for (int j = 0; j < k; ++j) {
      r.drafts.push_back(i + j);
      r.targets.push_back(i + j);
      r.accept_prob.push_back(1.f);
    }
  }
  test::add_two_sequences(r, 8, 48, rows / 2);
  return r;
}

RunProvenance provenance() {
  RunProvenance prov;
  prov.backend = "cpu";
  prov.hosts = {"host", "host"};
  prov.devices = {"cpu", "cpu"};
  prov.world = 2;
  return prov;
}

// An allowed value of `a` other than its default.
std::string other_value(const ArmSpec& a) {
  std::vector<std::string> candidates;
  switch (a.type) {
    case SettingType::choice:
    case SettingType::boolean:
      candidates = a.choices;
      break;
    case SettingType::integer:
      candidates = {str(a.min), str(a.min + 1), str(a.max)};
      break;
    case SettingType::real:
      candidates = {real_text(a.real_min + (a.real_max - a.real_min) * 0.35), real_text(a.real_max)};
      break;
    case SettingType::text: {
      std::string words = a.text_values;
      for (char& c : words)
        if (c == ',' || c == '(' || c == ')') c = ' ';
      std::istringstream in(words);
      for (std::string w; in >> w;) candidates.push_back(w);
      break;
    }
  }
  for (const auto& c : candidates)
    if (c != a.default_value() && a.allows(c)) return c;
  ADD_FAILURE() << a.name << ": no allowed value other than the default among " << a.allowed();
  return a.default_value();
}

// The experiment of one point with arm `a` at `v`: a sampled synthetic trace, so that the
// sampling arms can take effect (verify: sampling, the trace sampled at the same transform).
Experiment one_point_with(const ArmSpec& a, const std::string& v) {
  const std::string text = test::tiny_experiment(
      "sequences: 2, prompt_len: 8, new_tokens: 40, seed: 5, layers: 1, sampling: sampling",
      "output: out.h5\n");
  std::vector<std::string> sets = {str(a.name, "=", v)};
  if (!a.only_with.empty()) sets.push_back(a.only_with);
  if (a.name == "draft_len" && v == "0") sets.push_back("mode=online");  // MTP off: online points only
  if (a.name == "temperature" || a.name == "top_k" || a.name == "top_p")
    sets.push_back(str("trace.synthetic.", a.name, "=", v));
  return parse_experiment(text, "exp.yaml", sets, 2);
}

}  // namespace

TEST(ResultsV3, EveryArmRoundTripsAtANonDefaultValue) {
  TempDir dir("mtplab-v3-arms");
  ASSERT_FALSE(arm_registry().empty());
  for (const ArmSpec& a : arm_registry()) {
    SCOPED_TRACE(a.name);
    const std::string v = other_value(a);
    ASSERT_NE(v, a.default_value());
    const Experiment ex = one_point_with(a, v);
    ASSERT_EQ(ex.points.size(), 1u);
    const PointConfig& p = ex.points[0];
    ASSERT_EQ(a.get(p.arms), v);
    const std::string path = dir / (a.name + ".h5");
    const RunProvenance prov = provenance();
    EXPECT_TRUE(prepare_results_file(path, ex, prov).empty());
    append_point(path, ex, p, result_of(p.arms.drafter.draft_len, 4), prov);

    const io::H5File f = io::H5File::open_read(path);
    EXPECT_EQ(f.attr_int("schema_version"), 3);
    EXPECT_EQ(f.attr_strings("arms"), arm_names());
    EXPECT_FALSE(f.has_attr("configuration_identity"));
    EXPECT_EQ(f.attr_string("experiment_identity"), results_identity(ex.configuration, {}));
    const io::Group g = f.open_group("points").open_group("p0000");
    // The canonical config: the arm at its value; every other arm too, at its default.
    const std::string config = g.attr_string("config");
    EXPECT_EQ(config, p.canonical);
    expect_has(config, a.block().empty() ? str("\n", a.name, ": ", v, "\n") : str("\n  ", a.key(), ": ", v));
    for (const ArmSpec& b : arm_registry())
      expect_has(config, b.block().empty() ? str("\n", b.name, ": ") : str("\n  ", b.key(), ": "));
    // The attribute, typed by the arm's type, and the /index column.
    const io::Group idx = f.open_group("index");
    switch (a.type) {
      case SettingType::integer:
        EXPECT_EQ(str(g.attr_int(a.name)), v);
        EXPECT_EQ(str(idx.open_dataset(a.name).read<int64_t>().at(0)), v);
        break;
      case SettingType::real:
        EXPECT_EQ(real_text(g.attr_double(a.name)), v);
        EXPECT_EQ(real_text(idx.open_dataset(a.name).read<double>().at(0)), v);
        break;
      default:
        EXPECT_EQ(g.attr_string(a.name), v);
        EXPECT_EQ(idx.open_dataset(a.name).read_strings().at(0), v);
        break;
    }
    // The per-op kernel record, as the run gave it.
    EXPECT_EQ(g.attr_strings("kernels"), (std::vector<std::string>{"head_argmax_batch=cpu", "linear=cpu"}));
    // The resume check reads it back as the same point.
    const ResumeState st = inspect_results_file(path, ex, {});
    EXPECT_TRUE(st.problems.empty()) << join(st.problems, "\n");
    EXPECT_EQ(st.done, (std::set<int>{0}));
    // And the point at the default is another point.
    const Experiment plain = one_point_with(a, a.default_value());
    EXPECT_NE(plain.points[0].canonical, p.canonical);
  }
}

TEST(ResultsUpgrade, Version2FileResumesAsARerunOfItsExperiment) {
  TempDir dir("mtplab-upgrade-v2");
  const std::string old_path = data("results-v2.h5"), out = dir / "v3.h5";
  const UpgradeReport r = upgrade_results(old_path, out, false, {"mtplab", "upgrade"});
  EXPECT_EQ(r.from_version, 2);
  EXPECT_EQ(r.points, 2);
  const io::H5File old_file = io::H5File::open_read(old_path);
  const io::H5File f = io::H5File::open_read(out);
  EXPECT_EQ(old_file.attr_int("schema_version"), 2);  // the input is only read
  EXPECT_EQ(f.attr_int("schema_version"), 3);
  EXPECT_EQ(f.attr_int("upgraded_from_version"), 2);
  EXPECT_EQ(f.attr_string("upgraded_from"), old_path);
  EXPECT_FALSE(f.has_attr("configuration_identity"));
  EXPECT_EQ(f.attr_strings("arms"), arm_names());

  // The experiment the file records, expanded by this mtplab: the file is its results file.
  const Experiment ex = parse_experiment(f.attr_string("experiment_yaml"), "results-v2.yaml", {},
                                         static_cast<int>(f.attr_int("world_size")));
  const results_format::IdentityParts parts = results_format::identity_parts(f);
  // The inputs as recorded, less the retired kernels.mla_clusters at auto (every run's choice today).
  IdentityInputs want_inputs;
  for (const auto& [key, value] : results_format::identity_parts(old_file).inputs) {
    if (key == "kernels.mla_clusters") {
      EXPECT_EQ(value, "auto");
      continue;
    }
    want_inputs.emplace_back(key, value);
  }
  EXPECT_LT(want_inputs.size(), results_format::identity_parts(old_file).inputs.size());
  EXPECT_EQ(parts.inputs, want_inputs);
  expect_has(join(r.notes, "\n"), "identity input kernels.mla_clusters: auto in the old file, left out");
  EXPECT_EQ(f.attr_string("experiment_identity"), results_identity(ex.configuration, parts.inputs));
  ASSERT_EQ(ex.points.size(), 2u);
  for (const PointConfig& p : ex.points) {
    SCOPED_TRACE(p.name());
    const io::Group g = f.open_group("points").open_group(p.name());
    const io::Group og = old_file.open_group("points").open_group(p.name());
    EXPECT_EQ(g.attr_string("config"), p.canonical);
    EXPECT_NE(og.attr_string("config"), p.canonical);  // version 2 left arms out
    for (const ArmSpec& a : arm_registry()) {
      if (a.type == SettingType::integer)
        EXPECT_EQ(str(g.attr_int(a.name)), a.get(p.arms)) << a.name;
      else if (a.type == SettingType::real)
        EXPECT_EQ(real_text(g.attr_double(a.name)), a.get(p.arms)) << a.name;
      else
        EXPECT_EQ(g.attr_string(a.name), a.get(p.arms)) << a.name;
    }
    // The old file recorded no kernel per op; its policy is in the kernels.* arms.
    EXPECT_EQ(g.attr_strings("kernels"), std::vector<std::string>{"not recorded (results schema version 2)"});
    EXPECT_EQ(g.attr_string("record_margins"), "on");  // left out at its default; margins recorded
    EXPECT_EQ(g.attr_string("kernels.gemv_split"), "2");
    // Datasets and recorded figures as they were.
    for (const char* d : {"drafts", "targets"})
      EXPECT_EQ(g.open_dataset(d).read<int32_t>(), og.open_dataset(d).read<int32_t>()) << d;
    EXPECT_EQ(g.open_dataset("draft_margin").read<float>(), og.open_dataset("draft_margin").read<float>());
    EXPECT_EQ(g.open_group("steps").open_dataset("step_ms").read<double>(),
              og.open_group("steps").open_dataset("step_ms").read<double>());
    EXPECT_EQ(g.attr_doubles("tau_ci"), og.attr_doubles("tau_ci"));
    EXPECT_EQ(g.attr_double("wall_s"), og.attr_double("wall_s"));
  }
  // Resuming it is rerunning nothing.
  const ResumeState st = inspect_results_file(out, ex, parts.inputs);
  EXPECT_TRUE(st.problems.empty()) << join(st.problems, "\n");
  EXPECT_EQ(st.done, (std::set<int>{0, 1}));
  // The old file itself is refused, with the advice.
  const ResumeState old_st = inspect_results_file(old_path, ex, parts.inputs);
  ASSERT_EQ(old_st.problems.size(), 1u);
  expect_has(old_st.problems[0], old_path + ": results schema version 2");
  expect_has(old_st.problems[0], "run `mtplab upgrade " + old_path + " NEW.h5`");
}

TEST(ResultsUpgrade, Version1File) {
  TempDir dir("mtplab-upgrade-v1");
  const std::string old_path = data("seed-ablations-gpu.h5"), out = dir / "v3.h5";
  const UpgradeReport r = upgrade_results(old_path, out, false, {"mtplab", "upgrade"});
  EXPECT_EQ(r.from_version, 1);
  EXPECT_EQ(r.points, 60);
  expect_has(join(r.notes, "\n"), "identity inputs: not recorded");
  expect_has(join(r.notes, "\n"),
             "computed from the steps: accepted_hist and the bootstrap intervals (60 point(s))");
  const io::H5File old_file = io::H5File::open_read(old_path);
  const io::H5File f = io::H5File::open_read(out);
  EXPECT_EQ(f.attr_int("schema_version"), 3);
  // The identity: of the recorded configuration, with one input saying the inputs were not recorded.
  const results_format::IdentityParts parts = results_format::identity_parts(f);
  ASSERT_EQ(parts.inputs.size(), 1u);
  EXPECT_EQ(parts.inputs[0].first, "inputs");
  expect_has(parts.inputs[0].second, "not recorded (results schema version 1");
  EXPECT_EQ(f.attr_string("experiment_identity"),
            results_identity(configuration_text(f.attr_string("experiment_yaml"), 2), parts.inputs));
  EXPECT_NE(f.attr_string("experiment_identity"), old_file.attr_string("experiment_identity"));
  const std::vector<std::string> axes = f.attr_strings("sweep_axes");
  for (const auto& axis : axes) EXPECT_EQ(f.attr_string(results_format::axis_type_attr(axis)), "str");

  const io::Group points = f.open_group("points"), old_points = old_file.open_group("points");
  ASSERT_EQ(points.children(), old_points.children());
  for (const auto& name : points.children()) {
    SCOPED_TRACE(name);
    const io::Group g = points.open_group(name), og = old_points.open_group(name);
    // The typed assignment, from the "axis=value" texts (which go).
    EXPECT_FALSE(g.has_attr("assignment"));
    const std::vector<std::string> texts = og.attr_strings("assignment");
    const std::vector<int64_t> at = g.attr_ints("assignment_index");
    ASSERT_EQ(at.size(), axes.size());
    for (size_t i = 0; i < axes.size(); ++i) {
      const std::string v = g.attr_string(results_format::point_axis_attr(axes[i]));
      EXPECT_EQ(texts[i], axes[i] + "=" + v);
      EXPECT_EQ(f.attr_strings(results_format::axis_values_attr(axes[i])).at(static_cast<size_t>(at[i])), v);
    }
    // Every arm: as recorded, or at its default; record_margins off (no margins), on under skip: head.
    const std::string config = g.attr_string("config");
    for (const ArmSpec& a : arm_registry())
      expect_has(config, a.block().empty() ? str("\n", a.name, ": ") : str("\n  ", a.key(), ": "));
    expect_has(config, "\ncontext_gemm: off\n");
    expect_has(config, "\n    sampling: greedy\n");
    EXPECT_EQ(g.attr_string("context_gemm"), "off");
    EXPECT_EQ(g.attr_string("kernels.mla_decode"), "v2");
    EXPECT_EQ(g.attr_strings("kernels"), std::vector<std::string>{kernels_not_recorded(1)});
    EXPECT_EQ(g.attr_string("record_margins"), g.attr_string("skip") == "head" ? "on" : "off");
    EXPECT_EQ(g.attr_string("head_fp8"), og.attr_string("head_fp8"));
    EXPECT_EQ(g.attr_int("draft_len"), og.attr_int("draft_len"));
    // What the steps determine (greedy verification, batch_size 1).
    const io::Group steps = g.open_group("steps"), old_steps = og.open_group("steps");
    const auto accepted = steps.open_dataset("accepted").read<int32_t>();
    const auto expected = steps.open_dataset("expected_accepted").read<double>();
    EXPECT_EQ(expected, std::vector<double>(accepted.begin(), accepted.end()));
    const auto drafts = g.open_dataset("drafts").read<int32_t>(),
               targets = g.open_dataset("targets").read<int32_t>();
    const auto ap = g.open_dataset("accept_prob").read<float>();
    ASSERT_EQ(ap.size(), drafts.size());
    for (size_t i = 0; i < ap.size(); ++i) ASSERT_EQ(ap[i], drafts[i] == targets[i] ? 1.f : 0.f);
    EXPECT_EQ(g.attr_double("expected_tau"), g.attr_double("tau"));
    const auto hist = g.attr_ints("accepted_hist");
    EXPECT_EQ(static_cast<int64_t>(hist.size()), g.attr_int("draft_len") + 1);
    int64_t total = 0;
    for (int64_t h : hist) total += h;
    EXPECT_EQ(total, g.attr_int("steps"));
    const auto tau_ci = g.attr_doubles("tau_ci");
    EXPECT_LE(tau_ci[0], g.attr_double("tau"));
    EXPECT_GE(tau_ci[1], g.attr_double("tau"));
    const auto batch_step = steps.open_dataset("batch_step").read<int32_t>();
    for (size_t i = 0; i < batch_step.size(); ++i) ASSERT_EQ(batch_step[i], static_cast<int32_t>(i));
    // Everything recorded is as it was.
    EXPECT_EQ(drafts, og.open_dataset("drafts").read<int32_t>());
    EXPECT_EQ(steps.open_dataset("step_ms").read<double>(), old_steps.open_dataset("step_ms").read<double>());
    EXPECT_EQ(g.open_group("per_draft").open_dataset("head_ms").read<double>(),
              og.open_group("per_draft").open_dataset("head_ms").read<double>());
    EXPECT_EQ(g.attr_double("acceptance_rate"), og.attr_double("acceptance_rate"));
    EXPECT_EQ(g.attr_double("step_ms_median"), og.attr_double("step_ms_median"));
    EXPECT_FALSE(steps.exists("stats_ms"));  // not measured then: not made up
  }
  // /divergence rebuilt from the steps: the old file's rows.
  const io::Group d = f.open_group("divergence"), od = old_file.open_group("divergence");
  for (const char* c : {"point", "reference", "differ_any", "differ_first", "common_steps"})
    EXPECT_EQ(d.open_dataset(c).read<int64_t>(), od.open_dataset(c).read<int64_t>()) << c;
}

TEST(ResultsUpgrade, Refusals) {
  TempDir dir("mtplab-upgrade-refusals");
  const std::string v2 = data("results-v2.h5"), out = dir / "v3.h5";
  ASSERT_NO_THROW(upgrade_results(v2, out, false, {}));
  // A version-3 input.
  expect_has(test::error_of([&] { upgrade_results(out, dir / "again.h5", false, {}); }),
             out + ": already results schema version 3; there is nothing to upgrade");
  EXPECT_FALSE(std::filesystem::exists(dir / "again.h5"));
  // An existing output: replaced only with --force.
  expect_has(test::error_of([&] { upgrade_results(v2, out, false, {}); }), "replaces it only with --force");
  EXPECT_NO_THROW(upgrade_results(v2, out, true, {}));
  // The input as the output, under another spelling.
  const std::string copy = dir / "copy.h5";
  std::filesystem::copy_file(v2, copy);
  expect_has(test::error_of([&] { upgrade_results(copy, dir / "./copy.h5", true, {}); }),
             "is also an input of mtplab upgrade");
  // No such file; not a results file.
  expect_has(test::error_of([&] { upgrade_results(dir / "none.h5", dir / "x.h5", false, {}); }),
             dir / "none.h5" + ": no such file");
  {
    io::H5File other = io::H5File::create(dir / "other.h5");
    other.set_attr("format", "mtplab-trace");
    other.commit();
  }
  expect_has(test::error_of([&] { upgrade_results(dir / "other.h5", dir / "x.h5", false, {}); }),
             dir / "other.h5" + ": not an mtplab results file");
  EXPECT_FALSE(std::filesystem::exists(dir / "x.h5"));
}

TEST(ResultsUpgrade, MergeTakesVersion3Only) {
  TempDir dir("mtplab-upgrade-merge");
  const std::string v2 = data("results-v2.h5"), v3 = dir / "v3.h5";
  const std::string msg = test::error_of([&] { merge_results(dir / "m.h5", {v2}, false, {}); });
  expect_has(msg, v2 + ": results schema version 2; mtplab merge reads version 3 only");
  expect_has(msg, "run `mtplab upgrade " + v2 + " NEW.h5`");
  EXPECT_FALSE(std::filesystem::exists(dir / "m.h5"));
  upgrade_results(v2, v3, false, {});
  EXPECT_EQ(merge_results(dir / "m.h5", {v3}, false, {}), 2);
}
