// The guard around every entry point: an exception anywhere on any rank must end the whole job,
// never leave the other ranks waiting in a collective; and an error is printed once.
//
// Two ways a job ends on an error:
// - every rank knows the verdict (run_agreed: each rank ran the same step, then one all-reduce
//   told every rank whether it failed anywhere): the lowest failing rank prints its message,
//   every rank unwinds, the Runtime finalises MPI and the process exits 1. No MPI_Abort, so no
//   launcher banner about an abort and no copy of the message per rank.
// - one rank failed where the others cannot learn it (in the middle of a run, they wait in a
//   collective it will never join): it prints its message and calls MPI_Abort, which ends the job.
#pragma once
#include <functional>

#include "core/error.hpp"

namespace mtplab::dist {

/// The exit codes of mtplab (`mtplab run --help` lists them; interruptions are 128 + signal).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;                ///< an error (also: a bad command line)
inline constexpr int kExitUsage = 2;                ///< no command, or an unknown one
inline constexpr int kExitCollectiveTimeout = 124;  ///< a collective did not complete in time

/// The error every rank holds after run_agreed found a failure. reports() is true on exactly one
/// rank (the lowest that failed), which prints it; on the ranks that did not fail, message()
/// names the rank that did.
class AgreedError : public Error {
 public:
  AgreedError(const Error& cause, int reporter);
  AgreedError(std::string message, int reporter);
  int reporter() const { return reporter_; }
  bool reports() const { return reporter_ == process_identity().rank; }

 private:
  int reporter_;
};

/// An error of the command line, found before MPI is up. Every rank of a launched job has the
/// same command line, hence the same error: run_guarded prints it on the launcher's rank 0 only.
class ArgumentError : public Error {
 public:
  explicit ArgumentError(const Error& cause) : Error(cause.message(), cause.file().c_str(), cause.line()) {}
};

/// This process's rank as its launcher set it in the environment (PMIX_RANK, OMPI_COMM_WORLD_RANK,
/// PMI_RANK or SLURM_PROCID, the first set), readable before MPI is up; -1 without a launcher.
/// Used only to print an error of the command line once.
int launcher_rank();

/// A collective that did not complete within the collective timeout (NCCL's wait(); the MPI
/// waits end the job themselves): run_guarded ends the job with kExitCollectiveTimeout.
class CollectiveTimeout : public Error {
 public:
  using Error::Error;
};

/// Runs `step` on this rank, then agrees with every rank of the world on whether it failed
/// anywhere (collective over MPI_COMM_WORLD: every rank must call it, at the same place, with
/// its own step). Returns when no rank failed; otherwise throws AgreedError on every rank. With
/// MPI not running, or a world of one, it only runs `step`.
void run_agreed(const std::function<void()>& step);

/// True once run_agreed has found a failure: the Runtime then finalises MPI while unwinding,
/// since every rank is leaving at the same place.
bool failure_agreed();

/// Runs `body` and returns its exit code. On an exception it prints the error once and ends:
/// - an AgreedError: printed by the rank that reports it; returns 1 (the Runtime, unwinding,
///   finalises MPI);
/// - an ArgumentError: printed by the launcher's rank 0 (or without a launcher); returns 1;
/// - any other: `[rank r@host] message` (Error::describe: `(file:line)` too under MTPLAB_DEBUG=1)
///   on stderr; then, when MPI is initialised, not yet finalised, and the world has more than one
///   rank, MPI_Abort(MPI_COMM_WORLD, code), which does not return (the launcher kills every rank);
///   otherwise returns the code: 1, or kExitCollectiveTimeout for a CollectiveTimeout.
/// It creates nothing itself: `body` owns its Runtime.
int run_guarded(const std::function<int()>& body) noexcept;

/// The tail of run_guarded for an error already caught: prints `line` and aborts the job with
/// `code` when more than one rank runs; returns `code` otherwise.
int fail_job(const char* line, int code = kExitError) noexcept;

}  // namespace mtplab::dist
