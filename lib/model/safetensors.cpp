// Safetensors reading (mmap + the strict JSON reader of core/json.hpp) and writing.
#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <set>

#include "core/error.hpp"
#include "core/json.hpp"

namespace mtplab::model {
namespace {

// Headers and index files are read by the one JSON reader (core/json.hpp).
using Json = json::Value;

/// A non-negative integer that fits in 53 bits (JSON integers beyond that are not portable).
uint64_t json_uint(const Json& v, const std::string& what) {
  MTP_REQUIRE(v.kind == Json::Kind::number, what, ": expected a non-negative integer, got ", v.kind_name());
  const std::string& t = v.text;
  MTP_REQUIRE(!t.empty() && t.find_first_not_of("0123456789") == std::string::npos, what,
              ": expected a non-negative integer, got ", t);
  MTP_REQUIRE(t.size() <= 16, what, ": integer ", t, " is too large");
  return std::stoull(t);
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// ---- dtypes ----------------------------------------------------------------------------------

struct DTypeRow {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::bool_, "BOOL", 1}, {DType::u8, "U8", 1},           {DType::i8, "I8", 1},
    {DType::i16, "I16", 2},    {DType::u16, "U16", 2},         {DType::i32, "I32", 4},
    {DType::u32, "U32", 4},    {DType::i64, "I64", 8},         {DType::u64, "U64", 8},
    {DType::f16, "F16", 2},    {DType::bf16, "BF16", 2},       {DType::f32, "F32", 4},
    {DType::f64, "F64", 8},    {DType::f8_e4m3, "F8_E4M3", 1}, {DType::f8_e5m2, "F8_E5M2", 1},
};

bool parse_dtype(const std::string& s, DType& out) {
  for (const auto& row : kDTypes)
    if (s == row.name) {
      out = row.type;
      return true;
    }
  return false;
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // Subnormal: value = man * 2^-24.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

const char* dtype_name(DType t) {
  for (const auto& row : kDTypes)
    if (row.type == t) return row.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const auto& row : kDTypes)
    if (row.type == t) return row.size;
  return 0;
}

std::string shape_str(const std::vector<int64_t>& shape) { return str("[", join(shape, ", "), "]"); }

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsFile -------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MTP_REQUIRE(fd >= 0, path, ": cannot open (", errno_text(), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    MTP_FAIL(path, ": cannot stat (", why, ")");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    MTP_FAIL(path, ": truncated: ", size_,
             " bytes is too short for a safetensors file (an 8-byte header length comes first)");
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string why = errno_text();
  ::close(fd);
  MTP_REQUIRE(m != MAP_FAILED, path, ": cannot mmap ", size_, " bytes (", why, ")");
  base_ = static_cast<const uint8_t*>(m);

  try {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];
    MTP_REQUIRE(header_len >= 2 && header_len <= (uint64_t{100} << 20), path, ": header length ", header_len,
                " is not plausible (not a safetensors file?)");
    MTP_REQUIRE(8 + header_len <= size_, path, ": truncated: the header says ", header_len,
                " bytes of JSON but the file has ", size_, " bytes in all");
    const std::string what = str(path, " (header)");
    std::string_view text(reinterpret_cast<const char*>(base_ + 8), header_len);
    // The writer pads the header with spaces to an 8-byte boundary; JSON allows that whitespace.
    const Json root = json::parse(text, what);
    MTP_REQUIRE(root.kind == Json::Kind::object, what, ": expected an object, got ", root.kind_name());

    const uint64_t data_begin = 8 + header_len;
    const uint64_t data_size = size_ - data_begin;
    for (const auto& [key, value] : root.members) {
      if (key == "__metadata__") {
        MTP_REQUIRE(value.kind == Json::Kind::object, what, ": __metadata__ must be an object");
        for (const auto& [mk, mv] : value.members) {
          MTP_REQUIRE(mv.kind == Json::Kind::string, what, ": __metadata__.", mk, " must be a string, got ",
                      mv.kind_name());
          metadata_[mk] = mv.text;
        }
        continue;
      }
      const std::string where = str(what, ": tensor \"", key, "\"");
      MTP_REQUIRE(value.kind == Json::Kind::object, where, ": expected an object, got ", value.kind_name());
      TensorInfo t;
      t.name = key;
      bool have_dtype = false, have_shape = false, have_offsets = false;
      uint64_t begin = 0, end = 0;
      for (const auto& [fk, fv] : value.members) {
        if (fk == "dtype") {
          MTP_REQUIRE(fv.kind == Json::Kind::string, where, ": dtype must be a string");
          MTP_REQUIRE(parse_dtype(fv.text, t.dtype), where, ": unknown dtype \"", fv.text, "\"");
          have_dtype = true;
        } else if (fk == "shape") {
          MTP_REQUIRE(fv.kind == Json::Kind::array, where, ": shape must be an array");
          for (const auto& d : fv.items)
            t.shape.push_back(static_cast<int64_t>(json_uint(d, where + ": shape")));
          have_shape = true;
        } else if (fk == "data_offsets") {
          MTP_REQUIRE(fv.kind == Json::Kind::array && fv.items.size() == 2, where,
                      ": data_offsets must be an array of two integers");
          begin = json_uint(fv.items[0], where + ": data_offsets");
          end = json_uint(fv.items[1], where + ": data_offsets");
          MTP_REQUIRE(begin <= end, where, ": data_offsets [", begin, ", ", end, "] are reversed");
          have_offsets = true;
        } else {
          MTP_FAIL(where, ": unknown field \"", fk, "\" (expected dtype, shape, data_offsets)");
        }
      }
      MTP_REQUIRE(have_dtype && have_shape && have_offsets, where, ": needs dtype, shape and data_offsets");
      // Products of up to 8 dims of < 2^53 could overflow; cap each step.
      uint64_t numel = 1;
      for (const int64_t d : t.shape) {
        MTP_REQUIRE(d == 0 || numel <= (uint64_t{1} << 50) / static_cast<uint64_t>(d), where, ": shape ",
                    shape_str(t.shape), " is too large");
        numel *= static_cast<uint64_t>(d);
      }
      const uint64_t want = numel * dtype_size(t.dtype);
      MTP_REQUIRE(end - begin == want, where, ": ", dtype_name(t.dtype), " ", shape_str(t.shape), " needs ",
                  want, " bytes but data_offsets [", begin, ", ", end, "] span ", end - begin);
      t.offset = data_begin + begin;
      t.nbytes = end - begin;
      tensors_.push_back(std::move(t));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
    });
    uint64_t cursor = data_begin;
    for (const auto& t : tensors_) {
      MTP_REQUIRE(t.offset <= cursor, path, ": the data has a hole at bytes [", cursor - data_begin, ", ",
                  t.offset - data_begin, ") before tensor \"", t.name, "\"");
      MTP_REQUIRE(t.offset == cursor, path, ": tensor \"", t.name, "\" overlaps the tensor before it");
      cursor += t.nbytes;
    }
    const uint64_t data_end = cursor - data_begin;
    MTP_REQUIRE(data_end <= data_size, path, ": truncated: the tensors need ", data_end,
                " bytes of data after the header but the file holds ", data_size);
    MTP_REQUIRE(data_end == data_size, path, ": ", data_size - data_end,
                " trailing bytes after the last tensor (not a well-formed safetensors file)");
    for (size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

// ---- Checkpoint ------------------------------------------------------------------------------

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  MTP_REQUIRE(!ec && fs::exists(st), "checkpoint ", path, ": no such file or directory");
  auto add_file = [&](const std::string& file) -> const SafetensorsFile& {
    files_.push_back(std::make_unique<SafetensorsFile>(file));
    return *files_.back();
  };
  if (fs::is_regular_file(st)) {
    const SafetensorsFile& f = add_file(path);
    for (const auto& t : f.tensors()) where_[t.name] = Entry{&f, &t};
    return;
  }
  MTP_REQUIRE(fs::is_directory(st), "checkpoint ", path, ": neither a file nor a directory");
  const std::string index_path = (fs::path(path) / "model.safetensors.index.json").string();
  if (fs::exists(index_path)) {
    FILE* fp = std::fopen(index_path.c_str(), "rb");
    MTP_REQUIRE(fp, index_path, ": cannot open (", errno_text(), ")");
    std::string text;
    char buf[1 << 16];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, fp)) > 0) text.append(buf, got);
    const bool read_error = std::ferror(fp) != 0;
    std::fclose(fp);
    MTP_REQUIRE(!read_error, index_path, ": read error");
    const Json root = json::parse(text, index_path);
    MTP_REQUIRE(root.kind == Json::Kind::object, index_path, ": expected an object");
    const Json* weight_map = nullptr;
    for (const auto& [k, v] : root.members)
      if (k == "weight_map") weight_map = &v;
    MTP_REQUIRE(weight_map && weight_map->kind == Json::Kind::object, index_path,
                ": needs a \"weight_map\" object (tensor name -> file)");
    std::map<std::string, const SafetensorsFile*> opened;
    for (const auto& [name, file] : weight_map->members) {
      MTP_REQUIRE(file.kind == Json::Kind::string, index_path, ": weight_map.", name, " must be a file name");
      MTP_REQUIRE(file.text.find('/') == std::string::npos, index_path, ": weight_map.", name, ": file \"",
                  file.text, "\" must be a plain name in the same directory");
      auto it = opened.find(file.text);
      if (it == opened.end())
        it = opened.emplace(file.text, &add_file((fs::path(path) / file.text).string())).first;
      const TensorInfo* t = it->second->find(name);
      MTP_REQUIRE(t, index_path, ": weight_map puts \"", name, "\" in ", file.text,
                  ", which has no such tensor");
      where_[name] = Entry{it->second, t};
    }
    return;
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path().string());
  MTP_REQUIRE(!ec, "checkpoint ", path, ": cannot list (", ec.message(), ")");
  MTP_REQUIRE(!files.empty(), "checkpoint ", path,
              ": the directory has neither model.safetensors.index.json nor any .safetensors file");
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const SafetensorsFile& f = add_file(file);
    for (const auto& t : f.tensors()) {
      auto [it, fresh] = where_.emplace(t.name, Entry{&f, &t});
      MTP_REQUIRE(fresh, "checkpoint ", path, ": tensor \"", t.name, "\" is in both ",
                  it->second.file->path(), " and ", file);
    }
  }
}

namespace {

/// Where "layers.<digits>." starts in `name` (the first such), or npos; sets the digits' extent.
size_t find_layer(const std::string& name, size_t& digits_begin, size_t& digits_end) {
  for (size_t at = name.find("layers."); at != std::string::npos; at = name.find("layers.", at + 1)) {
    if (at > 0 && name[at - 1] != '.') continue;
    size_t e = at + 7;
    while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
    if (e > at + 7 && e < name.size() && name[e] == '.') {
      digits_begin = at + 7;
      digits_end = e;
      return at;
    }
  }
  return std::string::npos;
}

/// "{0-2, 5, 45}" for a set of layer numbers.
std::string ranges_text(const std::set<long>& v) {
  std::vector<std::string> parts;
  for (auto it = v.begin(); it != v.end();) {
    const long first = *it;
    long last = first;
    for (++it; it != v.end() && *it == last + 1; ++it) last = *it;
    parts.push_back(first == last ? str(first) : str(first, "-", last));
  }
  return parts.size() == 1 && v.size() == 1 ? parts[0] : str("{", join(parts, ", "), "}");
}

/// What a checkpoint holds, for the error of a tensor it lacks: the layer prefixes
/// ("model.language_model.layers.{0-44}."), a few names outside any layer, and the names that
/// end like the missing one under another prefix (the likely fix).
std::string holdings(const std::vector<std::string>& names, const std::string& missing) {
  std::map<std::string, std::set<long>> layers;  // text before the layer number -> numbers
  std::vector<std::string> outside;
  for (const std::string& n : names) {
    size_t b = 0, e = 0;
    if (find_layer(n, b, e) != std::string::npos)
      layers[n.substr(0, b)].insert(std::stol(n.substr(b, e - b)));
    else
      outside.push_back(n);
  }
  std::string text;
  if (!layers.empty()) {
    std::vector<std::string> prefixes;
    for (const auto& [head, numbers] : layers) prefixes.push_back(str(head, ranges_text(numbers), "."));
    text += str("; layer prefixes it holds: ", join(prefixes, ", "));
  } else {
    text += "; it holds no \"layers.<i>.\" tensors";
  }
  if (!outside.empty()) {
    const size_t shown = std::min<size_t>(outside.size(), 6);
    text += str("; outside layers: ",
                join(std::vector<std::string>(outside.begin(), outside.begin() + shown), ", "));
    if (outside.size() > shown) text += str(" (+", outside.size() - shown, " more)");
  }
  // The missing name's part after its layer (or its last two components) under another prefix.
  size_t b = 0, e = 0;
  std::string tail;
  if (find_layer(missing, b, e) != std::string::npos) {
    tail = missing.substr(e + 1);
  } else {
    const size_t last = missing.rfind('.');
    const size_t before =
        last == std::string::npos || last == 0 ? std::string::npos : missing.rfind('.', last - 1);
    tail = before == std::string::npos ? missing : missing.substr(before + 1);
  }
  std::vector<std::string> alike;
  for (const std::string& n : names)
    if (n != missing &&
        (n == tail || (n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0 &&
                       n[n.size() - tail.size() - 1] == '.')))
      alike.push_back(n);
  if (!alike.empty()) {
    const size_t shown = std::min<size_t>(alike.size(), 4);
    text += str("; the same name under another prefix: ",
                join(std::vector<std::string>(alike.begin(), alike.begin() + shown), ", "));
    if (alike.size() > shown) text += str(" (+", alike.size() - shown, " more)");
  }
  return text;
}

}  // namespace

const Checkpoint::Entry& Checkpoint::entry(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    MTP_FAIL("checkpoint ", path_, ": tensor \"", name, "\" not found (", where_.size(), " tensors in ",
             files_.size(), " file(s))", holdings(names(), name));
  return it->second;
}

const TensorInfo& Checkpoint::info(const std::string& name) const { return *entry(name).info; }
const std::string& Checkpoint::file_of(const std::string& name) const { return entry(name).file->path(); }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, e] : where_) out.push_back(name);
  return out;
}

template <typename Out, typename Convert>
std::vector<Out> Checkpoint::read_block(const std::string& name, const std::vector<int64_t>& expected_shape,
                                        Block block, Convert convert) const {
  const Entry& e = entry(name);
  const TensorInfo& t = *e.info;
  const std::string where = str("tensor \"", name, "\" in ", e.file->path());
  MTP_REQUIRE(t.shape == expected_shape, where, ": expected shape ", shape_str(expected_shape), ", found ",
              shape_str(t.shape), " (", dtype_name(t.dtype), ")");
  const int64_t nrows = t.shape.empty() ? 1 : t.shape[0];
  const int64_t ncols = nrows == 0 ? 0 : t.numel() / nrows;
  if (block.rows.count < 0) block.rows.count = nrows - block.rows.begin;
  if (block.cols.count < 0) block.cols.count = ncols - block.cols.begin;
  MTP_REQUIRE(block.rows.begin >= 0 && block.rows.end() <= nrows && block.cols.begin >= 0 &&
                  block.cols.end() <= ncols,
              where, ": block rows [", block.rows.begin, ", ", block.rows.end(), ") x cols [",
              block.cols.begin, ", ", block.cols.end(), ") is outside ", nrows, " x ", ncols);

  // Block scales of an FP8 tensor, indexed [r / 128][c / 128].
  std::vector<float> scale;
  int64_t scale_cols = 0;
  if (t.dtype == DType::f8_e4m3) {
    MTP_REQUIRE(t.shape.size() == 2, where, ": an F8_E4M3 tensor must be 2-D to carry 128x128 block scales");
    const std::string sname = name + "_scale_inv";
    MTP_REQUIRE(contains(sname), where, ": F8_E4M3 without its block scale \"", sname, "\"");
    const std::vector<int64_t> sshape = {(nrows + 127) / 128, (ncols + 127) / 128};
    const Entry& se = entry(sname);
    MTP_REQUIRE(se.info->dtype == DType::f32 || se.info->dtype == DType::bf16, "tensor \"", sname, "\" in ",
                se.file->path(), ": block scales must be F32 or BF16, found ", dtype_name(se.info->dtype));
    scale = read_f32(sname, sshape);
    scale_cols = sshape[1];
  } else {
    MTP_REQUIRE(t.dtype == DType::bf16 || t.dtype == DType::f16 || t.dtype == DType::f32, where, ": dtype ",
                dtype_name(t.dtype), " cannot be read as a weight (BF16, F16, F32 or F8_E4M3 expected)");
  }

  const uint8_t* base = e.file->bytes(t);
  const size_t esize = dtype_size(t.dtype);
  std::vector<Out> out(static_cast<size_t>(block.rows.count * block.cols.count));
  for (int64_t r = 0; r < block.rows.count; ++r) {
    const int64_t gr = block.rows.begin + r;
    const uint8_t* src = base + (static_cast<size_t>(gr * ncols + block.cols.begin)) * esize;
    Out* dst = out.data() + r * block.cols.count;
    for (int64_t c = 0; c < block.cols.count; ++c) {
      const uint8_t* p = src + c * esize;
      float v;
      switch (t.dtype) {
        case DType::bf16: {
          uint16_t b;
          std::memcpy(&b, p, 2);
          v = to_float(bf16{b});
          break;
        }
        case DType::f16: {
          uint16_t h;
          std::memcpy(&h, p, 2);
          v = f16_to_float(h);
          break;
        }
        case DType::f32:
          std::memcpy(&v, p, 4);
          break;
        default: {
          const int64_t gc = block.cols.begin + c;
          v = to_float(fp8e4m3{*p}) * scale[static_cast<size_t>((gr / 128) * scale_cols + gc / 128)];
          break;
        }
      }
      dst[c] = convert(v);
    }
  }
  return out;
}

std::vector<bf16> Checkpoint::read_bf16(const std::string& name, const std::vector<int64_t>& expected_shape,
                                        Block block) const {
  const Entry& e = entry(name);
  // BF16 to BF16 is a copy; the generic path would give the same bits, only slower.
  if (e.info->dtype == DType::bf16 && e.info->shape == expected_shape && !expected_shape.empty()) {
    const int64_t nrows = expected_shape[0];
    const int64_t ncols = nrows == 0 ? 0 : e.info->numel() / nrows;
    Block b = block;
    if (b.rows.count < 0) b.rows.count = nrows - b.rows.begin;
    if (b.cols.count < 0) b.cols.count = ncols - b.cols.begin;
    if (b.rows.begin >= 0 && b.rows.end() <= nrows && b.cols.begin >= 0 && b.cols.end() <= ncols) {
      std::vector<bf16> out(static_cast<size_t>(b.rows.count * b.cols.count));
      const uint8_t* base = e.file->bytes(*e.info);
      for (int64_t r = 0; r < b.rows.count; ++r)
        std::memcpy(out.data() + r * b.cols.count, base + ((b.rows.begin + r) * ncols + b.cols.begin) * 2,
                    static_cast<size_t>(b.cols.count) * 2);
      return out;
    }
  }
  return read_block<bf16>(name, expected_shape, block, [](float v) { return to_bf16(v); });
}

std::vector<float> Checkpoint::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                                        Block block) const {
  return read_block<float>(name, expected_shape, block, [](float v) { return v; });
}

// ---- writing -----------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool mfirst = true;
    for (const auto& [k, v] : metadata) {
      if (!mfirst) header += ",";
      header += "\"" + json_escape(k) + "\":\"" + json_escape(v) + "\"";
      mfirst = false;
    }
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    MTP_REQUIRE(t.name != "__metadata__" && !t.name.empty(), path, ": bad tensor name \"", t.name, "\"");
    MTP_REQUIRE(names.insert(t.name).second, path, ": tensor \"", t.name, "\" given twice");
    const uint64_t want = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    MTP_REQUIRE(want == t.nbytes, path, ": tensor \"", t.name, "\" ", dtype_name(t.dtype), " ",
                shape_str(t.shape), " needs ", want, " bytes, given ", t.nbytes);
    if (!first) header += ",";
    first = false;
    header += str("\"", json_escape(t.name), "\":{\"dtype\":\"", dtype_name(t.dtype), "\",\"shape\":[",
                  join(t.shape, ","), "],\"data_offsets\":[", offset, ",", offset + t.nbytes, "]}");
    offset += t.nbytes;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';

  const std::string tmp = path + ".tmp";
  FILE* fp = std::fopen(tmp.c_str(), "wb");
  MTP_REQUIRE(fp, tmp, ": cannot create (", errno_text(), ")");
  bool ok = true;
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  ok = ok && std::fwrite(len, 1, 8, fp) == 8;
  ok = ok && std::fwrite(header.data(), 1, header.size(), fp) == header.size();
  for (const auto& t : tensors)
    if (ok && t.nbytes) ok = std::fwrite(t.data, 1, t.nbytes, fp) == t.nbytes;
  const std::string why = ok ? "" : errno_text();
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    MTP_FAIL(tmp, ": write failed (", why.empty() ? errno_text() : why, ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string rwhy = errno_text();
    std::remove(tmp.c_str());
    MTP_FAIL(path, ": cannot rename from ", tmp, " (", rwhy, ")");
  }
}

int write_safetensors_sharded(const std::string& dir, const std::vector<TensorView>& tensors,
                              uint64_t max_file_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  MTP_REQUIRE(!ec, dir, ": cannot create directory (", ec.message(), ")");
  MTP_REQUIRE(max_file_bytes > 0, dir, ": max_file_bytes must be positive");

  std::vector<std::vector<TensorView>> groups(1);
  uint64_t in_group = 0, total = 0;
  for (const auto& t : tensors) {
    if (!groups.back().empty() && in_group + t.nbytes > max_file_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(t);
    in_group += t.nbytes;
    total += t.nbytes;
  }
  const int n = static_cast<int>(groups.size());
  auto file_name = [n](int i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n);
    return std::string(buf);
  };
  std::string index = str("{\"metadata\":{\"total_size\":", total, "},\"weight_map\":{");
  bool first = true;
  for (int i = 0; i < n; ++i) {
    write_safetensors((fs::path(dir) / file_name(i)).string(), groups[static_cast<size_t>(i)]);
    for (const auto& t : groups[static_cast<size_t>(i)]) {
      if (!first) index += ",";
      first = false;
      index += str("\"", json_escape(t.name), "\":\"", file_name(i), "\"");
    }
  }
  index += "}}\n";
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  FILE* fp = std::fopen(index_path.c_str(), "wb");
  MTP_REQUIRE(fp, index_path, ": cannot create (", errno_text(), ")");
  const bool ok = std::fwrite(index.data(), 1, index.size(), fp) == index.size();
  MTP_REQUIRE((std::fclose(fp) == 0) && ok, index_path, ": write failed (", errno_text(), ")");
  return n;
}

}  // namespace mtplab::model
