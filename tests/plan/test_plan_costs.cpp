// The planner's cost side: benchmark CSVs read with their provenance, errors that name the file,
// the line and the column, and the terms of a step's time (plan/bench_csv.hpp, plan/costs.hpp).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "plan/bench_csv.hpp"
#include "plan/costs.hpp"

using namespace mtplab;
using namespace mtplab::plan;
using mtplab::test::error_of;
using mtplab::test::expect_has;

namespace {

const char* kStepHeader =
    "head,cuda_graph,index_share,context,k,B,reps,median_us,p10_us,p90_us,per_seq_us,distinct_experts,floor_"
    "bytes,"
    "floor_us,x_floor,launches_per_draft\n";
const char* kVerifyHeader =
    "part,head,B,R,rows,reps,median_us,p10_us,p90_us,distinct_experts,selected_rows_per_seq,floor_bytes,"
    "floor_us,"
    "x_floor,tensor_us,x_roofline\n";

std::string write(const test::TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir / name;
  std::ofstream(path) << text;
  return path;
}

std::string step_csv(const std::string& git = "abc1234", const std::string& device = "NVIDIA H200") {
  return str(
      "# mtplab_bench_step --batch git ", git, " device ", device,
      " preset glm5.3-flash contexts 4096 copy_GBps 4216 router_bias_scale 1 kernel_policy gemv_variant=auto "
      "gemv_split=auto\n",
      kStepHeader,
      "bf16,on,off,4096,1,1,20,500,490,510,500,8,,,,\n"
      "bf16,on,off,4096,1,8,20,1000,980,1020,125,55,,,,\n"
      "bf16,on,off,4096,2,8,20,1900,1880,1920,237.5,55,,,,\n"
      "fp8,on,off,4096,1,1,20,400,390,410,400,8,,,,\n"
      "bf16,off,off,4096,1,1,20,520,510,530,520,8,,,,\n");
}

std::string verify_csv(const std::string& git = "abc1234", const std::string& extra = "") {
  return str("# mtplab_bench_verify git ", git,
             " device NVIDIA H200 preset glm5.3-flash context 4096 copy_GBps 4206 gemm_TFLOPs 885\n"
             "# a note line\n",
             kVerifyHeader,
             "layer,,1,1,1,20,200,190,210,8,,,,,,\n"
             "layer,,1,2,2,20,300,290,310,16,,,,,,\n"
             "layer,,8,1,8,20,800,780,820,53,,,,,,\n"
             "layer,,8,2,16,20,1400,1380,1420,93,,,,,,\n"
             "layer,,8,3,24,20,1800,1780,1820,118,,,,,,\n"
             "head,bf16,,,1,20,350,,,,,,,,,\n"
             "head,bf16,,,2,20,300,,,,,,,,,\n"
             "head,bf16,,,8,20,305,,,,,,,,,\n"
             "head,bf16,,,16,20,310,,,,,,,,,\n"
             "head,bf16,,,24,20,314,,,,,,,,,\n"
             "head,fp8,,,1,20,150,,,,,,,,,\n",
             extra);
}

ModelShape shape(int layers, int dense = 0) {
  ModelShape m;
  m.name = "glm5.3-flash";
  m.layers = layers;
  m.dense_layers = dense;
  return m;
}

}  // namespace

TEST(PlanCosts, CommentLineGivesTheProvenance) {
  const auto p = parse_bench_comment(
      "# mtplab_bench_verify git 85f3590-dirty device NVIDIA H100 80GB HBM3 preset glm5.3-flash context 4096 "
      "copy_GBps 3030 gemm_TFLOPs 700 router_bias_scale 1 kernel_policy gemv_variant=auto gemv_split=4");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->tool, "mtplab_bench_verify");
  EXPECT_EQ(p->git, "85f3590-dirty");
  EXPECT_EQ(p->device, "NVIDIA H100 80GB HBM3");  // spaces and all, up to the next key
  EXPECT_EQ(p->preset, "glm5.3-flash");
  EXPECT_EQ(p->context, "4096");
  const auto s =
      parse_bench_comment("# mtplab_bench_step --batch git abc device cpu preset tiny contexts 64,128");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->tool, "mtplab_bench_step --batch");
  EXPECT_EQ(s->context, "64,128");
  EXPECT_FALSE(parse_bench_comment("head,B,k").has_value());
}

TEST(PlanCosts, BadFilesAreErrorsNamingFileLineAndColumn) {
  expect_has(error_of([] { BenchCsv::parse("head,B\n1,2\n", "x.csv"); }), "x.csv:1: not a benchmark CSV");
  expect_has(error_of([] { BenchCsv::parse("# mtplab_bench_step git a device d\nB,k\n1\n", "x.csv"); }),
             "x.csv:3: 1 fields for the header's 2 columns");
  const BenchCsv c =
      BenchCsv::parse("# mtplab_bench_step git a device d\nB,k,median_us\n1,2,fast\n", "y.csv");
  expect_has(error_of([&] { c.number(c.rows()[0], "median_us"); }),
             "y.csv:3: column median_us: \"fast\" is not a number");
  expect_has(error_of([&] { c.number(c.rows()[0], "p90_us"); }), "y.csv: no column \"p90_us\"");
  expect_has(error_of([] { BenchCsv::read("/nonexistent/z.csv"); }), "/nonexistent/z.csv: cannot read");
}

TEST(PlanCosts, StepTermsSumTheMeasuredPoints) {
  test::TempDir dir("mtplab-plan-costs");
  CostOptions o;
  o.step_files = {write(dir, "step.csv", step_csv())};
  o.verify_files = {write(dir, "verify.csv", verify_csv())};
  o.step_select = {{"cuda_graph", "on"}};
  o.fixed_us = 50;
  const CostBook b = CostBook::load(o);
  auto total = [&](int B, int k, const ModelShape& m) {
    double t = 0;
    for (const CostTerm& term : b.step_terms(B, k, m))
      t += term.times * b.points()[static_cast<size_t>(term.point)].median_us;
    return t;
  };
  // k = 0: 10 layers at R = 1, the head over B rows, c.
  EXPECT_DOUBLE_EQ(total(8, 0, shape(10)), 10 * 800 + 305 + 50);
  // k = 2 at B = 8: the measured draft(8, 2), 10 layers at R = 3, the head over 24 rows.
  EXPECT_DOUBLE_EQ(total(8, 2, shape(10)), 1900 + 10 * 1800 + 314 + 50);
  EXPECT_TRUE(b.draft_measured(8, 2));
  // k = 1 at B = 1 with the cuda_graph on row (500), not the off row (520).
  EXPECT_DOUBLE_EQ(total(1, 1, shape(4)), 500 + 4 * 300 + 300 + 50);
  EXPECT_EQ(b.batches(), (std::vector<int>{1, 8}));
  const CostPoint& layer = b.points()[static_cast<size_t>(b.step_terms(1, 1, shape(4))[1].point)];
  EXPECT_EQ(layer.label, "layer(B=1, R=2)");
  EXPECT_DOUBLE_EQ(layer.sigma_us(), 20 / 2.563);
  const CostPoint& head = b.points()[static_cast<size_t>(b.step_terms(1, 1, shape(4))[2].point)];
  EXPECT_FALSE(head.has_spread());
  EXPECT_EQ(head.sigma_us(), 0);
  expect_has(head.where, "verify.csv:10");
}

TEST(PlanCosts, DraftWithoutItsRowIsKTimesTheFirst) {
  test::TempDir dir("mtplab-plan-costs");
  CostOptions o;
  o.step_files = {write(dir, "step.csv", step_csv())};
  o.verify_files = {
      write(dir, "verify.csv",
            verify_csv("abc1234", "layer,,1,3,3,20,400,390,410,24,,,,,,\nhead,bf16,,,3,20,301,,,,,,,,,\n"))};
  o.step_select = {{"cuda_graph", "on"}};
  const CostBook b = CostBook::load(o);
  const std::vector<CostTerm> t = b.step_terms(1, 2, shape(1));
  ASSERT_EQ(t[0].part, "draft");
  EXPECT_EQ(t[0].times, 2);  // 2 x draft(1, 1): the file has no row at (1, 2)
  EXPECT_EQ(b.points()[static_cast<size_t>(t[0].point)].median_us, 500);
  EXPECT_FALSE(b.draft_measured(1, 2));
  EXPECT_EQ(t.back().part, "fixed");  // c not given: 0
  EXPECT_EQ(b.points()[static_cast<size_t>(t.back().point)].median_us, 0);
  expect_has(b.fixed_origin(), "not given");
}

TEST(PlanCosts, MissingPointsNameTheFilesAndTheKey) {
  test::TempDir dir("mtplab-plan-costs");
  CostOptions o;
  o.step_files = {write(dir, "step.csv", step_csv())};
  o.verify_files = {write(dir, "verify.csv", verify_csv())};
  o.step_select = {{"cuda_graph", "on"}};
  const CostBook b = CostBook::load(o);
  const std::string e = error_of([&] { b.step_terms(8, 3, shape(10)); });
  expect_has(e, "costs.verify (");
  expect_has(e, "verify.csv): no layer row at (B = 8, R = 4) (needed for k = 3 at B = 8)");
  expect_has(error_of([&] { b.step_terms(2, 0, shape(10)); }), "no layer row at (B = 2, R = 1)");
  expect_has(error_of([&] { b.step_terms(4, 1, shape(10)); }), "no draft step row at (B = 4, k = 1)");
  // Dense-MLP layers need their own rows, or the explicit choice to count them as MoE layers.
  expect_has(error_of([&] { b.step_terms(8, 1, shape(10, 3)); }),
             "the model's first 3 layer(s) have a dense MLP and no dense_layer row is at (B = 8, R = 2)");
  o.dense_as_moe = true;
  const CostBook as_moe = CostBook::load(o);
  double t = 0;
  for (const CostTerm& term : as_moe.step_terms(8, 1, shape(10, 3)))
    t += term.times * as_moe.points()[static_cast<size_t>(term.point)].median_us;
  EXPECT_DOUBLE_EQ(t, 1000 + 7 * 1400 + 3 * 1400 + 310);
  EXPECT_FALSE(b.covers(8, 3, shape(10)));
  EXPECT_TRUE(b.covers(8, 2, shape(10)));
}

TEST(PlanCosts, AmbiguousRowsAreRefusedNamingBoth) {
  test::TempDir dir("mtplab-plan-costs");
  CostOptions o;
  o.step_files = {write(dir, "step.csv", step_csv())};
  o.verify_files = {write(dir, "verify.csv", verify_csv())};
  // Without step_select the graph-on and graph-off rows at (1, 1) both match.
  const std::string e = error_of([&] { CostBook::load(o); });
  expect_has(e, "costs.step: two rows for the draft step at (B = 1, k = 1)");
  expect_has(e, "step.csv:3 and ");
  expect_has(e, "step.csv:7");
  expect_has(e, "cuda_graph (on vs off)");
  o.step_select = {{"graph", "on"}};
  expect_has(error_of([&] { CostBook::load(o); }), "costs.step_select: ");
  expect_has(error_of([&] { CostBook::load(o); }), "has no column \"graph\"");
  // The same layer point in two verify files.
  o.step_select = {{"cuda_graph", "on"}};
  o.verify_files.push_back(write(dir, "verify2.csv", verify_csv("def5678")));
  expect_has(error_of([&] { CostBook::load(o); }), "costs.verify: two rows for layer(B=1, R=1)");
  // The fixed cost given twice.
  o.verify_files = {write(dir, "verify.csv", verify_csv("abc1234", "fixed,,8,,,20,40,38,42,,,,,,,\n"))};
  o.fixed_us = 10;
  expect_has(error_of([&] { CostBook::load(o); }), "give the fixed cost one way");
}

TEST(PlanCosts, DisagreeingInputsAreNamed) {
  test::TempDir dir("mtplab-plan-costs");
  CostOptions o;
  o.step_files = {write(dir, "step.csv", step_csv("1111111", "NVIDIA H100 80GB HBM3"))};
  o.verify_files = {write(dir, "verify.csv", verify_csv("2222222"))};
  o.step_select = {{"cuda_graph", "on"}};
  const CostBook b = CostBook::load(o);
  const std::vector<std::string> d = b.disagreements(shape(10));
  ASSERT_EQ(d.size(), 2u) << join(d, "\n");
  expect_has(d[0], "the cost files disagree on the GPU: NVIDIA H100 80GB HBM3 (");
  expect_has(d[0], "vs NVIDIA H200 (");
  expect_has(d[1], "the cost files disagree on the git commit: 1111111");
  ModelShape other = shape(10);
  other.name = "small";
  expect_has(b.disagreements(other).back(),
             "the plan's model is small but the cost files ran at preset glm5.3-flash");
  // Files that agree: nothing to say.
  o.step_files = {write(dir, "step2.csv", step_csv("2222222"))};
  EXPECT_TRUE(CostBook::load(o).disagreements(shape(10)).empty());
  // The inputs name each file with its provenance and the rows it gave.
  const std::vector<std::string> in = b.inputs();
  expect_has(in[0], "step.csv: mtplab_bench_step --batch, git 1111111, device NVIDIA H100 80GB HBM3");
  expect_has(in[0], "3 of 5 row(s) used");
  expect_has(in[1], "(a note line)");
}
