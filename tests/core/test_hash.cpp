// core/hash: the standard FNV-1a 64 against published test vectors, its 32-bit-words form against
// values computed independently (a Python loop over the same definition), and
// the splitmix64 mixer against its published first outputs, the counter uniform against values
// computed independently.
#include <gtest/gtest.h>

#include <vector>

#include "core/hash.hpp"

using namespace mtplab;

TEST(Hash, StandardFnv1a64TestVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
  static_assert(fnv1a64("a") == 0xaf63dc4c8601ec8cull, "usable at compile time");
}

TEST(Hash, WordsVariant) {
  EXPECT_EQ(fnv1a64_words({}), kFnv1a64OffsetBasis);
  // A Python loop over the definition: h = basis; per word h = ((h ^ (w & 0xffffffff)) * prime) % 2**64.
  const std::vector<int32_t> w = {1, -2, 70000};
  EXPECT_EQ(fnv1a64_words(w), 0x2d78686897393412ull);
  // One XOR per word, not per byte: differs from hashing the words' bytes, and depends on the order.
  const std::vector<int32_t> swapped = {-2, 1, 70000};
  EXPECT_NE(fnv1a64_words(swapped), fnv1a64_words(w));
}

TEST(Hash, Hex16) {
  EXPECT_EQ(hex16(0), "0000000000000000");
  EXPECT_EQ(hex16(0xcbf29ce484222325ull), "cbf29ce484222325");
  EXPECT_EQ(hex16(0xf), "000000000000000f");
}

TEST(Hash, Splitmix64) {
  // The first outputs of splitmix64 seeded with 0 (Vigna's reference implementation).
  uint64_t state = 0;
  EXPECT_EQ(splitmix64_next(state), 0xe220a8397b1dcdafull);
  EXPECT_EQ(splitmix64_next(state), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(splitmix64_next(state), 0x06c45d188009454full);
  EXPECT_EQ(state, 3 * kSplitmix64Gamma);
  EXPECT_EQ(splitmix64_mix(0), 0u);
}

TEST(Hash, CounterUniformMatchesItsDefinition) {
  // Values from a Python loop over the definition in hash.hpp (the salts are the replay's coins,
  // "mtplab-v", and the synthetic sampler's, "syntheti"); negative inputs wrap as uint64.
  EXPECT_EQ(counter_uniform(0x6d74706c61622d76ull, 1, 2, 3), 0.7606404806210801);
  EXPECT_EQ(counter_uniform(0x73796e7468657469ull, 5, 1, 2), 0.3394282894798948);
  EXPECT_EQ(counter_uniform(0x6d74706c61622d76ull, -1, -7, int64_t{1} << 40), 0.10243258868419736);
  static_assert(counter_uniform(1, 0, 0, 0) >= 0.0 && counter_uniform(1, 0, 0, 0) < 1.0);
}
