// The cross-rank pick of the draft token when the lm_head is vocab-sharded: the four protocols of
// docs/drafter.md, written once and used by MtpDrafter::head_pick and by mtplab_bench_exchange
// (so the benchmark times exactly what the drafter runs).
//
// Invariants: every protocol returns the largest BF16 logit's lowest global token id, identically
// on every rank; only bf16_lanes synchronises with the host (it cannot be captured in a graph).
#pragma once
#include <cstdint>

#include "dist/communicator.hpp"
#include "drafter/options.hpp"
#include "ops/ops.hpp"

namespace mtplab::drafter {

/// The protocol's buffers, in backend memory.
struct ExchangeBuffers {
  /// `stride`: the largest shard's row count; the logit buffers exist only when with_logits.
  ExchangeBuffers(ops::Backend& be, int world, int64_t stride, bool with_logits);
  ops::Array<ops::ArgMax> local_max;     ///< [1]: this rank's (max, global index), input
  ops::Array<ops::ArgMax> gathered_max;  ///< [world]
  ops::Array<uint64_t> key;              ///< [1]
  ops::Array<bf16> lanes;                ///< [8]
  ops::Array<bf16> logits;               ///< [stride]: this rank's logits, -inf past its shard (input)
  ops::Array<bf16> gathered_logits;      ///< [world * stride]
  int64_t stride = 0;
};

/// Writes the global draft token to `token_out` (backend memory) from every rank's local_max
/// (and, for allgather_logits, logits). Collective over `comm`. bf16_lanes needs world 2.
/// `key_from_head`: packed_u64 only: buf.key already holds local_max's key (the head wrote it,
/// ops::HeadExtras::key), so the pack op is skipped.
void exchange_pick(ops::Backend& be, dist::Communicator& comm, Exchange protocol, int64_t vocab,
                   ExchangeBuffers& buf, int32_t* token_out, bool key_from_head = false);

/// The ops::HeadExtras the head writes for `protocol` (the packed key for packed_u64, nothing
/// for the others): pass them to head_argmax, then exchange_pick with key_from_head = true.
ops::HeadExtras head_extras_for(Exchange protocol, ExchangeBuffers& buf);

}  // namespace mtplab::drafter
