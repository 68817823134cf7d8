// The guard around every entry point: an exception anywhere on any rank must end the whole job,
// never leave the other ranks waiting in a collective.
#pragma once
#include <functional>

namespace mtplab::dist {

/// Runs `body` and returns its exit code. On an exception it prints
/// `[rank r@host] message (file:line)` (mtplab::Error::describe) to stderr and then: when MPI is
/// initialised, not yet finalised, and the world has more than one rank, calls
/// MPI_Abort(MPI_COMM_WORLD, 1), which does not return (the launcher kills every rank);
/// otherwise returns 1. It creates nothing itself: `body` owns its Runtime.
int run_guarded(const std::function<int()>& body) noexcept;

/// The tail of run_guarded for an error already caught: prints `line` and aborts the job when
/// more than one rank runs; returns 1 otherwise.
int fail_job(const char* line) noexcept;

}  // namespace mtplab::dist
