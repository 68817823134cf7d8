// NcclCommunicator: device-buffer collectives that cannot hang forever.
//
// The NCCL communicator is blocking by default (ncclConfig_t::blocking = 1): a collective is
// enqueued by the calling thread and returns, which costs a few microseconds. A blocking call can
// still wait on a peer (the communicator's creation, the connection setup of a collective's first
// use, finalisation), so every host call into NCCL runs under a watchdog: a thread of this
// communicator, asleep unless a call is armed, that aborts the communicator (ncclCommAbort from
// another thread, which makes the blocked call return an error) when the call has not returned
// within the collective timeout. Creation has no communicator to abort yet: the watchdog then
// prints the error and ends the job (fail_job: MPI_Abort, so every rank exits non-zero).
//
// NcclMode::non_blocking creates the communicator non-blocking instead (ncclInProgress settled by
// polling against the deadline, no watchdog): the design before, kept to compare. A host-issued
// collective costs ~25 us more through it on an H200 pair, which is why blocking is the default
// (docs/performance.md, exchange).
//
// Both modes: collectives only enqueue on the stream; wait() polls cudaStreamQuery and
// ncclCommGetAsyncError until the stream drains, an error appears, or the timeout passes. On an
// error or timeout the communicator is aborted (ncclCommAbort: local, it also stops the NCCL
// kernels spinning on a dead peer) and mtplab::Error is thrown; every later call throws too.
// Invariant: one thread issues calls on the communicator; the watchdog touches it only while that
// thread is inside an armed NCCL call, and only to abort it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/str.hpp"
#include "dist/check.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/mpi_wait.hpp"
#include "dist/poll.hpp"
#include "dist/watchdog.hpp"

namespace mtplab::dist {

#if defined(MTPLAB_HAVE_NCCL)
namespace {

using detail::Backoff;
using detail::Clock;
using detail::to_duration;

/// A collective's name, formatted only when an error needs it (a host-issued collective must
/// not pay for a string): op, then the count and its unit.
struct OpName {
  const char* op;
  size_t n;
  const char* unit;
  std::string text() const { return *unit ? str(op, n, unit) : std::string(op); }
};

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  NcclCommunicatorImpl(MPI_Comm mpi, void* stream, double timeout_s, NcclMode mode)
      : stream_(static_cast<cudaStream_t>(stream)),
        timeout_s_(timeout_s),
        blocking_(mode == NcclMode::blocking) {
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
    MPI_Request req = MPI_REQUEST_NULL;
    MTP_MPI_CHECK(MPI_Ibcast(&msg, sizeof msg, MPI_BYTE, 0, mpi, &req));
    detail::wait_bounded(req, mpi, [] { return std::string("broadcast of the NCCL unique id"); });
    MTP_REQUIRE(msg.ok, "ncclGetUniqueId failed on rank 0 of the group: ", msg.error);

    MTP_CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(int)));
    try {
      MTP_CUDA_CHECK(cudaMemset(barrier_scratch_, 0, sizeof(int)));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = blocking_ ? 1 : 0;
      if (blocking_) {
        // Checked every tenth of the timeout, between 10 ms and 1 s.
        const auto period = std::clamp(to_duration(timeout_s_ / 10), to_duration(0.01), to_duration(1.0));
        watchdog_ = std::make_unique<Watchdog>([this] { on_watchdog(); }, period);
        ncclComm_t fresh = nullptr;
        bool fired = false;
        const ncclResult_t rc = watched(
            "ncclCommInitRankConfig",
            [&] { return ncclCommInitRankConfig(&fresh, size_, msg.id, rank_, &config); }, fired);
        comm_ = fresh;  // fired: the watchdog has ended the job (nothing to abort yet)
        if (rc != ncclSuccess) fail_nccl("ncclCommInitRankConfig", rc);
        live_.store(comm_);
      } else {
        const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, msg.id, rank_, &config);
        if (rc != ncclSuccess && rc != ncclInProgress) fail_nccl("ncclCommInitRankConfig", rc);
        settle_or_throw("ncclCommInitRankConfig");
      }
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
      bool fired = false;
      ncclResult_t rc = watched(
          "ncclCommFinalize", [&] { return ncclCommFinalize(comm_); }, fired);
      if (!blocking_ && (rc == ncclInProgress || rc == ncclSuccess)) rc = settle(nullptr);
      if (fired) {
        comm_ = nullptr;  // the watchdog aborted it
        log_warn("NCCL communicator (rank ", rank_, " of ", size_, ") did not finalise within ", timeout_s_,
                 " s: aborted");
      } else if (rc == ncclSuccess) {
        if (ncclCommDestroy(comm_) != ncclSuccess) log_warn("ncclCommDestroy failed");
        comm_ = nullptr;
      } else {
        log_warn("NCCL communicator (rank ", rank_, " of ", size_, ") did not finalise cleanly (",
                 rc == ncclInProgress ? "timed out" : ncclGetErrorString(rc), "): aborting it");
        abort();
      }
    }
    watchdog_.reset();  // joins its thread before the members it reads go
    if (barrier_scratch_) cudaFree(barrier_scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void* stream() const override { return stream_; }
  NcclMode mode() const override { return blocking_ ? NcclMode::blocking : NcclMode::non_blocking; }
  double timeout_s() const override { return timeout_s_; }
  void set_timeout_s(double seconds) override {
    MTP_REQUIRE(seconds > 0, "NCCL collective timeout must be > 0 s (got ", seconds, ")");
    timeout_s_ = seconds;
  }
  bool aborted() const override { return aborted_; }

  void abort() noexcept override {
    live_.store(nullptr);
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
  }

  void all_reduce_sum(const float* send, float* recv, size_t count) override {
    issue({"all_reduce_sum(f32, ", count, ")"},
          [&] { return ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm_, stream_); });
  }
  void all_reduce_sum(const bf16* send, bf16* recv, size_t count) override {
    issue({"all_reduce_sum(bf16, ", count, ")"},
          [&] { return ncclAllReduce(send, recv, count, ncclBfloat16, ncclSum, comm_, stream_); });
  }
  void all_reduce_max(const uint64_t* send, uint64_t* recv, size_t count) override {
    issue({"all_reduce_max(u64, ", count, ")"},
          [&] { return ncclAllReduce(send, recv, count, ncclUint64, ncclMax, comm_, stream_); });
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    issue({"all_gather(", bytes, " bytes)"},
          [&] { return ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_); });
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    MTP_REQUIRE(root >= 0 && root < size_, "broadcast: root ", root, " outside [0, ", size_, ")");
    issue({"broadcast(", bytes, " bytes)"},
          [&] { return ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_); });
  }
  void barrier() override {
    // NCCL has no barrier: a one-element all-reduce that every rank must join, then wait.
    issue({"barrier", 0, ""}, [&] {
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
      if (state != ncclSuccess && state != ncclInProgress) fail_nccl(last_op_.text().c_str(), state);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        const std::string what =
            str("the stream of the NCCL communicator failed after ", last_op_.text(), ": ",
                cudaGetErrorName(q), ": ", cudaGetErrorString(q), "; NCCL communicator aborted");
        abort();
        MTP_FAIL(what);
      }
      if (Clock::now() > deadline) fail_timeout();
      backoff.pause();
    }
  }

 private:
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

  /// Runs one host call into NCCL; with a blocking communicator under the watchdog (`fired`: it
  /// aborted the communicator, or ended the job during creation, before the call returned).
  template <typename Call>
  ncclResult_t watched(const char* what, Call&& call, bool& fired) {
    fired = false;
    if (!watchdog_) return call();
    watched_what_ = what;
    watchdog_->arm(Clock::now() + to_duration(timeout_s_));
    const ncclResult_t rc = call();
    fired = watchdog_->disarm();
    return rc;
  }

  /// The watchdog's action, on its thread: abort the live communicator, or end the job when the
  /// creation itself hangs.
  void on_watchdog() noexcept {
    const ncclComm_t c = live_.exchange(nullptr);
    if (!c) {
      const auto& id = process_identity();
      const std::string line =
          str("[rank ", id.rank, "@", id.host, "] NCCL ", watched_what_, " did not complete within ",
              timeout_s_, " s (", kCollectiveTimeoutEnv, ") on rank ", rank_, " of ", size_,
              ": a peer rank has probably died; ending the job");
      fail_job(line.c_str(), kExitCollectiveTimeout);
      std::_Exit(kExitCollectiveTimeout);
    }
    cudaSetDevice(device_);  // this thread's first CUDA call: the communicator's device
    ncclCommAbort(c);
  }

  template <typename Call>
  void issue(OpName what, Call&& call) {
    require_live(what.op);
    last_op_ = what;
    bool fired = false;
    ncclResult_t rc = watched("collective enqueue", call, fired);
    if (fired) {
      comm_ = nullptr;  // aborted by the watchdog
      fail_timeout_named(str(last_op_.text(), " (its enqueue)").c_str());
    }
    if (rc == ncclInProgress) {
      settle_or_throw(last_op_.text().c_str());
    } else if (rc != ncclSuccess) {
      fail_nccl(last_op_.text().c_str(), rc);
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
    throw CollectiveTimeout(text, __FILE__, __LINE__);
  }
  [[noreturn]] void fail_timeout() { fail_timeout_named(str("collectives up to ", last_op_.text()).c_str()); }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = -1;
  bool aborted_ = false;
  int* barrier_scratch_ = nullptr;
  OpName last_op_{"(none)", 0, ""};
  bool blocking_ = true;
  std::atomic<ncclComm_t> live_{nullptr};  // what the watchdog may abort
  const char* watched_what_ = "";
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(MPI_Comm comm, void* stream, double timeout_s,
                                                           NcclMode mode) {
  return std::make_unique<NcclCommunicatorImpl>(comm, stream, timeout_s, mode);
}

#else  // built without NCCL

bool nccl_available() { return false; }

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(MPI_Comm /*comm*/, void* /*stream*/,
                                                           double /*timeout_s*/, NcclMode /*mode*/) {
  MTP_FAIL("an NCCL communicator was asked for, but this mtplab was built without CUDA / NCCL");
}

#endif

}  // namespace mtplab::dist
