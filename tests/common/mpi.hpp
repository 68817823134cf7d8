// For test programs that run under mpiexec: every rank runs every test, one report (rank 0's,
// plus any failure of another rank, prefixed with its rank), and the program's exit status is the
// worst over the ranks, so a failure on any rank fails the test on all of them.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "dist/world_ops.hpp"

namespace mtplab::test {

/// Prints failures as `[rank r] file:line` + message; replaces gtest's printer on ranks != 0 so
/// that a passing run shows one report, not one per rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
  }

 private:
  int rank_;
};

inline void report_from_rank0_only(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

/// RUN_ALL_TESTS() on this rank, then 1 on every rank when it failed on any (collective).
inline int run_all_tests_on_every_rank(const dist::Runtime& rt) {
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  const dist::Group world = rt.world_group();
  return dist::all_reduce(world, failed, dist::ReduceOp::max);
}

/// main() of a test program under mpiexec, inside dist::run_guarded: a Runtime, gtest reporting
/// from rank 0 only, then `body(rt)`, which sets up what the tests need and returns the exit
/// status (run_all_tests_on_every_rank(rt), or 77 to skip).
template <typename Body>
int mpi_test_main(int argc, char** argv, Body&& body) {
  return dist::run_guarded([&] {
    dist::Runtime rt(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    report_from_rank0_only(rt.rank());
    return body(rt);
  });
}

}  // namespace mtplab::test
