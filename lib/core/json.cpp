// The JSON reader (json.hpp): a recursive-descent parser of RFC 8259.
#include "core/json.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.hpp"

namespace mtplab::json {

const char* Value::kind_name() const {
  static constexpr const char* kNames[] = {"null",     "a boolean", "a number",
                                           "a string", "an array",  "an object"};
  static_assert(std::size(kNames) == static_cast<size_t>(Kind::object) + 1);
  return kNames[static_cast<size_t>(kind)];
}

namespace {

class Parser {
 public:
  Parser(std::string_view text, std::string what) : s_(text), what_(std::move(what)) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail(str("text after the document: ", found()));
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    const auto [line, column] = position(pos_);
    MTP_FAIL(what_, ":", line, ":", column, ": invalid JSON at byte ", pos_, ": ", msg);
  }
  std::pair<int, int> position(size_t at) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return {line, column};
  }
  /// What stands at pos_, for "expected ..." messages.
  std::string found() const {
    if (pos_ >= s_.size()) return "the end of the text (truncated?)";
    const char c = s_[pos_];
    if (c == '/' && pos_ + 1 < s_.size() && (s_[pos_ + 1] == '/' || s_[pos_ + 1] == '*'))
      return "a comment (JSON has none)";
    if (c == '\'') return "a single quote (JSON strings take double quotes)";
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return str("the control byte ", int(c));
    return str("'", c, "'");
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void expect(char c) {
    if (peek() != c) fail(str("expected '", c, "', found ", found()));
    ++pos_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  /// At an opening bracket: `item` for each comma-separated item up to `close` (an empty list is
  /// fine).
  template <typename Item>
  void parse_items(char close, Item&& item) {
    ++pos_;
    skip_ws();
    if (peek() == close) {
      ++pos_;
      return;
    }
    for (;;) {
      skip_ws();
      item();
      skip_ws();
      if (peek() != ',') break;
      ++pos_;
      skip_ws();
      if (peek() == close) fail(str("a trailing comma before '", close, "' (JSON allows none)"));
    }
    if (peek() != close) fail(str("expected ',' or '", close, "', found ", found()));
    ++pos_;
  }

  Value parse_value(int depth) {
    if (depth > 64) fail("nesting too deep");
    Value v;
    std::tie(v.line, v.column) = position(pos_);
    const char c = peek();
    if (c == '{') {
      v.kind = Value::Kind::object;
      std::set<std::string> seen;
      parse_items('}', [&] {
        if (peek() != '"') fail(str("expected a key in double quotes, found ", found()));
        const size_t key_at = pos_;
        std::string key = parse_string();
        if (!seen.insert(key).second) {
          pos_ = key_at;
          fail(str(key, ": duplicate key \"", key, "\" (it appears twice in one object)"));
        }
        skip_ws();
        expect(':');
        skip_ws();
        v.members.emplace_back(std::move(key), parse_value(depth + 1));
      });
      return v;
    }
    if (c == '[') {
      v.kind = Value::Kind::array;
      parse_items(']', [&] { v.items.push_back(parse_value(depth + 1)); });
      return v;
    }
    if (c == '"') {
      v.kind = Value::Kind::string;
      v.text = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Value::Kind::number;
      v.text = parse_number();
      return v;
    }
    if (literal("true")) {
      v.kind = Value::Kind::boolean;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.kind = Value::Kind::boolean;
      return v;
    }
    if (literal("null")) return v;
    fail(str("expected a value, found ", found()));
  }

  std::string parse_number() {
    const size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail("malformed number");
    }
    if (peek() == '.') {
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("malformed number");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("malformed number");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<unsigned>(h - 'A' + 10);
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("the text ends inside a string (truncated?)");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xd800 && cp < 0xdc00) {
            if (!literal("\\u")) fail("unpaired surrogate");
            const unsigned lo = hex4();
            if (lo < 0xdc00 || lo >= 0xe000) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            fail("unpaired surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default:
          fail(str("bad escape '\\", e, "'"));
      }
    }
  }

  std::string_view s_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace

Value parse(std::string_view text, const std::string& name) { return Parser(text, name).parse_document(); }

namespace {
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MTP_FAIL(path, ": cannot open (", std::strerror(errno), ")");
  std::stringstream ss;
  ss << in.rdbuf();
  MTP_REQUIRE(!in.bad(), path, ": read error");
  return ss.str();
}
}  // namespace

Value parse_file(const std::string& path) { return parse(read_file(path), path); }

YamlNode load_as_yaml(const std::string& path) {
  const std::string text = read_file(path);
  (void)parse(text, path);  // what JSON refuses never reaches the YAML reader, which would take it
  return YamlNode::load_string(text, path);
}

}  // namespace mtplab::json
