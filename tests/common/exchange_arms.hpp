// The arms the multi-rank drafter tests run against their reference arm: every head sharding,
// exchange protocol and context-rows policy.
#pragma once
#include <string>
#include <vector>

#include "core/str.hpp"
#include "drafter/options.hpp"
#include "model/sharding.hpp"

namespace mtplab::test {

struct ExchangeArm {
  drafter::DrafterOptions opt;
  std::string name;  ///< "head_sharding/exchange/context_rows"
};

/// `base` with every (head_sharding, exchange, context_rows), in that nesting order.
inline std::vector<ExchangeArm> exchange_arms(const drafter::DrafterOptions& base) {
  std::vector<ExchangeArm> out;
  for (auto hs : {model::HeadSharding::none, model::HeadSharding::vocab})
    for (auto ex : {drafter::Exchange::packed_u64, drafter::Exchange::allgather_pairs,
                    drafter::Exchange::allgather_logits, drafter::Exchange::bf16_lanes})
      for (auto cr : {drafter::ContextRows::cache_only, drafter::ContextRows::full}) {
        drafter::DrafterOptions opt = base;
        opt.head_sharding = hs;
        opt.exchange = ex;
        opt.context_rows = cr;
        out.push_back(
            {opt, str(model::to_string(hs), "/", drafter::to_string(ex), "/", drafter::to_string(cr))});
      }
  return out;
}

}  // namespace mtplab::test
