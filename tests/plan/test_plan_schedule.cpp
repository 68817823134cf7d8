// Engine schedules (plan/schedule.hpp): the ranges a plan's best k per batch size becomes, and each
// engine's syntax read back, batch size by batch size, by a reader of that engine's rules.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "plan/schedule.hpp"

using namespace mtplab;
using namespace mtplab::plan;
using mtplab::test::error_of;
using mtplab::test::expect_has;

TEST(PlanSchedule, RangesTakeTheNextPlannedSizeAbove) {
  const std::vector<ScheduleEntry> e = {{1, 3}, {2, 3}, {4, 2}, {8, 2}, {16, 1}, {32, 0}};
  const std::vector<BatchRange> r = schedule_ranges(e, 64);
  EXPECT_EQ(r, (std::vector<BatchRange>{{1, 2, 3}, {3, 8, 2}, {9, 16, 1}, {17, 64, 0}}));
  EXPECT_EQ(range_k(r, 3), 2);
  EXPECT_EQ(range_k(r, 16), 1);
  EXPECT_EQ(range_k(r, 65), 0);
  // A first planned size above 1 covers 1 .. b_1 too; the tail above b_n is off.
  EXPECT_EQ(schedule_ranges({{4, 2}, {8, 1}}, 8), (std::vector<BatchRange>{{1, 4, 2}, {5, 8, 1}}));
  EXPECT_EQ(schedule_ranges({{4, 2}, {8, 1}}, 10),
            (std::vector<BatchRange>{{1, 4, 2}, {5, 8, 1}, {9, 10, 0}}));
  expect_has(error_of([] { schedule_ranges({{4, 2}, {4, 1}}, 8); }), "not increasing");
}

TEST(PlanSchedule, EverySyntaxReadsBackAtEveryBatchSize) {
  const std::vector<std::vector<ScheduleEntry>> cases = {
      {{1, 3}, {2, 3}, {4, 2}, {8, 2}, {16, 1}, {32, 0}, {64, 0}, {128, 0}},  // off at the top
      {{1, 1}, {2, 3}, {4, 1}, {64, 3}, {128, 2}},                            // up and down
      {{1, 4}, {16, 0}, {32, 1}},                                             // off in the middle
      {{8, 2}},                                                               // one size
      {{1, 0}, {8, 0}},                                                       // MTP off everywhere
  };
  const int max_batch = 256;
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<BatchRange> ranges = schedule_ranges(cases[c], max_batch);
    const std::string v = vllm_schedule_json(cases[c], max_batch);
    const std::string t = trtllm_schedule_yaml(cases[c]);
    const std::string s = sglang_flags_json(cases[c], max_batch);
    const std::vector<int> vk = vllm_k_per_batch(v, "vllm.json", max_batch);
    const std::vector<int> tk = trtllm_k_per_batch(t, "trtllm.yaml", max_batch);
    const std::vector<int> sk = sglang_k_per_batch(s, "sglang.json", max_batch);
    for (int B = 1; B <= max_batch; ++B) {
      const int want = range_k(ranges, B);
      EXPECT_EQ(vk[static_cast<size_t>(B)], want) << "vLLM, case " << c << ", B " << B << "\n" << v;
      EXPECT_EQ(tk[static_cast<size_t>(B)], want) << "TensorRT-LLM, case " << c << ", B " << B << "\n" << t;
      EXPECT_EQ(sk[static_cast<size_t>(B)], want) << "SGLang, case " << c << ", B " << B << "\n" << s;
    }
  }
}

TEST(PlanSchedule, TheSyntaxesAsEachEngineWritesThem) {
  const std::vector<ScheduleEntry> e = {{1, 3}, {16, 3}, {128, 2}};
  EXPECT_EQ(vllm_schedule_json(e, 4096),
            "{\n  \"num_speculative_tokens\": 3,\n  \"num_speculative_tokens_per_batch_size\": {\n    "
            "\"1-16\": 3,\n"
            "    \"17-128\": 2,\n    \"129-4096\": 0\n  }\n}\n");
  EXPECT_EQ(trtllm_schedule_yaml(e),
            "speculative_config:\n  max_draft_len: 3\n  draft_len_schedule:\n    16: 3\n    128: 2\n");
  EXPECT_EQ(sglang_flags(3),
            "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4");
  EXPECT_EQ(sglang_flags(0), "");
  EXPECT_EQ(vllm_schedule_json({{1, 0}}, 8), "null\n");
  EXPECT_EQ(trtllm_schedule_yaml({{1, 0}}), "speculative_config: null\n");
}

TEST(PlanSchedule, ReadersFollowTheEngineRules) {
  // vLLM: a gap inherits the range before it; k is clamped to num_speculative_tokens.
  const std::vector<int> v = vllm_k_per_batch(
      R"({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": {"1-4": 3, "9-16": 1}})",
      "v.json", 20);
  EXPECT_EQ(v[1], 2);  // 3 clamped to 2
  EXPECT_EQ(v[6], 2);  // the gap 5-8 takes 1-4's k
  EXPECT_EQ(v[12], 1);
  EXPECT_EQ(v[20], 1);  // after the last range: its k
  expect_has(
      error_of([] {
        vllm_k_per_batch(
            R"({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": {"1-8": 2, "4-9": 1}})",
            "v.json", 10);
      }),
      "v.json: ranges 1-8 and 4-9 overlap");
  expect_has(error_of([] {
               vllm_k_per_batch(
                   R"({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": {"8": 2}})",
                   "v.json", 10);
             }),
             "range \"8\" is not \"lo-hi\"");
  // TensorRT-LLM: the smallest key at or above B; above the largest, 0.
  const std::vector<int> t = trtllm_k_per_batch(
      "speculative_config:\n  max_draft_len: 4\n  draft_len_schedule: {4: 4, 8: 2, 32: 1}\n", "t.yaml", 40);
  EXPECT_EQ(t[1], 4);
  EXPECT_EQ(t[5], 2);
  EXPECT_EQ(t[32], 1);
  EXPECT_EQ(t[33], 0);
  expect_has(error_of([] {
               trtllm_k_per_batch("speculative_config:\n  max_draft_len: 2\n  draft_len_schedule: {4: 3}\n",
                                  "t.yaml", 4);
             }),
             "t.yaml");
  // SGLang: flags that do not match k are refused.
  expect_has(error_of([] {
               sglang_k_per_batch(
                   R"({"ranges": [{"lo": 1, "hi": 4, "k": 2, "flags": "--speculative-num-steps 3"}]})",
                   "s.json", 4);
             }),
             "s.json: ranges[0].flags: \"--speculative-num-steps 3\" is not the launch flags of k = 2");
}
