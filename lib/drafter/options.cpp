#include "drafter/options.hpp"

#include <cmath>

#include "core/error.hpp"

namespace mtplab::drafter {

const char* to_string(ContextRows v) { return kContextRowsNames[static_cast<int>(v)]; }
const char* to_string(Skip v) { return kSkipNames[static_cast<int>(v)]; }
const char* to_string(Exchange v) { return kExchangeNames[static_cast<int>(v)]; }
const char* to_string(DraftRows v) { return kDraftRowsNames[static_cast<int>(v)]; }
const char* to_string(ops::KvDtype v) { return kKvDtypeNames[static_cast<int>(v)]; }

void check_transform(const SamplingTransform& t) {
  MTP_REQUIRE(std::isfinite(t.temperature) && t.temperature > 0, "temperature: ", t.temperature,
              " must be finite and > 0 (greedy verification needs no transform)");
  MTP_REQUIRE(t.top_k >= 0, "top_k: ", t.top_k, " must be >= 0 (0: off)");
  MTP_REQUIRE(t.top_p > 0 && t.top_p <= 1, "top_p: ", t.top_p, " must be in (0, 1] (1: off)");
  // The ops read the parameters as fp32: a value that rounds out of its range is refused too.
  MTP_REQUIRE(static_cast<float>(t.temperature) > 0.0f && std::isfinite(static_cast<float>(t.temperature)),
              "temperature: ", t.temperature, " is outside the fp32 range the ops read it in");
  MTP_REQUIRE(static_cast<float>(t.top_p) > 0.0f, "top_p: ", t.top_p,
              " rounds to 0 in the fp32 the ops read it in");
}

void check_options(const DrafterOptions& o, const OptionsContext& ctx) {
  MTP_REQUIRE(ctx.world >= 1, "world size ", ctx.world, " must be >= 1");
  MTP_REQUIRE(o.draft_len >= 1, "draft_len: ", o.draft_len, " must be >= 1");
  const bool sharded = o.head_sharding == HeadSharding::vocab && ctx.world > 1;
  if (sharded && o.exchange == Exchange::bf16_lanes) {
    MTP_REQUIRE(
        ctx.world == 2,
        "exchange: bf16_lanes with head_sharding: vocab packs two ranks' values into 8 BF16 lanes and "
        "runs on exactly 2 ranks, not ",
        ctx.world, "; use packed_u64, allgather_pairs or allgather_logits");
    MTP_REQUIRE(ctx.vocab <= (int64_t{1} << 24),
                "exchange: bf16_lanes carries a token id in three base-256 digits (below 2^24); vocab is ",
                ctx.vocab);
    MTP_REQUIRE(
        !o.cuda_graph,
        "exchange: bf16_lanes synchronises with the host mid-step (it downloads each rank's (max, index) "
        "and uploads the packed lanes) and cannot be captured with cuda_graph: on; use cuda_graph: off, "
        "or exchange packed_u64, allgather_pairs or allgather_logits");
  }
  if (ctx.backend_graphs == 0)
    MTP_REQUIRE(
        !o.cuda_graph,
        "cuda_graph: on needs the cuda backend (one that records CUDA graphs); the cpu backend runs every "
        "op at once");
}

}  // namespace mtplab::drafter
