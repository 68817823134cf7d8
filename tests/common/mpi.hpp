// For test programs that run under mpiexec: every rank runs every test, and the program's exit
// status is the worst over the ranks, so a failure on any rank fails the test on all of them.
#pragma once
#include <gtest/gtest.h>

#include "dist/runtime.hpp"
#include "dist/world_ops.hpp"

namespace mtplab::test {

/// RUN_ALL_TESTS() on this rank, then 1 on every rank when it failed on any (collective).
inline int run_all_tests_on_every_rank(const dist::Runtime& rt) {
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  const dist::Group world = rt.world_group();
  return dist::all_reduce(world, failed, dist::ReduceOp::max);
}

}  // namespace mtplab::test
