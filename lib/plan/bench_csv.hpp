// The benchmarks' CSV files as cost sources of the planner: bench_step_batch.csv
// (mtplab_bench_step --batch: the batched draft step) and bench_verify.csv (mtplab_bench_verify:
// one target layer at B x R rows, the head over B R rows), plus rows of the same shape written
// by hand or by another tool (a fixed cost per B).
//
// Invariants:
// - A file opens with the benchmark's comment line `# mtplab_bench_<name> ... git SHA device NAME
//   preset P ...`; its fields are the file's provenance, and the planner names them in its
//   output. Further `#` lines before the header are notes, kept.
// - Every data row has as many fields as the header; a field the planner reads that is missing or
//   not a number is an error naming the file, the line and the column. An empty p10_us / p90_us
//   pair is allowed (a transcribed table without its spread) and says so: the point then has no
//   spread.
// - Lookups never interpolate: a (B, R), (B, k) or row count the files do not hold is an error
//   naming the files and the missing key.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mtplab::plan {

/// What ran where, from a benchmark CSV's first line.
struct BenchProvenance {
  std::string tool;                ///< "mtplab_bench_step --batch", "mtplab_bench_verify"
  std::string git;                 ///< the commit, "-dirty" kept
  std::string device;              ///< "NVIDIA H200"
  std::string preset;              ///< the model preset the benchmark ran at
  std::string context;             ///< "4096" (bench_verify's context, bench_step's contexts)
  std::string comment;             ///< the whole first line without "# "
  std::vector<std::string> notes;  ///< further '#' lines before the header, without "# "
};

/// Parses a first line "# mtplab_bench_... git G device D preset P ..." (the device may hold
/// spaces: it runs to the next known key). Returns nothing when the line is no benchmark comment.
std::optional<BenchProvenance> parse_bench_comment(const std::string& line);

class BenchCsv {
 public:
  struct Row {
    int line = 0;  ///< 1-based line in the file
    std::vector<std::string> fields;
  };

  /// Reads and checks a file (see the invariants above).
  static BenchCsv read(const std::string& path);
  /// The same from text; `path` names it in messages.
  static BenchCsv parse(const std::string& text, const std::string& path);

  const std::string& path() const { return path_; }
  const BenchProvenance& provenance() const { return provenance_; }
  const std::vector<std::string>& columns() const { return columns_; }
  const std::vector<Row>& rows() const { return rows_; }
  bool has_column(const std::string& name) const;
  /// "path:line".
  std::string where(const Row& row) const;
  /// The field of `column` in `row`; a column the header lacks is an error naming the file.
  const std::string& field(const Row& row, const std::string& column) const;
  /// The field as a number / a whole number; empty or malformed is an error naming
  /// path:line and the column.
  double number(const Row& row, const std::string& column) const;
  int64_t integer(const Row& row, const std::string& column) const;
  /// nullopt when the field is empty, else as number().
  std::optional<double> optional_number(const Row& row, const std::string& column) const;

 private:
  std::string path_;
  BenchProvenance provenance_;
  std::vector<std::string> columns_;
  std::map<std::string, size_t> index_;
  std::vector<Row> rows_;
};

}  // namespace mtplab::plan
