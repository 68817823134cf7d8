// Running an experiment: every point (or one, for a Slurm array task) on every rank, measured,
// with rank 0 writing each finished point to the results file.
//
// Invariants:
// - All ranks run the same points in the same order and take the same decisions: which points
//   to skip (rank 0 reads the file and broadcasts), when to stop a replay (max_steps), and
//   whether to stop for a signal (an MPI_Allreduce of the flag after every step, outside the
//   timed region).
// - SIGTERM / SIGINT only set a flag: the run stops at the next step boundary on every rank,
//   the point in progress is discarded, the file keeps every completed point, and the exit code
//   is 128 + the signal number (SIGINT when any rank saw one; the same signal again stops a rank
//   at once: dist/stop_signals.hpp).
// - Step latency is the max over ranks of each rank's figure, reduced once per point.
#pragma once
#include <string>
#include <vector>

#include "dist/runtime.hpp"
#include "harness/experiment.hpp"
#include "harness/preflight.hpp"

namespace mtplab::harness {

struct RunOptions {
  std::vector<std::string> argv;  ///< the command line, for the provenance
  /// The `mtplab check ...` command that repeats the input checks of this run (check_command).
  std::string check_command;
};

/// Runs the points `pre.todo` of `pre.ex` (expanded for rt.world() ranks) into `pre.output`, after
/// the input check (check_inputs with run_check_options: the checks `mtplab check` runs). Returns
/// the process exit code: 0 when every requested point is in the file, 2 when the inputs are
/// refused, 128 + signal when interrupted. Collective over the world.
int run_experiment(dist::Runtime& rt, const Preflight& pre, const RunOptions& options);

/// Installs the SIGTERM / SIGINT handlers that set the stop flag (idempotent).
void install_stop_handlers();
/// The signal that asked to stop, 0 when none.
int stop_signal();

}  // namespace mtplab::harness
