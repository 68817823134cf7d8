// The bounded wait of every MPI collective (internal to dist). A collective is started
// non-blocking (MPI_Iallreduce, MPI_Ibcast, ...) and completed by wait_bounded(), which polls it
// against the collective timeout, the same MTPLAB_COLLECTIVE_TIMEOUT_S that bounds NCCL's. A
// collective still incomplete at the deadline ends the job: this rank asks every other rank what
// it is doing (an arrival probe on a communicator of its own), prints which collective it waited
// in and which ranks of its group had not arrived, and calls MPI_Abort (exit 124).
//
// Invariants:
// - Only the main thread calls MPI (MPI_THREAD_FUNNELED): the polling, the probes and the abort
//   all run on the thread that waits; nothing here starts a thread.
// - A rank waiting in a collective answers the other ranks' probes (after 20 ms of waiting, so a
//   collective that completes at once pays one MPI_Test). A rank that is computing, stopped
//   (SIGSTOP) or dead does not answer: that is how a missing peer is told from a waiting one.
// - When several ranks time out together, the lowest of them reports and ends the job; the others
//   stay quiet (they report themselves only if the job has not ended one timeout later), so the
//   message is printed once.
// - The timeout counts the time this rank waited while it ran: a gap between two polls (which come
//   every 500 us at most) longer than a third of the timeout (1 s at most) is time the rank was
//   stopped or not scheduled, and moves the deadline. A rank continued after a SIGSTOP does not
//   report its peers for the time it was stopped itself.
#pragma once
#include <mpi.h>

#include <string>
#include <type_traits>

namespace mtplab::dist::detail {

/// A collective's name for messages, built only when one is needed (a host collective in a
/// draft step must not pay for a string): a reference to a callable returning the text.
class CallName {
 public:
  template <typename F>
  requires(!std::is_same_v<std::decay_t<F>, CallName>)
      CallName(const F& f)  // NOLINT(google-explicit-constructor): lambdas convert at the call
      : obj_(&f), fn_([](const void* o) { return std::string((*static_cast<const F*>(o))()); }) {}
  std::string operator()() const { return fn_(obj_); }

 private:
  const void* obj_;
  std::string (*fn_)(const void*);
};

/// Completes `request`, a non-blocking collective just started on `comm`. Returns when it
/// completes; throws mtplab::Error naming `what` when MPI reports a failure; does not return when
/// the collective timeout passes first (the job ends, see above), unless a PatientWait lives.
void wait_bounded(MPI_Request& request, MPI_Comm comm, const CallName& what);

/// Starts the arrival probes (collective over the world: a duplicate of MPI_COMM_WORLD for them)
/// with the world's rank and size; Runtime calls it once MPI is up. Until then, and after
/// watch_stop(), waits are bounded all the same but ask no one.
void watch_start(int world_rank, int world_size);
void watch_stop() noexcept;

}  // namespace mtplab::dist::detail
