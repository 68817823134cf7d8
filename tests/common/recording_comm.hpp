// A communicator for the multi-rank drafter tests that forwards every call to another one and
// records each collective it issues, in order, so a test can assert how many collectives a step
// issued, of which kind and carrying how much.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "dist/communicator.hpp"

namespace mtplab::test {

class RecordingComm final : public dist::Communicator {
 public:
  /// all_reduce_sum (f32, bf16), all_reduce_max, all_gather, broadcast, barrier.
  enum Kind { sum_f32, sum_bf16, max_u64, gather, bcast, sync };
  struct Call {
    Kind kind;
    size_t size;  ///< elements (sums, max), bytes per rank (gather, bcast), 0 (sync)
    friend bool operator==(const Call&, const Call&) = default;
  };

  explicit RecordingComm(dist::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string kind() const override { return inner_.kind(); }
  bool on_device() const override { return inner_.on_device(); }
  void all_reduce_sum(const float* s, float* r, size_t n) override {
    note(sum_f32, n).all_reduce_sum(s, r, n);
  }
  void all_reduce_sum(const bf16* s, bf16* r, size_t n) override {
    note(sum_bf16, n).all_reduce_sum(s, r, n);
  }
  void all_reduce_max(const uint64_t* s, uint64_t* r, size_t n) override {
    note(max_u64, n).all_reduce_max(s, r, n);
  }
  void all_gather(const void* s, void* r, size_t bytes) override {
    note(gather, bytes).all_gather(s, r, bytes);
  }
  void broadcast(void* b, size_t bytes, int root) override { note(bcast, bytes).broadcast(b, bytes, root); }
  void barrier() override { note(sync, 0).barrier(); }
  void wait() override { inner_.wait(); }

  /// The sizes of the calls of kind `k`, in order.
  std::vector<size_t> sizes(Kind k) const {
    std::vector<size_t> out;
    for (const Call& c : calls)
      if (c.kind == k) out.push_back(c.size);
    return out;
  }

  std::vector<Call> calls;

 private:
  // Records the call, then returns the communicator it goes to.
  dist::Communicator& note(Kind kind, size_t size) {
    calls.push_back({kind, size});
    return inner_;
  }
  dist::Communicator& inner_;
};

}  // namespace mtplab::test
