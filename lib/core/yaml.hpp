// Strict YAML reading over yaml-cpp. Every error names the file, the key path, the line and the
// column: `configs/tiny.yaml:4:3: model.hidden: expected an integer, got "12x"`.
//
// Reading a mapping goes through a MapReader: each key the program understands is taken with
// req()/opt(); finish() then rejects every key nobody took (a typo is an error, never ignored,
// and names the key it most likely meant).
//
// Stricter than YAML itself, where YAML's leniency hides a mistake:
// - one document per file: a second document (`---` after content) is an error at its line
//   (yaml-cpp would read the first and drop the rest);
// - a quoted value closes on the line where it opens: an unclosed quote is an error at the quote
//   (yaml-cpp would read the rest of the file into the value, or fail much later);
// - a number is written bare: a quoted one (`draft_len: "3"`) is text in YAML and is refused
//   where a number is expected;
// - a key is given a value: an empty one (`max_steps:`, `max_steps: ~`, `max_steps: null`) is an
//   error naming the file, line and key (YAML reads it as null, which would quietly take the
//   key's default). The one place: MapReader::req / opt. Leave the key out for its default.
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace mtplab {

class YamlNode {
 public:
  YamlNode() = default;
  YamlNode(YAML::Node node, std::shared_ptr<const std::string> file, std::string path);

  /// Parses a file; a syntax error is reported with the file, line and column.
  static YamlNode load_file(const std::string& path);
  /// Parses text; `name` stands in for the file name in messages.
  static YamlNode load_string(const std::string& text, const std::string& name);

  const YAML::Node& raw() const { return node_; }
  const std::string& file() const { return *file_; }
  /// Dotted key path from the document root ("model.hidden", "sweep.grid.skip[1]").
  const std::string& path() const { return path_; }
  /// "file:line:col: path" (1-based line and column), the prefix of every message.
  std::string where() const;

  bool is_map() const { return node_.IsMap(); }
  bool is_sequence() const { return node_.IsSequence(); }
  bool is_scalar() const { return node_.IsScalar(); }
  bool is_null() const { return !node_ || node_.IsNull(); }

  std::string as_string() const;
  int64_t as_int() const;
  double as_double() const;
  bool as_bool() const;
  int64_t as_int(int64_t min, int64_t max) const;
  double as_double(double min, double max) const;
  /// One of `choices`; the message lists them.
  std::string as_choice(const std::vector<std::string>& choices) const;
  std::vector<YamlNode> items() const;                            ///< a sequence's elements
  std::vector<std::pair<std::string, YamlNode>> entries() const;  ///< a mapping's pairs, in order

  /// Whether the scalar was written in quotes ('...' or "..."): text, whatever it looks like.
  bool is_quoted() const;

  /// Throws an Error prefixed with where().
  [[noreturn]] void fail(const std::string& message) const;

 private:
  YAML::Node node_;
  std::shared_ptr<const std::string> file_ = std::make_shared<const std::string>("<none>");
  std::string path_;
};

/// Reads one mapping strictly: take keys with req/opt, then finish() rejects the rest.
class MapReader {
 public:
  explicit MapReader(const YamlNode& node);
  ~MapReader() = default;

  bool has(const std::string& key) const;
  /// A required key: missing is an error naming the mapping and the key; when a key of the
  /// mapping that nobody took yet is close to it (a misspelling), the error is at that key and
  /// says which key was meant.
  YamlNode req(const std::string& key);
  /// An optional key: nullopt when absent; an empty (null) value is an error, as in req().
  std::optional<YamlNode> opt(const std::string& key);

  int64_t req_int(const std::string& key, int64_t min, int64_t max) { return req(key).as_int(min, max); }
  double req_double(const std::string& key, double min, double max) { return req(key).as_double(min, max); }
  std::string req_string(const std::string& key) { return req(key).as_string(); }
  bool req_bool(const std::string& key) { return req(key).as_bool(); }
  std::string req_choice(const std::string& key, const std::vector<std::string>& choices) {
    return req(key).as_choice(choices);
  }
  int64_t opt_int(const std::string& key, int64_t fallback, int64_t min, int64_t max);
  double opt_double(const std::string& key, double fallback, double min, double max);
  std::string opt_string(const std::string& key, const std::string& fallback);
  bool opt_bool(const std::string& key, bool fallback);
  std::string opt_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& choices);

  /// Rejects every key not taken, naming it and, when close, the key that was probably meant.
  void finish();
  const YamlNode& node() const { return node_; }

 private:
  /// Throws when `value` (of `key`) is null: nothing, ~ or null.
  void refuse_empty(const std::string& key, const YAML::Node& value) const;
  YamlNode node_;
  std::set<std::string> taken_;
};

/// The key a misspelt `key` most likely meant among `candidates` (edit distance up to 2, 3 for
/// keys of 8 characters or more; else the only candidate that `key` is a prefix of, for keys of 3
/// characters or more); "" when none is close.
std::string suggest_key(const std::string& key, const std::vector<std::string>& candidates);

/// A problem found in YAML text before parsing it (1-based line and column).
struct YamlTextIssue {
  int line = 0;
  int column = 0;
  std::string message;
};
/// The first quoted value that does not close on the line where it opens, or the first line that
/// starts a second document; nothing when the text has neither. A line scan that knows comments,
/// block scalars (| and >), flow collections and which quotes open a value (a quote inside a plain
/// value, as in `it's`, opens nothing).
std::optional<YamlTextIssue> scan_yaml_text(const std::string& text);

}  // namespace mtplab
