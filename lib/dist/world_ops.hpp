// Host-side collectives over a Group, typed: the control plane of a run (agreeing on a stop,
// handing rank 0's trace or file state to every rank, checking that the ranks did the same work,
// reducing timings). The harness reaches MPI only through these.
//
// Invariants:
// - Every function is collective over the group: every rank calls it, with the same root, op
//   and (where the text says so) the same element count.
// - Every MPI call is checked: a failure is an mtplab::Error naming the collective, the element
//   type and count, and MPI's own error string.
// - Every call is bounded: a collective that has not completed within mpi_timeout_s()
//   (MTPLAB_COLLECTIVE_TIMEOUT_S) ends the job with a message naming this rank, the collective
//   and the ranks that had not arrived, unless a PatientWait lives (a wait known to be long).
// - Buffers of any length: a call is split into pieces of at most `chunk` elements (default
//   kMaxChunkElements, below what MPI's int counts carry at any element size used here). An
//   element-wise reduction or a broadcast gives the same bits however it is split.
// - Integer reductions and min / max are exact; the order of a floating-point sum is MPI's.
//   Device-buffer collectives are dist::Communicator's (dist/communicator.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/numeric.hpp"
#include "dist/runtime.hpp"

namespace mtplab::dist {

enum class ReduceOp { min, max, sum };
const char* to_string(ReduceOp op);

/// The element types the typed helpers carry.
enum class Elem { i8, u8, i16, u16, i32, u32, i64, u64, f32, f64 };
const char* to_string(Elem elem);

/// 2^27 elements: 1 GiB of doubles, well below 2^31 bytes.
inline constexpr size_t kMaxChunkElements = size_t{1} << 27;

namespace detail {
template <typename T>
constexpr Elem elem_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bf16>)
    return Elem::u16;  // carried as its bits, never reduced
  else if constexpr (std::is_same_v<U, char>)
    return std::is_signed_v<char> ? Elem::i8 : Elem::u8;
  else if constexpr (std::is_same_v<U, float>)
    return Elem::f32;
  else if constexpr (std::is_same_v<U, double>)
    return Elem::f64;
  else {
    static_assert(std::is_integral_v<U> && !std::is_same_v<U, bool>, "dist helpers carry numbers only");
    constexpr bool s = std::is_signed_v<U>;
    if constexpr (sizeof(U) == 1)
      return s ? Elem::i8 : Elem::u8;
    else if constexpr (sizeof(U) == 2)
      return s ? Elem::i16 : Elem::u16;
    else if constexpr (sizeof(U) == 4)
      return s ? Elem::i32 : Elem::u32;
    else {
      static_assert(sizeof(U) == 8, "unsupported integer size");
      return s ? Elem::i64 : Elem::u64;
    }
  }
}
template <typename T>
constexpr bool reducible() {
  return !std::is_same_v<std::remove_cv_t<T>, bf16>;
}
}  // namespace detail

// ---- untyped entry points (the typed helpers below call these) -----------------------------------

/// `count` elements at `data` from `root` to every rank.
void broadcast_elems(const Group& g, void* data, size_t count, Elem elem, int root,
                     size_t chunk = kMaxChunkElements);
/// data[i] = op over ranks of data[i], on every rank (in place).
void all_reduce_elems(const Group& g, void* data, size_t count, Elem elem, ReduceOp op,
                      size_t chunk = kMaxChunkElements);
/// At `root`: data[i] = op over ranks of data[i] (in place); elsewhere `data` is left as it was.
void reduce_elems(const Group& g, void* data, size_t count, Elem elem, ReduceOp op, int root,
                  size_t chunk = kMaxChunkElements);

// ---- broadcast ------------------------------------------------------------------------------------

/// Root's `value` on every rank.
template <typename T>
void broadcast(const Group& g, T& value, int root = 0) {
  broadcast_elems(g, &value, 1, detail::elem_of<T>(), root);
}
/// Root's elements into `data` on every rank; every rank's span has the same size.
template <typename T>
void broadcast(const Group& g, std::span<T> data, int root = 0, size_t chunk = kMaxChunkElements) {
  broadcast_elems(g, data.data(), data.size(), detail::elem_of<T>(), root, chunk);
}
/// Root's vector on every rank: its size first, then its elements (other ranks are resized).
template <typename T>
void broadcast(const Group& g, std::vector<T>& values, int root = 0, size_t chunk = kMaxChunkElements) {
  uint64_t n = values.size();
  broadcast(g, n, root);
  if (g.rank() != root) values.resize(static_cast<size_t>(n));
  broadcast(g, std::span<T>(values), root, chunk);
}
/// Root's text on every rank.
void broadcast(const Group& g, std::string& text, int root = 0);
/// Root's list of texts on every rank.
void broadcast(const Group& g, std::vector<std::string>& texts, int root = 0);

// ---- reductions -----------------------------------------------------------------------------------

/// op over ranks of `value`, on every rank.
template <typename T>
T all_reduce(const Group& g, T value, ReduceOp op) {
  static_assert(detail::reducible<T>(), "BF16 values are carried, not reduced, here");
  all_reduce_elems(g, &value, 1, detail::elem_of<T>(), op);
  return value;
}
/// Element-wise op over ranks, in place on every rank; every rank's span has the same size.
template <typename T>
void all_reduce(const Group& g, std::span<T> values, ReduceOp op, size_t chunk = kMaxChunkElements) {
  static_assert(detail::reducible<T>(), "BF16 values are carried, not reduced, here");
  all_reduce_elems(g, values.data(), values.size(), detail::elem_of<T>(), op, chunk);
}
/// Element-wise op over ranks, in place at `root` (others keep their values); every rank's span
/// has the same size.
template <typename T>
void reduce(const Group& g, std::span<T> values, ReduceOp op, int root = 0,
            size_t chunk = kMaxChunkElements) {
  static_assert(detail::reducible<T>(), "BF16 values are carried, not reduced, here");
  reduce_elems(g, values.data(), values.size(), detail::elem_of<T>(), op, root, chunk);
}
/// Element-wise max over ranks at `root` (the per-step timings of a point).
inline void reduce_max_to_root(const Group& g, std::vector<double>& values, int root = 0,
                               size_t chunk = kMaxChunkElements) {
  reduce(g, std::span<double>(values), ReduceOp::max, root, chunk);
}

/// The least and the largest of every rank's value, on every rank.
template <typename T>
struct Spread {
  T min{}, max{};
  /// True when every rank held the same value.
  bool agree() const { return min == max; }
};
template <typename T>
Spread<T> min_max(const Group& g, T value) {
  return {all_reduce(g, value, ReduceOp::min), all_reduce(g, value, ReduceOp::max)};
}
/// Whether every rank holds the same `value` (min == max over ranks).
template <typename T>
bool all_agree(const Group& g, T value) {
  return min_max(g, value).agree();
}

/// Waits for every rank of the group.
void barrier(const Group& g);

/// While one lives, this rank's MPI collectives wait without the timeout: for a wait known to
/// outlast it, e.g. the ranks waiting for the broadcast of a synthetic trace that rank 0
/// generates. `why` is logged once when a wait passes the timeout. Scopes nest.
class PatientWait {
 public:
  explicit PatientWait(std::string why);
  ~PatientWait();
  PatientWait(const PatientWait&) = delete;
  PatientWait& operator=(const PatientWait&) = delete;

 private:
  std::string previous_why_;
};

}  // namespace mtplab::dist
