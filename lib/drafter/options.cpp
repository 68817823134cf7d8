#include "drafter/options.hpp"

#include <cmath>

#include "core/error.hpp"

namespace mtplab::drafter {

const char* to_string(ContextRows v) { return kContextRowsNames[static_cast<int>(v)]; }
const char* to_string(Skip v) { return kSkipNames[static_cast<int>(v)]; }
const char* to_string(Exchange v) { return kExchangeNames[static_cast<int>(v)]; }
const char* to_string(DraftRows v) { return kDraftRowsNames[static_cast<int>(v)]; }
const char* to_string(ops::KvDtype v) { return kKvDtypeNames[static_cast<int>(v)]; }

const std::vector<Setting<DrafterOptions>>& drafter_settings() {
  using O = DrafterOptions;
  static const std::vector<Setting<O>> table = [] {
    std::vector<Setting<O>> r;
    r.push_back(choice_setting("head_sharding", &O::head_sharding, model::kHeadShardingNames,
                               "the lm_head replicated (none) or its vocab rows split over the ranks"));
    r.push_back(bool_setting("head_fp8", &O::head_fp8, "the draft head sweeps an E4M3 copy with row scales"));
    r.push_back(choice_setting("context_rows", &O::context_rows, kContextRowsNames,
                               "prefill / catch-up rows write only the caches, or run the full block"));
    r.push_back(choice_setting("skip", &O::skip, kSkipNames,
                               "timing arms: stop after the block (head), or run only the head (block)"));
    r.push_back(int_setting("draft_len", &O::draft_len, 1, 16, "k, the drafts of each propose"));
    r.push_back(choice_setting("exchange", &O::exchange, kExchangeNames,
                               "the cross-rank pick of the draft token of a vocab-sharded head"));
    r.push_back(choice_setting(
        "draft_rows", &O::draft_rows, kDraftRowsNames,
        "after verification, rewrite the drafted rows from the true hiddens, or keep the accepted ones"));
    r.push_back(bool_setting("batch_qidx", &O::batch_qidx,
                             "context rows' indexer queries as one batched linear (context_rows full)"));
    r.push_back(bool_setting("cuda_graph", &O::cuda_graph, "record each propose as one CUDA graph"));
    r.push_back(choice_setting("kv_cache_dtype", &O::kv_cache_dtype, kKvDtypeNames,
                               "the latent KV cache in BF16 or FP8 E4M3"));
    r.push_back(bool_setting("context_gemm", &O::context_gemm,
                             "context rows' projections as one batched linear per chunk"));
    r.push_back(bool_setting("index_share", &O::index_share,
                             "drafts 2..k of a propose reuse draft 1's indexer pool selection"));
    check_settings(r, "drafter options");
    return r;
  }();
  return table;
}

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
