#include "core/env.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.hpp"
#include "core/str.hpp"

namespace mtplab {

std::optional<std::string> env_choice(const char* name, std::initializer_list<std::string_view> allowed) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  const std::string_view value(v);
  for (std::string_view a : allowed)
    if (value == a) return std::string(value);
  MTP_FAIL(name, "=", value, " is not one of: ", join(allowed, ", "), " (unset it for the default)");
}

std::optional<long> env_int(const char* name, long lo, long hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  const std::string_view value(v);
  long n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  MTP_REQUIRE(ec == std::errc() && end == value.data() + value.size() && n >= lo && n <= hi, name, "=", value,
              " is not an integer in [", lo, ", ", hi, "] (unset it for the default)");
  return n;
}

std::optional<double> env_seconds(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  const auto d = parse_double(v);
  MTP_REQUIRE(d && std::isfinite(*d) && *d >= 0, name, "=", v,
              " is not a number of seconds >= 0 (unset it for the default)");
  return d;
}

void check_logging_env() {
  (void)env_choice("MTPLAB_LOG", {"error", "warn", "info", "debug"});
  (void)env_seconds("MTPLAB_PROGRESS_S");
}

}  // namespace mtplab
