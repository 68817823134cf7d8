// The temporary files a process is writing (a results file's FILE.tmp.<pid> while a point is
// added, a trace's while it is written), so that a signal that stops the process at once can remove
// them: dist/stop_signals.hpp's second SIGTERM / SIGINT calls remove_temporaries_now() before it
// exits, so that no stale temporary is left beside the file.
//
// Invariants:
// - remove_temporaries_now() is async-signal-safe (atomics and unlink(2) only) and may run on any
//   thread, at any point of register / unregister: a path is removed only once fully registered.
// - A fixed table of kMaxTemporaries paths of up to kMaxTemporaryPath bytes: a path beyond either
//   is not registered (register_temporary returns false); it is then left to the next writer, which
//   removes the temporaries of dead processes.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace mtplab {

inline constexpr size_t kMaxTemporaries = 16;
inline constexpr size_t kMaxTemporaryPath = 4096;

/// Registers `path` as a temporary file of this process; false when it does not fit the table.
bool register_temporary(const std::string& path) noexcept;
/// Forgets `path` (committed by a rename, or removed). Nothing when it is not registered.
void unregister_temporary(const std::string& path) noexcept;
/// Unlinks every registered temporary. Async-signal-safe.
void remove_temporaries_now() noexcept;
/// The registered paths (tests).
std::vector<std::string> registered_temporaries();

}  // namespace mtplab
