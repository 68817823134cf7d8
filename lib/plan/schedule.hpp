// The draft length per batch size that a plan chose, in the syntax each serving engine reads
// (docs/planning.md, "Engine schedules"), and readers of those syntaxes for the round trip.
//
// A plan knows the best k at its batch sizes b_1 < ... < b_n only. Between them the schedule takes
// the k of the next planned size above (B in (b_{i-1}, b_i] runs k(b_i); B <= b_1 runs k(b_1)):
// past the optimum a larger k costs more as B grows, so the upper end's k is the cautious one. Above
// b_n speculation is off (k = 0): nothing was planned there.
//
// - vLLM, speculative_config: `num_speculative_tokens` (the largest k) and
//   `num_speculative_tokens_per_batch_size`, an object of inclusive ranges "lo-hi" -> k; a
//   batch size in a gap between ranges takes the k of the range before it; the k is clamped to
//   num_speculative_tokens. The ranges here cover 1 .. max_batch without gaps, the last one
//   (b_n + 1 .. max_batch) at 0 when max_batch > b_n. MTP off at every size: `null`.
// - TensorRT-LLM, speculative_config (YAML, as --extra_llm_api_options reads it): `max_draft_len`
//   and `draft_len_schedule` {batch upper bound: draft length}: B up to the smallest key above or
//   equal to it takes that key's length, above the largest key 0. MTP off at every size: `null`.
// - SGLang reads no per-batch schedule: per concurrency range, the launch flags of a server for that
//   range (`--speculative-algorithm NEXTN --speculative-num-steps K --speculative-eagle-topk 1
//   --speculative-num-draft-tokens K+1`; none at K = 0), as JSON.
#pragma once
#include <string>
#include <vector>

namespace mtplab::plan {

/// The best k at one planned batch size.
struct ScheduleEntry {
  int batch = 0;
  int k = 0;
  friend bool operator==(const ScheduleEntry&, const ScheduleEntry&) = default;
};

/// An inclusive range of batch sizes and its k.
struct BatchRange {
  int lo = 0, hi = 0, k = 0;
  friend bool operator==(const BatchRange&, const BatchRange&) = default;
};

/// The ranges of a schedule (entries sorted by batch, each batch once, k >= 0): (b_{i-1}, b_i] ->
/// k(b_i) from 1, adjacent ranges of equal k merged; then b_n + 1 .. max_batch -> 0 when
/// max_batch > b_n.
std::vector<BatchRange> schedule_ranges(const std::vector<ScheduleEntry>& entries, int max_batch);
/// The k a list of ranges gives batch size B (0 outside every range).
int range_k(const std::vector<BatchRange>& ranges, int B);

/// vLLM's speculative_config keys, as JSON (one object, or `null`).
std::string vllm_schedule_json(const std::vector<ScheduleEntry>& entries, int max_batch);
/// The k vLLM runs at each batch size 1..up_to under a speculative_config as JSON text (the
/// rules above: ranges, gaps, the clamp); errors name `name` and the key.
std::vector<int> vllm_k_per_batch(const std::string& text, const std::string& name, int up_to);

/// TensorRT-LLM's speculative_config keys, as YAML.
std::string trtllm_schedule_yaml(const std::vector<ScheduleEntry>& entries);
std::vector<int> trtllm_k_per_batch(const std::string& text, const std::string& name, int up_to);

/// SGLang's launch flags per concurrency range, as JSON.
std::string sglang_flags_json(const std::vector<ScheduleEntry>& entries, int max_batch);
/// The flags for one k ("" at k = 0).
std::string sglang_flags(int k);
std::vector<int> sglang_k_per_batch(const std::string& text, const std::string& name, int up_to);

}  // namespace mtplab::plan
