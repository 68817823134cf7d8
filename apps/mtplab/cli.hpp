// A small strict command-line reader shared by the sub-commands: `--name value`, `--name=value`,
// `--flag`, and positional arguments. An unknown option or a missing value is an Error naming the
// command, so a typo never runs an experiment with defaults.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"

namespace mtplab::app {

class Cli {
 public:
  /// `valued`: options that take a value; `flags`: options that do not.
  Cli(std::string command, const Args& args, const std::set<std::string>& valued,
      const std::set<std::string>& flags = {"help"});
  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  /// The last value given (options may repeat; values() returns all).
  std::optional<std::string> get(const std::string& name) const;
  std::vector<std::string> values(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& fallback) const;
  int64_t get_int(const std::string& name, int64_t fallback, int64_t min, int64_t max) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string command_;
  std::multimap<std::string, std::string> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

}  // namespace mtplab::app
