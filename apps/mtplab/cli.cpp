#include "cli.hpp"

#include <cerrno>
#include <cstdlib>

#include "core/error.hpp"

namespace mtplab::app {

Cli::Cli(std::string command, const Args& args, const std::set<std::string>& valued,
         const std::set<std::string>& flags)
    : command_(std::move(command)) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h") {
      flags_.insert("help");
      continue;
    }
    if (!starts_with(a, "--")) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (flags.count(name) && !inline_value) {
      flags_.insert(name);
    } else if (valued.count(name)) {
      if (!inline_value) {
        MTP_REQUIRE(i + 1 < args.size(), "mtplab ", command_, ": --", name, " needs a value");
        value = args[++i];
      }
      values_.emplace(name, value);
    } else {
      MTP_FAIL("mtplab ", command_, ": unknown option --", name, " (see mtplab ", command_, " --help)");
    }
  }
}

std::optional<std::string> Cli::get(const std::string& name) const {
  auto range = values_.equal_range(name);
  if (range.first == range.second) return std::nullopt;
  return std::prev(range.second)->second;
}

std::vector<std::string> Cli::values(const std::string& name) const {
  std::vector<std::string> out;
  for (auto [it, end] = values_.equal_range(name); it != end; ++it) out.push_back(it->second);
  return out;
}

std::string Cli::get_or(const std::string& name, const std::string& fallback) const {
  auto v = get(name);
  return v ? *v : fallback;
}

int64_t Cli::get_int(const std::string& name, int64_t fallback, int64_t min, int64_t max) const {
  auto v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  MTP_REQUIRE(!v->empty() && *end == '\0' && errno == 0, "mtplab ", command_, ": --", name,
              " expects an integer, got \"", *v, "\"");
  MTP_REQUIRE(x >= min && x <= max, "mtplab ", command_, ": --", name, " ", x, " is out of range [", min, ", ",
              max, "]");
  return x;
}

}  // namespace mtplab::app
