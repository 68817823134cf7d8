// The stop handlers: async-signal-safe (flags, write(2), _exit); every text they print is made
// when they are installed.
#include "dist/stop_signals.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.hpp"
#include "core/str.hpp"
#include "core/temp_files.hpp"
#include "dist/guard.hpp"
#include "dist/world_ops.hpp"

namespace mtplab::dist {
namespace {

volatile std::sig_atomic_t g_first = 0;     // the first stop signal
volatile std::sig_atomic_t g_saw_int = 0;   // a SIGINT came
volatile std::sig_atomic_t g_saw_term = 0;  // a SIGTERM came
volatile std::sig_atomic_t g_first_from_parent = 0;
pid_t g_parent = 0;
bool g_note_first = true;  // print the note of the first signal (rank 0, or a rank not yet known)

/// A note made at install time, written by the handler.
struct Note {
  std::array<char, 512> text{};
  size_t len = 0;
  void set(const std::string& s) {
    len = std::min(s.size(), text.size());
    std::memcpy(text.data(), s.data(), len);
  }
  void write_out() const {
    if (len) (void)!::write(STDERR_FILENO, text.data(), len);
  }
};
// [0] SIGINT, [1] SIGTERM; the first signal's note also by [sent by the launcher].
Note g_first_note[2][2], g_again_note[2];

std::string& launcher_name() {
  static std::string name;
  return name;
}

extern "C" void on_stop_signal(int sig, siginfo_t* info, void* /*context*/) {
  const int i = sig == SIGINT ? 0 : 1;
  if (sig == SIGINT) g_saw_int = 1;
  if (sig == SIGTERM) g_saw_term = 1;
  if (g_first == 0) {
    g_first = sig;
    g_first_from_parent = info != nullptr && info->si_code == SI_USER && info->si_pid == g_parent;
    if (g_note_first) g_first_note[i][g_first_from_parent ? 1 : 0].write_out();
    return;
  }
  if (sig != g_first) return;  // a launcher passing the same stop on
  remove_temporaries_now();    // a point being written: its temporary goes, the file stays as it was
  g_again_note[i].write_out();
  _exit(128 + sig);
}

/// The name of the parent process when it is a launcher that signals its ranks, else "".
std::string parent_launcher(pid_t parent) {
  std::ifstream in(str("/proc/", parent, "/comm"));
  std::string name;
  if (!in || !std::getline(in, name)) return "";
  for (const char* known : {"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "slurmstepd"})
    if (name == known) return name;
  return "";
}

std::string signal_text(int sig) {
  const char* name = strsignal(sig);
  return str("signal ", sig, " (", name ? name : "?", ")");
}

/// Who sent a SIGTERM that came from the launcher, and what that means; "" for no launcher.
std::string launcher_note(int sig) {
  const std::string& name = launcher_name();
  if (name.empty() || sig != SIGTERM) return "";
  if (name == "slurmstepd") return " from slurmstepd (scancel, or the job's time limit)";
  return str(
      " from ", name,
      ", the launcher (Open MPI's stops a job with SIGTERM for a Ctrl-C, a SIGTERM or a SIGHUP it receives)");
}

}  // namespace

void install_stop_handlers(const std::string& what_stays) {
  g_parent = getppid();
  launcher_name() = parent_launcher(g_parent);
  // Before MPI is up (a run installs them first thing) the launcher's rank decides who notes.
  const int rank = process_identity().rank >= 0 ? process_identity().rank : launcher_rank();
  g_note_first = rank <= 0;
  for (const int sig : {SIGINT, SIGTERM}) {
    const int i = sig == SIGINT ? 0 : 1;
    for (const int from_launcher : {0, 1})
      g_first_note[i][from_launcher].set(str(
          rank_tag(), signal_text(sig), from_launcher ? launcher_note(sig) : "",
          ": stopping at the next step boundary; ", what_stays, " (the same signal again stops at once)\n"));
    g_again_note[i].set(str(rank_tag(), signal_text(sig), " again: stopping now, exit ", 128 + sig, "; ",
                            what_stays,
                            ", since a point is written whole or not at all (no temporary file "
                            "is left)\n"));
  }
  struct sigaction sa {};
  sa.sa_sigaction = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);  // one handler at a time
  sigaddset(&sa.sa_mask, SIGTERM);
  sa.sa_flags = SA_SIGINFO;
  MTP_REQUIRE(sigaction(SIGTERM, &sa, nullptr) == 0 && sigaction(SIGINT, &sa, nullptr) == 0,
              "cannot install the SIGTERM / SIGINT handlers: ", std::strerror(errno));
}

int stop_signal() { return static_cast<int>(g_first); }

int agreed_stop_signal(const Group& g) {
  const int mine = g_saw_int ? 2 : g_saw_term ? 1 : 0;
  const int agreed = all_reduce(g, mine, ReduceOp::max);
  return agreed == 2 ? SIGINT : agreed == 1 ? SIGTERM : 0;
}

std::string describe_stop_signal(int sig) {
  const bool from_launcher = sig == SIGTERM && g_first == SIGTERM && g_first_from_parent;
  return signal_text(sig) + (from_launcher ? launcher_note(sig) : "");
}

}  // namespace mtplab::dist
