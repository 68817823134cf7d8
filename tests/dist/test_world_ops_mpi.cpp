// dist/world_ops under mpiexec (2 and 3 ranks): every rank holds different values, drawn from
// (seed, rank, index), so each expected result is computed locally from all ranks' inputs and a
// reduction that used the wrong op, the wrong root or only some ranks fails. Receive sides are
// poisoned first; chunk sizes that do not divide the count exercise the split into pieces.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error_of.hpp"
#include "common/mpi.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "dist/world_ops.hpp"
#include "dist_test_util.hpp"

using namespace mtplab;
using namespace mtplab::dist;
using mtplab::dist::test::draw;

namespace {
Runtime* g_rt = nullptr;
uint64_t g_seed = 0;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// A value of rank r at index i that differs across ranks and indices, in [-1000, 1000].
int32_t small_int(uint64_t stream, int r, uint64_t i) {
  return static_cast<int32_t>(draw(g_seed, stream, r, i) % 2001) - 1000;
}

const size_t kChunks[] = {1, 7, 64, kMaxChunkElements};
}  // namespace

TEST(WorldOps, BroadcastScalarSpanAndVectorFromTheLastRank) {
  const Group g = g_rt->world_group();
  const int root = g.size() - 1;  // not 0: a broadcast that ignores its root fails
  int64_t scalar = g.rank() == root ? static_cast<int64_t>(draw(g_seed, 1, root, 0) >> 1) : -1;
  broadcast(g, scalar, root);
  EXPECT_EQ(scalar, static_cast<int64_t>(draw(g_seed, 1, root, 0) >> 1));

  for (const size_t chunk : kChunks) {
    std::vector<double> span_data(101, -7.0);
    if (g.rank() == root)
      for (size_t i = 0; i < span_data.size(); ++i) span_data[i] = small_int(2, root, i) * 0.25;
    broadcast(g, std::span<double>(span_data), root, chunk);
    for (size_t i = 0; i < span_data.size(); ++i) ASSERT_EQ(span_data[i], small_int(2, root, i) * 0.25) << i;
  }

  // A vector: every rank starts with another length; the root's length and elements arrive.
  std::vector<uint64_t> v(static_cast<size_t>(g.rank()) * 5 + 3, 0xdeadbeefull);
  for (size_t i = 0; i < v.size(); ++i)
    if (g.rank() == root) v[i] = draw(g_seed, 3, root, i);
  broadcast(g, v, root, 4);
  ASSERT_EQ(v.size(), static_cast<size_t>(root) * 5 + 3);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], draw(g_seed, 3, root, i)) << i;

  // BF16 travels as its bits.
  std::vector<bf16> h(9, bf16{0x7fc1});
  if (g.rank() == root)
    for (size_t i = 0; i < h.size(); ++i) h[i] = bf16{static_cast<uint16_t>(draw(g_seed, 4, root, i))};
  broadcast(g, std::span<bf16>(h), root);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(h[i].bits, static_cast<uint16_t>(draw(g_seed, 4, root, i)));
}

TEST(WorldOps, BroadcastStrings) {
  const Group g = g_rt->world_group();
  const int root = g.size() - 1;
  const std::string sent = std::string("from the last rank, with a NUL ") + '\0' + " inside";
  std::string text = g.rank() == root ? sent : std::string(static_cast<size_t>(g.rank()) + 40, 'x');
  broadcast(g, text, root);
  EXPECT_EQ(text, sent);

  const std::vector<std::string> list = {"alpha", "", "gamma, delta", std::string(300, 'z')};
  std::vector<std::string> texts = g.rank() == root ? list : std::vector<std::string>{"stale"};
  broadcast(g, texts, root);
  EXPECT_EQ(texts, list);
}

TEST(WorldOps, AllReduceScalars) {
  const Group g = g_rt->world_group();
  const int n = g.size();
  // int: a different value on every rank.
  const int mine = small_int(5, g.rank(), 0);
  int want_min = std::numeric_limits<int>::max(), want_max = std::numeric_limits<int>::min(), want_sum = 0;
  for (int r = 0; r < n; ++r) {
    want_min = std::min(want_min, small_int(5, r, 0));
    want_max = std::max(want_max, small_int(5, r, 0));
    want_sum += small_int(5, r, 0);
  }
  EXPECT_EQ(all_reduce(g, mine, ReduceOp::min), want_min);
  EXPECT_EQ(all_reduce(g, mine, ReduceOp::max), want_max);
  EXPECT_EQ(all_reduce(g, mine, ReduceOp::sum), want_sum);
  // uint64 above 2^63: a signed comparison would pick another maximum.
  const uint64_t u = draw(g_seed, 6, g.rank(), 0) | (g.rank() == 0 ? (uint64_t{1} << 63) : 0);
  uint64_t umax = 0, umin = ~uint64_t{0};
  for (int r = 0; r < n; ++r) {
    const uint64_t x = draw(g_seed, 6, r, 0) | (r == 0 ? (uint64_t{1} << 63) : 0);
    umax = std::max(umax, x);
    umin = std::min(umin, x);
  }
  EXPECT_EQ(all_reduce(g, u, ReduceOp::max), umax);
  EXPECT_EQ(all_reduce(g, u, ReduceOp::min), umin);
  // double: small integers in quarters sum exactly in any order.
  double dsum = 0;
  for (int r = 0; r < n; ++r) dsum += small_int(7, r, 0) * 0.25;
  EXPECT_EQ(all_reduce(g, small_int(7, g.rank(), 0) * 0.25, ReduceOp::sum), dsum);
}

TEST(WorldOps, AllReduceVectorsInPieces) {
  const Group g = g_rt->world_group();
  constexpr size_t count = 1001;
  for (const ReduceOp op : {ReduceOp::min, ReduceOp::max, ReduceOp::sum}) {
    for (const size_t chunk : kChunks) {
      std::vector<int64_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = small_int(8, g.rank(), i);
      all_reduce(g, std::span<int64_t>(v), op, chunk);
      for (size_t i = 0; i < count; ++i) {
        int64_t want = small_int(8, 0, i);
        for (int r = 1; r < g.size(); ++r) {
          const int64_t x = small_int(8, r, i);
          want = op == ReduceOp::min ? std::min(want, x) : op == ReduceOp::max ? std::max(want, x) : want + x;
        }
        ASSERT_EQ(v[i], want) << to_string(op) << " chunk " << chunk << " index " << i;
      }
    }
  }
}

TEST(WorldOps, ReduceMaxToRootLeavesTheOthersAlone) {
  const Group g = g_rt->world_group();
  const int root = g.size() - 1;
  for (const size_t chunk : kChunks) {
    std::vector<double> v(257);
    for (size_t i = 0; i < v.size(); ++i) v[i] = small_int(9, g.rank(), i) * 0.5;
    const std::vector<double> own = v;
    reduce_max_to_root(g, v, root, chunk);
    for (size_t i = 0; i < v.size(); ++i) {
      double want = small_int(9, 0, i) * 0.5;
      for (int r = 1; r < g.size(); ++r) want = std::max(want, small_int(9, r, i) * 0.5);
      if (g.rank() == root) {
        ASSERT_EQ(v[i], want) << "chunk " << chunk << " index " << i;
      } else {
        ASSERT_EQ(v[i], own[i]) << "a non-root buffer changed, chunk " << chunk << " index " << i;
      }
    }
  }
  // A sum to root 0.
  int32_t x = small_int(10, g.rank(), 0);
  reduce(g, std::span<int32_t>(&x, 1), ReduceOp::sum, 0);
  if (g.rank() == 0) {
    int32_t want = 0;
    for (int r = 0; r < g.size(); ++r) want += small_int(10, r, 0);
    EXPECT_EQ(x, want);
  }
}

TEST(WorldOps, MinMaxAndAgreement) {
  const Group g = g_rt->world_group();
  const auto ranks = min_max(g, static_cast<int64_t>(g.rank()) * 10 - 5);
  EXPECT_EQ(ranks.min, -5);
  EXPECT_EQ(ranks.max, static_cast<int64_t>(g.size() - 1) * 10 - 5);
  EXPECT_FALSE(ranks.agree());
  EXPECT_TRUE(all_agree(g, draw(g_seed, 11, 0, 0)));  // the same value everywhere
  // Only the last rank differs, in the top bit.
  const uint64_t same = draw(g_seed, 12, 0, 0) & ~(uint64_t{1} << 63);
  EXPECT_FALSE(all_agree(g, g.rank() == g.size() - 1 ? same | (uint64_t{1} << 63) : same));
}

TEST(WorldOps, BarrierWaitsForTheSlowestRank) {
  const Group g = g_rt->world_group();
  barrier(g);  // line the ranks up
  const auto t0 = std::chrono::steady_clock::now();
  if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  barrier(g);
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // Every rank leaves the second barrier after rank 0 entered it; the margin allows for ranks
  // that left the first barrier late on an oversubscribed machine.
  EXPECT_GE(waited_ms, 150.0) << "rank " << g.rank();
}

TEST(WorldOps, MisuseIsNamedBeforeAnyMpiCall) {
  const Group g = g_rt->world_group();
  int x = 0;
  std::string m = mtplab::test::error_of([&] { broadcast(g, x, g.size()); });
  EXPECT_TRUE(has(m, "dist::broadcast: root " + std::to_string(g.size()) + " outside [0, ")) << m;
  m = mtplab::test::error_of([&] { reduce(g, std::span<int>(&x, 1), ReduceOp::max, -1); });
  EXPECT_TRUE(has(m, "dist::reduce: root -1 outside")) << m;
  m = mtplab::test::error_of([&] { all_reduce(g, std::span<int>(&x, 1), ReduceOp::sum, 0); });
  EXPECT_TRUE(has(m, "dist::all_reduce: chunk 0 outside [1, INT_MAX]")) << m;
  const Group empty;
  m = mtplab::test::error_of([&] { barrier(empty); });
  EXPECT_TRUE(has(m, "dist::barrier on an empty group")) << m;
  m = mtplab::test::error_of([&] { (void)all_reduce(empty, 1, ReduceOp::max); });
  EXPECT_TRUE(has(m, "dist::all_reduce on an empty group")) << m;
}

// ---- the bounded wait ------------------------------------------------------------------------------

// A wait that is expected to outlast the timeout does so under a PatientWait (rank 0 working
// alone while the others wait for it); without one the same wait would end the job, which
// dist_failure.stop shows in a process of its own. And a wait shorter than the timeout completes.
TEST(WorldOps, PatientWaitOutlastsTheTimeout) {
  const Group g = g_rt->world_group();
  const double before = mpi_timeout_s();
  set_mpi_timeout_s(0.5);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::optional<PatientWait> patient;
    if (g.rank() != 0) patient.emplace("rank 0 works alone (test)");
    if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    barrier(g);
  }
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited_s, 1.4) << "rank " << g.rank();
  set_mpi_timeout_s(2.0);
  if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(all_reduce(g, g.rank() + 1, ReduceOp::sum), g.size() * (g.size() + 1) / 2);
  set_mpi_timeout_s(before);
  EXPECT_THROW(set_mpi_timeout_s(0), Error);
  EXPECT_THROW(set_mpi_timeout_s(std::numeric_limits<double>::infinity()), Error);
}

// run_agreed: one rank fails; every rank learns it, and only that rank reports it.
TEST(WorldOps, RunAgreedTellsEveryRankWhoFailed) {
  const Group g = g_rt->world_group();
  const int failing = g.size() - 1;
  try {
    run_agreed([&] { MTP_REQUIRE(g.rank() != failing, "rank ", g.rank(), " cannot open x.yaml"); });
    ADD_FAILURE() << "rank " << g.rank() << ": run_agreed returned although rank " << failing << " failed";
  } catch (const AgreedError& e) {
    EXPECT_EQ(e.reporter(), failing);
    EXPECT_EQ(e.reports(), g.rank() == failing);
    if (g.rank() == failing)
      EXPECT_EQ(e.message(), str("rank ", failing, " cannot open x.yaml"));
    else
      EXPECT_EQ(e.message(), str("rank ", failing, " failed (see its message)"));
  }
  EXPECT_TRUE(failure_agreed());
  // Every rank failing: the lowest, rank 0, reports.
  try {
    run_agreed([&] { MTP_FAIL("bad experiment"); });
    ADD_FAILURE() << "run_agreed returned";
  } catch (const AgreedError& e) {
    EXPECT_EQ(e.reporter(), 0);
    EXPECT_EQ(e.message(), "bad experiment");
  }
  int runs = 0;
  run_agreed([&] { ++runs; });  // no failure anywhere: returns on every rank
  EXPECT_EQ(runs, 1);
}

int main(int argc, char** argv) {
  return mtplab::test::mpi_test_main(argc, argv, [](Runtime& rt) {
    g_rt = &rt;
    g_seed = dist::test::shared_seed(rt);
    return mtplab::test::run_all_tests_on_every_rank(rt);
  });
}
