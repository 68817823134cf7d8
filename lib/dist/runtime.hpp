// Launch and bootstrap: one process per rank under mpirun, srun --mpi=pmix, or alone.
//
// Runtime is the RAII owner of MPI for the process: it initialises MPI (MPI_THREAD_FUNNELED:
// only the main thread calls MPI), records rank / world in mtplab::process_identity(), finds the
// ranks that share this node (MPI_Comm_split_type SHARED) and, for the CUDA backend, binds the
// rank to its GPU. Groups (world, TP, EP ...) are MPI communicators split from the world, each
// with the Communicator that runs collectives over it.
//
// Invariants:
// - One Runtime per process; every Group must be destroyed before the Runtime.
// - MPI errors come back as return codes (MPI_ERRORS_RETURN on MPI_COMM_WORLD) and are thrown.
// - When the Runtime is destroyed while an exception unwinds the stack and other ranks exist,
//   MPI is not finalised (a finalise would wait for ranks stuck in a collective): the guard that
//   catches the exception calls MPI_Abort instead (dist/guard.hpp). Unless the ranks agreed on
//   the failure (dist::run_agreed): then every rank unwinds from the same place and finalises.
// - Every collective of the Runtime (the bootstrap's, gather_strings, world_group, make_group,
//   bind_device's) is bounded by the collective timeout like every other MPI collective
//   (dist/mpi_wait.hpp); the constructor reads MTPLAB_COLLECTIVE_TIMEOUT_S for them. MPI
//   initialisation and the duplicate of the world that comes before them are bounded by
//   MTPLAB_STARTUP_TIMEOUT_S instead (dist/startup.hpp): a rank stopped or missing at start-up
//   ends the job with a message naming it (exit 124).
// - Device choice: local rank, or 0 when the scheduler shows each task a single GPU
//   (one visible device and CUDA_VISIBLE_DEVICES set). More ranks than GPUs on a node, or two
//   ranks on one GPU (same PCI bus id), is refused. See docs/launching.md.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "dist/collectives.hpp"
#include "dist/communicator.hpp"

namespace mtplab::dist {

/// An MPI communicator split from the world plus, optionally, the Communicator built on it.
/// Move-only; frees both (communicator first) when destroyed.
class Group {
 public:
  Group() = default;
  /// Takes ownership of `comm` (not MPI_COMM_WORLD / MPI_COMM_NULL).
  explicit Group(MPI_Comm comm);
  ~Group();
  Group(Group&& other) noexcept;
  Group& operator=(Group&& other) noexcept;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  MPI_Comm mpi() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Builds the group's Communicator (collective over the group); replaces any earlier one. `mode`
  /// is how an NCCL communicator is created (ignored for MPI).
  Communicator& connect(Transport transport, void* stream = nullptr, NcclMode mode = NcclMode::blocking);
  bool connected() const { return collective_ != nullptr; }
  /// The Communicator made by connect(); throws when there is none.
  Communicator& comm() const;

 private:
  void reset() noexcept;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  std::unique_ptr<Communicator> collective_;
};

/// What the CUDA device binding decided (empty strings / -1 before bind_device()).
struct DeviceBinding {
  int device = -1;         ///< CUDA ordinal within this process's visible devices
  int visible = 0;         ///< cudaGetDeviceCount() on this rank
  std::string name;        ///< cudaDeviceProp::name
  std::string pci_bus_id;  ///< "0000:3b:00.0"
};

class Runtime {
 public:
  /// Initialises MPI unless it already is (then it neither re-initialises nor finalises it).
  /// argc / argv may be null.
  Runtime(int* argc = nullptr, char*** argv = nullptr);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  /// Number of distinct nodes, and this node's index among them (ordered by lowest world rank).
  int num_nodes() const { return num_nodes_; }
  int node_index() const { return node_index_; }
  const std::string& host() const;
  /// The ranks of this node (owned by the Runtime).
  MPI_Comm node_comm() const { return node_comm_; }

  /// Binds this rank to its GPU (cudaSetDevice). Collective over the node: every rank of the
  /// node must call it. Throws with a clear message on a refusal, or when built without CUDA.
  const DeviceBinding& bind_device();
  const DeviceBinding& device() const { return device_; }

  /// MIN over all ranks of the visible GPU count (collective), so that `auto` decides alike
  /// everywhere. 0 when built without CUDA.
  int min_visible_gpus() const;

  /// A duplicate of the world (collective).
  Group world_group() const;
  /// Ranks with equal `color` form a group, ordered by `key` then world rank (MPI_Comm_split;
  /// collective over the world, color >= 0). One NCCL id per group when connected with nccl.
  Group make_group(int color, int key) const;

  /// Every rank's `text` at `root` in rank order (others get an empty vector). Collective.
  std::vector<std::string> gather_strings(const std::string& text, int root = 0) const;

 private:
  bool owns_mpi_ = false;
  int uncaught_at_construction_ = 0;
  int rank_ = 0;
  int world_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int num_nodes_ = 1;
  int node_index_ = 0;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  DeviceBinding device_;
};

/// GPUs this process can see (cudaGetDeviceCount); 0 without CUDA, driver or device.
int visible_gpu_count();

/// Why this process cannot use a GPU, "" when it sees one. Tells the cases apart: a build without
/// CUDA ("this mtplab was built without CUDA ..."), a CUDA build without a usable driver or device
/// (cudaGetDeviceCount's error quoted), and no device visible (CUDA_VISIBLE_DEVICES named).
std::string gpu_unusable_reason(const std::string& host);

/// The device rule, separate from CUDA so that it can be tested anywhere: returns the ordinal
/// for `local_rank`, or throws naming the host, the counts and CUDA_VISIBLE_DEVICES.
int choose_device(int local_rank, int local_size, int visible, const char* cuda_visible_devices,
                  const std::string& host);
/// Throws when two ranks of a node share a GPU. `pci_bus_ids[i]` belongs to world rank
/// `world_ranks[i]`.
void check_distinct_gpus(const std::vector<std::string>& pci_bus_ids, const std::vector<int>& world_ranks,
                         const std::string& host);

}  // namespace mtplab::dist
