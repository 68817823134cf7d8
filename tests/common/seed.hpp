// The seeds of the tests' random inputs. Every test that draws random inputs prints its seed
// with a failure; MTPLAB_TEST_SEED=<decimal> replays that run (or tries another seed).
#pragma once
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace mtplab::test {

inline constexpr const char* kTestSeedEnv = "MTPLAB_TEST_SEED";

/// MTPLAB_TEST_SEED when set, else `fallback`. A value that is not a decimal 64-bit unsigned
/// integer is an Error naming the variable (a typo must not silently pick another seed).
inline uint64_t env_seed_or(uint64_t fallback) {
  const char* env = std::getenv(kTestSeedEnv);
  if (!env || !*env) return fallback;
  const std::string_view text(env);
  uint64_t seed = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seed, 10);
  MTP_REQUIRE(ec == std::errc() && end == text.data() + text.size(), kTestSeedEnv, "=", text,
              " is not a decimal seed (0 .. 18446744073709551615)");
  return seed;
}

/// 64 fresh bits from std::random_device.
inline uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

/// MTPLAB_TEST_SEED when set, else a fresh seed: every run tries new inputs.
inline uint64_t env_seed_or_fresh() {
  const char* env = std::getenv(kTestSeedEnv);
  return env && *env ? env_seed_or(0) : fresh_seed();
}

/// What a failure prints so that the run can be replayed.
inline std::string seed_note(uint64_t seed) {
  return "seed " + std::to_string(seed) + " (rerun with " + kTestSeedEnv + "=" + std::to_string(seed) + ")";
}

}  // namespace mtplab::test
