// The job that must not hang: rank 1 fails at step 3 of a loop of all-reduces while rank 0
// enters step 3's all-reduce and waits there. Rank 0 printing "completed" would mean the
// collective never blocked. Modes:
//   throw      an mtplab::Error reaches run_guarded on rank 1, which aborts the job (MPI)
//   kill       rank 1 dies by SIGKILL (MPI)
//   exit       rank 1 exits 3 without finalising MPI (MPI)
//   stop       rank 1 stops itself (SIGSTOP) (MPI): rank 0's bounded wait must time out
//              (MTPLAB_COLLECTIVE_TIMEOUT_S), name rank 1 as not arrived, and end the job with
//              exit 124. Rank 1 writes its pid to $MTPLAB_TEST_PID_FILE first, so that the driver
//              can kill it if the job did not.
//   mismatch   rank 1 waits in a barrier of another group instead (MPI): both time out; rank 0,
//              the lowest, reports once, naming the collective rank 1 is in; rank 1 stays quiet
//   agreed     every rank fails alike inside dist::run_agreed (MPI): one message, from rank 0,
//              and every rank exits 1 through MPI_Finalize (no MPI_Abort)
//   startup_stop  rank 1 (the launcher's) stops itself (SIGSTOP) before MPI is initialised: rank 0
//              waits in MPI initialisation, which must end after MTPLAB_STARTUP_TIMEOUT_S with a
//              message naming rank 1 as stopped, and exit 124 (the start-up watch, dist/startup.hpp)
//   startup_busy  rank 1 is alive but never starts MPI (it sleeps): rank 0's message names it as
//              running without having reached the start-up, exit 124
//   startup_exit  rank 1 exits 3 before MPI is initialised: the launcher ends the job
//   nccl_hang  NCCL on 2 GPUs: rank 1 stays alive but never joins; rank 0's wait() must time
//              out (MTPLAB_COLLECTIVE_TIMEOUT_S), throw, and run_guarded must abort the job.
//              Exits 77 (skip) with fewer than 2 GPUs.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "dist/check.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "dist/world_ops.hpp"

using namespace mtplab;

namespace {

/// `count` floats in the memory the transport works on (host for MPI, device for NCCL).
class Buffer {
 public:
  Buffer(bool device, size_t count) : device_(device), host_(device ? 0 : count, 1.0f) {
#if defined(MTPLAB_HAVE_CUDA)
    if (device_) {
      MTP_CUDA_CHECK(cudaMalloc(&dev_, count * sizeof(float)));
      MTP_CUDA_CHECK(cudaMemset(dev_, 0, count * sizeof(float)));
    }
#endif
  }
  ~Buffer() {
#if defined(MTPLAB_HAVE_CUDA)
    if (dev_) cudaFree(dev_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() { return device_ ? dev_ : host_.data(); }

 private:
  bool device_;
  std::vector<float> host_;
  float* dev_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "throw";
  const bool nccl = mode == "nccl_hang";
  if (nccl && dist::visible_gpu_count() < 2) {
    std::printf("SKIP: mode nccl_hang needs 2 GPUs, %d visible\n", dist::visible_gpu_count());
    return 77;
  }
  return dist::run_guarded([&] {
    const bool startup = mode.rfind("startup_", 0) == 0;
    MTP_REQUIRE(mode == "throw" || mode == "kill" || mode == "exit" || mode == "stop" || mode == "mismatch" ||
                    mode == "agreed" || mode == "startup_stop" || mode == "startup_busy" ||
                    mode == "startup_exit" || nccl,
                "unknown mode \"", mode,
                "\" (throw, kill, exit, stop, mismatch, agreed, startup_stop, startup_busy, startup_exit or "
                "nccl_hang)");
    if (startup && dist::launcher_rank() == 1) {
      if (mode == "startup_exit") std::_Exit(3);
      if (mode == "startup_busy") std::this_thread::sleep_for(std::chrono::seconds(600));  // never starts MPI
      if (const char* pid_file = std::getenv("MTPLAB_TEST_PID_FILE")) {
        if (FILE* f = std::fopen(pid_file, "w")) {
          std::fprintf(f, "%d\n", static_cast<int>(getpid()));
          std::fclose(f);
        }
      }
      std::raise(SIGSTOP);
      while (true) pause();  // continued only by the job's end, which kills it
    }
    if (startup) std::fprintf(stderr, "rank 0 enters MPI initialisation\n");
    dist::Runtime rt(&argc, &argv);
    if (startup) {
      std::printf("rank %d completed\n", rt.rank());  // never: rank 1 does not start MPI
      return 0;
    }
    if (mode == "agreed") {
      dist::run_agreed([&] { MTP_FAIL("deliberate failure on rank ", rt.rank(), " of every rank"); });
      std::printf("rank %d completed\n", rt.rank());  // never: run_agreed throws on every rank
      return 0;
    }
    if (nccl) rt.bind_device();
    dist::Group world = rt.world_group();
    dist::Group side = rt.world_group();  // mode mismatch: rank 1 waits here instead
    dist::Communicator& comm = world.connect(nccl ? dist::Transport::nccl : dist::Transport::mpi);
    constexpr size_t count = 4096;
    Buffer buf(nccl, count);
    for (int step = 0; step < 6; ++step) {
      if (rt.rank() == 1 && step == 3) {
        // Give rank 0 time to enter the all-reduce, so it is really waiting in it.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        if (mode == "kill") std::raise(SIGKILL);
        if (mode == "exit") std::_Exit(3);
        if (mode == "stop") {
          if (const char* pid_file = std::getenv("MTPLAB_TEST_PID_FILE")) {
            if (FILE* f = std::fopen(pid_file, "w")) {
              std::fprintf(f, "%d\n", static_cast<int>(getpid()));
              std::fclose(f);
            }
          }
          std::raise(SIGSTOP);
          while (true) pause();  // continued only by the job's end, which kills it
        }
        if (mode == "mismatch") dist::barrier(side);  // never completes: rank 0 is not in it
        if (nccl) std::this_thread::sleep_for(std::chrono::seconds(600));  // alive, never joins
        MTP_FAIL("deliberate failure at step ", step, " while rank 0 waits in an all-reduce");
      }
      if (rt.rank() == 0 && step == 3) {
        std::fprintf(stderr, "rank 0 enters the all-reduce of step 3\n");
        std::fflush(stderr);
      }
      comm.all_reduce_sum(buf.data(), buf.data(), count);
      comm.wait();
    }
    std::printf("rank %d completed\n", rt.rank());
    return 0;
  });
}
