// String building without a formatting library: str(a, b, c) streams its arguments.
#pragma once
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace mtplab {

/// Concatenates the streamed form of every argument.
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// Joins the streamed form of each element with `sep`.
template <typename Range>
std::string join(const Range& items, std::string_view sep) {
  std::ostringstream os;
  bool first = true;
  for (const auto& item : items) {
    if (!first) os << sep;
    os << item;
    first = false;
  }
  return os.str();
}

std::vector<std::string> split(std::string_view s, char sep);
std::string trim(std::string_view s);
bool starts_with(std::string_view s, std::string_view prefix);

}  // namespace mtplab
