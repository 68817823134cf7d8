// The table of ModelConfig's fields (docs/model-config.md, "Keys"): one row per member, in the
// order of the canonical text, naming the member, its preset key, its range and default in a
// preset, the rule validate() checks, the Hugging Face config.json field it is read from and a
// one-line doc. The preset reader and writer (config.cpp), validate(), the Hugging Face reader
// (hf_config.cpp), the experiment's resolved model (harness/experiment.cpp) and the tests walk it,
// so a new field is one row here (plus its use).
//
// Invariants of the table (tests/model/test_config.cpp checks them):
// - every member of ModelConfig but the bookkeeping ones (source, source_format, key_locations)
//   has exactly one row;
// - the rows are in the order of the canonical text: changing it changes every results identity;
// - a row with a `key` is a preset key; one with a dotted key sits in that sub-mapping
//   ("checkpoint."), and the sub-mapping's rows come last.
#pragma once
#include <optional>
#include <span>
#include <string>

#include "core/fields.hpp"
#include "model/config.hpp"

namespace mtplab::model {

/// What validate() checks of one field by itself (the rules that tie fields together are written
/// out in validate()). The checks run in the order of the enumerators, each over the rows in table
/// order: the positive integers, the non-negative integers, the reals, then the fields that must
/// be zero.
enum class FieldCheck {
  none,
  positive,      ///< > 0: "KEY must be positive"
  non_negative,  ///< >= 0: "KEY must be >= 0"
  zero,          ///< == 0: "KEY V is not supported: <check_note>"
};

/// How the Hugging Face reader fills a field.
enum class HfRead {
  none,          ///< not in config.json: the field keeps its default (hf.note says why)
  derived,       ///< computed by hand in load_hf_config from hf.key (and other fields)
  required,      ///< hf.key must be present and not null
  optional,      ///< hf.key absent or null: the default
  null_is_zero,  ///< hf.key must be present; null means 0 (hf.note: what the field is, for the error)
  default_only,  ///< hf.key absent or null, or the default; any other value is refused (hf.note: why)
};

struct HfField {
  HfRead read = HfRead::none;
  const char* key = nullptr;    ///< the config.json (text config) field
  const char* alias = nullptr;  ///< another name of the same field; both given: they must agree
  const char* note = nullptr;
};

/// One row of the table. Rows are written with designated initialisers; a member left out takes
/// the default below.
struct ModelField {
  const char* name = "";  ///< the member's name; its key in the canonical (identity) text
  /// The preset key path ("hidden", "checkpoint.lm_head"); nullptr: derived, not read from a preset.
  const char* key = nullptr;
  FieldMember<ModelConfig> member{};
  bool required = false;  ///< in a preset
  FieldRange range{};     ///< of a preset's (and a config.json's) value
  /// An optional preset key left out: this value (nullopt: the member's default).
  std::optional<double> absent = std::nullopt;
  bool in_identity = true;  ///< written in an experiment's resolved model (the point identity)
  FieldCheck check = FieldCheck::none;
  const char* check_note = nullptr;  ///< appended to the check's message (zero: the reason)
  HfField hf{};
  const char* doc = "";

  /// The key validate() blames and names: the preset key, else the member's name.
  const char* label() const { return key ? key : name; }
  FieldType type() const { return field_type(member); }
};

/// Every field, in the order of the canonical text.
std::span<const ModelField> model_fields();
/// The row of the member named `name`; throws when there is none.
const ModelField& model_field(const std::string& name);

}  // namespace mtplab::model
