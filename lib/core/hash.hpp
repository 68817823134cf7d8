// The hashes of mtplab: FNV-1a 64 for identities and names, the splitmix64 mixer for seeded
// streams. One definition each, so that a value computed in one module is the value another
// recomputes.
//
// fnv1a64 is the standard function (offset basis 14695981039346656037, prime 1099511628211): a
// results file's identity (docs/results-schema.md), content fingerprints, synthetic weights'
// names. fnv1a64_words is the same loop over 32-bit words (one XOR per word, not per byte), which
// the run loop uses to compare the ranks' drafts.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace mtplab {

inline constexpr uint64_t kFnv1a64Prime = 1099511628211ull;
inline constexpr uint64_t kFnv1a64OffsetBasis = 14695981039346656037ull;

/// FNV-1a 64 of `bytes` from offset basis `basis`.
constexpr uint64_t fnv1a64_from(uint64_t basis, std::string_view bytes) {
  uint64_t h = basis;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnv1a64Prime;
  }
  return h;
}

/// Standard FNV-1a 64: "" -> cbf29ce484222325, "a" -> af63dc4c8601ec8c.
constexpr uint64_t fnv1a64(std::string_view bytes) { return fnv1a64_from(kFnv1a64OffsetBasis, bytes); }

/// FNV-1a 64 over 32-bit words from the standard basis: h ^= uint32(word); h *= prime, once per word.
constexpr uint64_t fnv1a64_words(std::span<const int32_t> words) {
  uint64_t h = kFnv1a64OffsetBasis;
  for (const int32_t w : words) {
    h ^= static_cast<uint32_t>(w);
    h *= kFnv1a64Prime;
  }
  return h;
}

/// `value` as 16 lower-case hex digits, most significant first.
std::string hex16(uint64_t value);

inline constexpr uint64_t kSplitmix64Gamma = 0x9e3779b97f4a7c15ull;

/// The splitmix64 finaliser: a bijection of 64-bit values that mixes every input bit into every
/// output bit.
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// One step of the splitmix64 generator: advances `state` by the gamma, returns its mix.
constexpr uint64_t splitmix64_next(uint64_t& state) { return splitmix64_mix(state += kSplitmix64Gamma); }

/// A uniform in [0, 1) from a counter (no generator state): the stream `salt` (eight ASCII bytes
/// read as a big-endian word, e.g. "mtplab-v"), then `seed`, then the two coordinates mixed in
/// turn, 64-bit wrapping:
///   h = mix(seed ^ salt); h = mix(h ^ (a * 0x9e3779b97f4a7c15)); h = mix(h ^ (b * 0xd1b54a32d192ed03))
///   u = (h >> 11) * 2^-53                                                   (mix: splitmix64_mix)
/// The same (salt, seed, a, b) gives the same u on every rank, backend and run.
constexpr double counter_uniform(uint64_t salt, int64_t seed, int64_t a, int64_t b) {
  uint64_t h = splitmix64_mix(static_cast<uint64_t>(seed) ^ salt);
  h = splitmix64_mix(h ^ (static_cast<uint64_t>(a) * kSplitmix64Gamma));
  h = splitmix64_mix(h ^ (static_cast<uint64_t>(b) * 0xd1b54a32d192ed03ull));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace mtplab
