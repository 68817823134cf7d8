// HDF5 wrapper implementation. Every C API call is checked; a failure becomes an mtplab::Error
// "<file>: <object path>: <what> (HDF5: <innermost message of the HDF5 error stack>)".
// Files are opened with the STRONG close degree, so closing a file closes every object of it:
// a Node checks FileState::open before closing its own id.
#include "io/hdf5.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <set>
#include <type_traits>

#include "core/temp_files.hpp"

namespace mtplab::io {

static_assert(std::is_same_v<hid_t, std::int64_t>, "hdf5.hpp carries hid_t as int64_t (HDF5 >= 1.10)");
static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>,
              "bf16 is read and written as uint16 bits");

namespace detail {

struct Node;

// A file and the objects opened in it. Closing is in RAII order on every path: each object still
// open (dataset, group) first, then the file. A close that fails (a full disk: HDF5 flushes on
// close) is not retried: the handle is left to the operating system, never closed twice, and the
// library's exit-time cleanup is off (ensure_init), since it would close it again and crash.
struct FileState {
  std::string path;     // final path, used in every message
  std::string working;  // where the bytes are (== path when read-only)
  hid_t id = -1;
  bool open = false;
  bool writable = false;
  bool append = false;
  struct stat original {};  // the file open_append copied, to detect a concurrent replacement
  std::set<Node*> nodes;    // the objects open in this file (Node registers itself)

  /// Closes the objects, then the file; false when a close failed (the first failure is kept in
  /// HDF5's error stack for the caller's message).
  bool close() noexcept;
  ~FileState() { close(); }
};

struct Node {
  hid_t id = -1;
  std::shared_ptr<FileState> file;
  std::string path;

  Node(hid_t i, std::shared_ptr<FileState> f, std::string p) : id(i), file(std::move(f)), path(std::move(p)) {
    if (file) file->nodes.insert(this);
  }
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  /// Closes the object (once); false when HDF5 failed to (it is not closed again).
  bool close() noexcept {
    const hid_t mine = id;
    id = -1;
    return !(file && file->open && mine >= 0) || H5Oclose(mine) >= 0;
  }
  ~Node() {
    close();
    if (file) file->nodes.erase(this);
  }
};

bool FileState::close() noexcept {
  if (!open) return true;
  bool ok = true;
  for (Node* n : nodes) {
    // After the first failure the error stack keeps that one (the cause); later ones are dropped.
    if (!n->close() && ok) ok = false;
  }
  const bool file_ok = H5Fclose(id) >= 0;
  open = false;  // closed, or its close failed: never closed again
  return ok && file_ok;
}

}  // namespace detail

namespace {

using detail::FileState;
using detail::Node;

// A file whose close failed (FileState::close, a full disk) is never closed again, not even by
// HDF5's own exit-time cleanup, which would flush it once more and crash (SIGSEGV in H5D_close /
// H5F__close_cb): the operating system releases it. H5dont_atexit works only before the library
// starts, so it runs at static initialisation, before anything (provenance included) calls HDF5.
// Every file mtplab writes is committed or discarded explicitly, so the cleanup has nothing to do.
[[maybe_unused]] const bool kNoExitCleanup = [] {
  H5dont_atexit();
  return true;
}();

// Turns HDF5's automatic error printing off (once; the library is used from one thread).
void ensure_init() {
  static const bool done = [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

// The innermost (most specific) message of the current HDF5 error stack, then clears it.
std::string take_hdf5_detail() {
  std::string innermost;
  auto walker = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    auto* out = static_cast<std::string*>(data);
    if (n == 0 && err && err->desc) *out = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walker, &innermost);
  H5Eclear2(H5E_DEFAULT);
  // A full disk reads as what it is, not as HDF5's dump of the failed write's arguments.
  if (innermost.find("errno = 28,") != std::string::npos ||
      innermost.find(std::strerror(ENOSPC)) != std::string::npos)
    return ": no space left on device (the file system or the quota is full)";
  return innermost.empty() ? std::string() : str(" (HDF5: ", innermost, ")");
}

template <typename... Args>
[[noreturn]] void fail_at(const std::string& file, const std::string& object, const Args&... what) {
  const std::string detail = take_hdf5_detail();
  MTP_FAIL(file, ": ", object, ": ", what..., detail);
}

// RAII for transient ids (dataspaces, datatypes, property lists, attributes).
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Hid(Hid&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid& operator=(Hid&& other) noexcept {
    if (this != &other) {
      if (id_ >= 0) closer_(id_);
      id_ = other.id_;
      closer_ = other.closer_;
      other.id_ = -1;
    }
    return *this;
  }
  ~Hid() {
    if (id_ >= 0) closer_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  Closer closer_;
};

// Checked constructors of transient ids: `what` names the operation for the message.
template <typename... Args>
hid_t check_id(hid_t id, const Node& at, const Args&... what) {
  if (id < 0) fail_at(at.file->path, at.path, what...);
  return id;
}
template <typename... Args>
void check(herr_t rc, const Node& at, const Args&... what) {
  if (rc < 0) fail_at(at.file->path, at.path, what...);
}

hid_t live(const Node& n) {
  MTP_REQUIRE(n.file->open, n.file->path, ": ", n.path, ": the file is closed (committed or discarded)");
  return n.id;
}

std::string z(std::string_view s) { return std::string(s); }

// One row per element type: its name, its type in the file (little-endian) and in memory, and
// the bytes of one element (a string element is a char*). bf16 is stored as uint16.
struct DTypeInfo {
  const char* name;
  hid_t file_type, mem_type;
  std::size_t size;
};
DTypeInfo info_of(DType t) {
  // In DType's order. The H5T_* names are library globals (read after H5open), hence a table built
  // on first use rather than a constant one.
  static const DTypeInfo table[] = {
      {"int8", H5T_STD_I8LE, H5T_NATIVE_INT8, 1},
      {"uint8", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1},
      {"uint16", H5T_STD_U16LE, H5T_NATIVE_UINT16, 2},
      {"int32", H5T_STD_I32LE, H5T_NATIVE_INT32, 4},
      {"int64", H5T_STD_I64LE, H5T_NATIVE_INT64, 8},
      {"float32", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4},
      {"float64", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 8},
      {"bf16", H5T_STD_U16LE, H5T_NATIVE_UINT16, 2},
      {"string", -1, -1, sizeof(char*)},
  };
  static_assert(static_cast<int>(DType::string) == 8, "one table row per DType, in its order");
  const auto i = static_cast<std::size_t>(t);
  return i < std::size(table) ? table[i] : DTypeInfo{"?", -1, -1, 1};
}
hid_t file_type_of(DType t) { return info_of(t).file_type; }
hid_t mem_type_of(DType t) { return info_of(t).mem_type; }
std::size_t size_of(DType t) { return info_of(t).size; }

// Strings are written fixed-length (UTF-8, NUL-padded to the longest value). Variable-length
// strings would live in HDF5's global heap, which has no checksum: HDF5 crashes (memcpy out of
// bounds) on a corrupted one, while a fixed-length string sits inside a checksummed object header
// or chunk. Both kinds are read.
struct PackedStrings {
  std::size_t width = 1;
  std::vector<char> bytes;  // values.size() * width
};

PackedStrings pack_strings(std::span<const std::string> values, std::size_t min_width, const Node& at,
                           std::string_view what) {
  PackedStrings p;
  p.width = std::max<std::size_t>(min_width, 1);
  for (std::size_t i = 0; i < values.size(); ++i) {
    MTP_REQUIRE(values[i].find('\0') == std::string::npos, at.file->path, ": ", at.path, ": ", what, "[", i,
                "] contains a NUL byte (HDF5 strings end at the first NUL)");
    p.width = std::max(p.width, values[i].size());
  }
  p.bytes.assign(values.size() * p.width, '\0');
  for (std::size_t i = 0; i < values.size(); ++i)
    std::memcpy(p.bytes.data() + i * p.width, values[i].data(), values[i].size());
  return p;
}

Hid fixed_string_type(std::size_t width, const Node& at) {
  Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
  check(t.get(), at, "cannot build a string type");
  check(H5Tset_size(t.get(), width), at, "cannot build a string type");
  check(H5Tset_strpad(t.get(), H5T_STR_NULLPAD), at, "cannot build a string type");
  check(H5Tset_cset(t.get(), H5T_CSET_UTF8), at, "cannot build a string type");
  return t;
}

Hid vlen_string_type(const Node& at) {
  Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
  check(t.get(), at, "cannot build a string type");
  check(H5Tset_size(t.get(), H5T_VARIABLE), at, "cannot build a string type");
  check(H5Tset_cset(t.get(), H5T_CSET_UTF8), at, "cannot build a string type");
  return t;
}

// Describes a stored type for messages: "uint32", "float16", "string" ...
std::string describe_type(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (cls == H5T_INTEGER) return str(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int", size * 8);
  if (cls == H5T_FLOAT) return str("float", size * 8);
  if (cls == H5T_STRING) return "string";
  if (cls == H5T_COMPOUND) return "compound";
  if (cls == H5T_ENUM) return "enum";
  if (cls == H5T_ARRAY) return "array";
  return str("HDF5 type class ", static_cast<int>(cls));
}

// The DType of a stored (file) type; false when this wrapper does not handle it.
bool classify(hid_t type, DType& out) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) != H5T_SGN_NONE;
    if (size == 1)
      out = is_signed ? DType::i8 : DType::u8;
    else if (size == 2 && !is_signed)
      out = DType::u16;
    else if (size == 4 && is_signed)
      out = DType::i32;
    else if (size == 8 && is_signed)
      out = DType::i64;
    else
      return false;
    return true;
  }
  if (cls == H5T_FLOAT) {
    if (size == 4)
      out = DType::f32;
    else if (size == 8)
      out = DType::f64;
    else
      return false;
    return true;
  }
  if (cls == H5T_STRING) {
    out = DType::string;
    return true;
  }
  return false;
}

// Reads n strings (fixed or variable length) stored with `file_type` via `reader`, which is
// H5Aread or H5Dread bound to the object and selection.
template <typename ReadFn>
std::vector<std::string> read_strings_of(hid_t file_type, std::size_t n, const Node& at,
                                         const std::string& what, ReadFn reader) {
  std::vector<std::string> out(n);
  if (n == 0) return out;
  const htri_t is_vlen = H5Tis_variable_str(file_type);
  check(is_vlen, at, "cannot inspect the string type of ", what);
  if (is_vlen > 0) {
    Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
    check(mem.get(), at, "cannot build a string type");
    check(H5Tset_size(mem.get(), H5T_VARIABLE), at, "cannot build a string type");
    check(H5Tset_cset(mem.get(), H5Tget_cset(file_type)), at, "cannot build a string type");
    std::vector<char*> ptrs(n, nullptr);
    check(reader(mem.get(), ptrs.data()), at, "cannot read ", what);
    for (std::size_t i = 0; i < n; ++i) {
      if (ptrs[i]) out[i] = ptrs[i];
      H5free_memory(ptrs[i]);  // the library allocated each string
    }
    return out;
  }
  const std::size_t width = H5Tget_size(file_type);
  Hid mem(H5Tcopy(file_type), H5Tclose);
  check(mem.get(), at, "cannot build a string type");
  std::vector<char> buf(width * n, '\0');
  check(reader(mem.get(), buf.data()), at, "cannot read ", what);
  for (std::size_t i = 0; i < n; ++i) {
    const char* s = buf.data() + i * width;
    out[i].assign(s, strnlen(s, width));
  }
  return out;
}

std::vector<const char*> c_strings(std::span<const std::string> values, const Node& at,
                                   std::string_view what) {
  std::vector<const char*> ptrs;
  ptrs.reserve(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    MTP_REQUIRE(values[i].find('\0') == std::string::npos, at.file->path, ": ", at.path, ": ", what, "[", i,
                "] contains a NUL byte (HDF5 strings end at the first NUL)");
    ptrs.push_back(values[i].c_str());
  }
  return ptrs;
}

// File access: STRONG close (closing the file closes its objects) and, for writing, the HDF5
// 1.10 file format exactly. That format checksums every piece of metadata (superblock, object
// headers, link and attribute storage, the chunk indexes of extendable datasets), so a flipped
// byte is a read error instead of a wild pointer, and it stores attributes over 64 KiB densely;
// every reader from HDF5 1.10 on (h5py included) reads it. HDF5's own file locking is off:
// safety comes from writing a private temporary and renaming, and the lock fails on some
// parallel file systems.
Hid make_fapl(const std::string& path, bool writing) {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  bool ok = fapl.valid() && H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) >= 0;
  if (writing) ok = ok && H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110) >= 0;
#if H5_VERSION_GE(1, 10, 7)
  ok = ok && H5Pset_file_locking(fapl.get(), false, true) >= 0;
#endif
  MTP_REQUIRE(ok, path, ": cannot set up HDF5 file access", take_hdf5_detail());
  return fapl;
}

// Tracks attribute creation order on new groups / the root, so attr_names() lists in the order written.
void track_attr_order(hid_t plist, const std::string& path) {
  MTP_REQUIRE(H5Pset_attr_creation_order(plist, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED) >= 0, path,
              ": cannot set attribute creation order", take_hdf5_detail());
}

// Paths of working files this process has open, so two writers of one path in one process fail.
// Each is also registered as a temporary (core/temp_files.hpp): a signal that stops the process at
// once removes it.
std::set<std::string>& active_working_paths() {
  static std::set<std::string> paths;
  return paths;
}

// The working file is gone (committed by its rename, or removed): forget it.
void release_working(const std::string& working) {
  active_working_paths().erase(working);
  unregister_temporary(working);
}

std::string errno_text(int err) { return std::strerror(err); }

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) {
    MTP_REQUIRE(directory, path, ": cannot open to fsync: ", errno_text(errno));
    return;  // some file systems do not open directories; the rename is still done
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: the object does not support synchronisation (some file systems for directories).
  MTP_REQUIRE(rc == 0 || (directory && err == EINVAL), path, ": fsync failed: ", errno_text(err));
}

bool same_file_version(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

void validate_name(std::string_view name, const Node& at) {
  MTP_REQUIRE(!name.empty(), at.file->path, ": ", at.path, ": empty object name");
}

}  // namespace

const char* dtype_name(DType t) { return info_of(t).name; }

std::string hdf5_library_version() {
  unsigned maj = 0, min = 0, rel = 0;
  if (H5get_libversion(&maj, &min, &rel) < 0) return "-";
  return str(maj, ".", min, ".", rel);
}

// ---- Object: attributes ----------------------------------------------------------------------

const detail::Node& Object::node() const {
  MTP_REQUIRE(node_ != nullptr, "HDF5: use of an empty Group / Dataset handle");
  return *node_;
}
const std::string& Object::path() const { return node().path; }
const std::string& Object::file_name() const { return node().file->path; }
std::int64_t Object::raw_id() const { return live(node()); }

bool Object::has_attr(std::string_view name) const {
  const htri_t r = H5Aexists(live(node()), z(name).c_str());
  check(r, node(), "cannot look up attribute '", name, "'");
  return r > 0;
}

std::vector<std::string> Object::attr_names() const {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* attr_name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(attr_name);
    return 0;
  };
  const hid_t id = live(node());
  hsize_t idx = 0;
  if (H5Aiterate2(id, H5_INDEX_CRT_ORDER, H5_ITER_INC, &idx, collect, &names) < 0) {
    // Objects written without creation-order tracking (e.g. by h5py) list by name.
    H5Eclear2(H5E_DEFAULT);
    names.clear();
    idx = 0;
    check(H5Aiterate2(id, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names), node(),
          "cannot list attributes");
  }
  return names;
}

void Object::remove_attr(std::string_view name) {
  check(H5Adelete(live(node()), z(name).c_str()), node(), "cannot delete attribute '", name, "'");
}

void Object::check_int64_range(std::string_view name, std::uint64_t value) const {
  MTP_REQUIRE(value <= static_cast<std::uint64_t>(INT64_MAX), file_name(), ": ", path(), ": attribute '",
              name, "' value ", value, " does not fit in int64");
}

namespace {

// Writes an attribute of `count` elements (scalar when count < 0), replacing any of that name.
void write_attr(const Node& at, std::string_view name, hid_t file_type, hid_t mem_type, long long count,
                const void* data) {
  const hid_t obj = live(at);
  const std::string n = z(name);
  MTP_REQUIRE(!n.empty(), at.file->path, ": ", at.path, ": empty attribute name");
  const htri_t exists = H5Aexists(obj, n.c_str());
  check(exists, at, "cannot look up attribute '", n, "'");
  if (exists > 0) check(H5Adelete(obj, n.c_str()), at, "cannot replace attribute '", n, "'");
  const hsize_t dims[1] = {static_cast<hsize_t>(count < 0 ? 1 : count)};
  Hid space(count < 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, nullptr), H5Sclose);
  check(space.get(), at, "cannot create the dataspace of attribute '", n, "'");
  Hid attr(H5Acreate2(obj, n.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  check(attr.get(), at, "cannot create attribute '", n, "'");
  if (count != 0) check(H5Awrite(attr.get(), mem_type, data), at, "cannot write attribute '", n, "'");
}

// An open attribute with its type and element count, for the typed readers.
struct OpenAttr {
  Hid attr;
  Hid type;
  bool scalar = true;
  std::size_t count = 1;
};

OpenAttr open_attr(const Node& at, std::string_view name) {
  const hid_t obj = live(at);
  const std::string n = z(name);
  const htri_t exists = H5Aexists(obj, n.c_str());
  check(exists, at, "cannot look up attribute '", n, "'");
  if (exists == 0) fail_at(at.file->path, at.path, "no attribute '", n, "'");
  Hid attr(H5Aopen(obj, n.c_str(), H5P_DEFAULT), H5Aclose);
  check(attr.get(), at, "cannot open attribute '", n, "'");
  Hid type(H5Aget_type(attr.get()), H5Tclose);
  check(type.get(), at, "cannot read the type of attribute '", n, "'");
  Hid space(H5Aget_space(attr.get()), H5Sclose);
  check(space.get(), at, "cannot read the dataspace of attribute '", n, "'");
  OpenAttr a{std::move(attr), std::move(type), true, 1};
  const H5S_class_t cls = H5Sget_simple_extent_type(space.get());
  if (cls == H5S_SCALAR) {
    a.scalar = true;
    a.count = 1;
  } else if (cls == H5S_SIMPLE && H5Sget_simple_extent_ndims(space.get()) == 1) {
    a.scalar = false;
    const hssize_t npoints = H5Sget_simple_extent_npoints(space.get());
    check(static_cast<herr_t>(npoints < 0 ? -1 : 0), at, "cannot size attribute '", n, "'");
    a.count = static_cast<std::size_t>(npoints);
  } else if (cls == H5S_NULL) {
    a.scalar = false;
    a.count = 0;
  } else {
    fail_at(at.file->path, at.path, "attribute '", n, "' is not a scalar or a 1-D array");
  }
  return a;
}

AttrKind attr_kind_of(hid_t type) {
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return AttrKind::integer;
    case H5T_FLOAT:
      return AttrKind::floating;
    case H5T_STRING:
      return AttrKind::string;
    default:
      return AttrKind::other;
  }
}
const char* attr_kind_name(AttrKind k) {
  static constexpr const char* kNames[] = {"an integer", "a float", "a string",
                                           "of another type"};  // AttrKind order
  static_assert(std::size(kNames) == static_cast<std::size_t>(AttrKind::other) + 1);
  return kNames[static_cast<std::size_t>(k)];
}

void require_attr(const Node& at, std::string_view name, const OpenAttr& a, AttrKind want, bool scalar) {
  const AttrKind got = attr_kind_of(a.type.get());
  if (got != want) {
    fail_at(at.file->path, at.path, "attribute '", name, "' is ", attr_kind_name(got), " (",
            describe_type(a.type.get()), "), not ", attr_kind_name(want));
  }
  if (scalar && !a.scalar) {
    fail_at(at.file->path, at.path, "attribute '", name, "' is an array of ", a.count, ", not a scalar");
  }
}

std::vector<std::int64_t> read_int_attr(const Node& at, std::string_view name, bool scalar) {
  const OpenAttr a = open_attr(at, name);
  require_attr(at, name, a, AttrKind::integer, scalar);
  std::vector<std::int64_t> out(a.count);
  if (a.count == 0) return out;
  const bool is_u64 = H5Tget_sign(a.type.get()) == H5T_SGN_NONE && H5Tget_size(a.type.get()) >= 8;
  if (is_u64) {  // HDF5 would clip values above INT64_MAX silently
    std::vector<std::uint64_t> raw(a.count);
    check(H5Aread(a.attr.get(), H5T_NATIVE_UINT64, raw.data()), at, "cannot read attribute '", name, "'");
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] > static_cast<std::uint64_t>(INT64_MAX)) {
        fail_at(at.file->path, at.path, "attribute '", name, "' value ", raw[i], " does not fit in int64");
      }
      out[i] = static_cast<std::int64_t>(raw[i]);
    }
    return out;
  }
  check(H5Aread(a.attr.get(), H5T_NATIVE_INT64, out.data()), at, "cannot read attribute '", name, "'");
  return out;
}

std::vector<double> read_double_attr(const Node& at, std::string_view name, bool scalar) {
  const OpenAttr a = open_attr(at, name);
  require_attr(at, name, a, AttrKind::floating, scalar);
  std::vector<double> out(a.count);
  if (a.count != 0) {
    check(H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, out.data()), at, "cannot read attribute '", name, "'");
  }
  return out;
}

std::vector<std::string> read_string_attr(const Node& at, std::string_view name, bool scalar) {
  const OpenAttr a = open_attr(at, name);
  require_attr(at, name, a, AttrKind::string, scalar);
  const hid_t attr = a.attr.get();
  return read_strings_of(a.type.get(), a.count, at, str("attribute '", name, "'"),
                         [attr](hid_t mem, void* buf) { return H5Aread(attr, mem, buf); });
}

}  // namespace

void Object::set_attr(std::string_view name, std::int64_t value) {
  write_attr(node(), name, H5T_STD_I64LE, H5T_NATIVE_INT64, -1, &value);
}
void Object::set_attr(std::string_view name, double value) {
  write_attr(node(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, -1, &value);
}
void Object::set_attr(std::string_view name, bool value) {
  set_attr(name, static_cast<std::int64_t>(value ? 1 : 0));
}
void Object::set_attr(std::string_view name, std::string_view value) {
  const std::string s(value);
  const PackedStrings p =
      pack_strings(std::span<const std::string>(&s, 1), 1, node(), str("attribute '", name, "'"));
  Hid type = fixed_string_type(p.width, node());
  write_attr(node(), name, type.get(), type.get(), -1, p.bytes.data());
}
void Object::set_attr(std::string_view name, std::span<const std::int64_t> values) {
  write_attr(node(), name, H5T_STD_I64LE, H5T_NATIVE_INT64, static_cast<long long>(values.size()),
             values.data());
}
void Object::set_attr(std::string_view name, std::span<const double> values) {
  write_attr(node(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, static_cast<long long>(values.size()),
             values.data());
}
void Object::set_attr(std::string_view name, std::span<const std::string> values) {
  const PackedStrings p = pack_strings(values, 1, node(), str("attribute '", name, "'"));
  Hid type = fixed_string_type(p.width, node());
  write_attr(node(), name, type.get(), type.get(), static_cast<long long>(values.size()), p.bytes.data());
}

AttrInfo Object::attr_info(std::string_view name) const {
  const OpenAttr a = open_attr(node(), name);
  return AttrInfo{attr_kind_of(a.type.get()), a.scalar, a.count};
}

std::int64_t Object::attr_int(std::string_view name) const { return read_int_attr(node(), name, true).at(0); }
double Object::attr_double(std::string_view name) const { return read_double_attr(node(), name, true).at(0); }
std::string Object::attr_string(std::string_view name) const {
  return read_string_attr(node(), name, true).at(0);
}
std::vector<std::int64_t> Object::attr_ints(std::string_view name) const {
  return read_int_attr(node(), name, false);
}
std::vector<double> Object::attr_doubles(std::string_view name) const {
  return read_double_attr(node(), name, false);
}
std::vector<std::string> Object::attr_strings(std::string_view name) const {
  return read_string_attr(node(), name, false);
}

// ---- Dataset ---------------------------------------------------------------------------------

namespace {

struct Extent {
  int rank = 0;
  hsize_t dims[2] = {0, 0};
  hsize_t maxdims[2] = {0, 0};
};

Extent extent_of(const Node& at) {
  Hid space(H5Dget_space(live(at)), H5Sclose);
  check(space.get(), at, "cannot read the dataspace");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  check(rank, at, "cannot read the rank");
  if (rank > 2)
    fail_at(at.file->path, at.path, "has rank ", rank, "; this wrapper handles 1-D and 2-D datasets");
  Extent e;
  e.rank = rank;
  if (rank > 0)
    check(H5Sget_simple_extent_dims(space.get(), e.dims, e.maxdims), at, "cannot read the dimensions");
  return e;
}

DType stored_dtype(const Node& at) {
  Hid type(H5Dget_type(live(at)), H5Tclose);
  check(type.get(), at, "cannot read the element type");
  DType t{};
  if (!classify(type.get(), t)) {
    fail_at(at.file->path, at.path, "holds ", describe_type(type.get()),
            ", which this wrapper does not read");
  }
  if (t == DType::u16) {
    const htri_t has = H5Aexists(at.id, "dtype");
    check(has, at, "cannot look up attribute 'dtype'");
    if (has > 0) {
      const auto names = read_string_attr(at, "dtype", true);
      if (names.at(0) == "bf16") t = DType::bf16;
    }
  }
  return t;
}

void require_readable_as(const Node& at, DType want) {
  const DType got = stored_dtype(at);
  const bool ok = got == want || (want == DType::u16 && got == DType::bf16);  // raw bits of bf16 are allowed
  if (!ok)
    fail_at(at.file->path, at.path, "holds ", dtype_name(got), ", read as ", dtype_name(want), " requested");
}

// A 1-D memory dataspace of n elements.
Hid memory_space(const Node& at, hsize_t n) {
  const hsize_t dims[1] = {n};
  Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  check(space.get(), at, "cannot create a memory dataspace");
  return space;
}

// Selects rows [first, first + count) of a dataset's file space.
Hid select_rows(const Node& at, const Extent& e, hsize_t first, hsize_t count) {
  Hid space(H5Dget_space(at.id), H5Sclose);
  check(space.get(), at, "cannot read the dataspace");
  if (e.rank == 0) return space;
  const hsize_t start[2] = {first, 0};
  const hsize_t block[2] = {count, e.rank == 2 ? e.dims[1] : 1};
  check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, block, nullptr), at,
        "cannot select rows ", first, "..", first + count);
  return space;
}

}  // namespace

DType Dataset::dtype() const { return stored_dtype(node()); }
int Dataset::rank() const { return extent_of(node()).rank; }
std::vector<std::uint64_t> Dataset::shape() const {
  const Extent e = extent_of(node());
  return std::vector<std::uint64_t>(e.dims, e.dims + e.rank);
}
std::uint64_t Dataset::rows() const {
  const Extent e = extent_of(node());
  return e.rank == 0 ? 1 : e.dims[0];
}
std::uint64_t Dataset::cols() const {
  const Extent e = extent_of(node());
  return e.rank == 2 ? e.dims[1] : 1;
}
bool Dataset::extendable() const {
  const Extent e = extent_of(node());
  return e.rank > 0 && e.maxdims[0] == H5S_UNLIMITED;
}

void Dataset::read_raw(DType t, std::uint64_t first, std::uint64_t count, void* out, std::size_t n) const {
  const Node& at = node();
  require_readable_as(at, t);
  const Extent e = extent_of(at);
  const std::uint64_t rows = e.rank == 0 ? 1 : e.dims[0];
  const std::uint64_t cols = e.rank == 2 ? e.dims[1] : 1;
  if (first > rows || count > rows - first) {
    fail_at(at.file->path, at.path, "rows ", first, "..", first + count, " requested, the dataset has ",
            rows);
  }
  if (n != count * cols) {
    fail_at(at.file->path, at.path, "a buffer of ", n, " elements for ", count, " rows of ", cols);
  }
  if (n == 0) return;
  Hid file_space = select_rows(at, e, first, count);
  Hid mem_space = memory_space(at, n);
  check(H5Dread(at.id, mem_type_of(t), mem_space.get(), file_space.get(), H5P_DEFAULT, out), at,
        "cannot read rows ", first, "..", first + count);
}

namespace {
void require_writable_as(const Node& at, DType t) {
  const DType stored = stored_dtype(at);
  if (stored != t && !(stored == DType::bf16 && t == DType::u16)) {
    fail_at(at.file->path, at.path, "holds ", dtype_name(stored), ", cannot write ", dtype_name(t));
  }
}
}  // namespace

void Dataset::write_raw(DType t, std::uint64_t first, const void* data, std::size_t n) {
  const Node& at = node();
  require_writable_as(at, t);
  const Extent e = extent_of(at);
  const std::uint64_t rows = e.rank == 0 ? 1 : e.dims[0];
  const std::uint64_t cols = e.rank == 2 ? e.dims[1] : 1;
  if (cols == 0 || n % cols != 0) fail_at(at.file->path, at.path, n, " values are not whole rows of ", cols);
  const std::uint64_t count = n / cols;
  if (first > rows || count > rows - first) {
    fail_at(at.file->path, at.path, "cannot write rows ", first, "..", first + count, ", the dataset has ",
            rows);
  }
  if (n == 0) return;
  Hid file_space = select_rows(at, e, first, count);
  Hid mem_space = memory_space(at, n);
  check(H5Dwrite(at.id, mem_type_of(t), mem_space.get(), file_space.get(), H5P_DEFAULT, data), at,
        "cannot write rows ", first, "..", first + count);
}

void Dataset::append_raw(DType t, const void* data, std::size_t n) {
  const Node& at = node();
  require_writable_as(at, t);  // before growing: a refused append must not leave new empty rows
  const Extent e = extent_of(at);
  if (e.rank == 0 || e.maxdims[0] != H5S_UNLIMITED) fail_at(at.file->path, at.path, "is not extendable");
  const std::uint64_t cols = e.rank == 2 ? e.dims[1] : 1;
  if (cols == 0 || n % cols != 0) fail_at(at.file->path, at.path, n, " values are not whole rows of ", cols);
  if (n == 0) return;
  const hsize_t new_dims[2] = {e.dims[0] + n / cols, e.dims[1]};
  check(H5Dset_extent(at.id, new_dims), at, "cannot grow to ", new_dims[0], " rows");
  write_raw(t, e.dims[0], data, n);
}

std::vector<std::string> Dataset::read_strings() const {
  const Node& at = node();
  const DType got = stored_dtype(at);
  if (got != DType::string)
    fail_at(at.file->path, at.path, "holds ", dtype_name(got), ", read as strings requested");
  const Extent e = extent_of(at);
  if (e.rank == 2) fail_at(at.file->path, at.path, "is 2-D; string datasets are read as 1-D");
  const std::size_t n = e.rank == 0 ? 1 : e.dims[0];
  Hid type(H5Dget_type(at.id), H5Tclose);
  check(type.get(), at, "cannot read the element type");
  const hid_t id = at.id;
  return read_strings_of(type.get(), n, at, "the strings", [id](hid_t mem, void* buf) {
    return H5Dread(id, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
  });
}

void Dataset::append_strings(std::span<const std::string> values) {
  const Node& at = node();
  if (stored_dtype(at) != DType::string) fail_at(at.file->path, at.path, "is not a string dataset");
  const Extent e = extent_of(at);
  if (e.rank != 1 || e.maxdims[0] != H5S_UNLIMITED)
    fail_at(at.file->path, at.path, "is not an extendable 1-D dataset");
  if (values.empty()) return;
  Hid type(H5Dget_type(at.id), H5Tclose);
  check(type.get(), at, "cannot read the element type");
  const htri_t is_vlen = H5Tis_variable_str(type.get());
  check(is_vlen, at, "cannot inspect the string type");
  // Check (and pack) before growing: a refused append must not leave new empty rows.
  PackedStrings packed;
  std::vector<const char*> ptrs;
  Hid mem_type(-1, H5Tclose);
  if (is_vlen > 0) {  // a file written elsewhere (h5py writes variable-length strings)
    ptrs = c_strings(values, at, "value");
    mem_type = vlen_string_type(at);
  } else {
    const std::size_t width = H5Tget_size(type.get());
    packed = pack_strings(values, width, at, "value");
    if (packed.width != width) {
      fail_at(at.file->path, at.path, "a value of ", packed.width, " bytes does not fit the fixed width ",
              width, " (set DatasetOptions::string_width when creating it)");
    }
    mem_type = fixed_string_type(width, at);
  }
  const hsize_t new_dims[1] = {e.dims[0] + values.size()};
  check(H5Dset_extent(at.id, new_dims), at, "cannot grow to ", new_dims[0], " rows");
  Hid file_space = select_rows(at, Extent{1, {new_dims[0], 0}, {H5S_UNLIMITED, 0}}, e.dims[0], values.size());
  Hid mem_space = memory_space(at, values.size());
  const void* data =
      is_vlen > 0 ? static_cast<const void*>(ptrs.data()) : static_cast<const void*>(packed.bytes.data());
  check(H5Dwrite(at.id, mem_type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT, data), at,
        "cannot write strings");
}

// ---- Group -----------------------------------------------------------------------------------

std::string Group::child_path(std::string_view name) const {
  if (!name.empty() && name.front() == '/') return std::string(name);
  return path() == "/" ? str("/", name) : str(path(), "/", name);
}

bool Group::exists(std::string_view name) const {
  const Node& at = node();
  const hid_t id = live(at);
  validate_name(name, at);
  // H5Lexists fails (rather than saying no) when an intermediate group is absent: walk the path.
  std::string prefix;
  for (const std::string& part : split(name, '/')) {
    if (part.empty()) {
      if (prefix.empty()) prefix = "/";
      continue;
    }
    prefix += (prefix.empty() || prefix.back() == '/') ? part : "/" + part;
    const htri_t r = H5Lexists(id, prefix.c_str(), H5P_DEFAULT);
    check(r, at, "cannot look up '", prefix, "'");
    if (r == 0) return false;
  }
  return true;
}

NodeKind Group::kind(std::string_view name) const {
  const Node& at = node();
  if (!exists(name)) fail_at(at.file->path, at.path, "no object '", name, "'");
  Hid obj(H5Oopen(at.id, z(name).c_str(), H5P_DEFAULT), H5Oclose);
  check(obj.get(), at, "cannot open '", name, "'");
  const H5I_type_t type = H5Iget_type(obj.get());
  return type == H5I_GROUP ? NodeKind::group : type == H5I_DATASET ? NodeKind::dataset : NodeKind::other;
}

std::vector<std::string> Group::children() const {
  const Node& at = node();
  const hid_t id = live(at);
  H5G_info_t info{};
  check(H5Gget_info(id, &info), at, "cannot list the group");
  std::vector<std::string> names;
  names.reserve(info.nlinks);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(id, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    check(static_cast<herr_t>(len < 0 ? -1 : 0), at, "cannot read the name of child ", i);
    std::string name(static_cast<std::size_t>(len) + 1, '\0');
    check(static_cast<herr_t>(H5Lget_name_by_idx(id, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                                                 name.size(), H5P_DEFAULT) < 0
                                  ? -1
                                  : 0),
          at, "cannot read the name of child ", i);
    name.resize(static_cast<std::size_t>(len));
    names.push_back(std::move(name));
  }
  return names;
}

Group Group::create_group(std::string_view name) {
  const Node& at = node();
  const hid_t id = live(at);
  validate_name(name, at);
  if (exists(name)) fail_at(at.file->path, child_path(name), "already exists");
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  check(lcpl.get(), at, "cannot create a property list");
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), at, "cannot set intermediate group creation");
  Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  check(gcpl.get(), at, "cannot create a property list");
  track_attr_order(gcpl.get(), at.file->path);
  const hid_t g = H5Gcreate2(id, z(name).c_str(), lcpl.get(), gcpl.get(), H5P_DEFAULT);
  if (g < 0) fail_at(at.file->path, child_path(name), "cannot create the group");
  return Group(std::make_shared<Node>(g, at.file, child_path(name)));
}

std::int64_t Group::open_child(std::string_view name, NodeKind want, const char* what) const {
  const Node& at = node();
  validate_name(name, at);
  if (!exists(name)) fail_at(at.file->path, at.path, "no ", what, " '", name, "'");
  if (kind(name) != want) fail_at(at.file->path, child_path(name), "is not a ", what);
  const hid_t id = want == NodeKind::group ? H5Gopen2(at.id, z(name).c_str(), H5P_DEFAULT)
                                           : H5Dopen2(at.id, z(name).c_str(), H5P_DEFAULT);
  if (id < 0) fail_at(at.file->path, child_path(name), "cannot open the ", what);
  return id;
}

Group Group::open_group(std::string_view name) const {
  const hid_t g = static_cast<hid_t>(open_child(name, NodeKind::group, "group"));
  return Group(std::make_shared<Node>(g, node().file, child_path(name)));
}

Group Group::require_group(std::string_view name) {
  return exists(name) ? open_group(name) : create_group(name);
}

void Group::remove(std::string_view name) {
  const Node& at = node();
  if (!exists(name)) fail_at(at.file->path, at.path, "no object '", name, "' to remove");
  check(H5Ldelete(live(at), z(name).c_str(), H5P_DEFAULT), at, "cannot remove '", name, "'");
}

Dataset Group::open_dataset(std::string_view name) const {
  const hid_t d = static_cast<hid_t>(open_child(name, NodeKind::dataset, "dataset"));
  const Node& at = node();
  Dataset ds(std::make_shared<Node>(d, at.file, child_path(name)));
  extent_of(ds.node());  // refuses rank > 2 at open
  return ds;
}

namespace {

// Creates a dataset of `file_type` with the given shape and layout; returns its id.
hid_t create_dataset_id(const Node& at, const std::string& full_path, std::string_view name, hid_t file_type,
                        std::size_t elem_size, std::uint64_t rows, std::uint64_t cols,
                        const DatasetOptions& opt) {
  const hid_t id = live(at);
  const int rank = cols == 0 ? 1 : 2;
  const hsize_t dims[2] = {rows, cols};
  const hsize_t maxdims[2] = {opt.extendable ? H5S_UNLIMITED : rows, cols};
  Hid space(H5Screate_simple(rank, dims, maxdims), H5Sclose);
  check(space.get(), at, "cannot create the dataspace of '", name, "'");

  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  check(dcpl.get(), at, "cannot create a property list");
  track_attr_order(dcpl.get(), at.file->path);
  MTP_REQUIRE(opt.deflate >= 0 && opt.deflate <= 9, at.file->path, ": ", full_path, ": deflate level ",
              opt.deflate, " is not in 0..9");
  const bool chunked = !opt.chunk.empty() || opt.deflate > 0 || opt.extendable;
  if (chunked) {
    hsize_t chunk[2] = {1, cols};
    if (!opt.chunk.empty()) {
      MTP_REQUIRE(opt.chunk.size() == static_cast<std::size_t>(rank), at.file->path, ": ", full_path,
                  ": chunk has ", opt.chunk.size(), " dimensions, the dataset ", rank);
      for (int i = 0; i < rank; ++i) {
        MTP_REQUIRE(opt.chunk[i] > 0, at.file->path, ": ", full_path, ": chunk dimensions must be positive");
        chunk[i] = opt.chunk[i];
      }
    } else {
      // About 256 KiB per chunk: large enough for deflate, small enough for the default chunk cache.
      const std::uint64_t row_bytes = elem_size * (cols == 0 ? 1 : cols);
      std::uint64_t chunk_rows =
          std::max<std::uint64_t>(1, (256u << 10) / std::max<std::uint64_t>(row_bytes, 1));
      if (!opt.extendable) chunk_rows = std::min<std::uint64_t>(chunk_rows, std::max<std::uint64_t>(rows, 1));
      chunk[0] = chunk_rows;
      MTP_REQUIRE(rank == 1 || cols > 0, at.file->path, ": ", full_path,
                  ": a chunked 2-D dataset needs cols > 0");
    }
    check(H5Pset_chunk(dcpl.get(), rank, chunk), at, "cannot set the chunk shape of '", name, "'");
    if (opt.checksum) check(H5Pset_fletcher32(dcpl.get()), at, "cannot set the fletcher32 checksum");
    if (opt.deflate > 0) {
      MTP_REQUIRE(H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0, at.file->path, ": ", full_path,
                  ": this HDF5 library has no deflate filter");
      if (opt.shuffle) check(H5Pset_shuffle(dcpl.get()), at, "cannot set the shuffle filter");
      check(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(opt.deflate)), at, "cannot set deflate");
    }
  }
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  check(lcpl.get(), at, "cannot create a property list");
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), at, "cannot set intermediate group creation");
  const hid_t d =
      H5Dcreate2(id, z(name).c_str(), file_type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT);
  if (d < 0) fail_at(at.file->path, full_path, "cannot create the dataset");
  return d;
}

}  // namespace

Dataset Group::create_dataset(std::string_view name, DType type, std::uint64_t rows, std::uint64_t cols,
                              const DatasetOptions& options) {
  const Node& at = node();
  validate_name(name, at);
  const std::string full = child_path(name);
  if (exists(name)) fail_at(at.file->path, full, "already exists");
  MTP_REQUIRE(type != DType::string, at.file->path, ": ", full, ": use write_strings for string datasets");
  const hid_t d = create_dataset_id(at, full, name, file_type_of(type), size_of(type), rows, cols, options);
  Dataset ds(std::make_shared<Node>(d, at.file, full));
  if (type == DType::bf16) ds.set_attr("dtype", "bf16");
  return ds;
}

Dataset Group::write_strings(std::string_view name, std::span<const std::string> values,
                             const DatasetOptions& options) {
  const Node& at = node();
  validate_name(name, at);
  const std::string full = child_path(name);
  if (exists(name)) fail_at(at.file->path, full, "already exists");
  const PackedStrings p = pack_strings(values, options.string_width, at, str(full, " value"));
  Hid type = fixed_string_type(p.width, at);
  const hid_t d = create_dataset_id(at, full, name, type.get(), p.width, values.size(), 0, options);
  Dataset ds(std::make_shared<Node>(d, at.file, full));
  if (!values.empty()) {
    check(H5Dwrite(d, type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, p.bytes.data()), ds.node(),
          "cannot write strings");
  }
  return ds;
}

// ---- H5File ----------------------------------------------------------------------------------

namespace {

std::shared_ptr<Node> open_root(const std::shared_ptr<FileState>& fs) {
  const hid_t root = H5Gopen2(fs->id, "/", H5P_DEFAULT);
  if (root < 0) {
    const std::string detail = take_hdf5_detail();
    fs->close();
    MTP_FAIL(fs->path, ": cannot open the root group", detail);
  }
  return std::make_shared<Node>(root, fs, "/");
}

[[noreturn]] void fail_not_hdf5(const std::string& path) {
  const std::string detail = take_hdf5_detail();
  MTP_FAIL(path, ": not a valid HDF5 file or truncated", detail);
}

// Checks that `path` is a readable regular file that starts like HDF5.
void require_hdf5_file(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  MTP_REQUIRE(!ec && std::filesystem::exists(status), path, ": no such file");
  MTP_REQUIRE(std::filesystem::is_regular_file(status), path, ": not a regular file");
  MTP_REQUIRE(::access(path.c_str(), R_OK) == 0, path, ": not readable: ", errno_text(errno));
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) fail_not_hdf5(path);
}

hid_t open_existing(const std::string& path, const std::string& working, unsigned flags) {
  Hid fapl = make_fapl(path, (flags & H5F_ACC_RDWR) != 0);
  const hid_t id = H5Fopen(working.c_str(), flags, fapl.get());
  if (id < 0) fail_not_hdf5(path);
  return id;
}

std::string working_name(const std::string& path) { return str(path, ".tmp.", ::getpid()); }

// A writer renames its temporary onto `path`: onto a symbolic link that would replace the link
// with a regular file. The commands resolve links first (io/output.hpp); this is the backstop.
void refuse_link(const std::string& path) {
  std::error_code ec;
  MTP_REQUIRE(!std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec)), path,
              ": is a symbolic link; not writing through it (that would replace the link with a "
              "regular file): give the path of the file it points at");
}

void claim_working(const std::string& path, const std::string& working) {
  MTP_REQUIRE(active_working_paths().insert(working).second, path,
              ": already open for writing in this process (", working, ")");
  (void)register_temporary(working);
}

}  // namespace

H5File H5File::create(const std::string& path) {
  ensure_init();
  MTP_REQUIRE(!path.empty(), "HDF5: empty file path");
  refuse_link(path);
  auto fs = std::make_shared<FileState>();
  fs->path = path;
  fs->working = working_name(path);
  fs->writable = true;
  claim_working(path, fs->working);
  Hid fapl = make_fapl(path, true);
  Hid fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  if (!fcpl.valid()) {
    release_working(fs->working);
    MTP_FAIL(path, ": cannot create a property list", take_hdf5_detail());
  }
  track_attr_order(fcpl.get(), path);
  fs->id = H5Fcreate(fs->working.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
  if (fs->id < 0) {
    const std::string detail = take_hdf5_detail();
    ::unlink(fs->working.c_str());  // a full disk may leave it created, empty
    release_working(fs->working);
    MTP_FAIL(path, ": cannot create ", fs->working, detail);
  }
  fs->open = true;
  try {
    return H5File(open_root(fs));
  } catch (...) {
    ::unlink(fs->working.c_str());
    release_working(fs->working);
    throw;
  }
}

H5File H5File::open_read(const std::string& path) {
  ensure_init();
  require_hdf5_file(path);
  auto fs = std::make_shared<FileState>();
  fs->path = path;
  fs->working = path;
  fs->id = open_existing(path, path, H5F_ACC_RDONLY);
  fs->open = true;
  return H5File(open_root(fs));
}

H5File H5File::open_append(const std::string& path) {
  ensure_init();
  refuse_link(path);
  require_hdf5_file(path);
  auto fs = std::make_shared<FileState>();
  fs->path = path;
  fs->working = working_name(path);
  fs->writable = true;
  fs->append = true;
  claim_working(path, fs->working);
  auto abandon = [&] {
    ::unlink(fs->working.c_str());
    release_working(fs->working);
  };
  struct stat before {
  }, after{};
  if (::stat(path.c_str(), &before) != 0) {
    abandon();
    MTP_FAIL(path, ": cannot stat: ", errno_text(errno));
  }
  std::error_code ec;
  std::filesystem::copy_file(path, fs->working, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec || ::stat(path.c_str(), &after) != 0 || !same_file_version(before, after)) {
    // A copy cut short by a full disk may say only "Input/output error": asked before the
    // partial copy is removed (which frees its space).
    struct statvfs vfs {};
    const std::filesystem::path dir = std::filesystem::path(fs->working).parent_path();
    const bool full = ec && ::statvfs(dir.empty() ? "." : dir.c_str(), &vfs) == 0 && vfs.f_bavail == 0;
    abandon();
    MTP_FAIL(path, ": cannot copy to ", fs->working, " for appending: ",
             full ? std::string("no space left on device (the file system or the quota is full)")
             : ec ? ec.message()
                  : std::string("the file changed while it was copied"));
  }
  fs->original = before;
  try {
    fs->id = open_existing(path, fs->working, H5F_ACC_RDWR);
    fs->open = true;
    return H5File(open_root(fs));
  } catch (...) {
    fs->close();
    abandon();
    throw;
  }
}

H5File::H5File(H5File&& other) noexcept : Group(std::move(other.node_)), committed_(other.committed_) {
  other.node_.reset();
}

H5File& H5File::operator=(H5File&& other) noexcept {
  if (this != &other) {
    discard();
    node_ = std::move(other.node_);
    other.node_.reset();
    committed_ = other.committed_;
  }
  return *this;
}

H5File::~H5File() { discard(); }

bool H5File::writable() const { return node().file->writable; }
const std::string& H5File::working_path() const { return node().file->working; }

namespace {
// Throws a writer's temporary away: emptied first, so that closing it (HDF5 flushes what it holds
// on close) has room even on a full disk, then closed (its objects before it, a failure not
// retried: FileState::close) and removed. Any HDF5 error on the way is dropped: the caller
// reports the first one.
void discard_working(FileState& fs) noexcept {
  if (fs.open) {
    const int emptied = ::truncate(fs.working.c_str(), 0);
    (void)emptied;
    (void)fs.close();
    H5Eclear2(H5E_DEFAULT);
  }
  ::unlink(fs.working.c_str());
  release_working(fs.working);
}
}  // namespace

void H5File::discard() noexcept {
  if (!node_) return;
  FileState& fs = *node_->file;
  if (fs.writable && !committed_) discard_working(fs);
  node_.reset();
}

void H5File::commit() {
  FileState& fs = *node().file;
  MTP_REQUIRE(fs.writable, fs.path, ": opened read-only, nothing to commit");
  MTP_REQUIRE(!committed_, fs.path, ": already committed");
  MTP_REQUIRE(fs.open, fs.path, ": the file is closed");
  auto abandon = [&] { discard_working(fs); };
  // A failed flush or close means data may be missing: the temporary is not promoted.
  if (H5Fflush(fs.id, H5F_SCOPE_LOCAL) < 0) {
    const std::string detail = take_hdf5_detail();
    abandon();
    MTP_FAIL(fs.path, ": flushing ", fs.working, " failed, nothing written", detail);
  }
  const bool closed = fs.close();  // the objects still open, then the file
  if (!closed) {
    const std::string detail = take_hdf5_detail();
    abandon();
    MTP_FAIL(fs.path, ": closing ", fs.working, " failed, nothing written", detail);
  }
  try {
    fsync_path(fs.working, false);
    if (fs.append) {
      struct stat now {};
      const bool same = ::stat(fs.path.c_str(), &now) == 0 && same_file_version(fs.original, now);
      MTP_REQUIRE(same, fs.path,
                  ": replaced or changed by another writer since it was opened for append; "
                  "not overwriting it (the additions are discarded)");
    }
    if (::rename(fs.working.c_str(), fs.path.c_str()) != 0) {
      MTP_FAIL(fs.path, ": cannot rename ", fs.working, " onto it: ", errno_text(errno));
    }
  } catch (...) {
    abandon();
    throw;
  }
  release_working(fs.working);
  committed_ = true;
  const std::filesystem::path parent = std::filesystem::path(fs.path).parent_path();
  fsync_path(parent.empty() ? std::string(".") : parent.string(), true);  // makes the rename durable
}

}  // namespace mtplab::io
