// String building without a formatting library (str(a, b, c) streams its arguments), strict
// number parsing for command lines and files, and the closest-name suggestion of error messages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace mtplab {

/// Concatenates the streamed form of every argument.
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// A floating value as the shortest decimal that reads back to the same value ("0.7",
/// "0.30000000000000004", "1", "1e-05", "inf"): what messages print, so that two values that differ
/// never read the same.
std::string exact_text(double v);
std::string exact_text(float v);

namespace str_detail {
template <typename T>
decltype(auto) message_arg(const T& a) {
  if constexpr (std::is_floating_point_v<T>) {
    return exact_text(a);
  } else {
    return (a);
  }
}
}  // namespace str_detail

/// str() for messages (every Error's text, MTP_REQUIRE / MTP_FAIL): floating arguments printed
/// exactly (exact_text) instead of to the stream's 6 significant digits.
template <typename... Args>
std::string message(const Args&... args) {
  std::ostringstream os;
  (os << ... << str_detail::message_arg(args));
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

/// The whole of `text` as a base-10 integer (strtoll syntax); nullopt when anything is left over,
/// nothing is read, or the value does not fit.
std::optional<int64_t> parse_int64(std::string_view text);
/// The whole of `text` as a finite number (strtod syntax); nullopt otherwise (overflow included).
std::optional<double> parse_double(std::string_view text);

/// Levenshtein distance (insertions, deletions, substitutions of single characters).
size_t edit_distance(std::string_view a, std::string_view b);

/// The first of `candidates` nearest to `name` by edit distance when at most `max_distance`
/// away, else "": what a typo most likely meant.
template <typename Range>
std::string closest_match(std::string_view name, const Range& candidates, size_t max_distance = 2) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = std::string(c);
  }
  return best_d <= max_distance ? best : std::string();
}

}  // namespace mtplab
