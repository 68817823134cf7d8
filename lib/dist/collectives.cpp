// MpiCommunicator, the transport factory and the collective timeout setting. Every MPI call of
// the communicator is started non-blocking and waited for within mpi_timeout_s().
// BF16 sums use a user MPI_Op that rounds after every pairwise add, like NCCL's ncclBfloat16 sum:
// a single fp32 accumulation rounded once at the end would differ from the GPU beyond 2 ranks.
#include "dist/collectives.hpp"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "core/str.hpp"
#include "dist/check.hpp"
#include "dist/mpi_wait.hpp"

namespace mtplab::dist {
namespace {

/// The user op: inout[i] = bf16(float(in[i]) + float(inout[i])), round to nearest even.
void bf16_sum_op(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(to_float(a[i]) + to_float(b[i]));
}

// `what` names the call in the message (its parts are formatted only on failure).
template <typename... What>
int as_count(size_t count, const What&... what) {
  MTP_REQUIRE(count <= static_cast<size_t>(INT_MAX), what..., ": ", count,
              " elements exceed what one MPI call carries (INT_MAX)");
  return static_cast<int>(count);
}

/// One all-reduce of `count` elements of `type` under `op` over `comm` (in place when send ==
/// recv), waited for within the timeout. `name` and `unit` make the messages, "name(unit, count)",
/// and are formatted only when one is needed.
void all_reduce(MPI_Comm comm, const void* send, void* recv, size_t count, MPI_Datatype type, MPI_Op op,
                const char* name, const char* unit) {
  const int n = as_count(count, name, "(", unit, ")");
  MPI_Request req = MPI_REQUEST_NULL;
  MTP_MPI_CHECK(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, type, op, comm, &req));
  detail::wait_bounded(req, comm, [&] { return str(name, "(", unit, ", ", count, ")"); });
}

}  // namespace

const char* to_string(Transport transport) { return transport == Transport::nccl ? "nccl" : "mpi"; }

const char* to_string(NcclMode mode) { return mode == NcclMode::blocking ? "blocking" : "non_blocking"; }

Transport transport_for_backend(std::string_view backend_kind) {
  if (backend_kind == "cpu") return Transport::mpi;
  if (backend_kind == "cuda") return Transport::nccl;
  MTP_FAIL("unknown backend \"", backend_kind, "\" (expected cpu or cuda)");
}

double parse_timeout_s(std::string_view text, std::string_view origin) {
  const std::string s = trim(text);
  char* end = nullptr;
  const double v = s.empty() ? NAN : std::strtod(s.c_str(), &end);
  MTP_REQUIRE(!s.empty() && end == s.c_str() + s.size() && std::isfinite(v) && v > 0, origin, ": \"", text,
              "\" is not a timeout in seconds (a finite number > 0)");
  return v;
}

double collective_timeout_s() {
  const char* env = std::getenv(kCollectiveTimeoutEnv);
  if (!env) return kDefaultCollectiveTimeoutS;
  return parse_timeout_s(env, kCollectiveTimeoutEnv);
}

// ---- MpiCommunicator ---------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  MTP_REQUIRE(comm != MPI_COMM_NULL, "MpiCommunicator over MPI_COMM_NULL");
  MTP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MTP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MTP_MPI_CHECK(MPI_Op_create(&bf16_sum_op, /*commute=*/1, &bf16_sum_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalised = 0;
  if (bf16_sum_ != MPI_OP_NULL && MPI_Finalized(&finalised) == MPI_SUCCESS && !finalised)
    MPI_Op_free(&bf16_sum_);
}

void MpiCommunicator::all_reduce_sum(const float* send, float* recv, size_t count) {
  all_reduce(comm_, send, recv, count, MPI_FLOAT, MPI_SUM, "all_reduce_sum", "f32");
}

void MpiCommunicator::all_reduce_sum(const bf16* send, bf16* recv, size_t count) {
  static_assert(sizeof(bf16) == sizeof(uint16_t));
  all_reduce(comm_, send, recv, count, MPI_UINT16_T, bf16_sum_, "all_reduce_sum", "bf16");
}

void MpiCommunicator::all_reduce_max(const uint64_t* send, uint64_t* recv, size_t count) {
  all_reduce(comm_, send, recv, count, MPI_UINT64_T, MPI_MAX, "all_reduce_max", "u64");
}

void MpiCommunicator::all_gather(const void* send, void* recv, size_t bytes) {
  const int n = as_count(bytes, "all_gather");
  // In place when this rank's slot of recv already holds the data (NCCL's in-place rule).
  const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(rank_) * bytes;
  MPI_Request req = MPI_REQUEST_NULL;
  MTP_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req));
  detail::wait_bounded(req, comm_, [&] { return str("all_gather(", bytes, " bytes)"); });
}

void MpiCommunicator::broadcast(void* buf, size_t bytes, int root) {
  MTP_REQUIRE(root >= 0 && root < size_, "broadcast: root ", root, " outside [0, ", size_, ")");
  MPI_Request req = MPI_REQUEST_NULL;
  MTP_MPI_CHECK(MPI_Ibcast(buf, as_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &req));
  detail::wait_bounded(req, comm_, [&] { return str("broadcast(", bytes, " bytes from rank ", root, ")"); });
}

void MpiCommunicator::barrier() {
  MPI_Request req = MPI_REQUEST_NULL;
  MTP_MPI_CHECK(MPI_Ibarrier(comm_, &req));
  detail::wait_bounded(req, comm_, [] { return std::string("barrier"); });
}

// ---- factory -----------------------------------------------------------------------------------

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Transport transport, void* stream,
                                                NcclMode mode) {
  if (transport == Transport::mpi) return std::make_unique<MpiCommunicator>(comm);
  return NcclCommunicator::create(comm, stream, collective_timeout_s(), mode);
}

}  // namespace mtplab::dist
