// Shared by the dist tests: inputs drawn from (seed, rank, index) so that every rank can compute
// every other rank's data and hence the expected result of a collective locally, and the
// run-wide seed (fresh each run, printed, MTPLAB_TEST_SEED to replay one).
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "common/seed.hpp"
#include "core/hash.hpp"
#include "core/numeric.hpp"
#include "dist/runtime.hpp"
#include "dist/world_ops.hpp"

namespace mtplab::dist::test {

inline uint64_t mix(uint64_t x) { return splitmix64_mix(x + kSplitmix64Gamma); }

/// 64 random bits for (seed, stream, rank, index); `stream` separates the tests' draws.
inline uint64_t draw(uint64_t seed, uint64_t stream, int rank, uint64_t index) {
  return mix(mix(mix(seed ^ (stream * 0x100000001b3ull)) + static_cast<uint64_t>(rank)) + index);
}

/// Uniform in [-1, 1), never exactly 0 (24 random bits, odd numerator).
inline float draw_unit(uint64_t seed, uint64_t stream, int rank, uint64_t index) {
  const auto m = static_cast<int64_t>((draw(seed, stream, rank, index) >> 40) | 1u);  // odd, < 2^24
  return static_cast<float>(m - (1 << 23)) / static_cast<float>(1 << 23);
}

/// A BF16 value in roughly [-4, 4], never zero, with a random full mantissa.
inline bf16 draw_bf16(uint64_t seed, uint64_t stream, int rank, uint64_t index) {
  const uint64_t r = draw(seed, stream, rank, index);
  const float mag = 1.0f + static_cast<float>(r & 0x7f) / 128.0f;  // 1.xxxxxxx: 7 mantissa bits
  const int exp = static_cast<int>((r >> 7) % 5) - 2;              // 2^-2 .. 2^2
  const float v = std::ldexp(mag, exp) * (((r >> 12) & 1) ? -1.0f : 1.0f);
  return to_bf16(v);
}

/// The run's seed, identical on every rank: MTPLAB_TEST_SEED when set, else a fresh one drawn
/// at rank 0, which prints it (collective).
inline uint64_t shared_seed(const Runtime& rt) {
  uint64_t seed = rt.rank() == 0 ? ::mtplab::test::env_seed_or_fresh() : 0;
  const Group world = rt.world_group();
  broadcast(world, seed);
  if (rt.rank() == 0) std::printf("%s\n", ::mtplab::test::seed_note(seed).c_str());
  return seed;
}

}  // namespace mtplab::dist::test
