// Field descriptors: one row per member of a settings struct, naming the member (a member
// pointer of the struct's type), its key in a settings file, its range and a one-line doc, so that
// every reader, checker and writer of the struct walks one table instead of listing the members
// by hand. lib/model/fields.hpp is the table of ModelConfig; the experiment's arms and the kernel
// policy fields are meant to become tables of the same shape (FieldMember<Arms>, ...).
//
// A member is an int, a float or a std::string (the types ModelConfig holds); FieldType is the
// index of the alternative, so a table row's type cannot disagree with its member.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>
#include <variant>

#include "core/str.hpp"
#include "core/yaml.hpp"

namespace mtplab {

enum class FieldType { integer = 0, real = 1, text = 2 };

template <class Owner>
using FieldMember = std::variant<int Owner::*, float Owner::*, std::string Owner::*>;

/// The type of the member `m` points to.
template <class Owner>
FieldType field_type(const FieldMember<Owner>& m) {
  return static_cast<FieldType>(m.index());
}

/// The member `m` of `o` as a T: int, float or std::string, the alternative field_type names (a
/// const reference when `o` is const).
template <class T, class Owner>
T& field_ref(Owner& o, const FieldMember<Owner>& m) {
  return o.*std::get<T Owner::*>(m);
}
template <class T, class Owner>
const T& field_ref(const Owner& o, const FieldMember<Owner>& m) {
  return o.*std::get<T Owner::*>(m);
}

/// The inclusive range a file's value must lie in (integer or real, by the member's type).
struct FieldRange {
  int64_t min = 0, max = 0;           ///< integer members
  double real_min = 0, real_max = 0;  ///< real members
};

/// Reads `n` into the member `m` of `o`, checked against `range` (the node's error names the file,
/// line, column and key path, and the range).
template <class Owner>
void read_field(Owner& o, const FieldMember<Owner>& m, const FieldRange& range, const YamlNode& n) {
  switch (field_type(m)) {
    case FieldType::integer:
      field_ref<int>(o, m) = static_cast<int>(n.as_int(range.min, range.max));
      break;
    case FieldType::real:
      field_ref<float>(o, m) = static_cast<float>(n.as_double(range.real_min, range.real_max));
      break;
    case FieldType::text:
      field_ref<std::string>(o, m) = n.as_string();
      break;
  }
}

/// The member as text: integers and strings as streamed; reals as streamed with the stream's
/// default precision (6 digits), or with `real_digits` significant digits when > 0.
template <class Owner>
std::string field_text(const Owner& o, const FieldMember<Owner>& m, int real_digits = 0) {
  switch (field_type(m)) {
    case FieldType::integer:
      return str(field_ref<int>(o, m));
    case FieldType::real: {
      std::ostringstream os;
      if (real_digits > 0) os.precision(real_digits);
      os << field_ref<float>(o, m);
      return os.str();
    }
    case FieldType::text:
      return field_ref<std::string>(o, m);
  }
  return "";
}

}  // namespace mtplab
