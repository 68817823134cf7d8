#include "core/yaml.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace mtplab {
namespace {
std::string quoted(const YAML::Node& n) {
  if (!n || n.IsNull()) return "null";
  if (n.IsScalar()) return "\"" + n.Scalar() + "\"";
  if (n.IsSequence()) return "a sequence";
  return "a mapping";
}
std::string child_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

bool blank_char(char c) { return c == ' ' || c == '\t'; }

// The scan of one line of YAML: where values start, which quotes open a quoted value, and
// whether the line opens a block scalar. `flow` (the [ / { depth) carries over between lines.
struct LineScan {
  bool content = false;     // anything but blanks and a comment
  bool block_open = false;  // ends with a block scalar indicator (| or >)
  int unclosed_at = -1;     // 0-based column of a quote that does not close on the line
};

LineScan scan_line(std::string_view line, size_t from, int& flow) {
  LineScan out;
  bool expect_value = true;   // at a place where a value (or a key) may start
  bool after_quoted = false;  // just after a quoted value: `:` follows a key even without a blank
  size_t j = from;
  while (j < line.size()) {
    const char c = line[j];
    if (blank_char(c)) {
      ++j;
      continue;
    }
    const bool blank_before = j == 0 || blank_char(line[j - 1]);
    const bool blank_after = j + 1 >= line.size() || blank_char(line[j + 1]);
    if (c == '#' && blank_before) break;  // a comment runs to the end of the line
    out.content = true;
    if (expect_value && (c == '"' || c == '\'')) {
      size_t k = j + 1;
      bool closed = false;
      while (k < line.size()) {
        if (c == '"' && line[k] == '\\') {
          k += 2;
        } else if (c == '\'' && line[k] == '\'' && k + 1 < line.size() && line[k + 1] == '\'') {
          k += 2;
        } else if (line[k] == c) {
          closed = true;
          break;
        } else {
          ++k;
        }
      }
      if (!closed) {
        out.unclosed_at = static_cast<int>(j);
        return out;
      }
      j = k + 1;
      expect_value = false;
      after_quoted = true;
      continue;
    }
    if (expect_value && flow == 0 && (c == '|' || c == '>')) {
      // A block scalar: the indicator, chomping / indentation digits, then nothing or a comment.
      size_t k = j + 1;
      while (k < line.size() && (line[k] == '+' || line[k] == '-' || (line[k] >= '0' && line[k] <= '9'))) ++k;
      while (k < line.size() && blank_char(line[k])) ++k;
      if (k == line.size() || line[k] == '#') {
        out.block_open = true;
        return out;
      }
    }
    if (expect_value && (c == '&' || c == '!')) {  // an anchor or a tag before the value
      while (j < line.size() && !blank_char(line[j])) ++j;
      continue;
    }
    if ((c == '-' || c == '?') && expect_value && blank_after) {  // a sequence entry, a complex key
      ++j;
      continue;
    }
    if (c == ':' && (blank_after || after_quoted || flow > 0)) {  // a key ends, its value may follow
      expect_value = true;
      after_quoted = false;
      ++j;
      continue;
    }
    if (c == '[' || c == '{') {
      if (expect_value) {
        ++flow;
        ++j;
        continue;
      }
    } else if (flow > 0 && (c == ']' || c == '}')) {
      --flow;
      expect_value = false;
      after_quoted = false;
      ++j;
      continue;
    } else if (flow > 0 && c == ',') {
      expect_value = true;
      after_quoted = false;
      ++j;
      continue;
    }
    // A plain value (or key) runs on; a quote inside it is an ordinary character.
    expect_value = false;
    after_quoted = false;
    ++j;
  }
  return out;
}

size_t indentation(std::string_view line) {
  size_t n = 0;
  while (n < line.size() && line[n] == ' ') ++n;
  return n;
}

bool is_marker(std::string_view line, std::string_view marker) {
  return line.substr(0, 3) == marker && (line.size() == 3 || blank_char(line[3]));
}

}  // namespace

std::optional<YamlTextIssue> scan_yaml_text(const std::string& text) {
  bool content_seen = false;  // of the first document
  bool ended = false;         // `...` closed the first document
  int block_indent = -1;      // >= 0: inside a block scalar under a line of this indentation
  int flow = 0;
  const std::vector<std::string> lines = split(text, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const int line_no = static_cast<int>(i) + 1;
    const bool blank = line.find_first_not_of(" \t") == std::string_view::npos;
    if (block_indent >= 0) {
      if (blank || static_cast<int>(indentation(line)) > block_indent) continue;
      block_indent = -1;
    }
    size_t from = 0;
    if (is_marker(line, "---")) {
      if (content_seen)
        return YamlTextIssue{line_no, 1,
                             "a second YAML document starts here (---): a file holds one document; "
                             "remove the marker or split the file"};
      from = 3;
    } else if (is_marker(line, "...")) {
      ended = content_seen;
      continue;
    } else if (!content_seen && !line.empty() && line[0] == '%') {
      continue;  // a directive (%YAML, %TAG) before the document
    }
    const LineScan scan = scan_line(line, from, flow);
    if (scan.content && ended)
      return YamlTextIssue{line_no, static_cast<int>(indentation(line)) + 1,
                           "a second YAML document starts here (after ...): a file holds one document"};
    if (scan.unclosed_at >= 0)
      return YamlTextIssue{
          line_no, scan.unclosed_at + 1,
          str("unclosed quote: the quoted value that opens here with ",
              line[static_cast<size_t>(scan.unclosed_at)],
              " does not close on this line (a quoted value must end on the line it starts on)")};
    if (scan.block_open) block_indent = static_cast<int>(indentation(line));
    content_seen = content_seen || scan.content;
  }
  return std::nullopt;
}

std::string suggest_key(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string close = closest_match(key, candidates, key.size() >= 8 ? 3 : 2);
  if (!close.empty() || key.size() < 3) return close;
  std::string only;
  for (const auto& c : candidates) {
    if (!starts_with(c, key)) continue;
    if (!only.empty()) return "";  // a prefix of several keys says nothing
    only = c;
  }
  return only;
}

YamlNode::YamlNode(YAML::Node node, std::shared_ptr<const std::string> file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

YamlNode YamlNode::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) MTP_FAIL(path, ": cannot open (", std::strerror(errno), ")");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_string(ss.str(), path);
}

YamlNode YamlNode::load_string(const std::string& text, const std::string& name) {
  // The text scan first: an unclosed quote makes yaml-cpp report a later place, or nothing.
  if (const auto issue = scan_yaml_text(text))
    MTP_FAIL(name, ":", issue->line, ":", issue->column, ": ", issue->message);
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    MTP_FAIL(name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg);
  }
  if (docs.size() > 1) {  // a form of second document the scan does not know
    const YAML::Mark m = docs[1].Mark();
    MTP_FAIL(name, ":", m.line >= 0 ? m.line + 1 : 0,
             ": a second YAML document starts here: a file holds one document");
  }
  return YamlNode(docs.empty() ? YAML::Node() : docs.front(), std::make_shared<const std::string>(name), "");
}

std::string YamlNode::where() const {
  std::string loc = *file_;
  if (node_) {
    const YAML::Mark m = node_.Mark();
    if (m.line >= 0) loc += str(":", m.line + 1, ":", m.column + 1);
  }
  return path_.empty() ? loc : loc + ": " + path_;
}

void YamlNode::fail(const std::string& message) const { MTP_FAIL(where(), ": ", message); }

bool YamlNode::is_quoted() const { return node_ && node_.IsScalar() && node_.Tag() == "!"; }

std::string YamlNode::as_string() const {
  if (!node_ || !node_.IsScalar()) fail("expected a string, got " + quoted(node_));
  return node_.Scalar();
}

int64_t YamlNode::as_int() const {
  if (!node_ || !node_.IsScalar()) fail("expected an integer, got " + quoted(node_));
  if (is_quoted())
    fail(str("expected an integer, got the quoted text ", quoted(node_),
             ": a quoted value is text in YAML; write ", node_.Scalar(), " without quotes"));
  const std::string& s = node_.Scalar();
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || errno == ERANGE) fail("expected an integer, got " + quoted(node_));
  return v;
}

double YamlNode::as_double() const {
  if (!node_ || !node_.IsScalar()) fail("expected a number, got " + quoted(node_));
  if (is_quoted())
    fail(str("expected a number, got the quoted text ", quoted(node_),
             ": a quoted value is text in YAML; write ", node_.Scalar(), " without quotes"));
  const std::optional<double> v = parse_double(node_.Scalar());
  if (!v) fail("expected a finite number, got " + quoted(node_));
  return *v;
}

bool YamlNode::as_bool() const {
  if (node_ && node_.IsScalar()) {
    std::string s = node_.Scalar();
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    if (s == "true" || s == "on" || s == "yes") return true;
    if (s == "false" || s == "off" || s == "no") return false;
  }
  fail("expected true/false (or on/off), got " + quoted(node_));
}

int64_t YamlNode::as_int(int64_t min, int64_t max) const {
  int64_t v = as_int();
  if (v < min || v > max) fail(str("value ", v, " is out of range [", min, ", ", max, "]"));
  return v;
}

double YamlNode::as_double(double min, double max) const {
  double v = as_double();
  if (v < min || v > max) fail(str("value ", v, " is out of range [", min, ", ", max, "]"));
  return v;
}

std::string YamlNode::as_choice(const std::vector<std::string>& choices) const {
  std::string v;
  // YAML turns bare on/off into booleans in some readers; accept them as the strings they are.
  if (!node_ || !node_.IsScalar())
    fail("expected one of {" + join(choices, ", ") + "}, got " + quoted(node_));
  v = node_.Scalar();
  if (std::find(choices.begin(), choices.end(), v) == choices.end())
    fail("\"" + v + "\" is not one of {" + join(choices, ", ") + "}");
  return v;
}

std::vector<YamlNode> YamlNode::items() const {
  if (!node_ || !node_.IsSequence()) fail("expected a sequence, got " + quoted(node_));
  std::vector<YamlNode> out;
  for (size_t i = 0; i < node_.size(); ++i) out.emplace_back(node_[i], file_, str(path_, "[", i, "]"));
  return out;
}

std::vector<std::pair<std::string, YamlNode>> YamlNode::entries() const {
  if (!node_ || !node_.IsMap()) fail("expected a mapping, got " + quoted(node_));
  std::vector<std::pair<std::string, YamlNode>> out;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    std::string key = it->first.Scalar();
    out.emplace_back(key, YamlNode(it->second, file_, child_path(path_, key)));
  }
  return out;
}

MapReader::MapReader(const YamlNode& node) : node_(node) {
  if (!node.is_map()) {
    if (node.is_null()) node.fail("expected a mapping, got nothing");
    node.fail("expected a mapping");
  }
  // Duplicate keys are legal for yaml-cpp but almost always a mistake in an experiment file.
  std::set<std::string> seen;
  for (auto it = node.raw().begin(); it != node.raw().end(); ++it) {
    const std::string key = it->first.Scalar();
    if (!seen.insert(key).second) {
      YamlNode(it->first, std::make_shared<const std::string>(node.file()), child_path(node.path(), key))
          .fail("duplicate key");
    }
  }
}

bool MapReader::has(const std::string& key) const { return static_cast<bool>(node_.raw()[key]); }

void MapReader::refuse_empty(const std::string& key, const YAML::Node& value) const {
  if (value && !value.IsNull()) return;
  // At the key when the value is the file's (an empty value has no place of its own); at the value
  // when it came from the command line (--set), which has no line in the file.
  YAML::Node at;
  at.reset(value);  // reset(), not =: YAML::Node's = writes into the node it refers to
  if (value.Mark().line >= 0) {
    for (auto it = node_.raw().begin(); it != node_.raw().end(); ++it)
      if (it->first.Scalar() == key) at.reset(it->first);
  }
  YamlNode(at, std::make_shared<const std::string>(node_.file()), child_path(node_.path(), key))
      .fail("the value is empty (nothing, ~ or null): write a value, or remove the key to take its default");
}

YamlNode MapReader::req(const std::string& key) {
  YAML::Node child = node_.raw()[key];
  if (!child) {
    // A key nobody took yet that is close to the one required is most likely its misspelling:
    // report it there, where the fix is.
    std::vector<std::string> untaken;
    for (auto it = node_.raw().begin(); it != node_.raw().end(); ++it)
      if (!taken_.count(it->first.Scalar())) untaken.push_back(it->first.Scalar());
    const std::string typo = suggest_key(key, untaken);
    if (!typo.empty()) {
      for (auto it = node_.raw().begin(); it != node_.raw().end(); ++it)
        if (it->first.Scalar() == typo)
          YamlNode(it->first, std::make_shared<const std::string>(node_.file()),
                   child_path(node_.path(), typo))
              .fail(str("missing required key \"", key, "\" (did you mean \"", key, "\" instead of \"", typo,
                        "\"?)"));
    }
    // The document's position is that of its first key, which says nothing about a key that is
    // not there: the top level is named by the file alone.
    if (node_.path().empty()) MTP_FAIL(node_.file(), ": missing required key \"", key, "\" at the top level");
    node_.fail(str("missing required key \"", key, "\""));
  }
  taken_.insert(key);
  refuse_empty(key, child);
  return YamlNode(child, std::make_shared<const std::string>(node_.file()), child_path(node_.path(), key));
}

std::optional<YamlNode> MapReader::opt(const std::string& key) {
  YAML::Node child = node_.raw()[key];
  taken_.insert(key);
  if (!child) return std::nullopt;
  refuse_empty(key, child);
  return YamlNode(child, std::make_shared<const std::string>(node_.file()), child_path(node_.path(), key));
}

int64_t MapReader::opt_int(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  auto n = opt(key);
  return n ? n->as_int(min, max) : fallback;
}
double MapReader::opt_double(const std::string& key, double fallback, double min, double max) {
  auto n = opt(key);
  return n ? n->as_double(min, max) : fallback;
}
std::string MapReader::opt_string(const std::string& key, const std::string& fallback) {
  auto n = opt(key);
  return n ? n->as_string() : fallback;
}
bool MapReader::opt_bool(const std::string& key, bool fallback) {
  auto n = opt(key);
  return n ? n->as_bool() : fallback;
}
std::string MapReader::opt_choice(const std::string& key, const std::string& fallback,
                                  const std::vector<std::string>& choices) {
  auto n = opt(key);
  return n ? n->as_choice(choices) : fallback;
}

void MapReader::finish() {
  for (auto it = node_.raw().begin(); it != node_.raw().end(); ++it) {
    const std::string key = it->first.Scalar();
    if (taken_.count(key)) continue;
    const std::string best = suggest_key(key, std::vector<std::string>(taken_.begin(), taken_.end()));
    std::string hint = best.empty() ? "" : str(" (did you mean \"", best, "\"?)");
    std::string known = taken_.empty() ? "" : str("; known keys: ", join(taken_, ", "));
    YamlNode(it->first, std::make_shared<const std::string>(node_.file()), child_path(node_.path(), key))
        .fail(str("unknown key \"", key, "\"", hint, known));
  }
}

}  // namespace mtplab
