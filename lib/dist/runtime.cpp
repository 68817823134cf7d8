// Runtime: MPI init / finalise, node-local ranks, GPU binding; Group: an owned MPI communicator.
// The refusals (too many ranks for the node's GPUs, two ranks on one GPU) are decided by the
// pure functions choose_device / check_distinct_gpus, which the unit tests exercise without a GPU.
#include "dist/runtime.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <utility>

#include "core/env.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/str.hpp"
#include "dist/check.hpp"
#include "dist/guard.hpp"
#include "dist/mpi_wait.hpp"
#include "dist/startup.hpp"

namespace mtplab::dist {
namespace {

bool mpi_finalised() noexcept {
  int finalised = 0;
  return MPI_Finalized(&finalised) == MPI_SUCCESS && finalised;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// Waits for a non-blocking collective just started (`rc` its return code) within the timeout.
template <typename Name>
void finish(int rc, MPI_Request& req, MPI_Comm comm, const char* call, const Name& name) {
  if (rc != MPI_SUCCESS) MTP_FAIL(call, " failed: ", detail::mpi_error_string(rc));
  detail::wait_bounded(req, comm, name);
}

}  // namespace

// ---- Group -------------------------------------------------------------------------------------

Group::Group(MPI_Comm comm) : comm_(comm) {
  MTP_REQUIRE(comm != MPI_COMM_NULL && comm != MPI_COMM_WORLD,
              "Group takes ownership of a derived communicator, not MPI_COMM_NULL or MPI_COMM_WORLD");
  MTP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MTP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

Group::~Group() { reset(); }

Group::Group(Group&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(std::exchange(other.rank_, 0)),
      size_(std::exchange(other.size_, 0)),
      collective_(std::move(other.collective_)) {}

Group& Group::operator=(Group&& other) noexcept {
  if (this != &other) {
    reset();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = std::exchange(other.rank_, 0);
    size_ = std::exchange(other.size_, 0);
    collective_ = std::move(other.collective_);
  }
  return *this;
}

void Group::reset() noexcept {
  // The Communicator (an NCCL communicator bootstrapped over comm_) goes first.
  collective_.reset();
  if (comm_ != MPI_COMM_NULL) {
    if (mpi_finalised()) {
      log_warn("a dist::Group outlived MPI; its communicator is leaked (destroy Groups before the Runtime)");
    } else if (MPI_Comm_free(&comm_) != MPI_SUCCESS) {
      log_warn("MPI_Comm_free failed while destroying a dist::Group");
    }
    comm_ = MPI_COMM_NULL;
  }
}

Communicator& Group::connect(Transport transport, void* stream, NcclMode mode) {
  MTP_REQUIRE(comm_ != MPI_COMM_NULL, "Group::connect on an empty group");
  collective_.reset();
  collective_ = make_communicator(comm_, transport, stream, mode);
  return *collective_;
}

Communicator& Group::comm() const {
  MTP_REQUIRE(collective_ != nullptr, "this group has no communicator yet: call connect(transport, stream)");
  return *collective_;
}

// ---- Runtime -----------------------------------------------------------------------------------

Runtime::Runtime(int* argc, char*** argv) : uncaught_at_construction_(std::uncaught_exceptions()) {
  // The start-up is bounded until the arrival probes are up (dist/startup.hpp): MPI initialisation
  // waits for every rank of the job and has no non-blocking form. A malformed timeout is found
  // before MPI is up, alike on every rank: printed once, by the launcher's rank 0.
  double startup_s = 0;
  try {
    startup_s = detail::startup_timeout_s();
  } catch (const Error& e) {
    throw ArgumentError(e);
  }
  detail::StartupWatch startup(startup_s, "MPI initialisation (MPI_Init_thread)");
  int initialised = 0;
  MTP_MPI_CHECK(MPI_Initialized(&initialised));
  if (!initialised) {
    MTP_REQUIRE(!mpi_finalised(), "MPI was already finalised in this process: one Runtime per process");
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MTP_REQUIRE(rc == MPI_SUCCESS, "MPI_Init_thread failed (", detail::mpi_error_string(rc),
                "); under Slurm launch with `srun --mpi=pmix`, or use mpirun");
    owns_mpi_ = true;
    MTP_REQUIRE(provided >= MPI_THREAD_FUNNELED, "the MPI library provides thread level ", provided,
                " but mtplab needs MPI_THREAD_FUNNELED");
  }
  MTP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MTP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MTP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  set_process_identity(rank_, world_);

  // The collective timeout, before the first collective that it bounds, and the logging variables.
  // A malformed value is agreed, so that it is printed once (by the lowest rank that has it).
  startup.phase("the start-up's duplicate of the world (MPI_Comm_dup, for the arrival probes)");
  detail::watch_start(rank_, world_);
  startup.stop();  // from here on every collective is bounded, and a missing rank named
  try {
    run_agreed([] {
      set_mpi_timeout_s(collective_timeout_s());
      check_logging_env();  // MTPLAB_LOG, MTPLAB_PROGRESS_S: a bad value is an error, not ignored
    });
  } catch (const AgreedError&) {
    // No Runtime to destroy: leave MPI here, as every rank does.
    detail::watch_stop();
    if (owns_mpi_) MPI_Finalize();
    throw;
  }

  MPI_Request req = MPI_REQUEST_NULL;
  finish(MPI_Ibarrier(MPI_COMM_WORLD, &req), req, MPI_COMM_WORLD, "MPI_Ibarrier",
         [] { return std::string("barrier before MPI_Comm_split_type"); });  // bounds the split below
  MTP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm_));
  MTP_MPI_CHECK(MPI_Comm_rank(node_comm_, &local_rank_));
  MTP_MPI_CHECK(MPI_Comm_size(node_comm_, &local_size_));

  // Nodes are numbered by their lowest world rank: count the node leaders before this rank.
  const int leader = local_rank_ == 0 ? 1 : 0;
  int leaders_before = 0;
  finish(MPI_Iexscan(&leader, &leaders_before, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req), req,
         MPI_COMM_WORLD, "MPI_Iexscan", [] { return std::string("exscan of the node leaders"); });
  if (rank_ == 0) leaders_before = 0;  // MPI_Exscan leaves rank 0's result undefined
  node_index_ = leaders_before;
  finish(MPI_Ibcast(&node_index_, 1, MPI_INT, 0, node_comm_, &req), req, node_comm_, "MPI_Ibcast",
         [] { return std::string("broadcast of the node index"); });
  finish(MPI_Iallreduce(&leader, &num_nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req), req, MPI_COMM_WORLD,
         "MPI_Iallreduce", [] { return std::string("all_reduce of the node count"); });
}

Runtime::~Runtime() {
  // Unwinding with peers alive: a peer may sit in a collective that this rank will never join,
  // and both MPI_Comm_free and MPI_Finalize may wait for it. Leave MPI to the guard's MPI_Abort,
  // unless every rank agreed on the failure (run_agreed): then every rank leaves from the same
  // place and finalises.
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_construction_;
  if (unwinding && world_ > 1 && !failure_agreed()) return;
  if (mpi_finalised()) return;
  detail::watch_stop();
  if (node_comm_ != MPI_COMM_NULL && MPI_Comm_free(&node_comm_) != MPI_SUCCESS)
    log_warn("MPI_Comm_free(node communicator) failed");
  if (owns_mpi_ && MPI_Finalize() != MPI_SUCCESS) log_warn("MPI_Finalize failed");
}

const std::string& Runtime::host() const { return process_identity().host; }

int Runtime::min_visible_gpus() const {
  const int mine = visible_gpu_count();
  int least = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  finish(MPI_Iallreduce(&mine, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req), req, MPI_COMM_WORLD,
         "MPI_Iallreduce", [] { return std::string("all_reduce min of the visible GPU count"); });
  return least;
}

Group Runtime::world_group() const {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  finish(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &req), req, MPI_COMM_WORLD, "MPI_Comm_idup",
         [] { return std::string("MPI_Comm_idup of the world"); });
  return Group(dup);
}

Group Runtime::make_group(int color, int key) const {
  MTP_REQUIRE(color >= 0, "make_group: color must be >= 0 (got ", color, ")");
  // MPI has no non-blocking split: a bounded barrier first, so that a missing rank is named
  // instead of hanging the split.
  MPI_Request req = MPI_REQUEST_NULL;
  finish(MPI_Ibarrier(MPI_COMM_WORLD, &req), req, MPI_COMM_WORLD, "MPI_Ibarrier",
         [] { return std::string("barrier before MPI_Comm_split"); });
  MPI_Comm split = MPI_COMM_NULL;
  MTP_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &split));
  return Group(split);
}

std::vector<std::string> Runtime::gather_strings(const std::string& text, int root) const {
  MTP_REQUIRE(root >= 0 && root < world_, "gather_strings: root ", root, " outside [0, ", world_, ")");
  MTP_REQUIRE(text.size() < (1u << 30), "gather_strings: ", text.size(), " bytes is too long");
  const int len = static_cast<int>(text.size());
  std::vector<int> lens(rank_ == root ? world_ : 0);
  MPI_Request req = MPI_REQUEST_NULL;
  finish(MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, MPI_COMM_WORLD, &req), req,
         MPI_COMM_WORLD, "MPI_Igather", [] { return std::string("gather_strings (the lengths)"); });
  std::vector<int> offsets(lens.size());
  long long total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    offsets[i] = static_cast<int>(total);
    total += lens[i];
  }
  MTP_REQUIRE(total < (1ll << 30), "gather_strings: ", total, " bytes in all is too long");
  std::string all(static_cast<size_t>(total), '\0');
  finish(MPI_Igatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, root,
                      MPI_COMM_WORLD, &req),
         req, MPI_COMM_WORLD, "MPI_Igatherv", [] { return std::string("gather_strings (the texts)"); });
  std::vector<std::string> out;
  for (size_t i = 0; i < lens.size(); ++i)
    out.push_back(all.substr(static_cast<size_t>(offsets[i]), static_cast<size_t>(lens[i])));
  return out;
}

const DeviceBinding& Runtime::bind_device() {
#if defined(MTPLAB_HAVE_CUDA)
  int visible = 0;
  const cudaError_t count_rc = cudaGetDeviceCount(&visible);
  if (count_rc != cudaSuccess) {
    (void)cudaGetLastError();
    MTP_FAIL("no usable GPU on host ", host(), ": cudaGetDeviceCount failed: ", cudaGetErrorName(count_rc),
             ": ", cudaGetErrorString(count_rc));
  }
  const int dev =
      choose_device(local_rank_, local_size_, visible, std::getenv("CUDA_VISIBLE_DEVICES"), host());
  MTP_CUDA_CHECK(cudaSetDevice(dev));
  std::array<char, 64> bus{};
  MTP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()) - 1, dev));
  cudaDeviceProp prop{};
  MTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));

  std::vector<char> buses(static_cast<size_t>(local_size_) * bus.size());
  std::vector<int> ranks(static_cast<size_t>(local_size_));
  MPI_Request req = MPI_REQUEST_NULL;
  finish(MPI_Iallgather(bus.data(), static_cast<int>(bus.size()), MPI_CHAR, buses.data(),
                        static_cast<int>(bus.size()), MPI_CHAR, node_comm_, &req),
         req, node_comm_, "MPI_Iallgather", [] { return std::string("all_gather of the PCI bus ids"); });
  finish(MPI_Iallgather(&rank_, 1, MPI_INT, ranks.data(), 1, MPI_INT, node_comm_, &req), req, node_comm_,
         "MPI_Iallgather", [] { return std::string("all_gather of the node's world ranks"); });
  std::vector<std::string> ids;
  for (int i = 0; i < local_size_; ++i) {
    const char* p = buses.data() + static_cast<size_t>(i) * bus.size();
    ids.emplace_back(p, strnlen(p, bus.size()));
  }
  check_distinct_gpus(ids, ranks, host());

  device_.device = dev;
  device_.visible = visible;
  device_.name = prop.name;
  device_.pci_bus_id = lower(bus.data());
  log_debug("bound to GPU ", dev, " (", device_.name, ", ", device_.pci_bus_id, ") of ", visible, " visible");
  return device_;
#else
  MTP_FAIL(
      "the CUDA backend was asked for, but this mtplab was built without CUDA (MTPLAB_CUDA=OFF or no "
      "toolkit)");
#endif
}

// ---- the device rule ---------------------------------------------------------------------------

int visible_gpu_count() {
#if defined(MTPLAB_HAVE_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: not an error for the question asked
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

std::string gpu_unusable_reason(const std::string& host) {
#if defined(MTPLAB_HAVE_CUDA)
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return str("no usable GPU on host ", host, ": cudaGetDeviceCount failed: ", cudaGetErrorName(rc), ": ",
               cudaGetErrorString(rc),
               " (this mtplab was built with CUDA; the driver or the device is missing)");
  }
  if (n > 0) return "";
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  return str("no GPU is visible on host ", host, " (",
             cvd ? str("CUDA_VISIBLE_DEVICES=", cvd) : std::string("CUDA_VISIBLE_DEVICES unset"), ")");
#else
  (void)host;
  return "this mtplab was built without CUDA (MTPLAB_CUDA=OFF or no toolkit): rebuild with -DMTPLAB_CUDA=ON, "
         "or use the cpu backend";
#endif
}

int choose_device(int local_rank, int local_size, int visible, const char* cuda_visible_devices,
                  const std::string& host) {
  const std::string cvd = cuda_visible_devices ? str("CUDA_VISIBLE_DEVICES=", cuda_visible_devices)
                                               : std::string("CUDA_VISIBLE_DEVICES unset");
  MTP_REQUIRE(local_rank >= 0 && local_rank < local_size, "local rank ", local_rank, " outside [0, ",
              local_size, ")");
  MTP_REQUIRE(visible > 0, "no GPU is visible on host ", host, " (", cvd, ")");
  // A scheduler that binds one GPU per task (srun --gpus-per-task=1, --gpu-bind) shows each
  // task only its own device, as ordinal 0; two tasks landing on the same one is caught later by
  // the PCI bus id check.
  if (visible == 1 && cuda_visible_devices != nullptr && *cuda_visible_devices != '\0') return 0;
  MTP_REQUIRE(local_size <= visible, local_size, " ranks run on host ", host, " but only ", visible,
              " GPU(s) are visible (", cvd, "): mtplab needs one GPU per rank; start at most ", visible,
              " ranks per node (mpirun --map-by ppr:", visible, ":node, srun --ntasks-per-node=", visible,
              ") or make more GPUs visible");
  return local_rank;
}

void check_distinct_gpus(const std::vector<std::string>& pci_bus_ids, const std::vector<int>& world_ranks,
                         const std::string& host) {
  MTP_REQUIRE(pci_bus_ids.size() == world_ranks.size(), "check_distinct_gpus: ", pci_bus_ids.size(),
              " bus ids for ", world_ranks.size(), " ranks");
  std::map<std::string, int> owner;
  for (size_t i = 0; i < pci_bus_ids.size(); ++i) {
    const auto [it, fresh] = owner.emplace(lower(pci_bus_ids[i]), world_ranks[i]);
    MTP_REQUIRE(
        fresh, "ranks ", std::min(it->second, world_ranks[i]), " and ", std::max(it->second, world_ranks[i]),
        " on host ", host, " would share the GPU at PCI bus id ", it->first,
        ": mtplab needs one GPU per rank (does CUDA_VISIBLE_DEVICES show every task the same device?)");
  }
}

}  // namespace mtplab::dist
