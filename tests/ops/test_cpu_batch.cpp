// CPU reference of the batched ops (ops.hpp, "batched rows"), the case that crosses op families:
// ragged rows (each sequence's rows consecutive at ascending positions of its own slot) through the
// cache writes and the reads after them, each live row equal, bit for bit, to the single-row ops
// run one row at a time; a padded row (slot -1) reads and writes nothing (every output and cache
// is poisoned first, and the reference buffers carry the same poison, so a stray write shows as a
// difference). Each family's own batched cases (every row the single-row op's bytes, whatever the
// batch: B = 1, 3, 16, 64, 128, padded rows among them) are in its file: test_cpu_norm.cpp,
// test_cpu_dense.cpp, test_cpu_indexer.cpp, test_cpu_mla.cpp, test_cpu_moe.cpp.
//
// The single-row ops themselves are tested against exact arithmetic in the other test_cpu_*
// files; equality with them is the whole contract here, so every comparison is of raw bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "core/error.hpp"
#include "cpu_batch_util.hpp"
#include "cpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::test {
namespace {

using ::mtplab::test::error_of;

struct CpuBatch : ::testing::Test {
  std::unique_ptr<Backend> be = make_cpu_backend();
};

// ---- ragged rows ------------------------------------------------------------------------------------

/// One sequence of a ragged batch: `count` rows of slot `slot` at positions start .. start + count - 1.
struct Seq {
  int slot, start, count;
};

/// A ragged batch: each sequence's rows consecutive, in `seqs` order, with pads[i] padded rows
/// (slot -1 at `pad_pos`) before sequence i and pads[seqs.size()] after the last.
struct Ragged {
  std::vector<Seq> seqs;
  std::vector<int> pads;
  std::vector<int32_t> slot, pos;
  int max_seq_rows = 1;
  int rows() const { return static_cast<int>(slot.size()); }
};

Ragged make_ragged(std::vector<Seq> seqs, std::vector<int> pads, int32_t pad_pos) {
  Ragged r{std::move(seqs), std::move(pads), {}, {}, 1};
  for (size_t i = 0; i <= r.seqs.size(); ++i) {
    for (int k = 0; k < r.pads[i]; ++k) {
      r.slot.push_back(-1);
      r.pos.push_back(pad_pos);
    }
    if (i == r.seqs.size()) break;
    const Seq& q = r.seqs[i];
    for (int k = 0; k < q.count; ++k) {
      r.slot.push_back(q.slot);
      r.pos.push_back(q.start + k);
    }
    r.max_seq_rows = std::max(r.max_seq_rows, q.count);
  }
  return r;
}

std::string describe(const Ragged& r) {
  std::string d = "rows";
  for (size_t i = 0; i < r.seqs.size(); ++i)
    d += " | " + std::to_string(r.pads[i]) + " padded, slot " + std::to_string(r.seqs[i].slot) + " at " +
         std::to_string(r.seqs[i].start) + " .. " + std::to_string(r.seqs[i].start + r.seqs[i].count - 1);
  return d + " | " + std::to_string(r.pads.back()) + " padded; " + seed_note();
}

// Ragged rows (several rows of one slot at ascending positions, ops.hpp "ragged rows") through the
// cache writes: 3 sequences of 1, 4 and 7 rows over a pool of 5 slots at different starting
// positions (each slot holding rows 0 .. start - 1 already), positions crossing pool boundaries
// (P = 4) so the batch completes pools from rows stored before it and by its own earlier rows,
// padded rows between and around the sequences. kv_norm_write_batch and indexer_norm_store_batch
// must leave the same cache bytes (latent rows, k and gate rows, valid flags, every pool key) as
// the single-row ops storing the rows one at a time in batch order; then indexer_scores_batch,
// indexer_select_batch and mla_decode_batch over the same rows must equal the single-row ops per
// row at its position.
TEST_F(CpuBatch, RaggedRowsEqualTheSingleRowOpsOneRowAtATime) {
  Rng rng(716);
  const int L = Pool::kLora, D = Pool::kD, P = Pool::kP, nh = 3, K = 8, width = K + P - 1, slots = 5;
  auto kw = upload(*be, rng.bf16s(L, 0.5f, 1.5f));
  auto lw = upload(*be, rng.bf16s(D, 0.5f, 1.5f)), lb = upload(*be, rng.bf16s(D, -0.2f, 0.2f));
  auto ape = upload(*be, rng.floats(static_cast<size_t>(P) * D, -1, 1));
  constexpr int32_t kPadPos = 1 << 20;  // refused if a padded row's position were read
  std::vector<Ragged> cases = {
      // Slots 1 and 2 hold nothing and must keep their poison; slot 4 completes pools 3 and 4.
      make_ragged({{3, 9, 1}, {0, 2, 4}, {4, 13, 7}}, {1, 1, 0, 1}, kPadPos),
      // From an empty slot, and up to the slots' last row (pools 8 and 9 completed by the batch).
      make_ragged({{1, 33, 7}, {2, 0, 1}, {0, 3, 4}}, {0, 0, 2, 0}, kPadPos),
  };
  for (int i = 0; i < 6; ++i) {  // random slots, orders, starts and padding
    std::vector<int> counts = {1, 4, 7}, slot_ids = {0, 1, 2, 3, 4};
    std::shuffle(counts.begin(), counts.end(), rng);
    std::shuffle(slot_ids.begin(), slot_ids.end(), rng);
    std::vector<Seq> seqs;
    for (int j = 0; j < 3; ++j)
      seqs.push_back({slot_ids[j], rng.integer(0, Pool::kMaxRows - counts[j]), counts[j]});
    cases.push_back(make_ragged(
        seqs, {rng.integer(0, 2), rng.integer(0, 2), rng.integer(0, 2), rng.integer(0, 2)}, kPadPos));
  }
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    for (const Ragged& r : cases) {
      const std::string what = std::string(dtype == KvDtype::fp8 ? "FP8, " : "BF16, ") + describe(r);
      const int R = r.rows();
      Pool pool(*be, rng, slots, dtype), ref(*be, rng, slots, dtype);
      be->upload(ref.tables.data(), pool.tables_h.data(), pool.tables.bytes());  // the same tables
      // The rows before each sequence, stored one at a time by the single-row ops.
      for (const Seq& q : r.seqs) {
        for (int32_t t = 0; t < q.start; ++t) {
          auto ckv = upload(*be, rng.bf16s(L, -3, 3)), k_pre = upload(*be, rng.bf16s(D, -2, 2));
          auto gate = upload(*be, rng.floats(D, -2, 2));
          auto tp = upload(*be, std::vector<int32_t>{t});
          mtplab::ops::OneRow(*be).kv_norm_write(ckv.data(), kw.data(), 1e-5f, pool.table(q.slot), tp.data(),
                                                 pool.kv.cache);
          mtplab::ops::OneRow(*be).indexer_norm_store(
              k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(), ape.data(), tp.data(),
              pool.k_of(q.slot), pool.gate_of(q.slot), pool.valid_of(q.slot), pool.keys_of(q.slot), D, P);
        }
      }
      be->copy(ref.kv_data.data(), pool.kv_data.data(), pool.kv_data.bytes());
      be->copy(ref.k_cache.data(), pool.k_cache.data(), pool.k_cache.bytes());
      be->copy(ref.gate_cache.data(), pool.gate_cache.data(), pool.gate_cache.bytes());
      be->copy(ref.valid.data(), pool.valid.data(), pool.valid.bytes());
      be->copy(ref.pool_keys.data(), pool.pool_keys.data(), pool.pool_keys.bytes());

      auto s = upload(*be, r.slot), pos = upload(*be, r.pos);
      const RowBatch rb{s.data(), pos.data(), R, r.max_seq_rows};
      auto ckv = upload(*be, rng.bf16s(static_cast<size_t>(R) * L, -3, 3));
      auto k_pre = upload(*be, rng.bf16s(static_cast<size_t>(R) * D, -2, 2));
      auto gate = upload(*be, rng.floats(static_cast<size_t>(R) * D, -2, 2));
      be->kv_norm_write_batch(ckv.data(), kw.data(), 1e-5f, rb, pool.kv);
      be->indexer_norm_store_batch(k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(), ape.data(), rb,
                                   pool.idx);
      for (int b = 0; b < R; ++b) {
        const int sl = r.slot[b];
        if (sl < 0) continue;
        mtplab::ops::OneRow(*be).kv_norm_write(ckv.data() + b * L, kw.data(), 1e-5f, ref.table(sl),
                                               pos.data() + b, ref.kv.cache);
        mtplab::ops::OneRow(*be).indexer_norm_store(
            k_pre.data() + b * D, lw.data(), lb.data(), 1e-6f, gate.data() + b * D, ape.data(),
            pos.data() + b, ref.k_of(sl), ref.gate_of(sl), ref.valid_of(sl), ref.keys_of(sl), D, P);
      }
      EXPECT_TRUE(same_bytes(download(*be, pool.kv_data), download(*be, ref.kv_data))) << "latent, " << what;
      EXPECT_TRUE(same_bytes(download(*be, pool.k_cache), download(*be, ref.k_cache))) << "k, " << what;
      EXPECT_TRUE(same_bytes(download(*be, pool.gate_cache), download(*be, ref.gate_cache)))
          << "gate, " << what;
      EXPECT_TRUE(same_bytes(download(*be, pool.valid), download(*be, ref.valid))) << "valid, " << what;
      const auto keys = download(*be, pool.pool_keys);
      EXPECT_TRUE(same_bytes(keys, download(*be, ref.pool_keys))) << "pool keys, " << what;
      // Every pool a sequence has completed by its last row has a key (not the poison).
      for (const Seq& q : r.seqs) {
        for (int j = 0; (j + 1) * P <= q.start + q.count; ++j) {
          const float* key = keys.data() + (static_cast<size_t>(q.slot) * (Pool::kMaxRows / P) + j) * D;
          EXPECT_TRUE(std::all_of(key, key + D, [](float v) { return std::isfinite(v); }))
              << "slot " << q.slot << " pool " << j << ", " << what;
        }
      }

      // The reads over the same rows: each row sees its slot's rows up to its own position.
      const int mp = pool.idx.max_pools();
      auto q = upload(*be, rng.floats(static_cast<size_t>(R) * nh * D, -1, 1));
      auto qw = upload(*be, rng.floats(static_cast<size_t>(R) * nh, 0, 1));
      auto scores = poisoned<float>(*be, static_cast<size_t>(R) * mp),
           scores_ref = poisoned<float>(*be, scores.size());
      be->indexer_scores_batch(q.data(), qw.data(), rb, pool.idx, scores.data(), nh);
      auto sel = poisoned<int32_t>(*be, static_cast<size_t>(R) * width, 0x7B);
      auto sel_ref = poisoned<int32_t>(*be, sel.size(), 0x7B);
      be->indexer_select_batch(scores.data(), rb, sel.data(), K, P, mp);
      auto q_abs = upload(*be, rng.bf16s(static_cast<size_t>(R) * nh * L, -1, 1));
      auto o = poisoned<bf16>(*be, static_cast<size_t>(R) * nh * L), o_ref = poisoned<bf16>(*be, o.size());
      be->mla_decode_batch(q_abs.data(), sel.data(), width, rb, pool.kv, o.data(), nh, 0.3f);
      for (int b = 0; b < R; ++b) {
        const int sl = r.slot[b];
        if (sl < 0) continue;
        be->indexer_scores(q.data() + b * nh * D, qw.data() + b * nh, pool.keys_of(sl), pos.data() + b,
                           scores_ref.data() + b * mp, nh, D, P, mp);
        be->indexer_select(scores.data() + b * mp, pos.data() + b, sel_ref.data() + b * width, K, P, mp);
        mtplab::ops::OneRow(*be).mla_decode(q_abs.data() + b * nh * L, sel.data() + b * width, width,
                                            pool.table(sl), pool.kv.cache, o_ref.data() + b * nh * L, nh,
                                            0.3f);
      }
      EXPECT_TRUE(same_bytes(download(*be, scores), download(*be, scores_ref))) << "scores, " << what;
      EXPECT_TRUE(same_bytes(download(*be, sel), download(*be, sel_ref))) << "selection, " << what;
      EXPECT_TRUE(same_bytes(download(*be, o), download(*be, o_ref))) << "decode, " << what;
    }
  }
}

}  // namespace
}  // namespace mtplab::ops::test
