// Safetensors reading and writing, without a JSON library.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}}
// then the data; offsets are relative to the first data byte.
//
// Invariants a file must satisfy to be opened (anything else is refused with the file named):
// - the header is strict JSON (no duplicate keys, no trailing garbage) of that exact form;
// - every tensor's byte size is numel x dtype size; the tensors tile the data region exactly
//   (no overlap, no hole) and the data region ends at the end of the file: a truncated file,
//   or one with trailing bytes, is refused at open, not at first read.
// Files are memory-mapped read-only, so a rank reading its shard's rows touches only those pages.
//
// Conversions at read (read_bf16 / read_f32): BF16, F16, F32 and F8_E4M3; an F8_E4M3 tensor
// `X.weight` must come with `X.weight_scale_inv` [ceil(rows/128), ceil(cols/128)] (F32 or
// BF16), a block scale that multiplies: value = fp8 * scale_inv[r/128][c/128].
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/numeric.hpp"
#include "model/sharding.hpp"

namespace mtplab::model {

enum class DType { bool_, u8, i8, i16, u16, i32, u32, i64, u64, f16, bf16, f32, f64, f8_e4m3, f8_e5m2 };
/// The safetensors spelling ("BF16", "F8_E4M3", ...).
const char* dtype_name(DType t);
size_t dtype_size(DType t);

std::string shape_str(const std::vector<int64_t>& shape);
int64_t shape_numel(const std::vector<int64_t>& shape);

struct TensorInfo {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  ///< absolute byte offset of the first element in the file
  uint64_t nbytes = 0;
  int64_t numel() const { return shape_numel(shape); }
};

/// One .safetensors file, validated and memory-mapped.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// In the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor's bytes in the mapping.
  const uint8_t* bytes(const TensorInfo& t) const { return base_ + t.offset; }

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

/// A rectangular block of a tensor viewed as 2-D [shape[0], numel / shape[0]] (a 1-D tensor
/// is [n, 1]). count < 0 means "to the end".
struct Block {
  Range rows{0, -1};
  Range cols{0, -1};
};

/// A checkpoint: one .safetensors file, or a directory holding model.safetensors.index.json
/// (its weight_map names each tensor's file), or a directory of .safetensors files (merged;
/// a name in two files is an error).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);
  const std::string& path() const { return path_; }

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// The tensor's header entry; a missing tensor is an error naming it and the checkpoint.
  const TensorInfo& info(const std::string& name) const;
  /// The file that holds `name`.
  const std::string& file_of(const std::string& name) const;
  std::vector<std::string> names() const;

  /// Reads `block` of tensor `name` as BF16 (converted / dequantised as the file header says),
  /// after checking that the full tensor has `expected_shape`. Row-major [rows, cols] result.
  std::vector<bf16> read_bf16(const std::string& name, const std::vector<int64_t>& expected_shape,
                              Block block = {}) const;
  /// As read_bf16, to fp32 (no rounding of F32 data).
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                              Block block = {}) const;

 private:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  template <typename Out, typename Convert>
  std::vector<Out> read_block(const std::string& name, const std::vector<int64_t>& expected_shape,
                              Block block, Convert convert) const;
  const Entry& entry(const std::string& name) const;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> where_;
};

// ---- writing ------------------------------------------------------------------------------------

/// A tensor to write: a view of `nbytes` bytes at `data`.
struct TensorView {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

/// Writes one file (through a temporary name, renamed when complete). Names must be unique and
/// nbytes must match the shape.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Writes `dir`/model-0000i-of-0000n.safetensors files of at most `max_file_bytes` of data
/// each (a tensor is never split; one larger than the limit gets a file of its own) and
/// `dir`/model.safetensors.index.json. Creates `dir` when missing. Returns the file count.
int write_safetensors_sharded(const std::string& dir, const std::vector<TensorView>& tensors,
                              uint64_t max_file_bytes);

}  // namespace mtplab::model
