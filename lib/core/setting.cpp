// The parts of the setting descriptors (setting.hpp) that do not depend on the owner's type.
#include "core/setting.hpp"

#include <charconv>
#include <system_error>

namespace mtplab {

const char* to_string(SettingType t) {
  static const char* const names[] = {"choice", "boolean", "integer", "real", "text"};
  return names[static_cast<size_t>(t)];
}

std::string real_text(double v) { return exact_text(v); }

namespace setting_detail {

std::string allowed_text(SettingType type, const std::vector<std::string>& choices,
                         const std::string& text_values, int64_t min, int64_t max, double real_min,
                         double real_max, bool real_min_exclusive) {
  switch (type) {
    case SettingType::integer:
      return str("[", min, ", ", max, "]");
    case SettingType::real:
      return str(real_min_exclusive ? "(" : "[", real_text(real_min), ", ", real_text(real_max), "]");
    case SettingType::text:
      return str("{", text_values, "}");
    case SettingType::choice:
    case SettingType::boolean:
      break;
  }
  return str("{", join(choices, ", "), "}");
}

size_t choice_index(const std::vector<std::string>& choices, const std::string& v) {
  for (size_t i = 0; i < choices.size(); ++i)
    if (choices[i] == v) return i;
  MTP_FAIL("\"", v, "\" is not one of {", join(choices, ", "), "}");
}

int64_t integer_value(const std::string& v, int64_t lo, int64_t hi) {
  const auto x = parse_int64(v);
  MTP_REQUIRE(x.has_value(), "\"", v, "\" is not a whole number");
  MTP_REQUIRE(*x >= lo && *x <= hi, v, " is outside [", lo, ", ", hi, "]");
  return *x;
}

double real_value(const std::string& v, double lo, bool lo_exclusive, double hi) {
  const auto d = parse_double(v);
  MTP_REQUIRE(d.has_value(), "\"", v, "\" is not a number");
  MTP_REQUIRE((lo_exclusive ? *d > lo : *d >= lo) && *d <= hi, v, " is outside ", lo_exclusive ? "(" : "[",
              real_text(lo), ", ", real_text(hi), "]");
  return *d;
}

}  // namespace setting_detail
}  // namespace mtplab
