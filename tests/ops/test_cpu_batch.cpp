// CPU reference of the batched ops (ops.hpp, "batched rows"): each live row must equal, bit for bit,
// the single-row op it names on the same inputs, whatever the batch (B = 1, 3, 16, 64, 128), with
// the rows' sequences at different positions; a padded row (slot -1) must read nothing (its token,
// position or selection is set to what would be refused if it were read) and write nothing (every
// output and cache is poisoned first, and the reference buffers carry the same poison, so a stray
// write shows as a difference); and the pool addressing (slot-major indexer arrays, one block
// table per slot into a shuffled shared block pool) must reach each row's own caches only.
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
#include "cpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::test {
namespace {

using ::mtplab::test::error_of;

struct CpuBatch : ::testing::Test {
  std::unique_ptr<Backend> be = make_cpu_backend();
};

// ---- the head and the argmax family -----------------------------------------------------------

struct HeadCase {
  bool fp8;
  bool logits;
  bool extras;
};

TEST_F(CpuBatch, HeadArgmaxEqualsTheSingleRowOpBf16AndFp8) {
  Rng rng(704);
  const int n = 300, k = 72, ld = n + 20;
  const int64_t base = 1000;
  auto W_h = rng.bf16s(static_cast<size_t>(n) * k, -1, 1);
  // Duplicate rows, so equal logits occur at several places of the sweep.
  std::copy_n(W_h.begin() + 17 * k, k, W_h.begin() + 250 * k);
  std::copy_n(W_h.begin() + 3 * k, k, W_h.begin() + 200 * k);
  auto W = upload(*be, W_h);
  auto W8 = upload(*be, rng.fp8s(static_cast<size_t>(n) * k));
  auto scale = upload(*be, rng.floats(n, 0.001f, 0.01f));
  for (const HeadCase c : {HeadCase{false, true, true}, HeadCase{true, true, true},
                           HeadCase{false, false, false}, HeadCase{true, false, true}}) {
    for (int B : kBatches) {
      const auto slots_h = make_slots(rng, B, B);
      auto slots = upload(*be, slots_h);
      auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * k, -1, 1));
      auto out = poisoned<ArgMax>(*be, B), out_ref = poisoned<ArgMax>(*be, B);
      auto logits = poisoned<bf16>(*be, static_cast<size_t>(B) * ld);
      auto logits_ref = poisoned<bf16>(*be, static_cast<size_t>(B) * ld);
      auto key = poisoned<uint64_t>(*be, B), key_ref = poisoned<uint64_t>(*be, B);
      auto token = poisoned<int32_t>(*be, B), token_ref = poisoned<int32_t>(*be, B);
      const fp8e4m3* w8 = c.fp8 ? W8.data() : nullptr;
      const bf16* w16 = c.fp8 ? nullptr : W.data();
      const float* sc = c.fp8 ? scale.data() : nullptr;
      HeadExtras extras;
      if (c.extras) extras = {key.data(), token.data()};
      be->head_argmax_batch(w16, w8, sc, x.data(), RowBatch{slots.data(), nullptr, B}, n, k, base,
                            c.logits ? logits.data() : nullptr, ld, out.data(), extras);
      for (int b = 0; b < B; ++b) {
        if (slots_h[b] < 0) continue;
        HeadExtras e1;
        if (c.extras) e1 = {key_ref.data() + b, token_ref.data() + b};
        be->head_argmax(w16, w8, sc, x.data() + b * k, n, k, base,
                        c.logits ? logits_ref.data() + b * ld : nullptr, out_ref.data() + b, e1);
      }
      const std::string what = std::string(c.fp8 ? "FP8" : "BF16") + (c.logits ? " with logits" : "") +
                               (c.extras ? " with extras" : "") + ", " + where(B);
      EXPECT_TRUE(same_bytes(download(*be, out), download(*be, out_ref))) << what;
      EXPECT_TRUE(same_bytes(download(*be, logits), download(*be, logits_ref))) << what;
      EXPECT_TRUE(same_bytes(download(*be, key), download(*be, key_ref))) << what;
      EXPECT_TRUE(same_bytes(download(*be, token), download(*be, token_ref))) << what;
    }
  }
}

TEST_F(CpuBatch, HeadArgmaxTiesGoToTheLowestRowInEveryRow) {
  // Rows 7 and 40 of W are the same large positive row, row 90 a little smaller: with positive
  // inputs every row's maximum is the tie of rows 7 and 40, and row 7 must win in each.
  Rng rng(705);
  const int n = 128, k = 32, B = 16;
  auto W_h = rng.bf16s(static_cast<size_t>(n) * k, -0.05f, 0.05f);
  for (int j = 0; j < k; ++j) {
    W_h[7 * k + j] = to_bf16(1.0f);
    W_h[40 * k + j] = to_bf16(1.0f);
    W_h[90 * k + j] = to_bf16(0.875f);
  }
  auto W = upload(*be, W_h);
  auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * k, 0.5f, 1.0f));
  std::vector<int32_t> slots_h(B);
  std::iota(slots_h.begin(), slots_h.end(), 0);
  auto slots = upload(*be, slots_h);
  auto out = poisoned<ArgMax>(*be, B);
  be->head_argmax_batch(W.data(), nullptr, nullptr, x.data(), RowBatch{slots.data(), nullptr, B}, n, k, 5,
                        nullptr, 0, out.data());
  for (const ArgMax& a : download(*be, out)) EXPECT_EQ(a.index, 5 + 7);
}

TEST_F(CpuBatch, ArgmaxFamilyEqualsTheSingleRowOps) {
  Rng rng(706);
  const int n = 37, ld = 50, world = 3;
  for (int B : kBatches) {
    // Values from a small set, so ties are common.
    std::vector<bf16> x_h(static_cast<size_t>(B) * ld);
    for (auto& v : x_h) v = to_bf16(static_cast<float>(rng.integer(-4, 4)) * 0.25f);
    auto x = upload(*be, x_h);
    auto out = poisoned<ArgMax>(*be, B), out_ref = poisoned<ArgMax>(*be, B);
    be->argmax_batch(x.data(), ld, B, n, 500, out.data());
    for (int b = 0; b < B; ++b) be->argmax(x.data() + b * ld, n, 500, out_ref.data() + b);
    EXPECT_TRUE(same_bytes(download(*be, out), download(*be, out_ref))) << where(B);

    std::vector<ArgMax> pairs_h(static_cast<size_t>(world) * B);
    for (auto& p : pairs_h) p = ArgMax{static_cast<float>(rng.integer(0, 2)), rng.integer(0, 1000)};
    auto pairs = upload(*be, pairs_h);
    auto tok = poisoned<int32_t>(*be, B), tok_ref = poisoned<int32_t>(*be, B);
    be->argmax_pick_batch(pairs.data(), world, B, tok.data());
    for (int b = 0; b < B; ++b) {
      std::vector<ArgMax> row;
      for (int i = 0; i < world; ++i) row.push_back(pairs_h[static_cast<size_t>(i) * B + b]);
      auto row_dev = upload(*be, row);
      be->argmax_pick(row_dev.data(), world, tok_ref.data() + b);
    }
    EXPECT_TRUE(same_bytes(download(*be, tok), download(*be, tok_ref))) << "pick, " << where(B);

    auto keys = poisoned<uint64_t>(*be, B);
    for (int b = 0; b < B; ++b) be->argmax_pack_key(pairs.data() + b, keys.data() + b);
    auto unpacked = poisoned<int32_t>(*be, B), unpacked_ref = poisoned<int32_t>(*be, B);
    be->argmax_unpack_key_batch(keys.data(), unpacked.data(), B);
    for (int b = 0; b < B; ++b) be->argmax_unpack_key(keys.data() + b, unpacked_ref.data() + b);
    const auto u = download(*be, unpacked);
    EXPECT_TRUE(same_bytes(u, download(*be, unpacked_ref))) << "unpack, " << where(B);
    for (int b = 0; b < B; ++b) EXPECT_EQ(u[b], pairs_h[b].index);
  }
}

// ---- the slot pool ---------------------------------------------------------------------------------

/// A pool of `slots` sequences: the latent KV block pool (one table per slot, blocks shuffled over
/// the whole pool) and the slot-major indexer arrays, all poisoned.
struct Pool {
  static constexpr int kBlockSize = 8, kMaxBlocks = 5, kMaxRows = 40, kD = 20, kP = 4, kLora = 36;
  Pool(Backend& be, Rng& rng, int num_slots, KvDtype dtype) : slots(num_slots) {
    const size_t blocks = static_cast<size_t>(slots) * kMaxBlocks;
    std::vector<int32_t> t(blocks);
    std::iota(t.begin(), t.end(), 0);
    std::shuffle(t.begin(), t.end(), rng);
    tables_h = t;
    tables = upload(be, t);
    const size_t elem = dtype == KvDtype::bf16 ? 2 : 1;
    kv_data = poisoned<uint8_t>(be, blocks * kBlockSize * kLora * elem);
    kv.cache = KvCache{kv_data.data(), dtype, 0.05f, static_cast<int>(blocks), kBlockSize, kLora};
    kv.block_tables = tables.data();
    kv.slots = slots;
    kv.max_blocks = kMaxBlocks;
    k_cache = poisoned<bf16>(be, static_cast<size_t>(slots) * kMaxRows * kD);
    gate_cache = poisoned<float>(be, static_cast<size_t>(slots) * kMaxRows * kD);
    valid = poisoned<uint8_t>(be, static_cast<size_t>(slots) * kMaxRows, 0);
    pool_keys = poisoned<float>(be, static_cast<size_t>(slots) * (kMaxRows / kP) * kD);
    idx = IndexerSlots{k_cache.data(), gate_cache.data(), valid.data(), pool_keys.data(),
                       slots,          kMaxRows,          kD,           kP};
  }
  /// Slot s's block table, as the single-row ops take it.
  const int32_t* table(int s) const { return tables.data() + static_cast<size_t>(s) * kMaxBlocks; }
  /// Slot s's indexer arrays, as the single-row ops take them.
  bf16* k_of(int s) { return k_cache.data() + static_cast<size_t>(s) * kMaxRows * kD; }
  float* gate_of(int s) { return gate_cache.data() + static_cast<size_t>(s) * kMaxRows * kD; }
  uint8_t* valid_of(int s) { return valid.data() + static_cast<size_t>(s) * kMaxRows; }
  float* keys_of(int s) { return pool_keys.data() + static_cast<size_t>(s) * (kMaxRows / kP) * kD; }
  int slots;
  std::vector<int32_t> tables_h;
  Array<int32_t> tables;
  Array<uint8_t> kv_data;
  KvSlots kv;
  Array<bf16> k_cache;
  Array<float> gate_cache;
  Array<uint8_t> valid;
  Array<float> pool_keys;
  IndexerSlots idx;
};

/// Every cache byte of the pool's indexer arrays, in one vector (k_cache, gate_cache, valid, pool_keys).
std::vector<uint8_t> indexer_bytes(Backend& be, const Pool& pool) {
  std::vector<uint8_t> all;
  auto add = [&](const void* p, size_t bytes) {
    std::vector<uint8_t> part(bytes);
    be.download(part.data(), p, bytes);
    all.insert(all.end(), part.begin(), part.end());
  };
  add(pool.k_cache.data(), pool.k_cache.bytes());
  add(pool.gate_cache.data(), pool.gate_cache.bytes());
  add(pool.valid.data(), pool.valid.bytes());
  add(pool.pool_keys.data(), pool.pool_keys.bytes());
  return all;
}

/// The ragged-row rules of an op that writes caches, `write(rb)` with 3 rows of inputs on a pool of
/// at least 3 slots (positions < 8): a repeated slot at an equal or a descending position is refused
/// with a message naming the two rows, more live rows of one slot than rb.max_seq_rows is refused
/// with a message naming the slot and the bound, and a refused call writes nothing (`bytes()`, the
/// caches, is unchanged); rows of one slot at ascending positions within the bound are accepted.
template <typename Write, typename Bytes>
void expect_ragged_write_rules(Backend& be, Write&& write, Bytes&& bytes) {
  auto run = [&](std::vector<int32_t> slot, std::vector<int32_t> pos, int max_seq_rows) {
    auto s = upload(be, slot), p = upload(be, pos);
    write(RowBatch{s.data(), p.data(), static_cast<int>(slot.size()), max_seq_rows});
  };
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "\"" << msg << "\" should name \"" << part << "\"";
  };
  const auto before = bytes();
  // Slot 2 twice at one position (rows 0 and 2, a row of slot 0 between them).
  std::string msg = error_of([&] { run({2, 0, 2}, {5, 0, 5}, 2); });
  has(msg, "rows 0 and 2 of slot 2");
  has(msg, "positions 5 and 5");
  // Slot 2 at a descending position.
  msg = error_of([&] { run({0, 2, 2}, {0, 6, 4}, 2); });
  has(msg, "rows 1 and 2 of slot 2");
  has(msg, "positions 6 and 4");
  // Slot 1 three times at ascending positions, max_seq_rows 2; then twice with the default 1.
  msg = error_of([&] { run({1, 1, 1}, {0, 1, 2}, 2); });
  has(msg, "slot 1 has 3 rows");
  has(msg, "max_seq_rows 2");
  msg = error_of([&] { run({1, 1, -1}, {3, 4, -5}, 1); });
  has(msg, "slot 1 has 2 rows");
  has(msg, "max_seq_rows 1");
  EXPECT_TRUE(same_bytes(bytes(), before)) << "a refused call wrote";
  // Padded rows repeat no slot: two of them at one position are not a repeat.
  EXPECT_NO_THROW(run({-1, 0, -1}, {7, 2, 7}, 1));
  // Ascending rows of one slot within the bound (no row completes a pool whose rows are missing:
  // the row at 3 below completes slot 1's pool 0 from its rows 0 and 1 stored before and row 2 of
  // the same batch).
  EXPECT_NO_THROW(run({0, 1, 1}, {0, 0, 1}, 2));
  EXPECT_NO_THROW(run({1, 1, 1}, {2, 3, 4}, 3));
  EXPECT_NO_THROW(run({2, 2, 2}, {0, 1, 2}, 8));  // a bound above the count
}

/// Positions of live rows, different per row (0 .. capacity - 1), and for padded rows `pad_pos`.
std::vector<int32_t> make_positions(Rng& rng, const std::vector<int32_t>& slots, int capacity,
                                    int32_t pad_pos) {
  std::vector<int32_t> pos(slots.size());
  for (size_t b = 0; b < slots.size(); ++b) pos[b] = slots[b] < 0 ? pad_pos : rng.integer(0, capacity - 1);
  return pos;
}

TEST_F(CpuBatch, KvNormWriteWritesEachRowToItsOwnSlotOnly) {
  Rng rng(707);
  const int L = Pool::kLora;
  auto w = upload(*be, rng.bf16s(L, 0.5f, 1.5f));
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    for (int B : kBatches) {
      const int slots = B + 3;
      Pool pool(*be, rng, slots, dtype), ref(*be, rng, slots, dtype);
      be->upload(ref.tables.data(), pool.tables_h.data(), pool.tables.bytes());  // the same tables
      const auto slots_h = make_slots(rng, B, slots);
      // A padded row at a position past every slot: refused if it were written.
      const auto pos_h = make_positions(rng, slots_h, Pool::kMaxBlocks * Pool::kBlockSize, 1 << 20);
      auto s = upload(*be, slots_h), pos = upload(*be, pos_h);
      auto ckv = upload(*be, rng.bf16s(static_cast<size_t>(B) * L, -3, 3));
      be->kv_norm_write_batch(ckv.data(), w.data(), 1e-5f, RowBatch{s.data(), pos.data(), B}, pool.kv);
      for (int b = 0; b < B; ++b)
        if (slots_h[b] >= 0)
          mtplab::ops::OneRow(*be).kv_norm_write(ckv.data() + b * L, w.data(), 1e-5f, ref.table(slots_h[b]),
                                                 pos.data() + b, ref.kv.cache);
      EXPECT_TRUE(same_bytes(download(*be, pool.kv_data), download(*be, ref.kv_data)))
          << (dtype == KvDtype::fp8 ? "FP8, " : "BF16, ") << where(B);
    }
  }
  // Refusals: the ragged-row rules, a slot past the pool, a position past the slot's blocks.
  Pool pool(*be, rng, 4, KvDtype::bf16);
  auto ckv = upload(*be, rng.bf16s(3 * L, -1, 1));
  expect_ragged_write_rules(
      *be, [&](const RowBatch& rb) { be->kv_norm_write_batch(ckv.data(), w.data(), 1e-5f, rb, pool.kv); },
      [&] { return download(*be, pool.kv_data); });
  auto past = upload(*be, std::vector<int32_t>{1, 4});
  auto p0 = upload(*be, std::vector<int32_t>{0, 1}), far = upload(*be, std::vector<int32_t>{0, 40});
  auto ok = upload(*be, std::vector<int32_t>{0, 1});
  EXPECT_THROW(
      be->kv_norm_write_batch(ckv.data(), w.data(), 1e-5f, RowBatch{past.data(), p0.data(), 2}, pool.kv),
      Error);
  EXPECT_THROW(
      be->kv_norm_write_batch(ckv.data(), w.data(), 1e-5f, RowBatch{ok.data(), far.data(), 2}, pool.kv),
      Error);
}

TEST_F(CpuBatch, IndexerNormStoreWritesEachRowToItsOwnSlotAndCompletesPools) {
  Rng rng(708);
  const int D = Pool::kD, P = Pool::kP;
  auto lw = upload(*be, rng.bf16s(D, 0.5f, 1.5f)), lb = upload(*be, rng.bf16s(D, -0.2f, 0.2f));
  auto ape = upload(*be, rng.floats(static_cast<size_t>(P) * D, -1, 1));
  for (int B : kBatches) {
    const int slots = B + 2;
    Pool pool(*be, rng, slots, KvDtype::bf16);
    const auto slots_h = make_slots(rng, B, slots);
    // Each live row's slot holds rows 0 .. pos-1 already (stored row by row with the single op);
    // half the rows complete a pool (pos % P == P - 1).
    std::vector<int32_t> pos_h(static_cast<size_t>(B), -3);  // -3: refused if a padded row were read
    for (int b = 0; b < B; ++b) {
      if (slots_h[b] < 0) continue;
      const int pools = rng.integer(0, Pool::kMaxRows / P - 1);
      pos_h[b] = pools * P + (b % 2 ? P - 1 : rng.integer(0, P - 2));
      const size_t so = static_cast<size_t>(slots_h[b]);
      for (int32_t t = 0; t < pos_h[b]; ++t) {
        auto k_pre = upload(*be, rng.bf16s(D, -2, 2));
        auto gate = upload(*be, rng.floats(D, -2, 2));
        auto tp = upload(*be, std::vector<int32_t>{t});
        mtplab::ops::OneRow(*be).indexer_norm_store(
            k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(), ape.data(), tp.data(),
            pool.k_cache.data() + so * Pool::kMaxRows * D, pool.gate_cache.data() + so * Pool::kMaxRows * D,
            pool.valid.data() + so * Pool::kMaxRows, pool.pool_keys.data() + so * (Pool::kMaxRows / P) * D, D,
            P);
      }
    }
    // The reference: a byte copy of the pool, then the single op per live row.
    Pool ref(*be, rng, slots, KvDtype::bf16);
    be->copy(ref.k_cache.data(), pool.k_cache.data(), pool.k_cache.bytes());
    be->copy(ref.gate_cache.data(), pool.gate_cache.data(), pool.gate_cache.bytes());
    be->copy(ref.valid.data(), pool.valid.data(), pool.valid.bytes());
    be->copy(ref.pool_keys.data(), pool.pool_keys.data(), pool.pool_keys.bytes());
    auto s = upload(*be, slots_h), pos = upload(*be, pos_h);
    auto k_pre = upload(*be, rng.bf16s(static_cast<size_t>(B) * D, -2, 2));
    auto gate = upload(*be, rng.floats(static_cast<size_t>(B) * D, -2, 2));
    be->indexer_norm_store_batch(k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(), ape.data(),
                                 RowBatch{s.data(), pos.data(), B}, pool.idx);
    for (int b = 0; b < B; ++b) {
      if (slots_h[b] < 0) continue;
      const size_t so = static_cast<size_t>(slots_h[b]);
      mtplab::ops::OneRow(*be).indexer_norm_store(
          k_pre.data() + b * D, lw.data(), lb.data(), 1e-6f, gate.data() + b * D, ape.data(), pos.data() + b,
          ref.k_cache.data() + so * Pool::kMaxRows * D, ref.gate_cache.data() + so * Pool::kMaxRows * D,
          ref.valid.data() + so * Pool::kMaxRows, ref.pool_keys.data() + so * (Pool::kMaxRows / P) * D, D, P);
    }
    EXPECT_TRUE(same_bytes(download(*be, pool.k_cache), download(*be, ref.k_cache))) << where(B);
    EXPECT_TRUE(same_bytes(download(*be, pool.gate_cache), download(*be, ref.gate_cache))) << where(B);
    EXPECT_TRUE(same_bytes(download(*be, pool.valid), download(*be, ref.valid))) << where(B);
    EXPECT_TRUE(same_bytes(download(*be, pool.pool_keys), download(*be, ref.pool_keys))) << where(B);
  }
  Pool pool(*be, rng, 3, KvDtype::bf16);
  auto k_pre = upload(*be, rng.bf16s(3 * D, -1, 1));
  auto gate = upload(*be, rng.floats(3 * D, -1, 1));
  expect_ragged_write_rules(
      *be,
      [&](const RowBatch& rb) {
        be->indexer_norm_store_batch(k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(), ape.data(), rb,
                                     pool.idx);
      },
      [&] { return indexer_bytes(*be, pool); });
  auto two = upload(*be, std::vector<int32_t>{0, 1}),
       past = upload(*be, std::vector<int32_t>{0, Pool::kMaxRows});
  EXPECT_THROW(be->indexer_norm_store_batch(k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(),
                                            ape.data(), RowBatch{two.data(), past.data(), 2}, pool.idx),
               Error);
}

TEST_F(CpuBatch, IndexerScoresReadEachRowsOwnPoolKeys) {
  Rng rng(709);
  const int D = Pool::kD, P = Pool::kP, nh = 3;
  for (int B : kBatches) {
    const int slots = B + 2;
    Pool pool(*be, rng, slots, KvDtype::bf16);
    const auto keys = rng.floats(pool.pool_keys.size(), -1, 1);
    be->upload(pool.pool_keys.data(), keys.data(), pool.pool_keys.bytes());
    const auto slots_h = make_slots(rng, B, slots);
    const auto pos_h = make_positions(rng, slots_h, Pool::kMaxRows, 1 << 20);
    auto s = upload(*be, slots_h), pos = upload(*be, pos_h);
    auto q = upload(*be, rng.floats(static_cast<size_t>(B) * nh * D, -1, 1));
    auto w = upload(*be, rng.floats(static_cast<size_t>(B) * nh, 0, 1));
    const int mp = pool.idx.max_pools();
    auto scores = poisoned<float>(*be, static_cast<size_t>(B) * mp),
         ref = poisoned<float>(*be, scores.size());
    be->indexer_scores_batch(q.data(), w.data(), RowBatch{s.data(), pos.data(), B}, pool.idx, scores.data(),
                             nh);
    for (int b = 0; b < B; ++b) {
      if (slots_h[b] < 0) continue;
      be->indexer_scores(q.data() + b * nh * D, w.data() + b * nh,
                         pool.pool_keys.data() + static_cast<size_t>(slots_h[b]) * mp * D, pos.data() + b,
                         ref.data() + b * mp, nh, D, P, mp);
    }
    EXPECT_TRUE(same_bytes(download(*be, scores), download(*be, ref))) << where(B);
  }
}

TEST_F(CpuBatch, IndexerSelectEqualsTheSingleRowOp) {
  Rng rng(710);
  const int P = 4, K = 12, max_pools = 30, width = K + P - 1;
  for (int B : kBatches) {
    std::vector<float> sc(static_cast<size_t>(B) * max_pools);
    for (auto& v : sc) v = static_cast<float>(rng.integer(0, 5));  // many ties
    auto scores = upload(*be, sc);
    const auto slots_h = make_slots(rng, B, B + 1);
    const auto pos_h = make_positions(rng, slots_h, max_pools * P, -3);  // -3: refused if read
    auto s = upload(*be, slots_h), pos = upload(*be, pos_h);
    auto sel = poisoned<int32_t>(*be, static_cast<size_t>(B) * width, 0x7B);
    auto ref = poisoned<int32_t>(*be, sel.size(), 0x7B);
    be->indexer_select_batch(scores.data(), RowBatch{s.data(), pos.data(), B}, sel.data(), K, P, max_pools);
    for (int b = 0; b < B; ++b)
      if (slots_h[b] >= 0)
        be->indexer_select(scores.data() + b * max_pools, pos.data() + b, ref.data() + b * width, K, P,
                           max_pools);
    EXPECT_TRUE(same_bytes(download(*be, sel), download(*be, ref))) << where(B);
  }
}

// ---- MLA -------------------------------------------------------------------------------------------

TEST_F(CpuBatch, MlaAbsorbAndOutVEqualTheSingleRowOps) {
  Rng rng(711);
  const int nh = 3, dqk = 20, dv = 12, L = 28;
  auto W = upload(*be, rng.bf16s(static_cast<size_t>(nh) * (dqk + dv) * L, -1, 1));
  for (int B : kBatches) {
    auto q = upload(*be, rng.bf16s(static_cast<size_t>(B) * nh * dqk, -1, 1));
    auto qa = poisoned<bf16>(*be, static_cast<size_t>(B) * nh * L), qa_ref = poisoned<bf16>(*be, qa.size());
    be->mla_absorb_q_batch(q.data(), W.data(), qa.data(), B, nh, dqk, dv, L);
    for (int b = 0; b < B; ++b)
      mtplab::ops::OneRow(*be).mla_absorb_q(q.data() + b * nh * dqk, W.data(), qa_ref.data() + b * nh * L, nh,
                                            dqk, dv, L);
    EXPECT_TRUE(same_bytes(download(*be, qa), download(*be, qa_ref))) << "absorb, " << where(B);

    auto o_lat = upload(*be, rng.bf16s(static_cast<size_t>(B) * nh * L, -1, 1));
    auto o = poisoned<bf16>(*be, static_cast<size_t>(B) * nh * dv), o_ref = poisoned<bf16>(*be, o.size());
    be->mla_out_v_batch(o_lat.data(), W.data(), o.data(), B, nh, dqk, dv, L);
    for (int b = 0; b < B; ++b)
      mtplab::ops::OneRow(*be).mla_out_v(o_lat.data() + b * nh * L, W.data(), o_ref.data() + b * nh * dv, nh,
                                         dqk, dv, L);
    EXPECT_TRUE(same_bytes(download(*be, o), download(*be, o_ref))) << "out_v, " << where(B);
  }
}

TEST_F(CpuBatch, MlaDecodeReadsEachRowsOwnCacheThroughItsBlockTable) {
  Rng rng(712);
  const int nh = 3, L = Pool::kLora, width = 11;
  const int capacity = Pool::kMaxBlocks * Pool::kBlockSize;
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    for (int B : kBatches) {
      const int slots = B + 2;
      Pool pool(*be, rng, slots, dtype);
      // Fresh random latent rows in every slot (FP8: random finite codes).
      if (dtype == KvDtype::bf16) {
        const auto rows = rng.bf16s(pool.kv_data.size() / 2, -1, 1);
        be->upload(pool.kv_data.data(), rows.data(), pool.kv_data.bytes());
      } else {
        const auto rows = rng.fp8s(pool.kv_data.size());
        be->upload(pool.kv_data.data(), rows.data(), pool.kv_data.bytes());
      }
      const auto slots_h = make_slots(rng, B, slots);
      // Each live row selects up to `width` distinct rows below its own position (some -1),
      // a padded row an entry that would be refused if read.
      std::vector<int32_t> sel_h(static_cast<size_t>(B) * width, -1);
      for (int b = 0; b < B; ++b) {
        int32_t* row = sel_h.data() + static_cast<size_t>(b) * width;
        if (slots_h[b] < 0) {
          row[0] = -9;
          continue;
        }
        const int pos = rng.integer(0, capacity - 1);
        for (int i = 0; i < width; ++i) row[i] = rng.integer(0, 5) == 0 ? -1 : rng.integer(0, pos);
      }
      if (B >= 3) std::fill_n(sel_h.begin(), width, -1);  // a live row with no rows at all: zeros
      auto sel = upload(*be, sel_h), s = upload(*be, slots_h);
      auto q_abs = upload(*be, rng.bf16s(static_cast<size_t>(B) * nh * L, -1, 1));
      auto o = poisoned<bf16>(*be, static_cast<size_t>(B) * nh * L), o_ref = poisoned<bf16>(*be, o.size());
      be->mla_decode_batch(q_abs.data(), sel.data(), width, RowBatch{s.data(), nullptr, B}, pool.kv, o.data(),
                           nh, 0.3f);
      for (int b = 0; b < B; ++b) {
        if (slots_h[b] < 0) continue;
        mtplab::ops::OneRow(*be).mla_decode(q_abs.data() + b * nh * L, sel.data() + b * width, width,
                                            pool.table(slots_h[b]), pool.kv.cache, o_ref.data() + b * nh * L,
                                            nh, 0.3f);
      }
      EXPECT_TRUE(same_bytes(download(*be, o), download(*be, o_ref)))
          << (dtype == KvDtype::fp8 ? "FP8, " : "BF16, ") << where(B);
    }
  }
  Pool pool(*be, rng, 2, KvDtype::bf16);
  auto q_abs = upload(*be, rng.bf16s(static_cast<size_t>(nh) * L, -1, 1));
  auto o = poisoned<bf16>(*be, static_cast<size_t>(nh) * L);
  auto s = upload(*be, std::vector<int32_t>{1});
  auto past = upload(*be, std::vector<int32_t>{capacity});  // inside the pool, outside the slot's table
  EXPECT_THROW(be->mla_decode_batch(q_abs.data(), past.data(), 1, RowBatch{s.data(), nullptr, 1}, pool.kv,
                                    o.data(), nh, 0.3f),
               Error);
}

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

// Every row padded: the head writes nothing (the grouped experts' case: CpuMoeBatch, test_cpu_moe.cpp).
TEST_F(CpuBatch, AllRowsPaddedWritesNothing) {
  Rng rng(715);
  const int B = 4, H = 16;
  const std::vector<int32_t> none(B, -1);
  auto s = upload(*be, none);
  auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * H, -1, 1));
  auto head_out = poisoned<ArgMax>(*be, B);
  const auto head_before = download(*be, head_out);
  auto W = upload(*be, rng.bf16s(static_cast<size_t>(10) * H, -1, 1));
  be->head_argmax_batch(W.data(), nullptr, nullptr, x.data(), RowBatch{s.data(), nullptr, B}, 10, H, 0,
                        nullptr, 0, head_out.data());
  EXPECT_TRUE(same_bytes(download(*be, head_out), head_before));
}

}  // namespace
}  // namespace mtplab::ops::test
