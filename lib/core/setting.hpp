// Settings: one descriptor per value that an experiment sets and a results file records: its
// name, its type, its default, its canonical text and how that text is parsed, and where the
// value is recorded. The experiment's arms (harness/arms.hpp) and the backend's kernel policy
// fields (ops/kernel_policy.hpp) are tables of these; the YAML reader, the sweep expansion, the
// point's canonical text (its identity), the results writer, `mtplab upgrade` and the tests walk
// the tables instead of naming a value by hand. ModelConfig's fields have their own table
// (core/fields.hpp): they carry preset and Hugging Face rules that settings do not.
//
// A table of one options struct (Setting<Part>) is lifted into a struct that holds it
// (Setting<Owner>) with nested(): the arms table is the drafter's, the replay's and the kernel
// policy's tables lifted into harness::Arms, so each value is described once, where its struct is.
//
// Invariants (check_settings, which every table's builder calls):
// - names are unique; the default (get of a default-constructed Owner) is an allowed value;
// - the canonical text is the YAML spelling: booleans off / on, choices as listed, integers in
//   decimal, reals as the shortest decimal that reads back to the same double ("0.7", "1");
// - set(v) then get() gives v for every allowed canonical v; set throws an Error naming the value
//   and the allowed values for any other text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/str.hpp"

namespace mtplab {

/// How a setting is spelt and recorded. choice / boolean / integer / real: the value is checked
/// by its descriptor; text: a value that its layer parses (`set` throws naming the value and
/// `text_values`), e.g. a kernel count that is "auto" or a number.
enum class SettingType {
  choice,   ///< one of `choices`; recorded as text
  boolean,  ///< off / on (a YAML boolean reads as one); recorded as text
  integer,  ///< a whole number in [min, max]; recorded as int64
  real,     ///< a number in [real_min, real_max] (real_min itself excluded when real_min_exclusive); f64
  text,     ///< one of `text_values` as its layer parses them; recorded as text
};
const char* to_string(SettingType t);  ///< "choice", "boolean", "integer", "real", "text"

/// Where a setting is recorded in a results file (docs/results-schema.md). Every setting is in
/// the point's canonical config (its identity), a point attribute of its name (typed by its type)
/// and an /index column; these say where else.
struct SettingRecord {
  /// The file's identity inputs carry the setting's values over the points: a choice that changes
  /// the results' bits, so that files which differ in it are not resumed or merged together.
  bool identity_input = false;
};

template <class Owner>
struct Setting {
  /// The YAML key, the point attribute and the /index column. A setting of a nested block is named
  /// "block.key" (nested() prefixes it).
  std::string name;
  SettingType type = SettingType::choice;
  std::vector<std::string> choices;   ///< canonical spellings (choice; boolean: off, on)
  std::string text_values;            ///< text: the accepted values, for messages
  int64_t min = 0, max = 0;           ///< integer range, inclusive
  double real_min = 0, real_max = 0;  ///< real range; real_max inclusive
  bool real_min_exclusive = false;    ///< real_min itself not allowed (temperature > 0)
  std::string summary;                ///< one line: what the setting switches
  SettingRecord record;
  std::function<std::string(const Owner&)> get;               ///< the canonical text of the value
  std::function<void(Owner&, const std::string& value)> set;  ///< from canonical text; checked

  /// The canonical default: get of a default-constructed Owner (defaults live in the structs).
  std::string default_value() const { return get(Owner{}); }
  /// Whether `v` is an allowed canonical value (set accepts it and get spells it back as `v`).
  bool allows(const std::string& v) const {
    try {
      Owner scratch{};
      set(scratch, v);
      return get(scratch) == v;
    } catch (const Error&) {
      return false;
    }
  }
  /// The allowed values as text for messages: "{none, vocab}", "[1, 16]" or "(0, 100]".
  std::string allowed() const;
};

/// The canonical text of a real value: the shortest decimal that reads back to `v`.
std::string real_text(double v);

namespace setting_detail {
std::string allowed_text(SettingType type, const std::vector<std::string>& choices,
                         const std::string& text_values, int64_t min, int64_t max, double real_min,
                         double real_max, bool real_min_exclusive);
/// The index of `v` among `choices`; throws naming the value and the choices.
size_t choice_index(const std::vector<std::string>& choices, const std::string& v);
/// `v` as a whole decimal number in [lo, hi]; throws naming the value and the range.
int64_t integer_value(const std::string& v, int64_t lo, int64_t hi);
/// `v` as a canonical real in the range; throws naming the value and the range.
double real_value(const std::string& v, double lo, bool lo_exclusive, double hi);
}  // namespace setting_detail

template <class Owner>
std::string Setting<Owner>::allowed() const {
  return setting_detail::allowed_text(type, choices, text_values, min, max, real_min, real_max,
                                      real_min_exclusive);
}

/// An enum member spelt as `names` spells its values (the enum's own name table, in enum order).
template <class Owner, class E, size_t N>
Setting<Owner> choice_setting(std::string name, E Owner::*field, const char* const (&names)[N],
                              std::string summary) {
  Setting<Owner> s;
  s.name = std::move(name);
  s.type = SettingType::choice;
  s.choices = std::vector<std::string>(std::begin(names), std::end(names));
  s.summary = std::move(summary);
  s.get = [field, choices = s.choices](const Owner& o) {
    const auto i = static_cast<size_t>(o.*field);
    return i < choices.size() ? choices[i] : std::string("?");
  };
  s.set = [field, choices = s.choices](Owner& o, const std::string& v) {
    o.*field = static_cast<E>(setting_detail::choice_index(choices, v));
  };
  return s;
}

/// A bool member, spelt off / on.
template <class Owner>
Setting<Owner> bool_setting(std::string name, bool Owner::*field, std::string summary) {
  Setting<Owner> s;
  s.name = std::move(name);
  s.type = SettingType::boolean;
  s.choices = {"off", "on"};
  s.summary = std::move(summary);
  s.get = [field](const Owner& o) { return std::string(o.*field ? "on" : "off"); };
  s.set = [field, choices = s.choices](Owner& o, const std::string& v) {
    o.*field = setting_detail::choice_index(choices, v) == 1;
  };
  return s;
}

/// An integer member (int or int64_t) in [lo, hi].
template <class Owner, class T>
Setting<Owner> int_setting(std::string name, T Owner::*field, int64_t lo, int64_t hi, std::string summary) {
  Setting<Owner> s;
  s.name = std::move(name);
  s.type = SettingType::integer;
  s.min = lo;
  s.max = hi;
  s.summary = std::move(summary);
  s.get = [field](const Owner& o) { return str(o.*field); };
  s.set = [field, lo, hi](Owner& o, const std::string& v) {
    o.*field = static_cast<T>(setting_detail::integer_value(v, lo, hi));
  };
  return s;
}

/// A double member in (lo, hi] (lo_exclusive) or [lo, hi].
template <class Owner>
Setting<Owner> real_setting(std::string name, double Owner::*field, double lo, bool lo_exclusive, double hi,
                            std::string summary) {
  Setting<Owner> s;
  s.name = std::move(name);
  s.type = SettingType::real;
  s.real_min = lo;
  s.real_min_exclusive = lo_exclusive;
  s.real_max = hi;
  s.summary = std::move(summary);
  s.get = [field](const Owner& o) { return real_text(o.*field); };
  s.set = [field, lo, lo_exclusive, hi](Owner& o, const std::string& v) {
    o.*field = setting_detail::real_value(v, lo, lo_exclusive, hi);
  };
  return s;
}

/// `s`, a setting of the struct `Part` that `Owner` holds as its member `part`, as a setting of
/// `Owner`; named "prefix.name" when `prefix` is not empty (a nested YAML block).
template <class Owner, class Part>
Setting<Owner> nested(const Setting<Part>& s, Part Owner::*part, const std::string& prefix = "") {
  Setting<Owner> o;
  o.name = prefix.empty() ? s.name : prefix + "." + s.name;
  o.type = s.type;
  o.choices = s.choices;
  o.text_values = s.text_values;
  o.min = s.min;
  o.max = s.max;
  o.real_min = s.real_min;
  o.real_max = s.real_max;
  o.real_min_exclusive = s.real_min_exclusive;
  o.summary = s.summary;
  o.record = s.record;
  o.get = [get = s.get, part](const Owner& x) { return get(x.*part); };
  o.set = [set = s.set, part](Owner& x, const std::string& v) { set(x.*part, v); };
  return o;
}

/// The invariants above, over a whole table named `table` (for messages): a vector of settings,
/// or of structs derived from one. Throws naming the setting that breaks one.
template <class Table>
void check_settings(const Table& settings, const std::string& table) {
  for (size_t i = 0; i < settings.size(); ++i) {
    const auto& s = settings[i];
    MTP_REQUIRE(s.get && s.set, table, ": ", s.name, " has no get or set");
    for (size_t j = 0; j < i; ++j) MTP_REQUIRE(s.name != settings[j].name, table, ": ", s.name, " twice");
    MTP_REQUIRE(s.allows(s.default_value()), table, ": ", s.name, "'s default \"", s.default_value(),
                "\" is not among its values ", s.allowed());
    for (const std::string& c : s.choices)
      MTP_REQUIRE(s.allows(c), table, ": ", s.name, "'s value \"", c, "\" does not read back as itself");
  }
}

}  // namespace mtplab
