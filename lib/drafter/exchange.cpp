#include "drafter/exchange.hpp"

#include <vector>

#include "core/error.hpp"
#include "model/sharding.hpp"

namespace mtplab::drafter {

ExchangeBuffers::ExchangeBuffers(ops::Backend& be, int world, int64_t stride_rows, bool with_logits,
                                 int n_rows)
    : local_max(be, static_cast<size_t>(n_rows)),
      gathered_max(be, static_cast<size_t>(world) * n_rows),
      key(be, static_cast<size_t>(n_rows)),
      lanes(be, static_cast<size_t>(n_rows) * 8),
      stride(stride_rows),
      rows(n_rows) {
  MTP_REQUIRE(n_rows >= 1, "exchange buffers for ", n_rows, " rows");
  if (n_rows > 1) {
    // Rows of a batch that no head has written yet (padded rows) hold zeros, not uninitialised bytes.
    be.fill_bytes(local_max.data(), 0, local_max.bytes());
    be.fill_bytes(key.data(), 0, key.bytes());
  }
  if (with_logits) {
    logits = ops::Array<bf16>(be, static_cast<size_t>(stride) * n_rows);
    gathered_logits = ops::Array<bf16>(be, static_cast<size_t>(stride) * world * n_rows);
    // -inf past this rank's shard, so a padded row never wins.
    std::vector<bf16> pad(static_cast<size_t>(stride) * n_rows, bf16{0xFF80});
    be.upload(logits.data(), pad.data(), pad.size() * sizeof(bf16));
  }
}

ops::HeadExtras head_extras_for(Exchange protocol, ExchangeBuffers& buf) {
  ops::HeadExtras extras;
  if (protocol == Exchange::packed_u64) extras.key = buf.key.data();
  return extras;
}

void exchange_pick(ops::Backend& be, dist::Communicator& comm, Exchange protocol, int64_t vocab,
                   ExchangeBuffers& buf, int32_t* token_out, bool key_from_head) {
  const int world = comm.size();
  const int rank = comm.rank();
  switch (protocol) {
    case Exchange::packed_u64:
      // Key: order-preserving bits of the value << 32 | ~index; one MAX all-reduce of 8 bytes.
      if (!key_from_head) be.argmax_pack_key(buf.local_max.data(), buf.key.data());
      comm.all_reduce_max(buf.key.data(), buf.key.data(), 1);
      be.argmax_unpack_key(buf.key.data(), token_out);
      break;
    case Exchange::allgather_pairs:
      comm.all_gather(buf.local_max.data(), buf.gathered_max.data(), sizeof(ops::ArgMax));
      be.argmax_pick(buf.gathered_max.data(), world, token_out);
      break;
    case Exchange::allgather_logits: {
      // Every rank's padded logits, then an argmax per rank's segment with that rank's first
      // token id, then the pick: what engines that gather the logits do, kept exact for uneven
      // splits (shard r starts at split_range(V, r, world).begin).
      MTP_REQUIRE(buf.logits.size() > 0, "exchange allgather_logits: the logit buffers were not allocated");
      comm.all_gather(buf.logits.data(), buf.gathered_logits.data(),
                      static_cast<size_t>(buf.stride) * sizeof(bf16));
      for (int r = 0; r < world; ++r) {
        const model::Range seg = model::split_range(vocab, r, world);
        be.argmax(buf.gathered_logits.data() + static_cast<size_t>(r) * buf.stride,
                  static_cast<int>(seg.count), seg.begin, buf.gathered_max.data() + r);
      }
      be.argmax_pick(buf.gathered_max.data(), world, token_out);
      break;
    }
    case Exchange::bf16_lanes: {
      // The seed's protocol: 8 BF16 lanes [val_r0, val_r1, 3 base-256 digits of each rank's
      // global index]; each rank fills only its own lanes, so a SUM all-reduce carries both
      // ranks' values exactly (x + 0 is exact, digits <= 255 are exact in BF16). Host
      // synchronisations included, as in the seed.
      MTP_REQUIRE(world == 2, "exchange bf16_lanes runs on exactly 2 ranks, not ", world);
      ops::ArgMax mine{};
      comm.wait();  // earlier collectives are on the stream the download synchronises
      be.download(&mine, buf.local_max.data(), sizeof mine);
      bf16 lanes[8] = {};
      lanes[rank] = to_bf16(mine.value);
      for (int d = 0; d < 3; ++d)
        lanes[2 + rank * 3 + d] = to_bf16(static_cast<float>((mine.index >> (8 * d)) & 0xFF));
      be.upload(buf.lanes.data(), lanes, sizeof lanes);
      comm.all_reduce_sum(buf.lanes.data(), buf.lanes.data(), 8);
      comm.wait();
      be.download(lanes, buf.lanes.data(), sizeof lanes);
      // `>=`: the lower rank (lower token ids) wins a tie, identically on both ranks.
      const int win = to_float(lanes[0]) >= to_float(lanes[1]) ? 0 : 1;
      int32_t idx = 0;
      for (int d = 0; d < 3; ++d) idx += static_cast<int32_t>(to_float(lanes[2 + win * 3 + d])) << (8 * d);
      be.upload(token_out, &idx, sizeof idx);
      break;
    }
  }
}

void exchange_pick_rows(ops::Backend& be, dist::Communicator& comm, Exchange protocol, int64_t vocab,
                        ExchangeBuffers& buf, int rows, int32_t* token_out, bool key_from_head) {
  MTP_REQUIRE(rows >= 1 && rows <= buf.rows, "exchange: ", rows, " rows with buffers for ", buf.rows);
  const int world = comm.size();
  const int rank = comm.rank();
  const size_t n = static_cast<size_t>(rows);
  switch (protocol) {
    case Exchange::packed_u64:
      if (!key_from_head)
        for (int b = 0; b < rows; ++b) be.argmax_pack_key(buf.local_max.data() + b, buf.key.data() + b);
      comm.all_reduce_max(buf.key.data(), buf.key.data(), n);
      be.argmax_unpack_key_batch(buf.key.data(), token_out, rows);
      break;
    case Exchange::allgather_pairs:
      // [world, rows]: rank r's pair of row b at r * rows + b, the layout argmax_pick_batch reads.
      comm.all_gather(buf.local_max.data(), buf.gathered_max.data(), n * sizeof(ops::ArgMax));
      be.argmax_pick_batch(buf.gathered_max.data(), world, rows, token_out);
      break;
    case Exchange::allgather_logits: {
      MTP_REQUIRE(buf.logits.size() > 0, "exchange allgather_logits: the logit buffers were not allocated");
      const size_t per_rank = n * static_cast<size_t>(buf.stride);
      comm.all_gather(buf.logits.data(), buf.gathered_logits.data(), per_rank * sizeof(bf16));
      for (int r = 0; r < world; ++r) {
        const model::Range seg = model::split_range(vocab, r, world);
        be.argmax_batch(buf.gathered_logits.data() + static_cast<size_t>(r) * per_rank,
                        static_cast<int>(buf.stride), rows, static_cast<int>(seg.count), seg.begin,
                        buf.gathered_max.data() + r * n);
      }
      be.argmax_pick_batch(buf.gathered_max.data(), world, rows, token_out);
      break;
    }
    case Exchange::bf16_lanes: {
      // Row b's 8 lanes at 8 * b: one SUM all-reduce carries every row's (as exchange_pick).
      MTP_REQUIRE(world == 2, "exchange bf16_lanes runs on exactly 2 ranks, not ", world);
      std::vector<ops::ArgMax> mine(n);
      comm.wait();
      be.download(mine.data(), buf.local_max.data(), n * sizeof(ops::ArgMax));
      std::vector<bf16> lanes(n * 8);
      for (size_t b = 0; b < n; ++b) {
        bf16* l = lanes.data() + 8 * b;
        l[rank] = to_bf16(mine[b].value);
        for (int d = 0; d < 3; ++d)
          l[2 + rank * 3 + d] = to_bf16(static_cast<float>((mine[b].index >> (8 * d)) & 0xFF));
      }
      be.upload(buf.lanes.data(), lanes.data(), lanes.size() * sizeof(bf16));
      comm.all_reduce_sum(buf.lanes.data(), buf.lanes.data(), n * 8);
      comm.wait();
      be.download(lanes.data(), buf.lanes.data(), lanes.size() * sizeof(bf16));
      std::vector<int32_t> idx(n, 0);
      for (size_t b = 0; b < n; ++b) {
        const bf16* l = lanes.data() + 8 * b;
        const int win = to_float(l[0]) >= to_float(l[1]) ? 0 : 1;
        for (int d = 0; d < 3; ++d) idx[b] += static_cast<int32_t>(to_float(l[2 + win * 3 + d])) << (8 * d);
      }
      be.upload(token_out, idx.data(), n * sizeof(int32_t));
      break;
    }
  }
}

// ---- sampling statistics ---------------------------------------------------------------------

StatsBuffers::StatsBuffers(ops::Backend& be, int world, int64_t stride_rows, int n_rows, bool sharded)
    : logits(be, static_cast<size_t>(stride_rows) * n_rows),
      requested(be, static_cast<size_t>(n_rows)),
      parts(be, static_cast<size_t>(n_rows)),
      out(be, static_cast<size_t>(n_rows)),
      params(be, 1),
      stride(stride_rows),
      rows(n_rows) {
  MTP_REQUIRE(n_rows >= 1 && stride_rows >= 1, "stats buffers for ", n_rows, " rows of ", stride_rows);
  // -inf everywhere: past a shard (an allgather_logits exchange reads the rows too) and in rows no
  // head writes (padded batch rows), so every row the row ops read holds defined values.
  std::vector<bf16> pad(logits.size(), bf16{0xFF80});
  be.upload(logits.data(), pad.data(), pad.size() * sizeof(bf16));
  be.fill_bytes(requested.data(), 0, requested.bytes());
  if (sharded) {
    gathered_logits = ops::Array<bf16>(be, logits.size() * static_cast<size_t>(world));
    gathered_parts = ops::Array<ops::LogitStats>(be, parts.size() * static_cast<size_t>(world));
  }
}

ops::SampleParams sample_params(const SamplingTransform& t) {
  check_transform(t);
  ops::SampleParams p;
  p.temperature = static_cast<float>(t.temperature);
  p.top_k = t.top_k;
  p.top_p = static_cast<float>(t.top_p);
  return p;
}

void stats_rows(ops::Backend& be, dist::Communicator* comm, bool sharded, int64_t vocab, int64_t shard_begin,
                int64_t shard_n, StatsBuffers& buf, int rows, bool with_requested, bool truncate) {
  MTP_REQUIRE(rows >= 1 && rows <= buf.rows, "stats: ", rows, " rows with buffers for ", buf.rows);
  const int world = comm ? comm->size() : 1;
  sharded = sharded && world > 1;
  const int32_t* requested = with_requested ? buf.requested.data() : nullptr;
  const ops::SampleParams* params = buf.params.data();
  ops::LogitRows view;
  view.data = buf.logits.data();
  view.rows = rows;
  view.ld = static_cast<int>(buf.stride);
  if (!sharded) {
    view.n = static_cast<int>(shard_n);
    view.index_base = shard_begin;
    be.logit_stats_batch(view, requested, params, buf.parts.data());
    be.logit_stats_combine(buf.parts.data(), 1, rows, params, buf.out.data());
    return;
  }
  MTP_REQUIRE(buf.gathered_parts.size() > 0, "stats: a sharded head's gather buffers were not allocated");
  const size_t n = static_cast<size_t>(rows);
  if (!truncate) {
    view.n = static_cast<int>(shard_n);
    view.index_base = shard_begin;
    be.logit_stats_batch(view, requested, params, buf.parts.data());
    comm->all_gather(buf.parts.data(), buf.gathered_parts.data(), n * sizeof(ops::LogitStats));
    be.logit_stats_combine(buf.gathered_parts.data(), world, rows, params, buf.out.data());
    return;
  }
  // A threshold over the whole vocab: every rank's rows, then each rank summarises them alone.
  const size_t per_rank = n * static_cast<size_t>(buf.stride);
  comm->all_gather(buf.logits.data(), buf.gathered_logits.data(), per_rank * sizeof(bf16));
  view.data = buf.gathered_logits.data();
  view.segments = world;
  view.seg_stride = static_cast<int64_t>(per_rank);
  view.vocab = vocab;
  be.logit_stats_batch(view, requested, params, buf.parts.data());
  be.logit_stats_combine(buf.parts.data(), 1, rows, params, buf.out.data());
}

}  // namespace mtplab::drafter
