// Polling a wait against a deadline (internal to dist): the clock, seconds as its duration, and
// the backoff between polls. The bounded MPI wait (mpi_wait.cpp) and the NCCL communicator's
// waits (nccl_communicator.cpp) both poll with it, so a host collective pays the same in either.
#pragma once
#include <chrono>
#include <thread>

namespace mtplab::dist::detail {

using Clock = std::chrono::steady_clock;

inline Clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

/// The wait between polls, by elapsed time: for the first 2 ms it only yields the core (a host
/// collective, an enqueue or a small device collective completes in microseconds, and a sleep
/// costs ~60 us of timer slack, which was the whole cost of a host-issued NCCL collective when
/// this slept after 64 rounds), then sleeps 20 us until 100 ms have passed, then 500 us, so a
/// long wait costs no CPU.
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

}  // namespace mtplab::dist::detail
