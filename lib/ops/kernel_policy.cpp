// KernelPolicy: one descriptor per field (name, canonical text, parser, environment variable), so
// that printing, parsing, validation and the environment overrides walk the same table in the same
// order and a new field is one entry. Three kinds of field share their code: a kernel choice (an
// enum spelled as its variable's values), a count (0 = automatic), an on/off switch.
#include "ops/kernel_policy.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/env.hpp"
#include "core/error.hpp"
#include "core/setting.hpp"
#include "core/str.hpp"

namespace mtplab::ops {
namespace {

// The texts of each choice in enum order (the enums are declared in this order), which are also
// the values their MTPLAB_* variable accepts.
const std::initializer_list<std::string_view> kGemvVariantTexts = {"auto",  "v1",  "rows2",
                                                                   "rows4", "occ", "fp8split"};
const std::initializer_list<std::string_view> kVersionTexts = {"v1", "v2"};  // MlaDecode, IndexerSelect
const std::initializer_list<std::string_view> kHeadGemmTexts = {"auto", "mma", "cublaslt", "gemv", "wgmma"};
const std::initializer_list<std::string_view> kMoePipelineTexts = {"auto", "v1",    "spread", "regs",
                                                                   "ring", "split", "slots",  "ringpf"};
const std::initializer_list<std::string_view> kRowsLinearTexts = {"auto", "cublaslt", "gemv"};
const std::initializer_list<std::string_view> kMlaBatchTexts = {"auto", "tiles", "shared", "shared2", "shared32"};
const std::initializer_list<std::string_view> kIndexerScoresTexts = {"auto", "pools4", "tiled"};
static_assert(static_cast<int>(IndexerScores::pools4) == 1 && static_cast<int>(IndexerScores::tiled) == 2,
              "kIndexerScoresTexts follows IndexerScores' order");
static_assert(static_cast<int>(MlaBatch::tiles) == 1 && static_cast<int>(MlaBatch::shared2) == 3 &&
                  static_cast<int>(MlaBatch::shared32) == 4,
              "kMlaBatchTexts follows MlaBatch's order");
static_assert(static_cast<int>(RowsLinear::cublaslt) == 1 && static_cast<int>(RowsLinear::gemv) == 2,
              "kRowsLinearTexts follows RowsLinear's order");
static_assert(static_cast<int>(GemvVariant::automatic) == 0 && static_cast<int>(GemvVariant::fp8split) == 5 &&
                  static_cast<int>(MlaDecode::v2) == 1 && static_cast<int>(IndexerSelect::v2) == 1 &&
                  static_cast<int>(HeadGemm::cublaslt) == 2 && static_cast<int>(HeadGemm::gemv) == 3 &&
                  static_cast<int>(HeadGemm::wgmma) == 4 &&
                  static_cast<int>(MoePipeline::ring) == 4 && static_cast<int>(MoePipeline::split) == 5 &&
                  static_cast<int>(MoePipeline::slots) == 6 && static_cast<int>(MoePipeline::ringpf) == 7,
              "the texts above follow the enums' order");

template <typename E>
const char* text_of(std::initializer_list<std::string_view> texts, E value) {
  const auto i = static_cast<size_t>(value);
  return i < texts.size() ? texts.begin()[i].data() : "?";
}

/// A whole decimal number (no sign, no spaces), else nullopt.
std::optional<int> whole_number(std::string_view text) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || text[0] == '-')
    return std::nullopt;
  return v;
}

bool valid_split(int v) { return v == 0 || v == 1 || v == 2 || v == 4 || v == 8; }
bool valid_clusters(int v) { return v >= 0 && v <= kMaxMlaClusters; }
bool valid_batch_splits(int v) { return v >= 0 && v <= kMaxMlaBatchSplits; }

struct Field {
  std::string_view name;
  const char* env;      ///< the MTPLAB_* variable that overrides it
  const char* choices;  ///< accepted texts, as messages list them
  SettingType type;     ///< choice (choices: the texts), boolean (on / off) or text (a count)
  std::string (*text)(const KernelPolicy&);
  bool (*parse)(KernelPolicy&, std::string_view);  ///< false: not one of the choices (p unchanged)
  bool (*valid)(const KernelPolicy&);
  bool (*from_env)(KernelPolicy&, const char* env);  ///< true: the variable was set and taken
};

/// A kernel choice: member kMember of enum type, spelled kTexts[value] in YAML and the variable.
template <auto kMember, const std::initializer_list<std::string_view>& kTexts>
struct ChoiceField {
  static constexpr SettingType kType = SettingType::choice;
  using E = std::remove_reference_t<decltype(std::declval<KernelPolicy&>().*kMember)>;
  static std::string text(const KernelPolicy& p) { return text_of(kTexts, p.*kMember); }
  static bool set(KernelPolicy& p, std::string_view t) {
    const auto it = std::find(kTexts.begin(), kTexts.end(), t);
    if (it == kTexts.end()) return false;
    p.*kMember = static_cast<E>(it - kTexts.begin());
    return true;
  }
  static bool valid(const KernelPolicy& p) { return static_cast<size_t>(p.*kMember) < kTexts.size(); }
  static bool from_env(KernelPolicy& p, const char* env) {
    const auto v = env_choice(env, kTexts);
    return v && set(p, *v);
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
bool split_from_env(KernelPolicy& p, const char* env) {
  const auto v = env_choice(env, {"1", "2", "4", "8"});
  if (v) p.gemv_split = *whole_number(*v);
  return v.has_value();
}
bool clusters_from_env(KernelPolicy& p, const char* env) {
  const auto v = env_int(env, 1, kMaxMlaClusters);
  if (v) p.mla_clusters = static_cast<int>(*v);
  return v.has_value();
}

/// An on/off switch: member kMember, "on" / "off" in YAML, 1 / 0 in the variable.
template <bool KernelPolicy::*kMember>
struct SwitchField {
  static constexpr SettingType kType = SettingType::boolean;
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
constexpr Field field(std::string_view name, const char* env, const char* choices,
                      bool (*from_env)(KernelPolicy&, const char*) = &F::from_env) {
  return Field{name, env, choices, F::kType, &F::text, &F::set, &F::valid, from_env};
}

using GemvSplitField = CountField<&KernelPolicy::gemv_split, valid_split>;
using MlaClustersField = CountField<&KernelPolicy::mla_clusters, valid_clusters>;
using MlaBatchSplitsField = CountField<&KernelPolicy::mla_batch_splits, valid_batch_splits>;
bool batch_splits_from_env(KernelPolicy& p, const char* env) {
  const auto v = env_int(env, 1, kMaxMlaBatchSplits);
  if (v) p.mla_batch_splits = static_cast<int>(*v);
  return v.has_value();
}

const std::array<Field, 13> kFields{{
    field<ChoiceField<&KernelPolicy::gemv_variant, kGemvVariantTexts>>(
        "gemv_variant", "MTPLAB_GEMV_VARIANT", "auto, v1, rows2, rows4, occ, fp8split"),
    field<GemvSplitField>("gemv_split", "MTPLAB_GEMV_SPLIT", "auto (or 0), 1, 2, 4, 8", split_from_env),
    field<ChoiceField<&KernelPolicy::mla_decode, kVersionTexts>>("mla_decode", "MTPLAB_MLA_DECODE", "v1, v2"),
    field<MlaClustersField>("mla_clusters", "MTPLAB_MLA_CLUSTERS", "auto (or 0), 1 .. 1024",
                            clusters_from_env),
    field<ChoiceField<&KernelPolicy::indexer_select, kVersionTexts>>("indexer_select",
                                                                     "MTPLAB_INDEXER_SELECT", "v1, v2"),
    field<SwitchField<&KernelPolicy::pdl>>("pdl", "MTPLAB_CUDA_PDL", "on, off"),
    field<SwitchField<&KernelPolicy::nccl_blocking>>("nccl_blocking", "MTPLAB_NCCL_BLOCKING", "on, off"),
    field<ChoiceField<&KernelPolicy::head_gemm, kHeadGemmTexts>>("head_gemm", "MTPLAB_HEAD_GEMM",
                                                                 "auto, mma, cublaslt, gemv, wgmma"),
    field<MlaBatchSplitsField>("mla_batch_splits", "MTPLAB_MLA_BATCH_SPLITS", "auto (or 0), 1 .. 64",
                               batch_splits_from_env),
    field<ChoiceField<&KernelPolicy::moe_pipeline, kMoePipelineTexts>>(
        "moe_pipeline", "MTPLAB_MOE_PIPELINE", "auto, v1, spread, regs, ring, split, slots, ringpf"),
    field<ChoiceField<&KernelPolicy::rows_linear, kRowsLinearTexts>>("rows_linear", "MTPLAB_ROWS_LINEAR",
                                                                     "auto, cublaslt, gemv"),
    field<ChoiceField<&KernelPolicy::mla_batch, kMlaBatchTexts>>("mla_batch", "MTPLAB_MLA_BATCH",
                                                                 "auto, tiles, shared, shared2, shared32"),
    field<ChoiceField<&KernelPolicy::indexer_scores, kIndexerScoresTexts>>(
        "indexer_scores", "MTPLAB_INDEXER_SCORES", "auto, pools4, tiled"),
}};

const Field& field_of(std::string_view name) {
  for (const Field& f : kFields)
    if (f.name == name) return f;
  MTP_FAIL("kernel policy: unknown field \"", name, "\" (fields: ", join(kernel_policy_fields(), ", "), ")");
}

}  // namespace

const char* to_string(GemvVariant v) { return text_of(kGemvVariantTexts, v); }
const char* to_string(MlaDecode d) { return text_of(kVersionTexts, d); }
const char* to_string(IndexerSelect s) { return text_of(kVersionTexts, s); }
const char* to_string(HeadGemm h) { return text_of(kHeadGemmTexts, h); }
const char* to_string(MoePipeline m) { return text_of(kMoePipelineTexts, m); }
const char* to_string(RowsLinear r) { return text_of(kRowsLinearTexts, r); }
const char* to_string(MlaBatch m) { return text_of(kMlaBatchTexts, m); }
const char* to_string(IndexerScores s) { return text_of(kIndexerScoresTexts, s); }

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
  MTP_REQUIRE(f.parse(p, text), "kernel policy: ", f.name, " \"", text, "\" is not one of: ", f.choices);
}

std::string field_choices(std::string_view field) { return field_of(field).choices; }

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
    MTP_REQUIRE(f.valid(p), "kernel policy: ", f.name, " holds ", f.text(p), ", not one of: ", f.choices);
}

KernelPolicy env_overrides(const KernelPolicy& base, std::vector<std::string>* overridden) {
  KernelPolicy p = base;
  for (const Field& f : kFields) {
    if (f.from_env(p, f.env) && overridden)
      overridden->push_back(str(f.name, "=", f.text(p), " (", f.env, ")"));
  }
  return p;
}

// The fields whose choice changes the results' bits (see the header): a results file's identity
// carries their values (harness/check.hpp), so files that differ in them do not resume or merge.
// Each must name a field (kernel_policy_settings checks).
constexpr std::string_view kIdentityFields[] = {"gemv_variant", "gemv_split", "mla_decode", "mla_clusters"};

const std::vector<Setting<KernelPolicy>>& kernel_policy_settings() {
  static const std::vector<Setting<KernelPolicy>> table = [] {
    std::vector<Setting<KernelPolicy>> out;
    for (const Field& f : kFields) {
      Setting<KernelPolicy> s;
      s.name = std::string(f.name);
      s.type = f.type;
      if (f.type == SettingType::choice)
        for (const auto& c : split(f.choices, ',')) s.choices.push_back(trim(c));
      else if (f.type == SettingType::boolean)
        s.choices = {"off", "on"};
      else
        s.text_values = f.choices;
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
