// NcclCommunicator on real GPUs, run as `mpiexec -n 2` on a node with at least 2 GPUs (exits 77,
// "skipped", otherwise). Each result is checked against a local expectation and against the
// MpiCommunicator on the same inputs (bit for bit where the order of a 2-rank sum cannot differ);
// device outputs are poisoned before each collective. Also covered: in-place calls, sub-groups
// with a reversed key, many calls then one wait(), a captured CUDA graph, the NCCL_* environment
// left alone, and the timeout path (a rank skips a collective: the waiting rank must get an
// mtplab::Error after the timeout, with the communicator aborted, instead of hanging).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <thread>
#include <vector>

#include "common/mpi.hpp"
#include "core/error.hpp"
#include "dist/check.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "dist_test_util.hpp"

extern char** environ;

using namespace mtplab;
using namespace mtplab::dist;
using mtplab::dist::test::draw;
using mtplab::dist::test::draw_bf16;
using mtplab::dist::test::draw_unit;

namespace {
Runtime* g_rt = nullptr;
uint64_t g_seed = 0;
cudaStream_t g_stream = nullptr;

/// Device memory for `n` elements of T, released on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    MTP_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }
  void upload(const std::vector<T>& host) {
    MTP_REQUIRE(host.size() == n_, "upload size");
    MTP_CUDA_CHECK(cudaMemcpyAsync(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, g_stream));
  }
  void poison(unsigned char byte) { MTP_CUDA_CHECK(cudaMemsetAsync(ptr_, byte, n_ * sizeof(T), g_stream)); }
  /// Call after the communicator's wait().
  std::vector<T> download() const {
    std::vector<T> host(n_);
    MTP_CUDA_CHECK(cudaMemcpyAsync(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost, g_stream));
    MTP_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

/// The world as an NCCL group and as an MPI group, for side-by-side results.
struct Pair {
  Group nccl_group = g_rt->world_group();
  Group mpi_group = g_rt->world_group();
  Communicator& nccl = nccl_group.connect(Transport::nccl, g_stream);
  Communicator& mpi = mpi_group.connect(Transport::mpi);

  /// `host` summed over the ranks through NCCL: uploaded to `send`, into `recv` (poisoned first).
  template <typename T>
  std::vector<T> nccl_sum(DeviceBuffer<T>& send, DeviceBuffer<T>& recv, const std::vector<T>& host) {
    send.upload(host);
    recv.poison(0xff);
    nccl.all_reduce_sum(send.get(), recv.get(), host.size());
    nccl.wait();
    return recv.download();
  }
  /// The same sum through MPI, on the host.
  template <typename T>
  std::vector<T> mpi_sum(const std::vector<T>& host) {
    std::vector<T> out(host.size());
    mpi.all_reduce_sum(host.data(), out.data(), host.size());
    return out;
  }
};

bool same_bits(bf16 a, bf16 b) { return a.bits == b.bits; }

/// The error of a call that waited for a peer that never joined, `waited` s after it started,
/// under a 3 s collective timeout `timeout`: it names the timeout and the abort, at the deadline.
void expect_timed_out(const Error& e, double waited, double timeout) {
  EXPECT_NE(e.message().find("did not complete within 3 s"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("aborted"), std::string::npos) << e.message();
  EXPECT_GE(waited, timeout - 0.1);
  EXPECT_LT(waited, timeout + 10.0);
}

std::map<std::string, std::string> nccl_environment() {
  std::map<std::string, std::string> out;
  for (char** e = environ; *e; ++e)
    if (!std::strncmp(*e, "NCCL_", 5)) {
      const char* eq = std::strchr(*e, '=');
      out[std::string(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e))] = eq ? eq + 1 : "";
    }
  return out;
}
}  // namespace

TEST(Nccl, Basics) {
  Pair p;
  EXPECT_EQ(p.nccl.kind(), "nccl");
  EXPECT_TRUE(p.nccl.on_device());
  EXPECT_EQ(p.nccl.rank(), g_rt->rank());
  EXPECT_EQ(p.nccl.size(), g_rt->world());
  auto* nc = dynamic_cast<NcclCommunicator*>(&p.nccl);
  ASSERT_NE(nc, nullptr);
  EXPECT_EQ(nc->stream(), static_cast<void*>(g_stream));
  EXPECT_EQ(nc->mode(), NcclMode::blocking);  // the default of Group::connect
  EXPECT_FALSE(nc->aborted());
  EXPECT_THROW(nc->set_timeout_s(0), Error);
}

TEST(Nccl, AllReduceSumF32) {
  Pair p;
  const int me = p.nccl.rank(), size = p.nccl.size();
  constexpr size_t n = 100003;
  std::vector<float> host(n), expect(n, 0.0f), bound(n, 0.0f);
  for (size_t i = 0; i < n; ++i) host[i] = draw_unit(g_seed, 21, me, i) * 50.0f;
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < n; ++i) {
      expect[i] += draw_unit(g_seed, 21, r, i) * 50.0f;
      bound[i] += std::fabs(draw_unit(g_seed, 21, r, i) * 50.0f);
    }
  DeviceBuffer<float> send(n), recv(n);
  const auto got = p.nccl_sum(send, recv, host);
  const auto via_mpi = p.mpi_sum(host);
  // Two ranks: a + b is one correctly rounded add on both sides, so the results are identical.
  // More ranks: any order, size-1 roundings of at most 2^-24 of sum |x| each (the local
  // expectation rounds as much again).
  const float tol = 2.0f * static_cast<float>(size - 1) * std::ldexp(1.0f, -24);
  for (size_t i = 0; i < n; ++i) {
    if (size == 2) {
      ASSERT_EQ(got[i], via_mpi[i]) << "element " << i;
    }
    ASSERT_NEAR(got[i], expect[i], tol * bound[i] + 1e-30f) << "element " << i;
  }
  // In place.
  send.upload(host);
  p.nccl.all_reduce_sum(send.get(), send.get(), n);
  p.nccl.wait();
  EXPECT_EQ(send.download(), got);
}

// The mode is a parameter of the communicator's creation: a non-blocking one (polled, no watchdog)
// gives the blocking one's sums, bit for bit, in the same process.
TEST(Nccl, NonBlockingModeGivesTheBlockingSums) {
  Group blocking_group = g_rt->world_group();
  Group polled_group = g_rt->world_group();
  auto& blocking = dynamic_cast<NcclCommunicator&>(blocking_group.connect(Transport::nccl, g_stream));
  auto& polled = dynamic_cast<NcclCommunicator&>(
      polled_group.connect(Transport::nccl, g_stream, NcclMode::non_blocking));
  EXPECT_EQ(blocking.mode(), NcclMode::blocking);
  EXPECT_EQ(polled.mode(), NcclMode::non_blocking);
  constexpr size_t n = 4099;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = draw_unit(g_seed, 29, blocking.rank(), i) * 10.0f;
  DeviceBuffer<float> send(n), a(n), b(n);
  send.upload(host);
  a.poison(0xff);
  b.poison(0xff);
  blocking.all_reduce_sum(send.get(), a.get(), n);
  blocking.wait();
  polled.all_reduce_sum(send.get(), b.get(), n);
  polled.wait();
  const auto got_a = a.download();
  const auto got_b = b.download();
  ASSERT_EQ(got_a.size(), got_b.size());
  EXPECT_EQ(std::memcmp(got_a.data(), got_b.data(), n * sizeof(float)), 0);
  // Both are the sum (not two untouched, equally poisoned buffers): as AllReduceSumF32's bound.
  const int size = blocking.size();
  const float tol = 2.0f * static_cast<float>(size) * std::ldexp(1.0f, -24);
  for (size_t i = 0; i < n; ++i) {
    float expect = 0.0f, bound = 0.0f;
    for (int r = 0; r < size; ++r) {
      expect += draw_unit(g_seed, 29, r, i) * 10.0f;
      bound += std::fabs(draw_unit(g_seed, 29, r, i) * 10.0f);
    }
    ASSERT_NEAR(got_b[i], expect, tol * bound + 1e-30f) << "element " << i;
  }
}

TEST(Nccl, AllReduceSumBf16) {
  Pair p;
  const int me = p.nccl.rank(), size = p.nccl.size();
  // Only ranks 0 and 1 non-zero (x + 0 is exact): the result is bf16(a + b) whatever the order.
  constexpr size_t n = 65537;
  std::vector<bf16> host(n), expect(n);
  for (size_t i = 0; i < n; ++i) {
    const bf16 a = draw_bf16(g_seed, 22, 0, i), b = draw_bf16(g_seed, 22, 1, i);
    host[i] = me == 0 ? a : me == 1 ? b : bf16{0};
    expect[i] = to_bf16(to_float(a) + to_float(b));
  }
  DeviceBuffer<bf16> send(n), recv(n);
  const auto got = p.nccl_sum(send, recv, host);
  for (size_t i = 0; i < n; ++i)
    ASSERT_TRUE(same_bits(got[i], expect[i]))
        << "element " << i << ": " << to_float(got[i]) << " vs " << to_float(expect[i]);

  // Ties to even, as in the MPI test.
  const float a_vals[] = {1.0f, 1.0f + 0x1p-7f, 1.0f, 256.0f};
  const float b_vals[] = {0x1p-8f, 0x1p-8f, 0x1p-8f + 0x1p-14f, 1.0f};
  const float want[] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, 256.0f};
  constexpr size_t m = std::size(a_vals);
  std::vector<bf16> ties(m);
  for (size_t i = 0; i < m; ++i)
    ties[i] = me == 0 ? to_bf16(a_vals[i]) : me == 1 ? to_bf16(b_vals[i]) : bf16{0};
  DeviceBuffer<bf16> tie_buf(m);
  tie_buf.upload(ties);
  p.nccl.all_reduce_sum(tie_buf.get(), tie_buf.get(), m);
  p.nccl.wait();
  const auto tie_got = tie_buf.download();
  for (size_t i = 0; i < m; ++i) EXPECT_EQ(to_float(tie_got[i]), want[i]) << "tie case " << i;

  // Every rank contributes: NCCL and MPI must agree bit for bit at 2 ranks.
  for (size_t i = 0; i < n; ++i) host[i] = draw_bf16(g_seed, 23, me, i);
  const auto all = p.nccl_sum(send, recv, host);
  const auto via_mpi = p.mpi_sum(host);
  for (size_t i = 0; i < n; ++i) {
    if (size == 2) {
      ASSERT_TRUE(same_bits(all[i], via_mpi[i])) << "element " << i;
    }
    double exact = 0, mag = 0;
    for (int r = 0; r < size; ++r) {
      exact += to_float(draw_bf16(g_seed, 23, r, i));
      mag += std::fabs(to_float(draw_bf16(g_seed, 23, r, i)));
    }
    ASSERT_LE(std::fabs(to_float(all[i]) - exact), (size - 1) * std::ldexp(1.0, -8) * mag) << "element " << i;
  }
}

TEST(Nccl, AllReduceMaxU64) {
  Pair p;
  constexpr size_t n = 4099;
  auto value = [](int r, size_t i) -> uint64_t {
    switch (i % 3) {
      case 0:
        return draw(g_seed, 24, 0, i);  // a tie across all ranks
      case 1:
        return (draw(g_seed, 25, r, i) % 3) << 62 | (i & 0xff);  // few values, top bit set
      default:
        return draw(g_seed, 26, r, i);
    }
  };
  std::vector<uint64_t> host(n), expect(n, 0);
  for (size_t i = 0; i < n; ++i) host[i] = value(p.nccl.rank(), i);
  for (int r = 0; r < p.nccl.size(); ++r)
    for (size_t i = 0; i < n; ++i) expect[i] = std::max(expect[i], value(r, i));
  DeviceBuffer<uint64_t> send(n), recv(n);
  send.upload(host);
  recv.poison(0x5a);
  p.nccl.all_reduce_max(send.get(), recv.get(), n);
  p.nccl.wait();
  EXPECT_EQ(recv.download(), expect);
  p.nccl.all_reduce_max(send.get(), send.get(), n);
  p.nccl.wait();
  EXPECT_EQ(send.download(), expect);
}

TEST(Nccl, AllGatherInRankOrder) {
  Pair p;
  const int me = p.nccl.rank(), size = p.nccl.size();
  constexpr size_t bytes = 8 * 1000 + 5;
  auto byte = [](int r, size_t j) { return static_cast<unsigned char>(draw(g_seed, 27, r, j)); };
  std::vector<unsigned char> mine(bytes), expect(bytes * static_cast<size_t>(size));
  for (size_t j = 0; j < bytes; ++j) mine[j] = byte(me, j);
  for (int r = 0; r < size; ++r)
    for (size_t j = 0; j < bytes; ++j) expect[static_cast<size_t>(r) * bytes + j] = byte(r, j);
  DeviceBuffer<unsigned char> send(bytes), recv(expect.size());
  send.upload(mine);
  recv.poison(0xa5);
  p.nccl.all_gather(send.get(), recv.get(), bytes);
  p.nccl.wait();
  EXPECT_EQ(recv.download(), expect);
  // In place: this rank's slot of recv is the send buffer.
  recv.poison(0x3c);
  MTP_CUDA_CHECK(cudaMemcpyAsync(recv.get() + static_cast<size_t>(me) * bytes, mine.data(), bytes,
                                 cudaMemcpyHostToDevice, g_stream));
  p.nccl.all_gather(recv.get() + static_cast<size_t>(me) * bytes, recv.get(), bytes);
  p.nccl.wait();
  EXPECT_EQ(recv.download(), expect);
}

TEST(Nccl, BroadcastFromNonZeroRoot) {
  Pair p;
  const int size = p.nccl.size();
  constexpr size_t bytes = 4097;
  for (const int root : {size - 1, 1 % size}) {
    std::vector<unsigned char> want(bytes);
    for (size_t j = 0; j < bytes; ++j) want[j] = static_cast<unsigned char>(draw(g_seed, 28, root, j));
    DeviceBuffer<unsigned char> buf(bytes);
    if (p.nccl.rank() == root) {
      buf.upload(want);
    } else {
      buf.poison(0xee);
    }
    p.nccl.broadcast(buf.get(), bytes, root);
    p.nccl.wait();
    EXPECT_EQ(buf.download(), want) << "root " << root;
  }
  EXPECT_THROW(p.nccl.broadcast(nullptr, 1, size), Error);
}

TEST(Nccl, BarrierWaitsForTheLastRank) {
  Pair p;
  constexpr auto delay = std::chrono::milliseconds(300);
  p.nccl.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (p.nccl.rank() == 0) std::this_thread::sleep_for(delay);
  p.nccl.barrier();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, delay - std::chrono::milliseconds(50));
}

TEST(Nccl, ManyCallsThenOneWait) {
  Pair p;
  const int size = p.nccl.size();
  constexpr size_t n = 1031;
  constexpr int rounds = 20;
  // Integer data: after k in-place sums every element is x * size^k exactly (< 2^24).
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(1 + draw(g_seed, 29, 0, i) % 7);
  DeviceBuffer<float> buf(n);
  buf.upload(host);
  for (int k = 0; k < rounds; ++k) p.nccl.all_reduce_sum(buf.get(), buf.get(), n);
  p.nccl.wait();
  const auto got = buf.download();
  const double factor = std::pow(static_cast<double>(size), rounds);
  ASSERT_LT(7 * factor, 16777216.0);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], static_cast<float>(host[i] * factor)) << "element " << i;
}

TEST(Nccl, SubGroupsWithReversedKey) {
  const int me = g_rt->rank(), world = g_rt->world();
  {
    Group g = g_rt->make_group(0, -me);
    Communicator& c = g.connect(Transport::nccl, g_stream);
    EXPECT_EQ(c.rank(), world - 1 - me);
    DeviceBuffer<int> ranks(static_cast<size_t>(world));
    DeviceBuffer<int> mine(1);
    mine.upload({me});
    ranks.poison(0xff);
    c.all_gather(mine.get(), ranks.get(), sizeof(int));
    c.wait();
    std::vector<int> expect(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) expect[static_cast<size_t>(r)] = world - 1 - r;
    EXPECT_EQ(ranks.download(), expect);
  }
  {
    // One group per rank: an NCCL communicator of one, whose sum is the identity.
    Group g = g_rt->make_group(me, 0);
    Communicator& c = g.connect(Transport::nccl, g_stream);
    EXPECT_EQ(c.size(), 1);
    const std::vector<float> host = {draw_unit(g_seed, 30, me, 0), draw_unit(g_seed, 30, me, 1)};
    DeviceBuffer<float> buf(2), out(2);
    buf.upload(host);
    out.poison(0xff);
    c.all_reduce_sum(buf.get(), out.get(), 2);
    c.wait();
    EXPECT_EQ(out.download(), host);
  }
}

TEST(Nccl, CapturedInACudaGraph) {
  Pair p;
  const int size = p.nccl.size();
  constexpr size_t n = 513;
  DeviceBuffer<float> buf(n), out(n);
  p.nccl.barrier();  // connections are set up outside the capture
  cudaGraphExec_t exec = nullptr;
  {
    cudaGraph_t graph = nullptr;
    MTP_CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    p.nccl.all_reduce_sum(buf.get(), out.get(), n);
    p.nccl.wait();  // a no-op while capturing
    MTP_CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
    MTP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MTP_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  for (int replay = 0; replay < 3; ++replay) {
    std::vector<float> host(n), expect(n, 0.0f);
    auto v = [replay](int r, size_t i) {
      return static_cast<float>(
          static_cast<int>(draw(g_seed, 31 + static_cast<uint64_t>(replay), r, i) % 1001) - 500);
    };
    for (size_t i = 0; i < n; ++i) host[i] = v(p.nccl.rank(), i);
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < n; ++i) expect[i] += v(r, i);
    buf.upload(host);
    out.poison(0xff);
    MTP_CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
    p.nccl.wait();
    EXPECT_EQ(out.download(), expect) << "replay " << replay;
  }
  // The graph executable goes before its communicator (ncclCommDestroy would wait forever).
  MTP_CUDA_CHECK(cudaGraphExecDestroy(exec));
}

TEST(Nccl, LeavesTheNcclEnvironmentAlone) {
  const auto before = nccl_environment();
  {
    Pair p;
    p.nccl.barrier();
  }
  EXPECT_EQ(nccl_environment(), before);
}

// Last two: they abort a communicator on purpose.
TEST(Nccl, TimeoutAbortsInsteadOfHanging) {
  Group g = g_rt->world_group();
  auto& c = dynamic_cast<NcclCommunicator&>(g.connect(Transport::nccl, g_stream));
  constexpr double timeout = 3.0;
  c.set_timeout_s(timeout);
  DeviceBuffer<float> buf(1024);
  buf.poison(0);
  c.all_reduce_sum(buf.get(), buf.get(), 1024);  // both ranks: connections are up
  c.wait();
  if (c.rank() == 0) {
    // Rank 1 skips this one, as a dead or diverged peer would.
    c.all_reduce_sum(buf.get(), buf.get(), 1024);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.wait();
      ADD_FAILURE() << "wait() returned although a peer never joined";
    } catch (const Error& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      expect_timed_out(e, waited, timeout);
    }
    EXPECT_TRUE(c.aborted());
    EXPECT_THROW(c.all_reduce_sum(buf.get(), buf.get(), 1024), Error);
    EXPECT_THROW(c.wait(), Error);
  }
  MTP_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  if (c.rank() != 0) c.abort();  // its peer's communicator is gone
  // The aborted kernel must not keep the stream busy.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaStreamQuery(g_stream)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(q, cudaSuccess) << cudaGetErrorName(q);
}

// Also aborts on purpose. A peer that never joins the FIRST collective of a new communicator:
// its connection setup can block inside the enqueue itself (a blocking communicator: the
// watchdog must abort it) or leave the kernel waiting (wait() must time out). Either way the
// waiting rank gets an mtplab::Error naming the timeout, within the timeout plus slack.
TEST(Nccl, TimeoutOnAFirstCollectiveAbortsInsteadOfHanging) {
  Group g = g_rt->world_group();
  auto& c = dynamic_cast<NcclCommunicator&>(g.connect(Transport::nccl, g_stream));
  constexpr double timeout = 3.0;
  c.set_timeout_s(timeout);
  DeviceBuffer<float> buf(1 << 20);
  buf.poison(0);
  if (c.rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.all_reduce_sum(buf.get(), buf.get(), 1 << 20);
      c.wait();
      ADD_FAILURE() << "the first collective completed although a peer never joined";
    } catch (const Error& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("[nccl] first collective without its peer: error after %.2f s: %s\n", waited,
                  e.message().c_str());
      expect_timed_out(e, waited, timeout);
    }
    EXPECT_TRUE(c.aborted());
    EXPECT_THROW(c.all_reduce_sum(buf.get(), buf.get(), 1), Error);
  }
  MTP_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  if (c.rank() != 0) c.abort();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaStreamQuery(g_stream)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(q, cudaSuccess) << cudaGetErrorName(q);
}

int main(int argc, char** argv) {
  const int visible = visible_gpu_count();
  if (visible < 2) {
    std::printf("SKIP: test_dist_nccl needs 2 GPUs on one node, %d visible\n", visible);
    return 77;
  }
  return mtplab::test::mpi_test_main(argc, argv, [](Runtime& rt) {
    if (rt.world() < 2) {
      std::printf("SKIP: test_dist_nccl runs under `mpiexec -n 2`\n");
      return 77;
    }
    g_rt = &rt;
    const auto& dev = rt.bind_device();
    g_seed = dist::test::shared_seed(rt);
    std::printf("rank %d on GPU %d (%s, %s)\n", rt.rank(), dev.device, dev.name.c_str(),
                dev.pci_bus_id.c_str());
    MTP_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    const int failed = mtplab::test::run_all_tests_on_every_rank(rt);
    MTP_CUDA_CHECK(cudaStreamDestroy(g_stream));
    return failed;
  });
}
