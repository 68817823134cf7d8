#include "drafter/options.hpp"

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
constexpr const char* kContextRows[] = {"cache_only", "full"};
constexpr const char* kSkip[] = {"none", "head", "block"};
constexpr const char* kExchange[] = {"bf16_lanes", "packed_u64", "allgather_pairs", "allgather_logits"};
constexpr const char* kDraftRows[] = {"rewrite", "keep"};
}  // namespace

const char* to_string(ContextRows v) { return kContextRows[static_cast<int>(v)]; }
const char* to_string(Skip v) { return kSkip[static_cast<int>(v)]; }
const char* to_string(Exchange v) { return kExchange[static_cast<int>(v)]; }
const char* to_string(DraftRows v) { return kDraftRows[static_cast<int>(v)]; }
ContextRows parse_context_rows(const std::string& s) { return parse<ContextRows>("context_rows", s, kContextRows); }
Skip parse_skip(const std::string& s) { return parse<Skip>("skip", s, kSkip); }
Exchange parse_exchange(const std::string& s) { return parse<Exchange>("exchange", s, kExchange); }
DraftRows parse_draft_rows(const std::string& s) { return parse<DraftRows>("draft_rows", s, kDraftRows); }

}  // namespace mtplab::drafter
