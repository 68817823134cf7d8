// KernelPolicy: one descriptor per field (name, canonical text, parser, environment variable), so
// that printing, parsing, validation and the environment overrides walk the same table in the same
// order and a new field is one entry. Three kinds of field share their code: a kernel choice (an
// enum and its table of texts, kernel_policy.hpp), a count (0 = automatic), an on/off switch.
#include "ops/kernel_policy.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/env.hpp"
#include "core/error.hpp"
#include "core/setting.hpp"
#include "core/str.hpp"

namespace mtplab::ops {
namespace {

/// A whole decimal number (no sign, no spaces), else nullopt.
std::optional<int> whole_number(std::string_view text) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || text[0] == '-')
    return std::nullopt;
  return v;
}

bool valid_split(int v) { return v == 0 || v == 1 || v == 2 || v == 4 || v == 8; }
bool valid_batch_splits(int v) { return v >= 0 && v <= kMaxMlaBatchSplits; }

struct Field {
  std::string_view name;
  const char* env;           ///< the MTPLAB_* variable that overrides it
  std::string (*choices)();  ///< accepted texts, as messages list them
  SettingType type;          ///< choice (choices: the texts), boolean (on / off) or text (a count)
  std::string (*text)(const KernelPolicy&);
  bool (*parse)(KernelPolicy&, std::string_view);  ///< false: not one of the choices (p unchanged)
  bool (*valid)(const KernelPolicy&);
  bool (*from_env)(KernelPolicy&, const char* env);  ///< true: the variable was set and taken
};

/// A kernel choice: member kMember of an enum type whose table (choices_of) gives its texts, in
/// YAML and in its variable alike.
template <auto kMember>
struct ChoiceField {
  static constexpr SettingType kType = SettingType::choice;
  using E = std::remove_cvref_t<decltype(std::declval<KernelPolicy&>().*kMember)>;
  static constexpr std::span<const Choice<E>> table() { return choices_of(E{}); }
  static std::string choices() {
    std::string s;
    for (const Choice<E>& c : table()) s += (s.empty() ? "" : ", ") + std::string(c.text);
    return s;
  }
  static std::string text(const KernelPolicy& p) { return to_string(p.*kMember); }
  static bool set(KernelPolicy& p, std::string_view t) {
    for (const Choice<E>& c : table()) {
      if (c.text != t) continue;
      p.*kMember = c.value;
      return true;
    }
    return false;
  }
  static bool valid(const KernelPolicy& p) {
    return std::any_of(table().begin(), table().end(),
                       [&](const Choice<E>& c) { return c.value == p.*kMember; });
  }
  static bool from_env(KernelPolicy& p, const char* env) {
    const char* v = std::getenv(env);
    if (!v || !*v) return false;
    MTP_REQUIRE(set(p, v), env, "=", v, " is not one of: ", choices(), " (unset it for the default)");
    return true;
  }
};

/// A count: member kMember, 0 spelled "auto" (the number 0 is accepted too), else kValid's values.
template <int KernelPolicy::*kMember, bool (*kValid)(int)>
struct CountField {
  static constexpr SettingType kType = SettingType::text;
  static std::string text(const KernelPolicy& p) {
    return p.*kMember == 0 ? std::string("auto") : std::to_string(p.*kMember);
  }
  static bool set(KernelPolicy& p, std::string_view t) {
    const auto v = t == "auto" ? std::optional<int>(0) : whole_number(t);
    if (!v || !kValid(*v)) return false;
    p.*kMember = *v;
    return true;
  }
  static bool valid(const KernelPolicy& p) { return kValid(p.*kMember); }
};
std::string split_choices() { return "auto (or 0), 1, 2, 4, 8"; }
bool split_from_env(KernelPolicy& p, const char* env) {
  const auto v = env_choice(env, {"1", "2", "4", "8"});
  if (v) p.gemv_split = *whole_number(*v);
  return v.has_value();
}
std::string batch_splits_choices() { return str("auto (or 0), 1 .. ", kMaxMlaBatchSplits); }
bool batch_splits_from_env(KernelPolicy& p, const char* env) {
  const auto v = env_int(env, 1, kMaxMlaBatchSplits);
  if (v) p.mla_batch_splits = static_cast<int>(*v);
  return v.has_value();
}

/// An on/off switch: member kMember, "on" / "off" in YAML, 1 / 0 in the variable.
template <bool KernelPolicy::*kMember>
struct SwitchField {
  static constexpr SettingType kType = SettingType::boolean;
  static std::string choices() { return "on, off"; }
  static std::string text(const KernelPolicy& p) { return p.*kMember ? "on" : "off"; }
  static bool set(KernelPolicy& p, std::string_view t) {
    if (t != "on" && t != "off") return false;
    p.*kMember = t == "on";
    return true;
  }
  static bool valid(const KernelPolicy&) { return true; }
  static bool from_env(KernelPolicy& p, const char* env) {
    const auto v = env_choice(env, {"0", "1"});
    if (v) p.*kMember = *v == "1";
    return v.has_value();
  }
};

template <typename F>
constexpr Field field(std::string_view name, const char* env) {
  return Field{name, env, &F::choices, F::kType, &F::text, &F::set, &F::valid, &F::from_env};
}
template <typename F>
constexpr Field count_field(std::string_view name, const char* env, std::string (*choices)(),
                            bool (*from_env)(KernelPolicy&, const char*)) {
  return Field{name, env, choices, F::kType, &F::text, &F::set, &F::valid, from_env};
}

const std::array<Field, 11> kFields{{
    field<ChoiceField<&KernelPolicy::gemv_variant>>("gemv_variant", "MTPLAB_GEMV_VARIANT"),
    count_field<CountField<&KernelPolicy::gemv_split, valid_split>>("gemv_split", "MTPLAB_GEMV_SPLIT",
                                                                    split_choices, split_from_env),
    field<ChoiceField<&KernelPolicy::mla_decode>>("mla_decode", "MTPLAB_MLA_DECODE"),
    field<SwitchField<&KernelPolicy::pdl>>("pdl", "MTPLAB_CUDA_PDL"),
    field<SwitchField<&KernelPolicy::nccl_blocking>>("nccl_blocking", "MTPLAB_NCCL_BLOCKING"),
    field<ChoiceField<&KernelPolicy::head_gemm>>("head_gemm", "MTPLAB_HEAD_GEMM"),
    count_field<CountField<&KernelPolicy::mla_batch_splits, valid_batch_splits>>(
        "mla_batch_splits", "MTPLAB_MLA_BATCH_SPLITS", batch_splits_choices, batch_splits_from_env),
    field<ChoiceField<&KernelPolicy::moe_pipeline>>("moe_pipeline", "MTPLAB_MOE_PIPELINE"),
    field<ChoiceField<&KernelPolicy::rows_linear>>("rows_linear", "MTPLAB_ROWS_LINEAR"),
    field<ChoiceField<&KernelPolicy::mla_batch>>("mla_batch", "MTPLAB_MLA_BATCH"),
    field<ChoiceField<&KernelPolicy::indexer_scores>>("indexer_scores", "MTPLAB_INDEXER_SCORES"),
}};

/// What is no longer a policy value or field, and where it went: a comparison kernel lives in a
/// playground of dev/cuda (docs/kernels.md, "Playgrounds"). value "": the whole field.
struct Retired {
  std::string_view field;
  std::string_view value;
  const char* env;  ///< the retired field's variable (nullptr for a value)
  const char* where;
};
constexpr Retired kRetired[] = {
    {"gemv_variant", "rows2", nullptr, "a comparison kernel in dev/cuda/gemv.cu (no rule picks it)"},
    {"gemv_variant", "fp8split", nullptr, "a comparison kernel in dev/cuda/gemv.cu (no rule picks it)"},
    {"mla_batch", "shared", nullptr, "a comparison kernel in dev/cuda/mla.cu (no rule picks it)"},
    {"moe_pipeline", "spread", nullptr, "a comparison pipeline in dev/cuda/moe.cu (no rule picks it)"},
    {"moe_pipeline", "regs", nullptr, "a comparison pipeline in dev/cuda/moe.cu (no rule picks it)"},
    {"moe_pipeline", "ring", nullptr,
     "a comparison pipeline in dev/cuda/moe.cu (no rule picks it; ringpf is ring with the L2 hint)"},
    {"moe_pipeline", "split", nullptr, "a comparison pipeline in dev/cuda/moe.cu (no rule picks it)"},
    {"indexer_select", "", "MTPLAB_INDEXER_SELECT",
     "the library selects with the radix kernel (v2) only; v1 is a comparison kernel in dev/cuda/indexer.cu"},
    {"mla_clusters", "", "MTPLAB_MLA_CLUSTERS",
     "the single-row decode runs the batched one, whose split count mla_batch_splits sets"},
};

/// ", <why>" when (field, value) is retired ("" value: the field itself), else "".
std::string retired_note(std::string_view field, std::string_view value) {
  for (const Retired& r : kRetired)
    if (r.field == field && r.value == value)
      return str("; ", value.empty() ? field : value, " is retired: ", r.where);
  return "";
}

const Field& field_of(std::string_view name) {
  for (const Field& f : kFields)
    if (f.name == name) return f;
  MTP_FAIL("kernel policy: unknown field \"", name, "\" (fields: ", join(kernel_policy_fields(), ", "), ")",
           retired_note(name, ""));
}

}  // namespace

const std::vector<std::string_view>& kernel_policy_fields() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> n;
    for (const Field& f : kFields) n.push_back(f.name);
    return n;
  }();
  return names;
}

std::string field_text(const KernelPolicy& p, std::string_view field) { return field_of(field).text(p); }

void parse_field(KernelPolicy& p, std::string_view field, std::string_view text) {
  const Field& f = field_of(field);
  MTP_REQUIRE(f.parse(p, text), "kernel policy: ", f.name, " \"", text, "\" is not one of: ", f.choices(),
              retired_note(field, text));
}

std::string field_choices(std::string_view field) { return field_of(field).choices(); }

const char* kernel_policy_env(std::string_view field) { return field_of(field).env; }

std::vector<std::pair<std::string, std::string>> named(const KernelPolicy& p) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(kFields.size());
  for (const Field& f : kFields) out.emplace_back(std::string(f.name), f.text(p));
  return out;
}

std::string to_string(const KernelPolicy& p) {
  std::string s;
  for (const auto& [name, value] : named(p)) s += (s.empty() ? "" : " ") + name + "=" + value;
  return s;
}

void validate(const KernelPolicy& p) {
  for (const Field& f : kFields)
    MTP_REQUIRE(f.valid(p), "kernel policy: ", f.name, " holds ", f.text(p), ", not one of: ", f.choices());
}

KernelPolicy env_overrides(const KernelPolicy& base, std::vector<std::string>* overridden) {
  for (const Retired& r : kRetired) {
    const char* v = r.env ? std::getenv(r.env) : nullptr;
    MTP_REQUIRE(!v || !*v, r.env, "=", v ? v : "", " is no longer read: ", r.field, " is retired: ", r.where,
                " (unset it)");
  }
  KernelPolicy p = base;
  for (const Field& f : kFields) {
    // A retired value of a live field: refused with where it went, before the field's own reader.
    const char* v = std::getenv(f.env);
    const std::string note = v && *v ? retired_note(f.name, v) : "";
    MTP_REQUIRE(note.empty(), f.env, "=", v, " is not one of: ", f.choices(), note,
                " (unset it for the default)");
    if (f.from_env(p, f.env) && overridden)
      overridden->push_back(str(f.name, "=", f.text(p), " (", f.env, ")"));
  }
  return p;
}

// The fields whose choice changes the results' bits (see the header): a results file's identity
// carries their values (harness/check.hpp), so files that differ in them do not resume or merge.
// Each must name a field (kernel_policy_settings checks).
constexpr std::string_view kIdentityFields[] = {"gemv_variant", "gemv_split", "mla_decode"};

const std::vector<Setting<KernelPolicy>>& kernel_policy_settings() {
  static const std::vector<Setting<KernelPolicy>> table = [] {
    std::vector<Setting<KernelPolicy>> out;
    for (const Field& f : kFields) {
      Setting<KernelPolicy> s;
      s.name = std::string(f.name);
      s.type = f.type;
      if (f.type == SettingType::choice)
        for (const auto& c : split(f.choices(), ',')) s.choices.push_back(trim(c));
      else if (f.type == SettingType::boolean)
        s.choices = {"off", "on"};
      else
        s.text_values = f.choices();
      s.summary = str("kernel policy: ", f.name, " (docs/kernels.md)");
      s.record.identity_input = std::find(std::begin(kIdentityFields), std::end(kIdentityFields), f.name) !=
                                std::end(kIdentityFields);
      s.get = [&f](const KernelPolicy& p) { return f.text(p); };
      s.set = [&f](KernelPolicy& p, const std::string& v) { parse_field(p, f.name, v); };
      out.push_back(std::move(s));
    }
    for (const std::string_view name : kIdentityFields) (void)field_of(name);
    check_settings(out, "kernel policy");
    return out;
  }();
  return table;
}

}  // namespace mtplab::ops
