// run_guarded: print an error once, then end the job: MPI_Finalize and exit 1 when every rank
// knows the verdict (run_agreed), else MPI_Abort from the failing rank.
#include "dist/guard.hpp"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "core/str.hpp"
#include "dist/mpi_wait.hpp"

namespace mtplab::dist {
namespace {

bool g_failure_agreed = false;

/// World size when MPI is live (initialised and not finalised), else 0. Safe at any time.
int live_world_size() noexcept {
  int initialised = 0, finalised = 0;
  if (MPI_Initialized(&initialised) != MPI_SUCCESS || !initialised) return 0;
  if (MPI_Finalized(&finalised) != MPI_SUCCESS || finalised) return 0;
  int world = 0;
  if (MPI_Comm_size(MPI_COMM_WORLD, &world) != MPI_SUCCESS) return 0;
  return world;
}

std::string describe_any(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e)) return err->describe();
  return rank_tag() + e.what();
}

}  // namespace

AgreedError::AgreedError(const Error& cause, int reporter)
    : Error(cause.message(), cause.file().c_str(), cause.line()), reporter_(reporter) {}

AgreedError::AgreedError(std::string message, int reporter)
    : Error(std::move(message), __FILE__, __LINE__), reporter_(reporter) {}

bool failure_agreed() { return g_failure_agreed; }

int launcher_rank() {
  for (const char* name : {"PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    const std::optional<int64_t> rank = parse_int64(v);
    return rank && *rank >= 0 && *rank <= INT_MAX ? static_cast<int>(*rank) : -1;
  }
  return -1;
}

void run_agreed(const std::function<void()>& step) {
  const int world = live_world_size();
  if (world <= 1) {
    step();
    return;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::exception_ptr failure;
  try {
    step();
  } catch (...) {
    failure = std::current_exception();
  }
  // The lowest failing rank, INT_MAX when none failed.
  int mine = failure ? rank : INT_MAX, lowest = INT_MAX;
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) {
    if (failure) std::rethrow_exception(failure);
    MTP_FAIL("MPI_Iallreduce failed in dist::run_agreed");
  }
  detail::wait_bounded(req, MPI_COMM_WORLD,
                       [] { return std::string("agreement on a failure (all_reduce min of 1 x int32)"); });
  if (lowest == INT_MAX) return;
  g_failure_agreed = true;
  if (!failure) throw AgreedError(str("rank ", lowest, " failed (see its message)"), lowest);
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    throw AgreedError(e, lowest);
  } catch (const std::exception& e) {
    throw AgreedError(e.what(), lowest);
  } catch (...) {
    throw AgreedError("unknown exception", lowest);
  }
}

int fail_job(const char* line, int code) noexcept {
  std::fprintf(stderr, "%s\n", line);
  std::fflush(stderr);
  std::fflush(stdout);
  if (live_world_size() > 1) {
    // Open MPI's launcher then kills every rank, including those blocked in a collective.
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  return code;
}

int run_guarded(const std::function<int()>& body) noexcept {
  std::string line;
  int code = kExitError;
  try {
    return body();
  } catch (const AgreedError& e) {
    if (e.reports()) {
      std::fprintf(stderr, "%s\n", e.describe().c_str());
      std::fflush(stderr);
    }
    std::fflush(stdout);
    return kExitError;
  } catch (const ArgumentError& e) {
    if (launcher_rank() <= 0) {
      std::fprintf(stderr, "%s\n", e.describe().c_str());
      std::fflush(stderr);
    }
    return kExitError;
  } catch (const CollectiveTimeout& e) {
    line = e.describe();
    code = kExitCollectiveTimeout;
  } catch (const std::exception& e) {
    line = describe_any(e);
  } catch (...) {
    line = rank_tag() + "unknown exception";
  }
  return fail_job(line.c_str(), code);
}

}  // namespace mtplab::dist
