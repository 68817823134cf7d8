// The one JSON reader of mtplab (safetensors headers and index files, Hugging Face config.json):
// RFC 8259 and nothing more. What JSON refuses is an error naming the file, the line, the column
// and the byte offset: a trailing comma, a comment, an unquoted key or value, single quotes, NaN /
// Infinity, a truncated text, a control character in a string, anything after the document. Also
// refused: a key twice in one object (JSON leaves it undefined; readers disagree on which wins).
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/yaml.hpp"

namespace mtplab::json {

struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  std::string text;  ///< a string's value, or a number's literal
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;  ///< in the order written, keys distinct
  int line = 0, column = 0;                            ///< 1-based, where the value starts

  /// "null", "a boolean", "a number", "a string", "an array", "an object".
  const char* kind_name() const;
};

/// Parses `text` as one JSON document; `name` (a file name) starts every message:
/// "config.json:3:17: invalid JSON at byte 40: a trailing comma before '}' (JSON allows none)".
Value parse(std::string_view text, const std::string& name);
/// Reads and parses a file.
Value parse_file(const std::string& path);

/// A JSON file checked by parse(), then as a YamlNode (JSON is YAML's flow style) for readers
/// that take their fields with YamlNode's messages (file:line:col: key path).
YamlNode load_as_yaml(const std::string& path);

}  // namespace mtplab::json
