// The one-rank CPU drafter that the drafter and replay tests build: the tiny preset with a short
// context, unsharded synthetic MTP weights (seed 11), and traces from the synthetic target.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "common/trace.hpp"
#include "drafter/factory.hpp"
#include "model/weights.hpp"

namespace mtplab::test {

/// A named arm of the drafter tests: the options and the latent cache's dtype.
struct DrafterArm {
  const char* name;
  drafter::DrafterOptions opt;
  ops::KvDtype kv = ops::KvDtype::bf16;
};

struct TinyCpuDrafter {
  model::ModelConfig cfg = tiny_config();
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  model::ShardPlan plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  model::MtpWeights w = model::synthesize_mtp_weights(cfg, plan, 11);
  /// A drafter of `opt` with `draft_len` drafts per propose and its latent cache in `kv`.
  std::unique_ptr<drafter::MtpDrafter> make_with(drafter::DrafterOptions opt, int draft_len,
                                                 ops::KvDtype kv = ops::KvDtype::bf16) {
    opt.draft_len = draft_len;
    opt.kv_cache_dtype = kv;
    return drafter::make_drafter(*be, nullptr, cfg, w, opt);
  }
};

/// TinyCpuDrafter whose drafters draft `K` tokens per propose.
template <int K>
struct TinyCpuDrafterOf : TinyCpuDrafter {
  std::unique_ptr<drafter::MtpDrafter> make(drafter::DrafterOptions opt = {},
                                            ops::KvDtype kv = ops::KvDtype::bf16) {
    return make_with(opt, K, kv);
  }
};

/// make_trace on the tiny preset (256 rows of context) and a CPU backend.
inline std::vector<io::TraceSequence> tiny_trace(int count, int prompt, int gen, uint64_t seed) {
  const std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  return make_trace(*be, tiny_config(), count, prompt, gen, seed);
}

/// tiny_trace made once per program and arguments, for the tests that share one trace.
inline const std::vector<io::TraceSequence>& shared_tiny_trace(int count, int prompt, int gen,
                                                               uint64_t seed) {
  static std::map<std::tuple<int, int, int, uint64_t>, std::vector<io::TraceSequence>> made;
  const auto key = std::make_tuple(count, prompt, gen, seed);
  auto it = made.find(key);
  if (it == made.end()) it = made.emplace(key, tiny_trace(count, prompt, gen, seed)).first;
  return it->second;
}

}  // namespace mtplab::test
