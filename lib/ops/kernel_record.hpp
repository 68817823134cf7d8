// Which kernel each op ran on a backend: the dispatch's choices as they were made (the CUDA
// backend's lib/ops/cuda/dispatch.cu), for the record of an experiment point beside its kernel
// policy. Per op, the distinct kernels it ran since the record was last cleared, in the order
// first seen (one op may run several: a batched op at another row count, the head at a batch
// bucket past a rule's limit).
//
// Invariants:
// - Ops and kernels are named by static texts (string literals): noting one is a pointer compare
//   in the common case, so the record costs next to nothing per launch.
// - A captured graph's launches are noted when recorded, not when replayed (the choices are made
//   at capture); a graph replays only under the policy it was recorded with.
// - The CPU reference runs one implementation per op and notes it as "cpu", under the op's
//   Backend name, for the ops whose CUDA kernel a dispatch rule picks (cpu/cpu_backend.hpp).
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace mtplab::ops {

class KernelRecord {
 public:
  /// `op` ran `kernel` (static texts).
  void note(const char* op, const char* kernel);
  void clear() {
    ops_.clear();
    last_ = 0;
  }
  bool empty() const { return ops_.empty(); }
  /// (op, "kernel[,kernel...]") per op, ops in name order: what a point records.
  std::vector<std::pair<std::string, std::string>> named() const;
  /// "op=kernel[,kernel...] ..." (named() joined), for logs.
  std::string text() const;

 private:
  struct Op {
    const char* name;
    std::vector<const char*> kernels;
  };
  std::vector<Op> ops_;
  size_t last_ = 0;  ///< the op noted last (the common repeat), when ops_ is not empty
};

}  // namespace mtplab::ops
