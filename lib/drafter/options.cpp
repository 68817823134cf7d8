#include "drafter/options.hpp"

#include <cmath>

#include "core/error.hpp"

namespace mtplab::drafter {
namespace {
template <typename E, size_t N>
E parse(const char* key, const std::string& s, const char* const (&names)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<E>(i);
  std::vector<std::string> list(names, names + N);
  MTP_FAIL(key, ": \"", s, "\" is not one of {", join(list, ", "), "}");
}
}  // namespace

const char* to_string(ContextRows v) { return kContextRowsNames[static_cast<int>(v)]; }
const char* to_string(Skip v) { return kSkipNames[static_cast<int>(v)]; }
const char* to_string(Exchange v) { return kExchangeNames[static_cast<int>(v)]; }
const char* to_string(DraftRows v) { return kDraftRowsNames[static_cast<int>(v)]; }
const char* to_string(ops::KvDtype v) { return kKvDtypeNames[static_cast<int>(v)]; }
ContextRows parse_context_rows(const std::string& s) {
  return parse<ContextRows>("context_rows", s, kContextRowsNames);
}
Skip parse_skip(const std::string& s) { return parse<Skip>("skip", s, kSkipNames); }
Exchange parse_exchange(const std::string& s) { return parse<Exchange>("exchange", s, kExchangeNames); }
DraftRows parse_draft_rows(const std::string& s) {
  return parse<DraftRows>("draft_rows", s, kDraftRowsNames);
}
ops::KvDtype parse_kv_dtype(const std::string& s) {
  return parse<ops::KvDtype>("kv_cache_dtype", s, kKvDtypeNames);
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
