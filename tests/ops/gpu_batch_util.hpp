// What the batched GPU op tests share (test_gpu_batch.cpp and the family files): the CPU
// reference on every core (on_cpu_rows), large inputs filled in parallel and uploaded (Big), row
// slots with padded rows between live ones, the comparisons over the elements an op writes (the
// rest must keep its poison), and the ragged batches of rows (Ragged, ragged_layouts).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.hpp"

namespace mtplab::ops::gputest {

inline constexpr int kBatches[] = {1, 3, 16, 64, 128};

inline std::string where(const std::string& what, int B) { return what + ", B = " + std::to_string(B); }

// ---- the CPU reference on every core -----------------------------------------------------------------

inline int cpu_workers() {
  const unsigned n = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(n, 1u, 16u));
}

/// fn(be, b0, b1) over contiguous row ranges covering [0, rows), each on its own CPU backend and
/// thread. Backend memory of the CPU is host memory, so every backend reads the test's buffers.
inline void on_cpu_rows(int rows, const std::function<void(Backend&, int, int)>& fn) {
  static std::vector<std::unique_ptr<Backend>> pool;
  const int n = std::max(1, std::min(rows, cpu_workers()));
  while (static_cast<int>(pool.size()) < n) pool.push_back(make_cpu_backend());
  std::vector<std::thread> threads;
  std::exception_ptr error;
  std::mutex m;
  for (int w = 0; w < n; ++w) {
    const int b0 = static_cast<int>(static_cast<int64_t>(rows) * w / n);
    const int b1 = static_cast<int>(static_cast<int64_t>(rows) * (w + 1) / n);
    threads.emplace_back([&, w, b0, b1] {
      try {
        if (b1 > b0) fn(*pool[static_cast<size_t>(w)], b0, b1);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

/// fill(rng, i) for every i < n, in chunks on every core (each chunk its own seeded generator).
template <typename T, typename Fill>
inline void parallel_fill(T* p, size_t n, uint64_t salt, Fill&& fill) {
  constexpr size_t kChunk = size_t{1} << 22;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < cpu_workers(); ++w) {
    threads.emplace_back([&] {
      for (size_t c = next++; c < chunks; c = next++) {
        Rng rng(salt * 0x10001 + c);
        const size_t end = std::min(n, (c + 1) * kChunk);
        for (size_t i = c * kChunk; i < end; ++i) p[i] = fill(rng);
      }
    });
  }
  for (auto& t : threads) t.join();
}

/// A large input on both backends: filled in place in the CPU backend's (host) memory, uploaded.
template <typename T>
struct Big {
  Array<T> c, g;
  explicit Big(size_t n) : c(cpu(), n), g(gpu(), n) {}
  void upload() { gpu().upload(g.data(), c.data(), c.bytes()); }
  size_t size() const { return c.size(); }
};

inline Big<bf16> big_bf16(size_t n, float lo, float hi, uint64_t salt) {
  Big<bf16> b(n);
  parallel_fill(b.c.data(), n, salt, [lo, hi](Rng& r) { return to_bf16(r.uniform(lo, hi)); });
  b.upload();
  return b;
}
inline Big<float> big_f32(size_t n, float lo, float hi, uint64_t salt) {
  Big<float> b(n);
  parallel_fill(b.c.data(), n, salt, [lo, hi](Rng& r) { return r.uniform(lo, hi); });
  b.upload();
  return b;
}
inline Big<fp8e4m3> big_fp8(size_t n, uint64_t salt) {
  Big<fp8e4m3> b(n);
  parallel_fill(b.c.data(), n, salt, [](Rng& r) { return r.fp8(); });
  b.upload();
  return b;
}

/// The rows' slots: distinct slots of a pool of `slots` in shuffled order; for B >= 3 rows 1, the
/// last and every 5th are padded (-1), so padded rows sit between live ones.
inline std::vector<int32_t> make_slots(Rng& rng, int rows, int slots) {
  std::vector<int32_t> all(static_cast<size_t>(slots));
  std::iota(all.begin(), all.end(), 0);
  rng.shuffle(all);
  std::vector<int32_t> s(all.begin(), all.begin() + rows);
  if (rows >= 3)
    for (int b = 0; b < rows; ++b)
      if (b == 1 || b == rows - 1 || b % 5 == 4) s[static_cast<size_t>(b)] = -1;
  return s;
}

/// Rows of context per slot (short: a few pools past the first sparse selection) and the block size.
inline int max_rows_for(const Shape& s) { return s.hidden >= 4096 ? 2560 : s.hidden >= 1024 ? 1024 : 64; }
inline int block_size_for(const Shape& s) { return s.hidden >= 1024 ? 64 : 16; }

/// Kernels the op enqueued: run it between two reads of the backend's counter.
template <typename F>
inline uint64_t kernels_of(F&& op) {
  const uint64_t before = gpu().kernels_enqueued();
  op();
  return gpu().kernels_enqueued() - before;
}

// ---- comparisons over the elements an op writes --------------------------------------------------------

/// mask[b * ld + j] = 1 for j < n of every row b with live(b).
inline std::vector<uint8_t> row_mask(int rows, size_t ld, size_t n, const std::vector<int32_t>* slots) {
  std::vector<uint8_t> m(static_cast<size_t>(rows) * ld, 0);
  for (int b = 0; b < rows; ++b) {
    if (slots && (*slots)[static_cast<size_t>(b)] < 0) continue;
    std::fill_n(m.begin() + static_cast<ptrdiff_t>(b * ld), n, 1);
  }
  return m;
}

template <typename T>
std::vector<T> masked(const std::vector<T>& v, const std::vector<uint8_t>& mask) {
  std::vector<T> out;
  for (size_t i = 0; i < v.size(); ++i)
    if (mask[i]) out.push_back(v[i]);
  return out;
}

/// Every element outside `mask` has the reference's bytes (poison, or cache rows the op must not touch).
template <typename T>
inline void expect_outside_unchanged(const std::vector<T>& got, const std::vector<T>& want,
                                     const std::vector<uint8_t>& mask, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(mask.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (mask[i] || std::memcmp(&got[i], &want[i], sizeof(T)) == 0) continue;
    if (bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements the op must not write changed, first at " << first
                     << "; " << seed_note();
}

/// BF16 outputs: the written elements within the BF16 tolerance, the rest unchanged.
inline void expect_bf16_written(const std::vector<bf16>& got, const std::vector<bf16>& want,
                                const std::vector<uint8_t>& mask, const std::string& what,
                                Tolerance tol = {}) {
  expect_bf16_close(masked(got, mask), masked(want, mask), what, tol);
  expect_outside_unchanged(got, want, mask, what + " (outside the written rows)");
}

/// fp32 with -inf: where the CPU has -inf the GPU must too; elsewhere |g - c| <= rel |c| + floor
/// (floor relative to the largest finite |c|).
inline void expect_f32_with_inf(const std::vector<float>& got, const std::vector<float>& want,
                                const std::string& what, double rel, double floor_rel) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0;
  for (float v : want)
    if (std::isfinite(v)) largest = std::max(largest, static_cast<double>(std::fabs(v)));
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], c = want[i];
    const bool ok = std::isinf(c) ? (std::isinf(g) && (g < 0) == (c < 0))
                                  : std::fabs(g - c) <= rel * std::fabs(c) + floor_rel * largest;
    if (!ok && bad++ < 5)
      first += "\n  [" + std::to_string(i) + "] gpu " + std::to_string(g) + " cpu " + std::to_string(c);
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " outside rel " << rel << " + "
                     << floor_rel << " of " << largest << "; " << seed_note() << first;
}

inline uint64_t host_key(const ArgMax& a) {
  uint64_t key = 0;
  cpu().argmax_pack_key(&a, &key);  // CPU backend memory is host memory
  return key;
}

// ---- the slot pool ---------------------------------------------------------------------------------------

/// Block tables of `slots` slots, max_blocks each: a shuffled permutation of the whole block pool.
inline std::vector<int32_t> make_tables(Rng& rng, int slots, int max_blocks) {
  std::vector<int32_t> t(static_cast<size_t>(slots) * max_blocks);
  std::iota(t.begin(), t.end(), 0);
  rng.shuffle(t);
  return t;
}

/// Positions: live rows at different positions of [0, capacity), the first live rows at the two
/// ends; padded rows at `pad` (past every slot: a write there would fault or land in another slot).
inline std::vector<int32_t> make_positions(Rng& rng, const std::vector<int32_t>& slots, int capacity,
                                           int32_t pad) {
  std::vector<int32_t> pos(slots.size());
  int live = 0;
  for (size_t b = 0; b < slots.size(); ++b) {
    if (slots[b] < 0) {
      pos[b] = pad;
      continue;
    }
    pos[b] = live == 0 ? capacity - 1 : live == 1 ? 0 : rng.integer(0, capacity - 1);
    ++live;
  }
  return pos;
}

/// E4M3 codes within one step of each other (same sign), and >= 90% identical.
inline void expect_fp8_codes_close(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0, same = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    same += got[i] == want[i];
    const bool zeros = (got[i] & 0x7f) == 0 && (want[i] & 0x7f) == 0;
    const bool close = ((got[i] ^ want[i]) & 0x80) == 0 && std::abs((got[i] & 0x7f) - (want[i] & 0x7f)) <= 1;
    bad += !(zeros || close);
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " codes more than one step apart; " << seed_note();
  if (!got.empty()) {
    EXPECT_GE(static_cast<double>(same) / static_cast<double>(got.size()), 0.9)
        << what << "; " << seed_note();
  }
}

// ---- ragged rows ---------------------------------------------------------------------------------------

/// One sequence of a ragged batch: `count` rows of slot `slot` at positions start .. start + count - 1.
struct Seq {
  int slot, start, count;
};

/// A ragged batch (ops.hpp, "ragged rows") over a pool of `slots` slots: each sequence's rows
/// consecutive at ascending positions; padded rows (slot -1) at a position past every slot.
struct Ragged {
  std::string name;
  std::vector<Seq> seqs;
  std::vector<int32_t> slot, pos;
  int max_seq_rows = 1;
  int slots = 0;
  int rows() const { return static_cast<int>(slot.size()); }
};

/// Sequences of counts[i] rows in distinct shuffled slots of a pool of counts.size() + 1 (one slot
/// no row names), each at a random start in [0, capacity - count]; with two or more sequences the
/// first starts at 0 (an empty slot) and the second ends at capacity - 1. With `pad`, a padded row
/// before every third sequence (from the second) and one after the last.
inline Ragged make_ragged(Rng& rng, std::string name, const std::vector<int>& counts, int capacity,
                          bool pad) {
  Ragged r;
  r.name = std::move(name);
  const int n = static_cast<int>(counts.size());
  r.slots = n + 1;
  std::vector<int32_t> ids(static_cast<size_t>(r.slots));
  std::iota(ids.begin(), ids.end(), 0);
  rng.shuffle(ids);
  auto padded = [&r] {
    r.slot.push_back(-1);
    r.pos.push_back(1 << 20);  // a write there would fault or land in another slot
  };
  for (int i = 0; i < n; ++i) {
    const int c = counts[static_cast<size_t>(i)];
    const int start = n >= 2 && i == 0 ? 0 : n >= 2 && i == 1 ? capacity - c : rng.integer(0, capacity - c);
    r.seqs.push_back({ids[static_cast<size_t>(i)], start, c});
    if (pad && i % 3 == 1) padded();
    for (int k = 0; k < c; ++k) {
      r.slot.push_back(ids[static_cast<size_t>(i)]);
      r.pos.push_back(start + k);
    }
    r.max_seq_rows = std::max(r.max_seq_rows, c);
  }
  if (pad) padded();
  return r;
}

/// The ragged batches every batched op is checked over: 1 row; B = 3, 16, 64 and 128 sequences of
/// one row; one sequence of n = 1 .. 64 rows (thin: n = 1 .. 5, 16, 17, 32, 33, 48, 49, 63, 64,
/// for shapes whose CPU reference is the cost); B = 4, 16 and 64 sequences of 2 .. 5 rows (the
/// first four 2, 3, 4 and 5 rows, the others random; shuffled) at different lengths and positions
/// in one batch. Sequences as make_ragged places them within `capacity` rows (at least 64) of a
/// slot, padded rows among them from B = 3 (and after odd single sequences).
inline std::vector<Ragged> ragged_layouts(Rng& rng, int capacity, bool thin) {
  std::vector<Ragged> layouts;
  layouts.push_back(make_ragged(rng, "1 row", {1}, capacity, false));
  for (int B : {3, 16, 64, 128})
    layouts.push_back(make_ragged(rng, "B = " + std::to_string(B) + " sequences of one row",
                                  std::vector<int>(static_cast<size_t>(B), 1), capacity, true));
  for (int n = 1; n <= 64; ++n) {
    if (thin && !(n <= 5 || n % 16 <= 1 || n == 63)) continue;
    layouts.push_back(
        make_ragged(rng, "one sequence of " + std::to_string(n) + " rows", {n}, capacity, n % 2 == 1));
  }
  for (int B : {4, 16, 64}) {
    std::vector<int> counts(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) counts[static_cast<size_t>(i)] = i < 4 ? 2 + i : rng.integer(2, 5);
    rng.shuffle(counts);
    layouts.push_back(
        make_ragged(rng, "B = " + std::to_string(B) + " sequences of 2 .. 5 rows", counts, capacity, true));
  }
  return layouts;
}

}  // namespace mtplab::ops::gputest
