// What the results writer records for reading an acceptance figure, on hand-made point results
// with known answers: the accepted-length histogram, the bootstrap intervals, the teacher-forced
// per-depth accuracy, the draft statistics datasets and the /divergence near-tie counts (the flip
// is a step's first differing draft, judged by the reference's margin there).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/point_result.hpp"
#include "core/error.hpp"
#include "experiment_text.hpp"
#include "harness/experiment.hpp"
#include "harness/results.hpp"
#include "harness/uncertainty.hpp"
#include "io/hdf5.hpp"

using namespace mtplab;
using namespace mtplab::harness;

namespace {

const std::string kExperiment =
    test::tiny_experiment("sequences: 2, prompt_len: 8, new_tokens: 16, seed: 5, layers: 1", R"(output: out.h5
backend: cpu
draft_len: 3
sweep:
  grid:
    head_fp8: [off, on]
)");

struct Row {
  int32_t sequence, position;
  std::vector<int32_t> drafts, targets;
  std::vector<float> margins;  // empty: the point recorded none
};

// A PointResult of repeat-0 rows, each its own step, with zero timings.
PointResult result_of(const std::vector<Row>& rows, int k) {
  PointResult r;
  r.k = k;
  r.kernels = {"head_argmax_batch=cpu", "linear=cpu"};
  r.timing.assign(timing_columns().size(), {});
  for (const Row& row : rows) {
    r.repeat.push_back(0);
    r.sequence.push_back(row.sequence);
    r.position.push_back(row.position);
    int a = 0;
    while (a < k && row.drafts[static_cast<size_t>(a)] == row.targets[static_cast<size_t>(a)]) ++a;
    r.accepted.push_back(a);
    r.acceptance.add(k, a);
    r.expected_accepted.push_back(a);  // greedy verification: the expected length is the realised one
    for (int j = 0; j < k; ++j)
      r.accept_prob.push_back(
          row.drafts[static_cast<size_t>(j)] == row.targets[static_cast<size_t>(j)] ? 1.f : 0.f);
    test::add_step_bookkeeping(r, k, 8, 0.0);
    r.drafts.insert(r.drafts.end(), row.drafts.begin(), row.drafts.end());
    r.targets.insert(r.targets.end(), row.targets.begin(), row.targets.end());
    if (!row.margins.empty()) {
      r.draft_margin.insert(r.draft_margin.end(), row.margins.begin(), row.margins.end());
      for (int j = 0; j < k; ++j) r.draft_logprob.push_back(-0.5f);
    }
  }
  test::add_two_sequences(r, 8, 24, 0);
  return r;
}

struct File {
  std::string path;
  Experiment ex = parse_experiment(kExperiment, "exp.yaml", {}, 1);
  RunProvenance prov;
  explicit File(const std::string& name)
      : path(
            (std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()) + ".h5")).string()) {
    std::filesystem::remove(path);
    prov.backend = "cpu";
    prov.hosts = {"host"};
    prov.devices = {"cpu"};
    prepare_results_file(path, ex, prov);
  }
  ~File() { std::filesystem::remove(path); }
};

// The BF16 reference (point 0) and the FP8 point (1): three common steps.
//   step A: drafts differ at draft 1, where the reference's margin is 0 (an exact tie)
//   step B: the same first draft, then a flip at draft 2 where the reference's margin is one step
//   step C: identical drafts
// and a step D only the reference took.
const std::vector<Row> kReference = {
    {0, 8, {1, 2, 3}, {1, 2, 3}, {0.0f, 0.5f, 0.5f}},
    {0, 12, {4, 5, 6}, {4, 9, 9}, {1.0f, 0.0625f, 0.0f}},
    {1, 8, {7, 8, 9}, {0, 0, 0}, {0.25f, 0.25f, 0.25f}},
    {1, 9, {7, 8, 9}, {7, 0, 0}, {0.25f, 0.25f, 0.25f}},
};
const std::vector<Row> kFp8 = {
    {0, 8, {9, 2, 3}, {1, 2, 3}, {0.125f, 0.5f, 0.5f}},
    {0, 12, {4, 7, 6}, {4, 9, 9}, {1.0f, 0.0f, 0.0f}},
    {1, 8, {7, 8, 9}, {0, 0, 0}, {0.25f, 0.25f, 0.25f}},
};

}  // namespace

TEST(ResultsReading, DivergenceCountsFlipsAtNearTies) {
  File f("mtplab-reading-");
  append_point(f.path, f.ex, f.ex.points[0], result_of(kReference, 3), f.prov);
  append_point(f.path, f.ex, f.ex.points[1], result_of(kFp8, 3), f.prov);
  const io::H5File h = io::H5File::open_read(f.path);
  const std::vector<Divergence> d = compute_divergence(h);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].point, 1);
  EXPECT_EQ(d[0].reference, 0);
  EXPECT_EQ(d[0].common_steps, 3);
  EXPECT_EQ(d[0].differ_any, 2);
  EXPECT_EQ(d[0].differ_first, 1);
  EXPECT_EQ(d[0].differ_with_margin, 2);
  EXPECT_EQ(d[0].differ_near_tie, 1);  // step A (margin 0); step B's flip had one BF16 step
  // The stored table holds the same counts.
  const io::Group div = h.open_group("divergence");
  EXPECT_EQ(div.open_dataset("differ_near_tie").read<int64_t>(), (std::vector<int64_t>{1}));
  EXPECT_EQ(div.open_dataset("near_tie_rate").read<double>(), (std::vector<double>{0.5}));
}

TEST(ResultsReading, NoReferenceMarginsNoNearTieCount) {
  std::vector<Row> ref = kReference;
  for (Row& r : ref) r.margins.clear();
  File f("mtplab-reading-nomargin-");
  append_point(f.path, f.ex, f.ex.points[0], result_of(ref, 3), f.prov);
  append_point(f.path, f.ex, f.ex.points[1], result_of(kFp8, 3), f.prov);
  const io::H5File h = io::H5File::open_read(f.path);
  const std::vector<Divergence> d = compute_divergence(h);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].differ_any, 2);
  EXPECT_EQ(d[0].differ_with_margin, 0);
  EXPECT_EQ(d[0].differ_near_tie, 0);
  EXPECT_TRUE(std::isnan(h.open_group("divergence").open_dataset("near_tie_rate").read<double>()[0]));
  const io::Group p0 = h.open_group("points").open_group("p0000");
  EXPECT_FALSE(p0.exists("draft_margin"));
  EXPECT_TRUE(h.open_group("points").open_group("p0001").exists("draft_margin"));
}

TEST(ResultsReading, PointAttributesForReadingAcceptance) {
  File f("mtplab-reading-attrs-");
  append_point(f.path, f.ex, f.ex.points[0], result_of(kReference, 3), f.prov);
  const io::H5File h = io::H5File::open_read(f.path);
  const io::Group g = h.open_group("points").open_group("p0000");
  // Accepted: 3, 1, 0, 1.
  EXPECT_EQ(g.attr_ints("accepted_hist"), (std::vector<int64_t>{1, 2, 0, 1}));
  // Two sequences: (2 steps, 4 accepted) and (2 steps, 1 accepted). A resample draws both twice
  // (2 per step), both once (1.25) or the second twice (0.5): the interval spans [0.5, 2] of
  // accepted per step, every value a resample of these two.
  const std::vector<double> tau = g.attr_doubles("tau_ci");
  ASSERT_EQ(tau.size(), 2u);
  EXPECT_EQ(tau[0], 1.5);
  EXPECT_EQ(tau[1], 3.0);
  const std::vector<double> rate = g.attr_doubles("acceptance_rate_ci");
  EXPECT_DOUBLE_EQ(rate[0], 0.5 / 3);
  EXPECT_DOUBLE_EQ(rate[1], 2.0 / 3);
  EXPECT_EQ(g.attr_int("bootstrap_seed"), static_cast<int64_t>(acceptance_bootstrap_seed(0)));
  EXPECT_EQ(g.attr_int("bootstrap_resamples"), kBootstrapResamples);
  EXPECT_FALSE(g.has_attr("teacher_forced_rate"));  // a speculative point
  const io::Dataset m = g.open_dataset("draft_margin");
  EXPECT_EQ(m.dtype(), io::DType::f32);
  EXPECT_EQ(m.rows(), 4u);
  EXPECT_EQ(m.cols(), 3u);
  EXPECT_EQ(m.read<float>()[4], 0.0625f);
}

TEST(ResultsReading, TeacherForcedRatePerDepth) {
  File f("mtplab-reading-teacher-");
  f.ex = parse_experiment(kExperiment, "exp.yaml", {"replay=teacher_forced"}, 1);
  std::filesystem::remove(f.path);
  prepare_results_file(f.path, f.ex, f.prov);
  append_point(f.path, f.ex, f.ex.points[0], result_of(kReference, 3), f.prov);
  const io::H5File h = io::H5File::open_read(f.path);
  const io::Group g = h.open_group("points").open_group("p0000");
  // Depth hits over the 4 rows: depth 1: rows 0, 1, 3; depth 2: row 0; depth 3: row 0.
  EXPECT_EQ(g.attr_doubles("teacher_forced_rate"), (std::vector<double>{0.75, 0.25, 0.25}));
  const std::vector<double> lo = g.attr_doubles("teacher_forced_rate_ci_lo"),
                            hi = g.attr_doubles("teacher_forced_rate_ci_hi");
  ASSERT_EQ(lo.size(), 3u);
  // Sequence 0 hits depth 1 twice in 2 steps, sequence 1 once: resampled ratios 1, 0.75, 0.5.
  EXPECT_EQ(lo[0], 0.5);
  EXPECT_EQ(hi[0], 1.0);
  // Depths 2 and 3: only sequence 0 hits (once): 0.5, 0.25, 0.
  EXPECT_EQ(lo[1], 0.0);
  EXPECT_EQ(hi[1], 0.5);
}

// The point's `kernels`: each op once, in name order, as "op=kernels" where every rank ran the
// same; where the ranks differ, each rank's ("-" where a rank did not run the op). The writer
// refuses a point without a record.
TEST(ResultsReading, KernelRecordJoinsTheRanks) {
  const KernelRecordEntries same = {{"head_argmax_batch", "cublaslt"}, {"linear", "rows_gemv,cublaslt"}};
  EXPECT_EQ(kernel_record_entries({same}),
            (std::vector<std::string>{"head_argmax_batch=cublaslt", "linear=rows_gemv,cublaslt"}));
  EXPECT_EQ(kernel_record_entries({same, same}), kernel_record_entries({same}));
  const KernelRecordEntries other = {
      {"gemv_bf16", "rows4 split 1"}, {"head_argmax_batch", "mma"}, {"linear", "rows_gemv,cublaslt"}};
  EXPECT_EQ(kernel_record_entries({same, other}),
            (std::vector<std::string>{"gemv_bf16=rank 0: -; rank 1: rows4 split 1",
                                      "head_argmax_batch=rank 0: cublaslt; rank 1: mma",
                                      "linear=rows_gemv,cublaslt"}));
  EXPECT_TRUE(kernel_record_entries({{}, {}}).empty());

  File f("mtplab-kernels-");
  PointResult r = result_of(kReference, 3);
  append_point(f.path, f.ex, f.ex.points[0], r, f.prov);
  EXPECT_EQ(io::H5File::open_read(f.path).open_group("points").open_group("p0000").attr_strings("kernels"),
            r.kernels);
  r.kernels.clear();
  try {
    append_point(f.path, f.ex, f.ex.points[1], r, f.prov);
    ADD_FAILURE() << "a point without a kernel record was written";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("p0001: no kernel record"), std::string::npos) << e.message();
  }
}

// Synthetic weights make acceptance chance: the point says so (acceptance_meaningful 0 with the
// reason), the index carries the flag, and a checkpoint's weights are meaningful.
TEST(ResultsReading, SyntheticWeightsAcceptanceNotMeaningful) {
  File f("mtplab-reading-meaning-");
  append_point(f.path, f.ex, f.ex.points[0], result_of(kReference, 3), f.prov);
  const io::H5File h = io::H5File::open_read(f.path);
  const io::Group g = h.open_group("points").open_group("p0000");
  EXPECT_EQ(g.attr_int("acceptance_meaningful"), 0);
  EXPECT_NE(g.attr_string("acceptance_note").find("synthetic weights (seed 3)"), std::string::npos)
      << g.attr_string("acceptance_note");
  EXPECT_EQ(h.open_group("index").open_dataset("acceptance_meaningful").read<int64_t>(),
            (std::vector<int64_t>{0}));
  // The figures are still written: they show that replay ran.
  EXPECT_DOUBLE_EQ(g.attr_double("tau"), 1 + 5.0 / 4);

  WeightsSpec ckpt;
  ckpt.synthetic = false;
  ckpt.checkpoint = "data/trained-tiny/model.safetensors";
  EXPECT_TRUE(acceptance_meaning(ckpt).meaningful);
  EXPECT_EQ(acceptance_meaning(ckpt).reason, "");
  // From a point's config (files written before the attribute): the same verdicts.
  EXPECT_TRUE(acceptance_meaning_of_config("weights:\n  checkpoint: a.safetensors\n", "p").meaningful);
  const AcceptanceMeaning syn = acceptance_meaning_of_config("weights:\n  synthetic:\n    seed: 7\n", "p");
  EXPECT_FALSE(syn.meaningful);
  EXPECT_NE(syn.reason.find("seed 7"), std::string::npos) << syn.reason;
  try {
    acceptance_meaning_of_config("model: tiny\n", "f.h5: /points/p0002");
    FAIL() << "a config without weights was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f.h5: /points/p0002: the point's config names no weights"),
              std::string::npos)
        << e.what();
  }
}
