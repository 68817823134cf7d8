// Watchdog: runs a callback on its own thread when a bracketed call overruns its deadline. The
// NCCL communicator brackets every host call into NCCL with it (nccl_communicator.cpp) and aborts
// the communicator from the callback; it has no NCCL or CUDA of its own, so it is tested alone
// (tests/dist/test_dist_unit.cpp).
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace mtplab::dist {

/// Runs `on_expiry` (on its own thread) when an armed call has not been disarmed by its deadline.
/// arm() / disarm() bracket one host call into NCCL and cost two atomic operations: no lock, no
/// wake-up (the enqueue they bracket takes a few microseconds). The thread checks the armed
/// deadline every `period` instead, so it acts up to one period late. disarm() returns whether the
/// watchdog fired for this call, after on_expiry has returned.
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  Watchdog(std::function<void()> on_expiry, Clock::duration period)
      : on_expiry_(std::move(on_expiry)), period_(period) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void arm(Clock::time_point deadline) {
    armed_ = std::max<int64_t>(kFired + 1, deadline.time_since_epoch().count());
    state_.store(armed_, std::memory_order_release);
  }
  bool disarm() {
    int64_t expected = armed_;
    if (state_.compare_exchange_strong(expected, kIdle, std::memory_order_acq_rel)) return false;
    while (state_.load(std::memory_order_acquire) != kFired) std::this_thread::yield();  // on_expiry runs
    state_.store(kIdle, std::memory_order_release);
    return true;
  }

 private:
  static constexpr int64_t kIdle = 0, kFiring = 1, kFired = 2;  // else: the armed deadline (ticks)

  void loop() {
    std::unique_lock<std::mutex> lock(m_);
    while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
      int64_t d = state_.load(std::memory_order_acquire);
      if (d <= kFired || Clock::now().time_since_epoch().count() < d) continue;
      if (!state_.compare_exchange_strong(d, kFiring, std::memory_order_acq_rel)) continue;  // disarmed
      on_expiry_();
      state_.store(kFired, std::memory_order_release);
    }
  }

  std::function<void()> on_expiry_;
  Clock::duration period_;
  std::atomic<int64_t> state_{kIdle};
  int64_t armed_ = kIdle;  // the value arm() stored (the issuing thread's own copy)
  std::mutex m_;           // for the stop flag and the sleep only
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mtplab::dist
