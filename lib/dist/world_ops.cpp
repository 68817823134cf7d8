// The typed host collectives: element types and ops mapped onto MPI, calls split into pieces of
// at most `chunk` elements, every return code checked and named, every piece started
// non-blocking and waited for within the collective timeout (dist/mpi_wait.hpp).
#include "dist/world_ops.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <iterator>

#include "core/error.hpp"
#include "core/str.hpp"
#include "dist/check.hpp"
#include "dist/mpi_wait.hpp"

namespace mtplab::dist {
namespace {

// One row per element type, indexed by Elem in its declaration order: its name, its MPI
// datatype and the bytes of one element.
struct ElemInfo {
  const char* name;
  MPI_Datatype type;
  size_t size;
};
const ElemInfo& info_of(Elem e) {
  static const ElemInfo table[] = {{"int8", MPI_INT8_T, 1},   {"uint8", MPI_UINT8_T, 1},
                                   {"int16", MPI_INT16_T, 2}, {"uint16", MPI_UINT16_T, 2},
                                   {"int32", MPI_INT32_T, 4}, {"uint32", MPI_UINT32_T, 4},
                                   {"int64", MPI_INT64_T, 8}, {"uint64", MPI_UINT64_T, 8},
                                   {"float32", MPI_FLOAT, 4}, {"float64", MPI_DOUBLE, 8}};
  static_assert(std::size(table) == static_cast<size_t>(Elem::f64) + 1);
  const auto i = static_cast<size_t>(e);
  MTP_REQUIRE(i < std::size(table), "unknown dist::Elem ", i);
  return table[i];
}

// Indexed by ReduceOp in its declaration order.
struct OpInfo {
  const char* name;
  MPI_Op op;
};
const OpInfo& info_of(ReduceOp op) {
  static const OpInfo table[] = {{"min", MPI_MIN}, {"max", MPI_MAX}, {"sum", MPI_SUM}};
  static_assert(std::size(table) == static_cast<size_t>(ReduceOp::sum) + 1);
  const auto i = static_cast<size_t>(op);
  MTP_REQUIRE(i < std::size(table), "unknown dist::ReduceOp ", i);
  return table[i];
}

/// Checks the group, the root and the chunk before any MPI call, so a misuse is named too.
void check_call(const Group& g, const char* what, int root, size_t chunk) {
  MTP_REQUIRE(g.mpi() != MPI_COMM_NULL, "dist::", what, " on an empty group");
  MTP_REQUIRE(root >= 0 && root < g.size(), "dist::", what, ": root ", root, " outside [0, ", g.size(), ")");
  MTP_REQUIRE(chunk >= 1 && chunk <= static_cast<size_t>(INT_MAX), "dist::", what, ": chunk ", chunk,
              " outside [1, INT_MAX]");
}

/// Checks the start of a piece, then waits for it; `call` describes it for messages.
template <typename Call>
void complete(int rc, MPI_Request& req, const Group& g, const char* mpi_call, const char* what,
              const Call& call) {
  if (rc != MPI_SUCCESS)
    MTP_FAIL(mpi_call, " failed in dist::", what, " (", call(), "): ", detail::mpi_error_string(rc));
  detail::wait_bounded(req, g.mpi(), [&] { return str(what, "(", call(), ")"); });
}

/// Calls fn(byte offset, count) over pieces of at most `chunk` elements.
template <typename Fn>
void chunked(size_t count, size_t chunk, size_t bytes_per_elem, Fn&& fn) {
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off);
    fn(off * bytes_per_elem, static_cast<int>(n));
  }
}

}  // namespace

const char* to_string(ReduceOp op) { return info_of(op).name; }
const char* to_string(Elem e) { return info_of(e).name; }

void broadcast_elems(const Group& g, void* data, size_t count, Elem elem, int root, size_t chunk) {
  check_call(g, "broadcast", root, chunk);
  const auto call = [&] { return str(count, " x ", to_string(elem), " from rank ", root); };
  auto* bytes = static_cast<char*>(data);
  chunked(count, chunk, info_of(elem).size, [&](size_t off, int n) {
    MPI_Request req = MPI_REQUEST_NULL;
    complete(MPI_Ibcast(bytes + off, n, info_of(elem).type, root, g.mpi(), &req), req, g, "MPI_Ibcast",
             "broadcast", call);
  });
}

void all_reduce_elems(const Group& g, void* data, size_t count, Elem elem, ReduceOp op, size_t chunk) {
  check_call(g, "all_reduce", 0, chunk);
  const auto call = [&] { return str(to_string(op), " of ", count, " x ", to_string(elem)); };
  auto* bytes = static_cast<char*>(data);
  chunked(count, chunk, info_of(elem).size, [&](size_t off, int n) {
    MPI_Request req = MPI_REQUEST_NULL;
    complete(MPI_Iallreduce(MPI_IN_PLACE, bytes + off, n, info_of(elem).type, info_of(op).op, g.mpi(), &req),
             req, g, "MPI_Iallreduce", "all_reduce", call);
  });
}

void reduce_elems(const Group& g, void* data, size_t count, Elem elem, ReduceOp op, int root, size_t chunk) {
  check_call(g, "reduce", root, chunk);
  const auto call = [&] {
    return str(to_string(op), " of ", count, " x ", to_string(elem), " to rank ", root);
  };
  auto* bytes = static_cast<char*>(data);
  const bool at_root = g.rank() == root;
  chunked(count, chunk, info_of(elem).size, [&](size_t off, int n) {
    // MPI_IN_PLACE is the root's send buffer only; the others send theirs and receive nothing.
    MPI_Request req = MPI_REQUEST_NULL;
    complete(MPI_Ireduce(at_root ? MPI_IN_PLACE : bytes + off, at_root ? bytes + off : nullptr, n,
                         info_of(elem).type, info_of(op).op, root, g.mpi(), &req),
             req, g, "MPI_Ireduce", "reduce", call);
  });
}

void broadcast(const Group& g, std::string& text, int root) {
  uint64_t n = text.size();
  broadcast(g, n, root);
  if (g.rank() != root) text.assign(static_cast<size_t>(n), '\0');
  broadcast_elems(g, text.data(), text.size(), Elem::u8, root);
}

void broadcast(const Group& g, std::vector<std::string>& texts, int root) {
  // The lengths, then every text joined: two collectives whatever the count.
  std::vector<uint64_t> lengths;
  std::string joined;
  if (g.rank() == root) {
    for (const auto& t : texts) {
      lengths.push_back(t.size());
      joined += t;
    }
  }
  broadcast(g, lengths, root);
  broadcast(g, joined, root);
  if (g.rank() == root) return;
  texts.clear();
  size_t off = 0;
  for (const uint64_t len : lengths) {
    MTP_REQUIRE(off + len <= joined.size(), "dist::broadcast(strings): lengths exceed the ", joined.size(),
                " bytes received");
    texts.push_back(joined.substr(off, static_cast<size_t>(len)));
    off += static_cast<size_t>(len);
  }
}

void barrier(const Group& g) {
  MTP_REQUIRE(g.mpi() != MPI_COMM_NULL, "dist::barrier on an empty group");
  MPI_Request req = MPI_REQUEST_NULL;
  complete(MPI_Ibarrier(g.mpi(), &req), req, g, "MPI_Ibarrier", "barrier",
           [&] { return str("group of ", g.size()); });
}

}  // namespace mtplab::dist
