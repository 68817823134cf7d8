// A small RAII wrapper over HDF5's C API: files, groups, attributes and 1-D / 2-D datasets.
//
// Invariants:
// - A file opened for writing is never written at its final path. create() and open_append()
//   work on `<path>.tmp.<pid>`; commit() flushes, fsyncs and renames it onto `<path>`. A writer
//   destroyed without commit() removes its temporary, so a reader sees the old file or the new
//   one, never half of one (docs/hdf5.md).
// - Every HDF5 failure becomes an mtplab::Error naming the file and the object path; HDF5's own
//   error printing is off. A truncated or corrupt file is an Error, never a crash: files are
//   written in the HDF5 1.10 format (checksummed metadata), strings fixed-length (never in the
//   unchecksummed global heap) and chunks with fletcher32 (docs/hdf5.md).
// - Dataset element types are checked exactly on read: reading a float32 dataset as double is an
//   Error, not a silent conversion. BF16 is stored as uint16 bits with attribute dtype="bf16".
// - hid_t handles are closed by destructors. Single-threaded use only (HDF5 is built serial).
// This header does not include hdf5.h: hid_t is carried as int64_t (checked in hdf5.cpp).
#pragma once
#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/error.hpp"
#include "core/numeric.hpp"

namespace mtplab::io {

/// Element types of datasets. bf16 is stored as uint16 with the attribute dtype="bf16".
enum class DType : std::uint8_t { i8, u8, u16, i32, i64, f32, f64, bf16, string };
const char* dtype_name(DType t);

template <typename T>
struct DTypeOf;  // maps a C++ element type to its DType
template <>
struct DTypeOf<std::int8_t> : std::integral_constant<DType, DType::i8> {};
template <>
struct DTypeOf<std::uint8_t> : std::integral_constant<DType, DType::u8> {};
template <>
struct DTypeOf<std::uint16_t> : std::integral_constant<DType, DType::u16> {};
template <>
struct DTypeOf<std::int32_t> : std::integral_constant<DType, DType::i32> {};
template <>
struct DTypeOf<std::int64_t> : std::integral_constant<DType, DType::i64> {};
template <>
struct DTypeOf<float> : std::integral_constant<DType, DType::f32> {};
template <>
struct DTypeOf<double> : std::integral_constant<DType, DType::f64> {};
template <>
struct DTypeOf<bf16> : std::integral_constant<DType, DType::bf16> {};

template <typename T>
concept Element = requires {
  DTypeOf<T>::value;
};

/// What a name in a group refers to.
enum class NodeKind { group, dataset, other };

/// What an attribute holds.
enum class AttrKind { integer, floating, string, other };
struct AttrInfo {
  AttrKind kind = AttrKind::other;
  bool scalar = true;      ///< false for a 1-D array (even of length 1)
  std::uint64_t size = 1;  ///< number of elements
};

/// How a new dataset is laid out.
struct DatasetOptions {
  /// Chunk shape (one entry per dimension). Empty: contiguous, or an automatic chunk of about
  /// 256 KiB when the dataset is extendable or compressed.
  std::vector<std::uint64_t> chunk;
  int deflate = 0;          ///< gzip level 0 (off) .. 9; implies chunking
  bool shuffle = true;      ///< byte-shuffle before deflate (helps on numeric data)
  bool extendable = false;  ///< the first dimension may grow with append_rows()
  bool checksum = true;     ///< fletcher32 on each chunk: corrupted data reads as an Error (chunked only)
  std::size_t string_width = 0;  ///< string datasets: fixed width in bytes (0: the longest initial value)
};

namespace detail {
struct FileState;
struct Node;
}  // namespace detail

class Group;
class Dataset;

/// Anything that can carry attributes: a group (the file root included) or a dataset.
/// Copies share the underlying HDF5 handle.
class Object {
 public:
  /// Path inside the file, e.g. "/point_3/latency".
  const std::string& path() const;
  /// The file's final path (not the temporary a writer works on).
  const std::string& file_name() const;

  bool has_attr(std::string_view name) const;
  std::vector<std::string> attr_names() const;  ///< in creation order
  AttrInfo attr_info(std::string_view name) const;
  void remove_attr(std::string_view name);

  // Writing an attribute replaces one of the same name, whatever its type.
  void set_attr(std::string_view name, std::int64_t value);
  void set_attr(std::string_view name, double value);
  void set_attr(std::string_view name, bool value);  ///< stored as int64 0 / 1
  void set_attr(std::string_view name, std::string_view value);
  void set_attr(std::string_view name, const char* value) { set_attr(name, std::string_view(value)); }
  void set_attr(std::string_view name, const std::string& value) { set_attr(name, std::string_view(value)); }
  void set_attr(std::string_view name, std::span<const std::int64_t> values);
  void set_attr(std::string_view name, std::span<const double> values);
  void set_attr(std::string_view name, std::span<const std::string> values);
  void set_attr(std::string_view name, const std::vector<std::int64_t>& v) {
    set_attr(name, std::span<const std::int64_t>(v));
  }
  void set_attr(std::string_view name, const std::vector<double>& v) {
    set_attr(name, std::span<const double>(v));
  }
  void set_attr(std::string_view name, const std::vector<std::string>& v) {
    set_attr(name, std::span<const std::string>(v));
  }
  /// Any other integer type (int, uint32_t, size_t, ...) is stored as int64; out of range is an Error.
  template <std::integral T>
  requires(!std::same_as<T, bool> && !std::same_as<T, std::int64_t>) void set_attr(std::string_view name,
                                                                                   T value) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) check_int64_range(name, value);
    set_attr(name, static_cast<std::int64_t>(value));
  }

  // Reading checks the stored class: an integer attribute is not a double and vice versa.
  // Scalar readers accept a scalar only; array readers accept an array or a scalar (as one element).
  std::int64_t attr_int(std::string_view name) const;
  double attr_double(std::string_view name) const;
  std::string attr_string(std::string_view name) const;
  std::vector<std::int64_t> attr_ints(std::string_view name) const;
  std::vector<double> attr_doubles(std::string_view name) const;
  std::vector<std::string> attr_strings(std::string_view name) const;

  /// The raw hid_t, for what this wrapper does not cover. Do not close it.
  std::int64_t raw_id() const;

 protected:
  Object() = default;
  explicit Object(std::shared_ptr<detail::Node> node) : node_(std::move(node)) {}
  const detail::Node& node() const;
  std::shared_ptr<detail::Node> node_;

 private:
  void check_int64_range(std::string_view name, std::uint64_t value) const;
};

class Dataset : public Object {
 public:
  Dataset() = default;  ///< empty; assign one from Group::open_dataset / create_dataset
  DType dtype() const;  ///< bf16 when stored as uint16 with dtype="bf16"
  int rank() const;     ///< 1 or 2 (other ranks can be opened, not read by this wrapper)
  std::vector<std::uint64_t> shape() const;
  std::uint64_t rows() const;  ///< shape[0]
  std::uint64_t cols() const;  ///< shape[1], or 1 for a 1-D dataset
  bool extendable() const;     ///< the first dimension is unlimited

  /// The whole dataset, row-major. T must match the stored type (uint16_t may read bf16 bits).
  template <Element T>
  std::vector<T> read() const {
    std::vector<T> out(static_cast<std::size_t>(rows() * cols()));
    read_raw(DTypeOf<T>::value, 0, rows(), out.data(), out.size());
    return out;
  }
  /// Rows [first, first + count) (all columns), row-major.
  template <Element T>
  std::vector<T> read_rows(std::uint64_t first, std::uint64_t count) const {
    std::vector<T> out(static_cast<std::size_t>(count * cols()));
    read_raw(DTypeOf<T>::value, first, count, out.data(), out.size());
    return out;
  }
  /// As read_rows, into a caller's buffer of exactly count * cols() elements.
  template <Element T>
  void read_rows_into(std::uint64_t first, std::uint64_t count, std::span<T> out) const {
    read_raw(DTypeOf<T>::value, first, count, out.data(), out.size());
  }
  /// Overwrites rows [first, first + data.size() / cols()); they must exist.
  template <Element T>
  void write_rows(std::uint64_t first, std::span<const T> data) {
    write_raw(DTypeOf<T>::value, first, data.data(), data.size());
  }
  /// Grows an extendable dataset by data.size() / cols() rows and writes them.
  template <Element T>
  void append_rows(std::span<const T> data) {
    append_raw(DTypeOf<T>::value, data.data(), data.size());
  }
  template <Element T>
  void append_rows(const std::vector<T>& data) {
    append_rows(std::span<const T>(data));
  }

  /// 1-D string datasets (fixed- or variable-length). Appending to a fixed-length one refuses
  /// values longer than its width.
  std::vector<std::string> read_strings() const;
  void append_strings(std::span<const std::string> values);

 private:
  friend class Group;
  explicit Dataset(std::shared_ptr<detail::Node> node) : Object(std::move(node)) {}
  void read_raw(DType t, std::uint64_t first, std::uint64_t count, void* out, std::size_t n) const;
  void write_raw(DType t, std::uint64_t first, const void* data, std::size_t n);
  void append_raw(DType t, const void* data, std::size_t n);
};

class Group : public Object {
 public:
  Group() = default;  ///< empty; assign one from H5File::root / create_group / open_group

  /// Creates a child group; `name` may be a path ("a/b"), intermediate groups are created.
  Group create_group(std::string_view name);
  Group open_group(std::string_view name) const;
  /// Opens the group, creating it when absent.
  Group require_group(std::string_view name);
  /// Whether a link of that name (or relative path) exists; false when an intermediate is absent.
  bool exists(std::string_view name) const;
  NodeKind kind(std::string_view name) const;
  /// Names of the direct children, in name order.
  std::vector<std::string> children() const;
  void remove(std::string_view name);  ///< unlinks a child (its space is not reclaimed)

  /// A new dataset of shape {rows} (cols == 0) or {rows, cols}, contents unwritten.
  Dataset create_dataset(std::string_view name, DType type, std::uint64_t rows, std::uint64_t cols = 0,
                         const DatasetOptions& options = {});
  /// A new 1-D dataset holding `data`.
  template <Element T>
  Dataset write(std::string_view name, std::span<const T> data, const DatasetOptions& options = {}) {
    Dataset d = create_dataset(name, DTypeOf<T>::value, data.size(), 0, options);
    if (!data.empty()) d.write_rows(0, data);
    return d;
  }
  template <Element T>
  Dataset write(std::string_view name, const std::vector<T>& data, const DatasetOptions& options = {}) {
    return write(name, std::span<const T>(data), options);
  }
  /// A new 2-D dataset [rows, cols] holding `data` (row-major, rows * cols elements).
  template <Element T>
  Dataset write(std::string_view name, std::span<const T> data, std::uint64_t rows, std::uint64_t cols,
                const DatasetOptions& options = {}) {
    MTP_REQUIRE(data.size() == rows * cols, file_name(), ": ", child_path(name), ": ", data.size(),
                " values given for a [", rows, ", ", cols, "] dataset");
    Dataset d = create_dataset(name, DTypeOf<T>::value, rows, cols, options);
    if (rows * cols != 0) d.write_rows(0, data);
    return d;
  }
  template <Element T>
  Dataset write(std::string_view name, const std::vector<T>& data, std::uint64_t rows, std::uint64_t cols,
                const DatasetOptions& options = {}) {
    return write(name, std::span<const T>(data), rows, cols, options);
  }
  /// A new 1-D string dataset: fixed-length UTF-8, NUL-padded to options.string_width or the
  /// longest value (h5py: `ds.asstr()[()]`).
  Dataset write_strings(std::string_view name, std::span<const std::string> values,
                        const DatasetOptions& options = {});
  Dataset open_dataset(std::string_view name) const;

 protected:
  friend class H5File;
  explicit Group(std::shared_ptr<detail::Node> node) : Object(std::move(node)) {}
  std::string child_path(std::string_view name) const;
  /// The HDF5 id of child `name`, which must exist and be a `want` (`what` names it in errors).
  std::int64_t open_child(std::string_view name, NodeKind want, const char* what) const;
};

/// An HDF5 file. The object itself is the root group.
///
/// Writable files (create, open_append) are invisible at `path` until commit(); destroying one
/// uncommitted discards every change. Read-only files stay open while any Group or Dataset taken
/// from them lives; writable ones close at commit() or destruction, after which objects taken
/// from them throw on use.
class H5File : public Group {
 public:
  /// A new, empty file. It replaces `path` (if any) at commit().
  static H5File create(const std::string& path);
  static H5File open_read(const std::string& path);
  /// A private copy of the existing file at `path` to add to; commit() replaces `path` with it,
  /// after checking that nobody else replaced `path` since it was opened.
  static H5File open_append(const std::string& path);

  H5File(H5File&& other) noexcept;
  H5File& operator=(H5File&& other) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  ~H5File();

  /// Flushes, closes, fsyncs and renames the temporary onto the final path (writable files only).
  void commit();
  bool writable() const;
  bool committed() const { return committed_; }
  /// The final path.
  const std::string& path() const { return file_name(); }
  /// Where the bytes are while writing (`<path>.tmp.<pid>`), or the path itself when read-only.
  const std::string& working_path() const;

 private:
  explicit H5File(std::shared_ptr<detail::Node> root) : Group(std::move(root)) {}
  void discard() noexcept;
  bool committed_ = false;
};

/// The version of the HDF5 library linked, e.g. "1.10.8"; "-" when HDF5 cannot say (the
/// provenance of results and `mtplab info`, provenance/versions.hpp).
std::string hdf5_library_version();

}  // namespace mtplab::io
