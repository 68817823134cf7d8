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

/// The protocol's buffers, in backend memory, for up to `rows` rows (one per sequence of a
/// batch; 1 for the single-sequence drafter). Per-row buffers hold row b at b * (row size).
struct ExchangeBuffers {
  /// `stride`: the largest shard's row count; the logit buffers exist only when with_logits.
  ExchangeBuffers(ops::Backend& be, int world, int64_t stride, bool with_logits, int rows = 1);
  ops::Array<ops::ArgMax> local_max;     ///< [rows]: this rank's (max, global index), input
  ops::Array<ops::ArgMax> gathered_max;  ///< [world, rows]
  ops::Array<uint64_t> key;              ///< [rows]
  ops::Array<bf16> lanes;                ///< [rows, 8]
  ops::Array<bf16> logits;               ///< [rows, stride]: this rank's logits, -inf past its shard (input)
  ops::Array<bf16> gathered_logits;      ///< [world, rows, stride]
  int64_t stride = 0;
  int rows = 1;
};

/// Writes the global draft token to `token_out` (backend memory) from every rank's local_max
/// (and, for allgather_logits, logits). Collective over `comm`. bf16_lanes needs world 2.
/// `key_from_head`: packed_u64 only: buf.key already holds local_max's key (the head wrote it,
/// ops::HeadExtras::key), so the pack op is skipped.
void exchange_pick(ops::Backend& be, dist::Communicator& comm, Exchange protocol, int64_t vocab,
                   ExchangeBuffers& buf, int32_t* token_out, bool key_from_head = false);

/// exchange_pick for the first `rows` rows of `buf` at once, in ONE collective whatever the rows
/// (the keys, pairs, logits or lanes of every row travel together): token_out[b] is row b's global
/// draft token. Each row's token equals exchange_pick's on that row's inputs. The rows of the
/// call must be the buffers' rows (buf.rows >= rows); the per-row picks after the collective are
/// row ops (ops.hpp), so a padded row yields a token nobody reads.
void exchange_pick_rows(ops::Backend& be, dist::Communicator& comm, Exchange protocol, int64_t vocab,
                        ExchangeBuffers& buf, int rows, int32_t* token_out, bool key_from_head = false);

/// The ops::HeadExtras the head writes for `protocol` (the packed key for packed_u64, nothing
/// for the others): pass them to head_argmax, then exchange_pick with key_from_head = true.
ops::HeadExtras head_extras_for(Exchange protocol, ExchangeBuffers& buf);

// ---- sampling statistics of logit rows (docs/drafter.md, "Sampling statistics") ----------------

/// The buffers of the sampling statistics of up to `rows` logit rows (the k drafts x B rows of a
/// step, draft-major, or a chunk of target rows), in backend memory. `stride`: the largest shard's
/// row count (every rank's rows are padded to it, so an all-gather is one block per rank).
struct StatsBuffers {
  /// `sharded`: the head is vocab-sharded over `world` ranks (the gather buffers exist then).
  StatsBuffers(ops::Backend& be, int world, int64_t stride, int rows, bool sharded);
  ops::Array<bf16> logits;                     ///< [rows, stride]: this rank's logits, -inf past its shard
  ops::Array<bf16> gathered_logits;            ///< [world, rows, stride] (sharded)
  ops::Array<int32_t> requested;               ///< [rows]: global token ids
  ops::Array<ops::LogitStats> parts;           ///< [rows]: this rank's partials
  ops::Array<ops::LogitStats> gathered_parts;  ///< [world, rows] (sharded)
  ops::Array<ops::TokenStats> out;             ///< [rows]
  ops::Array<ops::SampleParams> params;        ///< [1]
  int64_t stride = 0;
  int rows = 0;
};

/// The ops::SampleParams of a transform (fp32, as the ops read them).
ops::SampleParams sample_params(const SamplingTransform& t);

/// buf.out[0 .. rows) = the TokenStats of the first `rows` rows of buf.logits under buf.params,
/// for the tokens buf.requested when `with_requested`. Each row holds this rank's shard, tokens
/// [shard_begin, shard_begin + shard_n) of `vocab` (the whole vocab when comm is null or of size 1,
/// or `sharded` is false). Sharded, collective over comm, ONE collective whatever the rows:
/// - no truncation: every rank's [rows] LogitStats partials in one all-gather, combined per row;
/// - `truncate` (top_k or top_p active): the logits rows in one all-gather ([rows, stride] BF16
///   per rank), then every rank summarises the whole rows itself (a global threshold needs them).
/// Every rank ends with the same values.
void stats_rows(ops::Backend& be, dist::Communicator* comm, bool sharded, int64_t vocab, int64_t shard_begin,
                int64_t shard_n, StatsBuffers& buf, int rows, bool with_requested, bool truncate);

}  // namespace mtplab::drafter
