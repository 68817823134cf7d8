// Collectives across ranks. Two implementations with one interface:
// - MPI: host buffers, used with the CPU backend (CI, laptops, the quickstart);
// - NCCL: device buffers on the backend's stream, used with the CUDA backend.
// Every call is collective over the communicator's group; counts are elements, not bytes.
// A collective that does not complete within the timeout (a dead peer) raises mtplab::Error
// instead of hanging (NCCL: checked in wait(); MPI: Open MPI ends the job when a rank dies).
// Implementations and their factory: dist/collectives.hpp; groups and bootstrap: dist/runtime.hpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/numeric.hpp"

namespace mtplab::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi" or "nccl".
  virtual std::string kind() const = 0;
  /// True when buffers are device memory (NCCL).
  virtual bool on_device() const = 0;

  /// recv = sum over ranks of send (in place when send == recv).
  virtual void all_reduce_sum(const float* send, float* recv, size_t count) = 0;
  virtual void all_reduce_sum(const bf16* send, bf16* recv, size_t count) = 0;
  virtual void all_reduce_max(const uint64_t* send, uint64_t* recv, size_t count) = 0;
  /// recv [size * bytes] = concatenation of every rank's `bytes` of send, in rank order.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  /// Blocks until every collective issued on this communicator so far has completed. MPI calls
  /// complete before they return, so this is a no-op there. NCCL calls are only enqueued on the
  /// stream: wait() polls them against the collective timeout and, when it passes or NCCL reports
  /// an error, aborts the communicator and throws mtplab::Error. Use it instead of a bare stream
  /// synchronize after collectives, which would hang forever on a dead peer.
  virtual void wait() {}
};

}  // namespace mtplab::dist
