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
}  // namespace

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
  try {
    return YamlNode(YAML::Load(text), std::make_shared<const std::string>(name), "");
  } catch (const YAML::Exception& e) {
    MTP_FAIL(name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg);
  }
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

std::string YamlNode::as_string() const {
  if (!node_ || !node_.IsScalar()) fail("expected a string, got " + quoted(node_));
  return node_.Scalar();
}

int64_t YamlNode::as_int() const {
  if (!node_ || !node_.IsScalar()) fail("expected an integer, got " + quoted(node_));
  const std::string& s = node_.Scalar();
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || errno == ERANGE) fail("expected an integer, got " + quoted(node_));
  return v;
}

double YamlNode::as_double() const {
  if (!node_ || !node_.IsScalar()) fail("expected a number, got " + quoted(node_));
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
  if (!node_ || !node_.IsScalar()) fail("expected one of {" + join(choices, ", ") + "}, got " + quoted(node_));
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

bool MapReader::has(const std::string& key) const {
  return static_cast<bool>(node_.raw()[key]);
}

YamlNode MapReader::req(const std::string& key) {
  YAML::Node child = node_.raw()[key];
  if (!child) node_.fail(str("missing required key \"", key, "\""));
  taken_.insert(key);
  return YamlNode(child, std::make_shared<const std::string>(node_.file()), child_path(node_.path(), key));
}

std::optional<YamlNode> MapReader::opt(const std::string& key) {
  YAML::Node child = node_.raw()[key];
  taken_.insert(key);
  if (!child || child.IsNull()) return std::nullopt;
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
    const std::string best = closest_match(key, taken_);
    std::string hint = best.empty() ? "" : str(" (did you mean \"", best, "\"?)");
    std::string known = taken_.empty() ? "" : str("; known keys: ", join(taken_, ", "));
    YamlNode(it->first, std::make_shared<const std::string>(node_.file()), child_path(node_.path(), key))
        .fail(str("unknown key \"", key, "\"", hint, known));
  }
}

}  // namespace mtplab
