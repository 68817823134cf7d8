// MpiCommunicator and Runtime under mpiexec (2 and 4 ranks): every expected result is computed
// locally from the (seed, rank, index) inputs of all ranks, and receive buffers are poisoned
// before each collective so that a call that writes nothing cannot pass.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <thread>
#include <vector>

#include "common/mpi.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "dist_test_util.hpp"

using namespace mtplab;
using namespace mtplab::dist;
using mtplab::dist::test::draw;
using mtplab::dist::test::draw_bf16;
using mtplab::dist::test::draw_unit;

namespace {
Runtime* g_rt = nullptr;
uint64_t g_seed = 0;

constexpr float kPoisonF = 1.0e30f;
constexpr uint16_t kPoisonBf16 = 0x7fc1;  // a NaN: never a legitimate sum here
constexpr uint64_t kPoisonU64 = 0xdeadbeefdeadbeefull;

bool same_bits(bf16 a, bf16 b) { return a.bits == b.bits; }
}  // namespace

TEST(Runtime, IdentityAndNodeLayout) {
  int rank = -1, world = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  EXPECT_EQ(g_rt->rank(), rank);
  EXPECT_EQ(g_rt->world(), world);
  EXPECT_EQ(process_identity().rank, rank);
  EXPECT_EQ(process_identity().world, world);
  // The test runs on one host: the node holds every rank, in world order.
  EXPECT_EQ(g_rt->local_size(), world);
  EXPECT_EQ(g_rt->local_rank(), rank);
  EXPECT_EQ(g_rt->num_nodes(), 1);
  EXPECT_EQ(g_rt->node_index(), 0);
  int node_size = 0;
  MPI_Comm_size(g_rt->node_comm(), &node_size);
  EXPECT_EQ(node_size, world);
}

TEST(Runtime, GatherStrings) {
  const std::string mine(static_cast<size_t>(g_rt->rank()) * 3 + 1, static_cast<char>('a' + g_rt->rank()));
  const int root = g_rt->world() - 1;
  const auto all = g_rt->gather_strings(mine, root);
  if (g_rt->rank() != root) {
    EXPECT_TRUE(all.empty());
    return;
  }
  ASSERT_EQ(static_cast<int>(all.size()), g_rt->world());
  for (int r = 0; r < g_rt->world(); ++r)
    EXPECT_EQ(all[static_cast<size_t>(r)],
              std::string(static_cast<size_t>(r) * 3 + 1, static_cast<char>('a' + r)));
}

TEST(Collectives, AllReduceSumF32) {
  Group g = g_rt->world_group();
  Communicator& c = g.connect(Transport::mpi);
  EXPECT_EQ(c.kind(), "mpi");
  EXPECT_FALSE(c.on_device());
  ASSERT_EQ(c.size(), g_rt->world());
  constexpr size_t n = 1001;
  std::vector<float> send(n), recv(n, kPoisonF), expect(n, 0.0f), bound(n, 0.0f);
  for (size_t i = 0; i < n; ++i) send[i] = draw_unit(g_seed, 1, c.rank(), i) * 100.0f;
  for (int r = 0; r < c.size(); ++r)
    for (size_t i = 0; i < n; ++i) {
      const float v = draw_unit(g_seed, 1, r, i) * 100.0f;
      expect[i] += v;
      bound[i] += std::fabs(v);
    }
  c.all_reduce_sum(send.data(), recv.data(), n);
  // MPI may add in any order: each of the size-1 fp32 adds rounds by at most 2^-24 of a partial
  // sum, and every partial sum is at most sum |x|; the local expectation rounds as much again.
  const float tol_scale = 2.0f * static_cast<float>(c.size() - 1) * std::ldexp(1.0f, -24);
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(recv[i], expect[i], tol_scale * bound[i] + 1e-30f) << "element " << i;

  // Integer-valued data sums exactly in any order: this pins the result, not just its neighbourhood.
  std::vector<float> ints(n), ints_expect(n, 0.0f);
  for (size_t i = 0; i < n; ++i)
    ints[i] = static_cast<float>(static_cast<int64_t>(draw(g_seed, 2, c.rank(), i) % 20001) - 10000);
  for (int r = 0; r < c.size(); ++r)
    for (size_t i = 0; i < n; ++i)
      ints_expect[i] += static_cast<float>(static_cast<int64_t>(draw(g_seed, 2, r, i) % 20001) - 10000);
  c.all_reduce_sum(ints.data(), ints.data(), n);  // in place
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(ints[i], ints_expect[i]) << "element " << i;
}

TEST(Collectives, AllReduceSumBf16RoundsLikeNccl) {
  Group g = g_rt->world_group();
  Communicator& c = g.connect(Transport::mpi);
  const int me = c.rank(), size = c.size();

  // (1) Only ranks 0 and 1 hold non-zero values; x + 0 is exact, so whatever order MPI sums in,
  // the result is bf16(float(a) + float(b)) rounded once, to nearest even.
  constexpr size_t n = 4099;
  std::vector<bf16> send(n), recv(n);
  for (auto& v : recv) v.bits = kPoisonBf16;
  std::vector<bf16> expect(n);
  for (size_t i = 0; i < n; ++i) {
    const bf16 a = draw_bf16(g_seed, 3, 0, i), b = draw_bf16(g_seed, 3, 1, i);
    send[i] = me == 0 ? a : me == 1 ? b : bf16{0};
    expect[i] = to_bf16(to_float(a) + to_float(b));
  }
  c.all_reduce_sum(send.data(), recv.data(), n);
  size_t rounded = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(same_bits(recv[i], expect[i]))
        << "element " << i << ": got " << to_float(recv[i]) << " expected " << to_float(expect[i]);
    const float a = to_float(draw_bf16(g_seed, 3, 0, i)), b = to_float(draw_bf16(g_seed, 3, 1, i));
    if (to_float(expect[i]) != a + b) ++rounded;
  }
  EXPECT_GT(rounded, n / 4) << "the inputs barely exercise rounding";

  // (2) Hand-picked ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (even: down to 1);
  // (1 + 2^-7) + 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 (even: up); just above half rounds up.
  const float a_vals[] = {1.0f, 1.0f + 0x1p-7f, 1.0f, -1.0f, 256.0f};
  const float b_vals[] = {0x1p-8f, 0x1p-8f, 0x1p-8f + 0x1p-14f, -0x1p-8f, 1.0f};
  const float want[] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -1.0f, 256.0f};
  constexpr size_t m = std::size(a_vals);
  std::vector<bf16> tie_send(m), tie_recv(m);
  for (size_t i = 0; i < m; ++i) {
    ASSERT_EQ(round_bf16(a_vals[i]), a_vals[i]);
    ASSERT_EQ(round_bf16(b_vals[i]), b_vals[i]);
    tie_send[i] = me == 0 ? to_bf16(a_vals[i]) : me == 1 ? to_bf16(b_vals[i]) : bf16{0};
    tie_recv[i].bits = kPoisonBf16;
  }
  c.all_reduce_sum(tie_send.data(), tie_recv.data(), m);
  for (size_t i = 0; i < m; ++i) EXPECT_EQ(to_float(tie_recv[i]), want[i]) << "tie case " << i;

  // (3) The seed's 8-lane exchange: each rank writes only its own lane, the rest zero, so a SUM
  // delivers every rank's value bit for bit (here in place).
  std::vector<bf16> lanes(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    lanes[static_cast<size_t>(r)] = r == me ? draw_bf16(g_seed, 4, r, 0) : bf16{0};
  c.all_reduce_sum(lanes.data(), lanes.data(), lanes.size());
  for (int r = 0; r < size; ++r)
    EXPECT_TRUE(same_bits(lanes[static_cast<size_t>(r)], draw_bf16(g_seed, 4, r, 0))) << "lane " << r;

  // (4) Every rank contributes: the order is MPI's, so check against the fp32 sum within the
  // rounding of size-1 BF16 adds (2^-8 of a partial sum each, partials <= sum |x|).
  std::vector<bf16> all_send(n), all_recv(n);
  for (auto& v : all_recv) v.bits = kPoisonBf16;
  for (size_t i = 0; i < n; ++i) all_send[i] = draw_bf16(g_seed, 5, me, i);
  c.all_reduce_sum(all_send.data(), all_recv.data(), n);
  for (size_t i = 0; i < n; ++i) {
    double exact = 0, mag = 0;
    for (int r = 0; r < size; ++r) {
      exact += to_float(draw_bf16(g_seed, 5, r, i));
      mag += std::fabs(to_float(draw_bf16(g_seed, 5, r, i)));
    }
    ASSERT_LE(std::fabs(to_float(all_recv[i]) - exact), (size - 1) * std::ldexp(1.0, -8) * mag)
        << "element " << i;
  }
}

TEST(Collectives, AllReduceMaxU64IsUnsignedWithTies) {
  Group g = g_rt->world_group();
  Communicator& c = g.connect(Transport::mpi);
  constexpr size_t n = 2053;
  auto value = [](int r, size_t i) -> uint64_t {
    const uint64_t x = draw(g_seed, 6, r, i);
    switch (i % 3) {
      case 0:
        return draw(g_seed, 7, 0, i);  // identical on every rank: a full tie
      case 1:
        return (x % 3) << 62 | (i & 0xff);  // few distinct values, top bit often set
      default:
        return x;  // anything, half of them >= 2^63
    }
  };
  std::vector<uint64_t> send(n), recv(n, kPoisonU64), expect(n, 0);
  for (size_t i = 0; i < n; ++i) send[i] = value(c.rank(), i);
  for (int r = 0; r < c.size(); ++r)
    for (size_t i = 0; i < n; ++i) expect[i] = std::max(expect[i], value(r, i));
  c.all_reduce_max(send.data(), recv.data(), n);
  size_t high = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(recv[i], expect[i]) << "element " << i;
    high += expect[i] >> 63;
  }
  EXPECT_GT(high, n / 4) << "a signed max would not be caught";
  c.all_reduce_max(send.data(), send.data(), n);  // in place
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(send[i], expect[i]) << "in place, element " << i;
}

TEST(Collectives, AllGatherIsInRankOrder) {
  Group g = g_rt->world_group();
  Communicator& c = g.connect(Transport::mpi);
  constexpr size_t bytes = 13;  // odd on purpose
  auto byte = [](int r, size_t j) { return static_cast<unsigned char>(draw(g_seed, 8, r, j)); };
  std::vector<unsigned char> send(bytes), recv(bytes * static_cast<size_t>(c.size()), 0xa5);
  for (size_t j = 0; j < bytes; ++j) send[j] = byte(c.rank(), j);
  // Poison with the complement of what is expected, so no byte can be right by accident.
  for (int r = 0; r < c.size(); ++r)
    for (size_t j = 0; j < bytes; ++j)
      recv[static_cast<size_t>(r) * bytes + j] = static_cast<unsigned char>(~byte(r, j));
  c.all_gather(send.data(), recv.data(), bytes);
  for (int r = 0; r < c.size(); ++r)
    for (size_t j = 0; j < bytes; ++j)
      ASSERT_EQ(recv[static_cast<size_t>(r) * bytes + j], byte(r, j)) << "rank " << r << " byte " << j;

  // In place: this rank's slot already holds its data.
  std::vector<unsigned char> inplace(recv.size());
  for (size_t k = 0; k < inplace.size(); ++k) inplace[k] = static_cast<unsigned char>(~recv[k]);
  unsigned char* mine = inplace.data() + static_cast<size_t>(c.rank()) * bytes;
  std::memcpy(mine, send.data(), bytes);
  c.all_gather(mine, inplace.data(), bytes);
  EXPECT_EQ(inplace, recv);
}

TEST(Collectives, BroadcastFromNonZeroRoot) {
  Group g = g_rt->world_group();
  Communicator& c = g.connect(Transport::mpi);
  for (const int root : {c.size() - 1, 1 % c.size()}) {
    constexpr size_t bytes = 37;
    std::vector<unsigned char> buf(bytes);
    for (size_t j = 0; j < bytes; ++j) {
      const auto want = static_cast<unsigned char>(draw(g_seed, 9, root, j));
      buf[j] = c.rank() == root ? want : static_cast<unsigned char>(~want);
    }
    c.broadcast(buf.data(), bytes, root);
    for (size_t j = 0; j < bytes; ++j)
      ASSERT_EQ(buf[j], static_cast<unsigned char>(draw(g_seed, 9, root, j)))
          << "root " << root << " byte " << j;
  }
  unsigned char one = 0;
  EXPECT_THROW(c.broadcast(&one, 1, c.size()), Error);  // checked before any rank communicates
}

TEST(Collectives, BarrierWaitsForTheLastRank) {
  Group g = g_rt->world_group();
  Communicator& c = g.connect(Transport::mpi);
  constexpr auto delay = std::chrono::milliseconds(300);
  c.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (c.rank() == 0) std::this_thread::sleep_for(delay);
  c.barrier();
  const auto waited = std::chrono::steady_clock::now() - t0;
  // Nobody can leave before rank 0 arrives; 50 ms of slack for clock and wake-up granularity.
  EXPECT_GE(waited, delay - std::chrono::milliseconds(50));
}

TEST(Groups, SplitByColourOrderedByKey) {
  const int me = g_rt->rank(), world = g_rt->world();
  const int colour = me % 2;
  Group g = g_rt->make_group(colour, /*key=*/-me);  // descending world rank inside a group
  std::vector<int> members;                         // the group's world ranks, in group order
  for (int r = world - 1; r >= 0; --r)
    if (r % 2 == colour) members.push_back(r);
  ASSERT_EQ(g.size(), static_cast<int>(members.size()));
  const int my_index = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  EXPECT_EQ(g.rank(), my_index);
  EXPECT_FALSE(g.connected());
  EXPECT_THROW(g.comm(), Error);

  Communicator& c = g.connect(Transport::mpi);
  EXPECT_EQ(c.rank(), g.rank());
  EXPECT_EQ(c.size(), g.size());
  constexpr size_t n = 257;
  std::vector<float> send(n), recv(n, kPoisonF), expect(n, 0.0f);
  // Integer-valued: exact in any order, and different per world rank, so a sum over the wrong
  // members is caught.
  auto v = [](int r, size_t i) {
    return static_cast<float>(static_cast<int64_t>(draw(g_seed, 10, r, i) % 2001) - 1000);
  };
  for (size_t i = 0; i < n; ++i) send[i] = v(me, i);
  for (const int r : members)
    for (size_t i = 0; i < n; ++i) expect[i] += v(r, i);
  c.all_reduce_sum(send.data(), recv.data(), n);
  EXPECT_EQ(recv, expect);

  std::vector<int> gathered(members.size(), -1);
  c.all_gather(&me, gathered.data(), sizeof(int));
  EXPECT_EQ(gathered, members);

  int from_root = me == members[0] ? 1000 + me : -1;
  c.broadcast(&from_root, sizeof from_root, 0);
  EXPECT_EQ(from_root, 1000 + members[0]);

  // Groups move; the moved-from one is empty.
  Group moved = std::move(g);
  EXPECT_EQ(moved.size(), static_cast<int>(members.size()));
  EXPECT_EQ(g.mpi(), MPI_COMM_NULL);
  EXPECT_THROW(g_rt->make_group(-1, 0), Error);
}

TEST(Factory, PicksByTransport) {
  EXPECT_EQ(transport_for_backend("cpu"), Transport::mpi);
  EXPECT_EQ(transport_for_backend("cuda"), Transport::nccl);
  EXPECT_THROW(transport_for_backend("tpu"), Error);
  Group g = g_rt->world_group();
  auto c = make_communicator(g.mpi(), Transport::mpi);
  EXPECT_EQ(c->kind(), "mpi");
  c->wait();  // a no-op for MPI: must simply return
  if (!nccl_available()) {
    EXPECT_THROW(make_communicator(g.mpi(), Transport::nccl), Error);
  } else if (visible_gpu_count() == 0) {
    // Every rank fails before its first collective, so this cannot hang.
    try {
      make_communicator(g.mpi(), Transport::nccl);
      ADD_FAILURE() << "an NCCL communicator without a GPU";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("cuda"), std::string::npos) << e.message();
    }
  }
}

int main(int argc, char** argv) {
  return mtplab::test::mpi_test_main(argc, argv, [](Runtime& rt) {
    g_rt = &rt;
    g_seed = dist::test::shared_seed(rt);
    return mtplab::test::run_all_tests_on_every_rank(rt);
  });
}
