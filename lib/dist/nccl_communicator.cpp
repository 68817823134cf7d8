// NcclCommunicator: device-buffer collectives that cannot hang forever.
//
// The NCCL communicator is created non-blocking (ncclConfig_t::blocking = 0), so creation,
// enqueue and finalisation return at once (ncclInProgress) and are polled against a deadline;
// collectives only enqueue on the stream, and wait() polls cudaStreamQuery and
// ncclCommGetAsyncError until the stream drains, an error appears, or the timeout passes. On an
// error or timeout the communicator is aborted (ncclCommAbort: local, it also stops the NCCL
// kernels spinning on a dead peer) and mtplab::Error is thrown; every later call throws too.
// Invariant: while any NCCL call is in progress nothing else is issued on the communicator (the
// NCCL rule for non-blocking communicators), which the synchronous settle() after each call keeps.
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/str.hpp"
#include "dist/check.hpp"
#include "dist/collectives.hpp"

namespace mtplab::dist {

#if defined(MTPLAB_HAVE_NCCL)
namespace {

using Clock = std::chrono::steady_clock;

/// Waits between polls, by elapsed time: for the first 2 ms it only yields the core (an enqueue
/// or a small collective completes in microseconds, and a sleep costs ~60 us of timer slack, which
/// was the whole cost of a host-issued collective when this slept after 64 rounds), then sleeps
/// 20 us until 100 ms have passed, then 500 us, so a long wait costs no CPU.
class Backoff {
 public:
  void pause() {
    const auto waited = Clock::now() - start_;
    if (waited < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::chrono::microseconds(waited < std::chrono::milliseconds(100) ? 20 : 500));
    }
  }

 private:
  Clock::time_point start_ = Clock::now();
};

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  NcclCommunicatorImpl(MPI_Comm mpi, void* stream, double timeout_s)
      : stream_(static_cast<cudaStream_t>(stream)), timeout_s_(timeout_s) {
    MTP_REQUIRE(mpi != MPI_COMM_NULL, "NcclCommunicator over MPI_COMM_NULL");
    MTP_REQUIRE(timeout_s > 0, "NCCL collective timeout must be > 0 s (got ", timeout_s, ")");
    MTP_MPI_CHECK(MPI_Comm_rank(mpi, &rank_));
    MTP_MPI_CHECK(MPI_Comm_size(mpi, &size_));
    MTP_CUDA_CHECK(cudaGetDevice(&device_));

    // Rank 0 makes the id; a failure there is broadcast too, so no rank waits for an id that
    // never comes.
    struct IdMessage {
      int ok = 0;
      char error[244] = {};
      ncclUniqueId id{};
    } msg;
    if (rank_ == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&msg.id);
      msg.ok = rc == ncclSuccess;
      if (!msg.ok)
        std::snprintf(msg.error, sizeof msg.error, "%s (%s)", ncclGetErrorString(rc),
                      ncclGetLastError(nullptr));
    }
    MTP_MPI_CHECK(MPI_Bcast(&msg, sizeof msg, MPI_BYTE, 0, mpi));
    MTP_REQUIRE(msg.ok, "ncclGetUniqueId failed on rank 0 of the group: ", msg.error);

    MTP_CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(int)));
    try {
      MTP_CUDA_CHECK(cudaMemset(barrier_scratch_, 0, sizeof(int)));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, msg.id, rank_, &config);
      if (rc != ncclSuccess && rc != ncclInProgress) fail_nccl("ncclCommInitRankConfig", rc);
      settle_or_throw("ncclCommInitRankConfig");
    } catch (...) {
      // The destructor does not run for a half-built object: release here.
      abort();
      cudaFree(barrier_scratch_);
      throw;
    }
  }

  ~NcclCommunicatorImpl() override {
    if (comm_ && std::uncaught_exceptions() > 0) {
      abort();  // unwinding: peers may be gone, and finalising would wait for them
    } else if (comm_) {
      // Finalise flushes the work still enqueued and waits for the peers to do the same, so it
      // is bounded like a collective; on failure, abort instead.
      ncclResult_t rc = ncclCommFinalize(comm_);
      if (rc == ncclInProgress || rc == ncclSuccess) rc = settle(nullptr);
      if (rc == ncclSuccess) {
        if (ncclCommDestroy(comm_) != ncclSuccess) log_warn("ncclCommDestroy failed");
        comm_ = nullptr;
      } else {
        log_warn("NCCL communicator (rank ", rank_, " of ", size_, ") did not finalise cleanly (",
                 rc == ncclInProgress ? "timed out" : ncclGetErrorString(rc), "): aborting it");
        abort();
      }
    }
    if (barrier_scratch_) cudaFree(barrier_scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void* stream() const override { return stream_; }
  double timeout_s() const override { return timeout_s_; }
  void set_timeout_s(double seconds) override {
    MTP_REQUIRE(seconds > 0, "NCCL collective timeout must be > 0 s (got ", seconds, ")");
    timeout_s_ = seconds;
  }
  bool aborted() const override { return aborted_; }

  void abort() noexcept override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
  }

  void all_reduce_sum(const float* send, float* recv, size_t count) override {
    issue(str("all_reduce_sum(f32, ", count, ")"),
          [&] { return ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm_, stream_); });
  }
  void all_reduce_sum(const bf16* send, bf16* recv, size_t count) override {
    issue(str("all_reduce_sum(bf16, ", count, ")"),
          [&] { return ncclAllReduce(send, recv, count, ncclBfloat16, ncclSum, comm_, stream_); });
  }
  void all_reduce_max(const uint64_t* send, uint64_t* recv, size_t count) override {
    issue(str("all_reduce_max(u64, ", count, ")"),
          [&] { return ncclAllReduce(send, recv, count, ncclUint64, ncclMax, comm_, stream_); });
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    issue(str("all_gather(", bytes, " bytes)"),
          [&] { return ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_); });
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    MTP_REQUIRE(root >= 0 && root < size_, "broadcast: root ", root, " outside [0, ", size_, ")");
    issue(str("broadcast(", bytes, " bytes, root ", root, ")"),
          [&] { return ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_); });
  }
  void barrier() override {
    // NCCL has no barrier: a one-element all-reduce that every rank must join, then wait.
    issue("barrier", [&] {
      return ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclInt32, ncclSum, comm_, stream_);
    });
    wait();
  }

  void wait() override {
    require_live("wait");
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MTP_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) return;  // nothing runs while a graph is captured
    const auto deadline = Clock::now() + to_duration(timeout_s_);
    Backoff backoff;
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t get = ncclCommGetAsyncError(comm_, &state);
      if (get != ncclSuccess) fail_nccl("ncclCommGetAsyncError", get);
      if (state != ncclSuccess && state != ncclInProgress) fail_nccl(last_op_.c_str(), state);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        const std::string what =
            str("the stream of the NCCL communicator failed after ", last_op_, ": ", cudaGetErrorName(q),
                ": ", cudaGetErrorString(q), "; NCCL communicator aborted");
        abort();
        MTP_FAIL(what);
      }
      if (Clock::now() > deadline) fail_timeout();
      backoff.pause();
    }
  }

 private:
  static Clock::duration to_duration(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  void require_live(const char* what) const {
    MTP_REQUIRE(!aborted_ && comm_, "NCCL ", what,
                " on a communicator that was aborted after an earlier failure");
  }

  /// Polls the communicator state until it leaves ncclInProgress or the timeout passes
  /// (returns ncclInProgress then). Throws nothing.
  ncclResult_t settle(const char* /*what*/) noexcept {
    const auto deadline = Clock::now() + to_duration(timeout_s_);
    Backoff backoff;
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t get = ncclCommGetAsyncError(comm_, &state);
      if (get != ncclSuccess) return get;
      if (state != ncclInProgress) return state;
      if (Clock::now() > deadline) return ncclInProgress;
      backoff.pause();
    }
  }

  void settle_or_throw(const char* what) {
    const ncclResult_t rc = settle(what);
    if (rc == ncclInProgress) fail_timeout_named(what);
    if (rc != ncclSuccess) fail_nccl(what, rc);
  }

  template <typename Call>
  void issue(std::string what, Call&& call) {
    require_live(what.c_str());
    last_op_ = std::move(what);
    ncclResult_t rc = call();
    if (rc == ncclInProgress) {
      settle_or_throw(last_op_.c_str());
    } else if (rc != ncclSuccess) {
      fail_nccl(last_op_.c_str(), rc);
    }
  }

  [[noreturn]] void fail_nccl(const char* what, ncclResult_t rc) {
    const std::string text =
        str("NCCL ", what, " failed on rank ", rank_, " of ", size_, ": ", ncclGetErrorString(rc), " (",
            ncclGetLastError(comm_), "); NCCL communicator aborted");
    abort();
    MTP_FAIL(text);
  }

  [[noreturn]] void fail_timeout_named(const char* what) {
    const std::string text =
        str("NCCL ", what, " did not complete within ", timeout_s_, " s (", kCollectiveTimeoutEnv,
            ") on rank ", rank_, " of ", size_,
            ": a peer rank has probably died or skipped a collective; NCCL communicator aborted");
    abort();
    MTP_FAIL(text);
  }
  [[noreturn]] void fail_timeout() { fail_timeout_named(str("collectives up to ", last_op_).c_str()); }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = -1;
  bool aborted_ = false;
  int* barrier_scratch_ = nullptr;
  std::string last_op_ = "(none)";
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(MPI_Comm comm, void* stream, double timeout_s) {
  return std::make_unique<NcclCommunicatorImpl>(comm, stream, timeout_s);
}

#else  // built without NCCL

bool nccl_available() { return false; }

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(MPI_Comm /*comm*/, void* /*stream*/,
                                                           double /*timeout_s*/) {
  MTP_FAIL("an NCCL communicator was asked for, but this mtplab was built without CUDA / NCCL");
}

#endif

}  // namespace mtplab::dist
