// The bound of the start-up (internal to dist). Until the collective timeout's own watch is up
// (dist/mpi_wait.hpp: the arrival probes), no MPI call of a rank is bounded: MPI_Init_thread waits
// for every rank of the job (the launcher's wire-up is a collective) and has no non-blocking form,
// and so does the duplicate of the world that the probes use. A StartupWatch bounds that stretch:
// a thread, started before MPI_Init_thread, that ends the job when the start-up has not completed
// within MTPLAB_STARTUP_TIMEOUT_S seconds (default 60).
//
// Invariants:
// - The thread never calls MPI (the process is MPI_THREAD_FUNNELED): on expiry it prints one line
//   and exits the process with kExitCollectiveTimeout (124); the launcher then ends the job (a rank
//   that exits non-zero ends an mpirun job; srun with --kill-on-bad-exit=1).
// - The line names the ranks of this host that have not arrived, from /proc: the processes of the
//   same job (the launcher's job id in their environment, else the same parent process) and their
//   launcher rank; a stopped one (SIGSTOP, a debugger) is named as stopped; one running without
//   having started MPI as busy; ranks not on this host are listed as such. A rank that reached the
//   start-up names its watch thread "mtplab-startup", which is how the others tell it arrived.
// - One line per host: the lowest rank of the host that is waiting reports; the others stay quiet
//   one timeout longer (and report then if the job is still alive).
// - The timeout counts the time the process ran: a gap between two looks (every 10 to 100 ms)
//   longer than a third of the timeout (1 s at most) is time it was stopped, and moves the deadline.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace mtplab::dist::detail {

inline constexpr const char* kStartupTimeoutEnv = "MTPLAB_STARTUP_TIMEOUT_S";
inline constexpr double kDefaultStartupTimeoutS = 60.0;
/// MTPLAB_STARTUP_TIMEOUT_S when set, else 60; a malformed value throws an Error naming it.
double startup_timeout_s();

/// The launcher's world size from the environment (OMPI_COMM_WORLD_SIZE, SLURM_STEP_NUM_TASKS,
/// SLURM_NTASKS, PMI_SIZE, the first set), -1 when none is set.
int launcher_world_size();

class StartupWatch {
 public:
  /// Starts the watch thread; `phase` says what the process waits in ("MPI initialisation ...").
  StartupWatch(double timeout_s, std::string phase);
  ~StartupWatch();  ///< stop()
  StartupWatch(const StartupWatch&) = delete;
  StartupWatch& operator=(const StartupWatch&) = delete;

  /// What the process now waits in (for the message).
  void phase(std::string what);
  /// The start-up completed: the thread ends (joined).
  void stop();

 private:
  void loop();
  [[noreturn]] void expire(const std::string& phase);

  double timeout_s_;
  std::mutex m_;
  std::condition_variable cv_;
  std::string phase_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mtplab::dist::detail
