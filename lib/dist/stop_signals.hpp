// The stop signals of a run (SIGTERM, SIGINT): the handlers, and the ranks' agreement on the
// signal the job stops for.
//
// - The first SIGTERM or SIGINT only sets a flag: the run stops at the next step boundary, where
//   the ranks agree (agreed_stop_signal, after every step). Rank 0 prints a note at once, so the
//   stop is explained even when a launcher kills the ranks before they finish stopping.
// - The same signal again stops this rank at once (exit 128 + signal) after a note: the results
//   file is still valid, since a point is committed whole or not at all, and the temporary file of
//   a point being written is removed first (core/temp_files.hpp).
// - Another stop signal after the first (SIGINT, then the SIGTERM of a launcher passing the same
//   stop on) changes nothing.
// - The ranks agree on SIGINT when any rank saw one (a Ctrl-C: it reaches the ranks as SIGINT
//   without a launcher and under srun), else SIGTERM. Open MPI's mpirun turns a Ctrl-C into
//   SIGTERM before the ranks see it (it ends a job with SIGTERM for SIGINT, SIGTERM and SIGHUP
//   alike), so a rank cannot tell it from a SIGTERM; describe_stop_signal then names mpirun as the
//   sender, and says so.
#pragma once
#include <string>

#include "dist/runtime.hpp"

namespace mtplab::dist {

/// Installs the SIGTERM / SIGINT handlers (again: replaces the note). `what_stays` ends the notes,
/// e.g. "results/q.h5 keeps every completed point".
void install_stop_handlers(const std::string& what_stays);
/// This rank's first stop signal; 0 when none came.
int stop_signal();
/// The signal the job stops for, the same on every rank of `g` (collective): SIGINT when any rank
/// saw one, else SIGTERM when any rank saw one, else 0.
int agreed_stop_signal(const Group& g);
/// "signal 2 (Interrupt)"; for a SIGTERM that this rank's launcher sent (its parent process, when
/// that is mpirun, orted, prterun or slurmstepd), also who sent it and what that means.
std::string describe_stop_signal(int sig);

}  // namespace mtplab::dist
