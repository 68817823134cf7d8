// run_guarded: print the failing rank's error, then take the whole job down with MPI_Abort.
#include "dist/guard.hpp"

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>

#include "core/error.hpp"
#include "core/str.hpp"

namespace mtplab::dist {
namespace {

/// World size when MPI is live (initialised and not finalised), else 0. Safe at any time.
int live_world_size() noexcept {
  int initialised = 0, finalised = 0;
  if (MPI_Initialized(&initialised) != MPI_SUCCESS || !initialised) return 0;
  if (MPI_Finalized(&finalised) != MPI_SUCCESS || finalised) return 0;
  int world = 0;
  if (MPI_Comm_size(MPI_COMM_WORLD, &world) != MPI_SUCCESS) return 0;
  return world;
}

}  // namespace

int fail_job(const char* line) noexcept {
  std::fprintf(stderr, "%s\n", line);
  std::fflush(stderr);
  std::fflush(stdout);
  if (live_world_size() > 1) {
    // Open MPI's launcher then kills every rank, including those blocked in a collective.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}

int run_guarded(const std::function<int()>& body) noexcept {
  std::string line;
  try {
    return body();
  } catch (const Error& e) {
    line = e.describe();
  } catch (const std::exception& e) {
    const auto& id = process_identity();
    line = str("[rank ", id.rank, "@", id.host, "] ", e.what());
  } catch (...) {
    const auto& id = process_identity();
    line = str("[rank ", id.rank, "@", id.host, "] unknown exception");
  }
  return fail_job(line.c_str());
}

}  // namespace mtplab::dist
