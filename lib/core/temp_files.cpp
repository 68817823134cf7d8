// The table of temporary files (temp_files.hpp): slots claimed and released with atomics, so that a
// signal handler reads only slots whose path is complete.
#include "core/temp_files.hpp"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace mtplab {
namespace {

enum SlotState : int { kFree = 0, kBusy = 1, kReady = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[kMaxTemporaryPath] = {};
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads the slots' states");

Slot g_slots[kMaxTemporaries];

}  // namespace

bool register_temporary(const std::string& path) noexcept {
  if (path.empty() || path.size() >= kMaxTemporaryPath) return false;
  for (Slot& s : g_slots) {
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kBusy, std::memory_order_acq_rel)) continue;
    std::memcpy(s.path, path.c_str(), path.size() + 1);
    s.state.store(kReady, std::memory_order_release);
    return true;
  }
  return false;
}

void unregister_temporary(const std::string& path) noexcept {
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != kReady || path != s.path) continue;
    int expected = kReady;
    if (!s.state.compare_exchange_strong(expected, kBusy, std::memory_order_acq_rel)) continue;
    s.path[0] = '\0';
    s.state.store(kFree, std::memory_order_release);
    return;
  }
}

void remove_temporaries_now() noexcept {
  for (Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kReady) (void)::unlink(s.path);
}

std::vector<std::string> registered_temporaries() {
  std::vector<std::string> out;
  for (const Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kReady) out.emplace_back(s.path);
  return out;
}

}  // namespace mtplab
