#include "drafter/exchange.hpp"

#include <vector>

#include "core/error.hpp"
#include "model/sharding.hpp"

namespace mtplab::drafter {

ExchangeBuffers::ExchangeBuffers(ops::Backend& be, int world, int64_t stride_rows, bool with_logits)
    : local_max(be, 1), gathered_max(be, world), key(be, 1), lanes(be, 8), stride(stride_rows) {
  if (with_logits) {
    logits = ops::Array<bf16>(be, stride);
    gathered_logits = ops::Array<bf16>(be, static_cast<size_t>(stride) * world);
    // -inf past this rank's shard, so a padded row never wins.
    std::vector<bf16> pad(stride, bf16{0xFF80});
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
      comm.all_gather(buf.logits.data(), buf.gathered_logits.data(), static_cast<size_t>(buf.stride) * sizeof(bf16));
      for (int r = 0; r < world; ++r) {
        const model::Range seg = model::split_range(vocab, r, world);
        be.argmax(buf.gathered_logits.data() + static_cast<size_t>(r) * buf.stride, static_cast<int>(seg.count),
                  seg.begin, buf.gathered_max.data() + r);
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
      for (int d = 0; d < 3; ++d) lanes[2 + rank * 3 + d] = to_bf16(static_cast<float>((mine.index >> (8 * d)) & 0xFF));
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

}  // namespace mtplab::drafter
