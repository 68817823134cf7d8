// The two implementations of dist::Communicator and the factory that picks one.
//
// - MpiCommunicator: host buffers, every call complete when it returns (waited for within
//   mpi_timeout_s(), see dist/mpi_wait.hpp). BF16 sums go through a
//   user MPI_Op that adds two BF16 values in fp32 and rounds the result to BF16 (RNE), the same
//   pairwise rounding NCCL applies to ncclBfloat16, so a 2-rank sum is bit-identical on both.
// - NcclCommunicator: device buffers, calls only enqueue work on the backend's stream; wait()
//   bounds how long that work may take (collective timeout, then ncclCommAbort + mtplab::Error).
//
// Invariants:
// - The MPI communicator handed in is borrowed: it must outlive the Communicator built on it.
// - NCCL: the current CUDA device when the communicator is created is its device for life.
// - NCCL: a CUDA graph executable that captured calls on a communicator must be destroyed before
//   that communicator (ncclCommDestroy waits forever while such a graph is still instantiated).
// - No NCCL_* environment variable is ever written here; the user's settings are NCCL's input.
#pragma once
#include <mpi.h>

#include <memory>
#include <string_view>

#include "dist/communicator.hpp"

namespace mtplab::dist {

enum class Transport { mpi, nccl };
const char* to_string(Transport transport);
/// The transport a backend works with, from the backend's name ("cpu" -> mpi, "cuda" -> nccl;
/// the names ops::to_string(BackendKind) gives; dist does not depend on ops).
Transport transport_for_backend(std::string_view backend_kind);

/// True when mtplab was built with NCCL (MTPLAB_HAVE_NCCL).
bool nccl_available();

/// How an NCCL communicator is created: blocking (the default; a call returns once its work is
/// enqueued, every host call into NCCL runs under a watchdog that aborts it after the timeout) or
/// non_blocking (every call returns ncclInProgress and is polled against the deadline; no watchdog;
/// ~25 us more per host-issued collective on an H200 pair). The same results either way. The
/// caller picks it (an experiment point's kernels.nccl_blocking); nothing here reads the
/// environment for it.
enum class NcclMode { blocking, non_blocking };
const char* to_string(NcclMode mode);

inline constexpr double kDefaultCollectiveTimeoutS = 60.0;
inline constexpr const char* kCollectiveTimeoutEnv = "MTPLAB_COLLECTIVE_TIMEOUT_S";
/// Seconds a collective (NCCL or MPI; an NCCL communicator's creation too) may take before it is
/// declared dead: MTPLAB_COLLECTIVE_TIMEOUT_S when set, else 60. Throws on a malformed value.
double collective_timeout_s();
/// Parses a timeout in seconds (finite, > 0); `origin` names the source in the error message.
double parse_timeout_s(std::string_view text, std::string_view origin);

/// The bound of every MPI collective of this process (MpiCommunicator, the host collectives of
/// world_ops, the Runtime's own): collective_timeout_s() when the Runtime started, else 60 s. An
/// MPI collective still incomplete then ends the job with a message naming this rank, the
/// collective and the ranks that had not arrived (exit 124; dist/mpi_wait.hpp).
double mpi_timeout_s();
/// Changes it for this process (tests; > 0 and finite).
void set_mpi_timeout_s(double seconds);

/// Host-buffer collectives over `comm` (borrowed).
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "mpi"; }
  bool on_device() const override { return false; }
  void all_reduce_sum(const float* send, float* recv, size_t count) override;
  void all_reduce_sum(const bf16* send, bf16* recv, size_t count) override;
  void all_reduce_max(const uint64_t* send, uint64_t* recv, size_t count) override;
  void all_gather(const void* send, void* recv, size_t bytes) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;

 private:
  MPI_Comm comm_;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  int rank_ = 0;
  int size_ = 1;
};

/// Device-buffer collectives through NCCL (only when built with NCCL; create() throws otherwise).
class NcclCommunicator : public Communicator {
 public:
  /// Collective over `comm`: its rank 0 makes the NCCL unique id and broadcasts it. Every host
  /// call into NCCL, creation included, is bounded by `timeout_s` (a watchdog thread aborts a
  /// blocking communicator; a non_blocking one is polled instead). `stream` is a cudaStream_t
  /// (nullptr: the legacy default stream). Every rank of `comm` must pass the same mode.
  static std::unique_ptr<NcclCommunicator> create(MPI_Comm comm, void* stream,
                                                  double timeout_s = collective_timeout_s(),
                                                  NcclMode mode = NcclMode::blocking);
  std::string kind() const override { return "nccl"; }
  bool on_device() const override { return true; }

  virtual void* stream() const = 0;
  /// The mode it was created with.
  virtual NcclMode mode() const = 0;
  virtual double timeout_s() const = 0;
  virtual void set_timeout_s(double seconds) = 0;
  /// Aborts the NCCL communicator (local, never blocks on peers); every later call throws.
  virtual void abort() noexcept = 0;
  virtual bool aborted() const = 0;
};

/// The factory: MpiCommunicator for Transport::mpi (stream and mode ignored), NcclCommunicator for
/// nccl.
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Transport transport, void* stream = nullptr,
                                                NcclMode mode = NcclMode::blocking);

}  // namespace mtplab::dist
