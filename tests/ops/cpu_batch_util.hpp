// What the batched CPU op tests of several families share (test_cpu_batch.cpp, test_cpu_mla.cpp,
// test_cpu_indexer.cpp): a pool of slots (the latent KV block pool behind shuffled block tables and
// the slot-major indexer arrays, all poisoned), the ragged-row rules of an op that writes caches,
// and the rows' positions.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "cpu_test_util.hpp"

namespace mtplab::ops::test {

using ::mtplab::test::error_of;

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
inline std::vector<uint8_t> indexer_bytes(Backend& be, const Pool& pool) {
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
inline void expect_ragged_write_rules(Backend& be, Write&& write, Bytes&& bytes) {
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
inline std::vector<int32_t> make_positions(Rng& rng, const std::vector<int32_t>& slots, int capacity,
                                           int32_t pad_pos) {
  std::vector<int32_t> pos(slots.size());
  for (size_t b = 0; b < slots.size(); ++b) pos[b] = slots[b] < 0 ? pad_pos : rng.integer(0, capacity - 1);
  return pos;
}

}  // namespace mtplab::ops::test
