// Benchmark CSV reading (bench_csv.hpp).
#include "plan/bench_csv.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/str.hpp"

namespace mtplab::plan {

std::optional<BenchProvenance> parse_bench_comment(const std::string& line) {
  if (!starts_with(line, "# mtplab_bench_")) return std::nullopt;
  static const std::set<std::string> keys = {"git",          "device",    "preset",      "context",
                                             "contexts",     "copy_GBps", "gemm_TFLOPs", "router_bias_scale",
                                             "kernel_policy"};
  BenchProvenance p;
  p.comment = trim(line.substr(2));
  std::istringstream in(p.comment);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  size_t i = 0;
  std::vector<std::string> tool;
  for (; i < words.size() && !keys.count(words[i]); ++i) tool.push_back(words[i]);
  p.tool = join(tool, " ");
  std::map<std::string, std::vector<std::string>> values;
  std::string key;
  for (; i < words.size(); ++i) {
    // kernel_policy's value is the rest of the line (field=value pairs).
    if (key != "kernel_policy" && keys.count(words[i])) {
      key = words[i];
      values[key];
      continue;
    }
    values[key].push_back(words[i]);
  }
  p.git = join(values["git"], " ");
  p.device = join(values["device"], " ");
  p.preset = join(values["preset"], " ");
  p.context = values.count("context") ? join(values["context"], " ") : join(values["contexts"], " ");
  return p;
}

namespace {
std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out = split(line, ',');
  for (auto& f : out) f = trim(f);
  return out;
}
}  // namespace

BenchCsv BenchCsv::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MTP_REQUIRE(in, path, ": cannot read the benchmark CSV (", (errno ? std::strerror(errno) : "unknown error"),
              ")");
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

BenchCsv BenchCsv::parse(const std::string& text, const std::string& path) {
  BenchCsv c;
  c.path_ = path;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (n == 1) {
      const auto p = parse_bench_comment(line);
      MTP_REQUIRE(p, path,
                  ":1: not a benchmark CSV: the first line must be the benchmark's comment "
                  "\"# mtplab_bench_<name> ... git SHA device NAME ...\", got \"",
                  line.substr(0, 80), "\"");
      c.provenance_ = *p;
      continue;
    }
    if (trim(line).empty()) continue;
    if (!header) {
      if (line[0] == '#') {
        c.provenance_.notes.push_back(trim(line.substr(1)));
        continue;
      }
      c.columns_ = split_fields(line);
      for (size_t i = 0; i < c.columns_.size(); ++i) {
        MTP_REQUIRE(!c.columns_[i].empty(), path, ":", n, ": the header has an empty column name (column ",
                    i + 1, ")");
        MTP_REQUIRE(c.index_.emplace(c.columns_[i], i).second, path, ":", n, ": the header names column \"",
                    c.columns_[i], "\" twice");
      }
      header = true;
      continue;
    }
    MTP_REQUIRE(line[0] != '#', path, ":", n, ": a comment line among the data rows");
    Row r{n, split_fields(line)};
    MTP_REQUIRE(r.fields.size() == c.columns_.size(), path, ":", n, ": ", r.fields.size(),
                " fields for the header's ", c.columns_.size(), " columns");
    c.rows_.push_back(std::move(r));
  }
  MTP_REQUIRE(header, path, ": no header line after the benchmark's comment");
  return c;
}

bool BenchCsv::has_column(const std::string& name) const { return index_.count(name) != 0; }

std::string BenchCsv::where(const Row& row) const { return str(path_, ":", row.line); }

const std::string& BenchCsv::field(const Row& row, const std::string& column) const {
  const auto it = index_.find(column);
  MTP_REQUIRE(it != index_.end(), path_, ": no column \"", column, "\" (the header has ",
              join(columns_, ", "), ")");
  return row.fields[it->second];
}

namespace {
// The field of `column` in `row` through `parse`; empty or unparsed is an error naming path:line,
// the column and `what` it should be.
template <typename Parse>
auto parsed_field(const BenchCsv& c, const BenchCsv::Row& row, const std::string& column, Parse parse,
                  const char* what) {
  const std::string& f = c.field(row, column);
  MTP_REQUIRE(!f.empty(), c.where(row), ": column ", column, " is empty");
  const auto v = parse(f);
  MTP_REQUIRE(v, c.where(row), ": column ", column, ": \"", f, "\" is not ", what);
  return *v;
}
}  // namespace

double BenchCsv::number(const Row& row, const std::string& column) const {
  return parsed_field(
      *this, row, column, [](const std::string& f) { return parse_double(f); }, "a number");
}

int64_t BenchCsv::integer(const Row& row, const std::string& column) const {
  return parsed_field(
      *this, row, column, [](const std::string& f) { return parse_int64(f); }, "a whole number");
}

std::optional<double> BenchCsv::optional_number(const Row& row, const std::string& column) const {
  if (field(row, column).empty()) return std::nullopt;
  return number(row, column);
}

}  // namespace mtplab::plan
