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
  enum Kind { sum_f32, sum_bf16, max_u64, gather, broadcast, barrier };
  struct Call {
    Kind kind;
    size_t size;  ///< elements (sums, max), bytes per rank (gather, broadcast), 0 (barrier)
    friend bool operator==(const Call&, const Call&) = default;
  };

  explicit RecordingComm(dist::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string kind() const override { return inner_.kind(); }
  bool on_device() const override { return inner_.on_device(); }
  void all_reduce_sum(const float* send, float* recv, size_t count) override {
    calls.push_back({sum_f32, count});
    inner_.all_reduce_sum(send, recv, count);
  }
  void all_reduce_sum(const bf16* send, bf16* recv, size_t count) override {
    calls.push_back({sum_bf16, count});
    inner_.all_reduce_sum(send, recv, count);
  }
  void all_reduce_max(const uint64_t* send, uint64_t* recv, size_t count) override {
    calls.push_back({max_u64, count});
    inner_.all_reduce_max(send, recv, count);
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    calls.push_back({gather, bytes});
    inner_.all_gather(send, recv, bytes);
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    calls.push_back({broadcast, bytes});
    inner_.broadcast(buf, bytes, root);
  }
  void barrier() override {
    calls.push_back({Kind::barrier, 0});
    inner_.barrier();
  }
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
  dist::Communicator& inner_;
};

}  // namespace mtplab::test
