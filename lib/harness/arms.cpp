// The arm registry (arms.hpp): one entry per arm, and the readers and writers that walk it.
#include "harness/arms.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>
#include <map>

#include "core/error.hpp"
#include "drafter/drafter.hpp"
#include "harness/experiment.hpp"

namespace mtplab::harness {
namespace {

const std::vector<std::string> kOffOn = {"off", "on"};

template <size_t N>
std::vector<std::string> names(const char* const (&list)[N]) {
  return std::vector<std::string>(std::begin(list), std::end(list));
}

// The options struct an arm's field lives in: the drafter's (ArmLayer::drafter) or the replay's
// (ArmLayer::harness). Every replay arm came after the first schema-v2 files, so a replay arm is
// omitted from the canonical text at its default.
template <typename S>
struct OptionsOf;
template <>
struct OptionsOf<drafter::DrafterOptions> {
  static constexpr ArmLayer layer = ArmLayer::drafter;
  static drafter::DrafterOptions& of(Arms& x) { return x.drafter; }
  static const drafter::DrafterOptions& of(const Arms& x) { return x.drafter; }
};
template <>
struct OptionsOf<ReplayOptions> {
  static constexpr ArmLayer layer = ArmLayer::harness;
  static ReplayOptions& of(Arms& x) { return x.replay; }
  static const ReplayOptions& of(const Arms& x) { return x.replay; }
};

// What every arm of an options struct `S` sets; the builders below add the type's own fields.
template <typename S>
ArmSpec arm_of(std::string name, ArmType type, std::string summary) {
  ArmSpec a;
  a.name = std::move(name);
  a.type = type;
  a.layer = OptionsOf<S>::layer;
  a.summary = std::move(summary);
  a.omit_at_default = OptionsOf<S>::layer == ArmLayer::harness;
  return a;
}

// A drafter arm added after the first schema-v2 files (omitted from the canonical text at its
// default, as every replay arm is).
ArmSpec added_later(ArmSpec a) {
  a.omit_at_default = true;
  return a;
}

// An enum arm: the field `field` of the options, spelt as `list` spells its values (the enum's own
// name table, in enum order).
template <typename S, typename E, size_t N>
ArmSpec choice_arm(std::string name, const char* const (&list)[N], E S::*field, std::string summary) {
  ArmSpec a = arm_of<S>(std::move(name), ArmType::choice, std::move(summary));
  a.choices = names(list);
  a.get = [field, &list](const Arms& x) {
    return std::string(list[static_cast<size_t>(OptionsOf<S>::of(x).*field)]);
  };
  a.set = [field, choices = a.choices](Arms& x, const std::string& v) {
    const auto it = std::find(choices.begin(), choices.end(), v);
    MTP_REQUIRE(it != choices.end(), "\"", v, "\" is not one of {", join(choices, ", "), "}");
    OptionsOf<S>::of(x).*field = static_cast<E>(it - choices.begin());
  };
  return a;
}

template <typename S>
ArmSpec bool_arm(std::string name, bool S::*field, std::string summary) {
  ArmSpec a = arm_of<S>(std::move(name), ArmType::boolean, std::move(summary));
  a.choices = kOffOn;
  a.get = [field](const Arms& x) { return std::string(OptionsOf<S>::of(x).*field ? "on" : "off"); };
  a.set = [field](Arms& x, const std::string& v) { OptionsOf<S>::of(x).*field = v == "on"; };
  return a;
}

// An integer arm in [lo, hi] (T: int or int64_t).
template <typename S, typename T>
ArmSpec int_arm(std::string name, T S::*field, int64_t lo, int64_t hi, std::string summary) {
  ArmSpec a = arm_of<S>(std::move(name), ArmType::integer, std::move(summary));
  a.min = lo;
  a.max = hi;
  a.get = [field](const Arms& x) { return str(OptionsOf<S>::of(x).*field); };
  a.set = [field](Arms& x, const std::string& v) {
    OptionsOf<S>::of(x).*field = static_cast<T>(std::stoll(v));
  };
  return a;
}

// A real arm in (lo, hi] (lo_exclusive) or [lo, hi].
template <typename S>
ArmSpec real_arm(std::string name, double S::*field, double lo, bool lo_exclusive, double hi,
                 std::string summary) {
  ArmSpec a = arm_of<S>(std::move(name), ArmType::real, std::move(summary));
  a.real_min = lo;
  a.real_min_exclusive = lo_exclusive;
  a.real_max = hi;
  a.get = [field](const Arms& x) { return real_text(OptionsOf<S>::of(x).*field); };
  a.set = [field](Arms& x, const std::string& v) {
    const auto d = parse_double(v);
    MTP_REQUIRE(d.has_value(), "\"", v, "\" is not a number");
    OptionsOf<S>::of(x).*field = *d;
  };
  return a;
}

// The sampling verification's arms: in effect with verify: sampling only.
std::vector<ArmSpec> sampling_arms() {
  using R = ReplayOptions;
  std::vector<ArmSpec> r;
  r.push_back(choice_arm("verify", kVerifyNames, &R::verify,
                         "greedy verification (draft == trace token) or speculative sampling at a "
                         "temperature, from a sampled trace (docs/acceptance.md)"));
  r.push_back(real_arm("temperature", &R::temperature, 0.0, true, 100.0,
                       "sampling verification: the temperature of both distributions (the trace's)"));
  r.push_back(int_arm("top_k", &R::top_k, 0, 1 << 24,
                      "sampling verification: keep the top_k largest logits (0: off; the trace's)"));
  r.push_back(real_arm("top_p", &R::top_p, 0.0, true, 1.0,
                       "sampling verification: keep the smallest top set of mass top_p (1: off; the "
                       "trace's)"));
  r.push_back(choice_arm("draft_proposal", kDraftProposalNames, &R::draft_proposal,
                         "sampling verification: the drafter proposes argmax q (greedy) or x ~ q "
                         "(sampled)"));
  r.push_back(
      int_arm("sampling_seed", &R::sampling_seed, 0, int64_t{1} << 62,
              "sampling verification: the seed of the acceptance coins (one per sequence and position)"));
  for (size_t i = 1; i < r.size(); ++i) r[i].only_with = "verify=sampling";
  return r;
}

// One field of the backend's kernel policy, as `kernels.<field>`.
ArmSpec kernel_arm(const std::string& field) {
  ArmSpec a;
  a.name = "kernels." + field;
  a.type = ArmType::text;
  a.text_values = ops::field_choices(field);
  a.layer = ArmLayer::backend;
  a.summary = "kernel policy: " + field + " (docs/kernels.md)";
  a.omit_at_default = true;  // added after the first schema-v2 files
  a.get = [field](const Arms& x) { return ops::field_text(x.kernels, field); };
  a.set = [field](Arms& x, const std::string& v) { ops::parse_field(x.kernels, field, v); };
  return a;
}

std::vector<ArmSpec> build_registry() {
  using drafter::DrafterOptions;
  std::vector<ArmSpec> r;
  r.push_back(choice_arm("head_sharding", model::kHeadShardingNames, &DrafterOptions::head_sharding,
                         "the lm_head replicated (none) or its vocab rows split over the ranks"));
  r.push_back(
      bool_arm("head_fp8", &DrafterOptions::head_fp8, "the draft head sweeps an E4M3 copy with row scales"));
  r.push_back(choice_arm("context_rows", drafter::kContextRowsNames, &DrafterOptions::context_rows,
                         "prefill / catch-up rows write only the caches, or run the full block"));
  r.push_back(choice_arm("skip", drafter::kSkipNames, &DrafterOptions::skip,
                         "timing arms: stop after the block (head), or run only the head (block)"));
  r.push_back(int_arm("draft_len", &DrafterOptions::draft_len, 1, 16, "k, the drafts of each propose"));
  r.push_back(choice_arm("exchange", drafter::kExchangeNames, &DrafterOptions::exchange,
                         "the cross-rank pick of the draft token of a vocab-sharded head"));
  r.push_back(choice_arm(
      "draft_rows", drafter::kDraftRowsNames, &DrafterOptions::draft_rows,
      "after verification, rewrite the drafted rows from the true hiddens, or keep the accepted ones"));
  r.push_back(bool_arm("batch_qidx", &DrafterOptions::batch_qidx,
                       "context rows' indexer queries as one batched linear (context_rows full)"));
  r.push_back(bool_arm("cuda_graph", &DrafterOptions::cuda_graph, "record each propose as one CUDA graph"));
  r.push_back(choice_arm("kv_cache_dtype", drafter::kKvDtypeNames, &DrafterOptions::kv_cache_dtype,
                         "the latent KV cache in BF16 or FP8 E4M3"));
  r.push_back(bool_arm("context_gemm", &DrafterOptions::context_gemm,
                       "context rows' projections as one batched linear per chunk"));
  r.push_back(added_later(bool_arm("index_share", &DrafterOptions::index_share,
                                   "drafts 2..k of a propose reuse draft 1's indexer pool selection")));
  r.push_back(int_arm("batch_size", &ReplayOptions::batch_size, 1, drafter::kMaxBatch,
                      "trace sequences drafted together in one batched step (continuous batching)"));
  r.push_back(choice_arm("replay", kReplayModeNames, &ReplayOptions::replay,
                         "speculative steps (serving acceptance) or teacher-forced drafts at every "
                         "position"));
  r.push_back(bool_arm("record_margins", &ReplayOptions::record_margins,
                       "record each draft's top-1 minus top-2 logit margin and log-probability (a stats pass "
                       "per step)"));
  for (auto& a : sampling_arms()) r.push_back(std::move(a));
  for (const auto field : ops::kernel_policy_fields()) r.push_back(kernel_arm(std::string(field)));
  return r;
}

// Whether `v` is an allowed canonical value of `a`.
bool allowed_value(const ArmSpec& a, const std::string& v) {
  if (a.type == ArmType::text) {
    try {
      Arms scratch;
      a.set(scratch, v);
      return a.get(scratch) == v;
    } catch (const Error&) {
      return false;
    }
  }
  if (a.type == ArmType::real) {
    const auto d = parse_double(v);
    return d && real_text(*d) == v && (a.real_min_exclusive ? *d > a.real_min : *d >= a.real_min) &&
           *d <= a.real_max;
  }
  if (a.type != ArmType::integer) return std::find(a.choices.begin(), a.choices.end(), v) != a.choices.end();
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    return used == v.size() && x >= a.min && x <= a.max;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

const char* to_string(ArmLayer layer) {
  static const char* const names[] = {"drafter", "harness", "backend"};
  return names[static_cast<size_t>(layer)];
}

std::string ArmSpec::default_value() const { return get(Arms{}); }

std::string ArmSpec::block() const {
  const auto dot = name.find('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

std::string ArmSpec::key() const {
  const auto dot = name.find('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

bool ArmSpec::in_effect(const Arms& arms) const {
  if (only_with.empty()) return true;
  const auto eq = only_with.find('=');
  const ArmSpec* other = find_arm(only_with.substr(0, eq));
  MTP_REQUIRE(other, "arm registry: ", name, " is only in effect with the unknown arm \"", only_with, "\"");
  return other->get(arms) == only_with.substr(eq + 1);
}

std::string ArmSpec::allowed() const {
  if (type == ArmType::integer) return str("[", min, ", ", max, "]");
  if (type == ArmType::real)
    return str(real_min_exclusive ? "(" : "[", real_text(real_min), ", ", real_text(real_max), "]");
  if (type == ArmType::text) return str("{", text_values, "}");
  return str("{", join(choices, ", "), "}");
}

const std::vector<ArmSpec>& arm_registry() {
  static const std::vector<ArmSpec> registry = [] {
    std::vector<ArmSpec> r = build_registry();
    // The registry's own consistency: names unique, every default allowed, get(set(v)) == v.
    for (size_t i = 0; i < r.size(); ++i) {
      for (size_t j = 0; j < i; ++j)
        MTP_REQUIRE(r[i].name != r[j].name, "arm registry: ", r[i].name, " twice");
      MTP_REQUIRE(allowed_value(r[i], r[i].default_value()), "arm registry: ", r[i].name, "'s default \"",
                  r[i].default_value(), "\" is not among its values ", r[i].allowed());
    }
    return r;
  }();
  return registry;
}

const ArmSpec* find_arm(const std::string& name) {
  for (const auto& a : arm_registry())
    if (a.name == name) return &a;
  return nullptr;
}

const std::vector<std::string>& arm_names() {
  static const std::vector<std::string> list = [] {
    std::vector<std::string> n;
    for (const auto& a : arm_registry()) n.push_back(a.name);
    return n;
  }();
  return list;
}

Arms read_arms(MapReader& m) {
  Arms arms;
  // Arms of nested blocks, read from their block's own strict reader.
  std::map<std::string, std::unique_ptr<MapReader>> blocks;
  std::vector<std::string> block_order;
  for (const auto& a : arm_registry()) {
    const std::string block = a.block();
    MapReader* reader = &m;
    if (!block.empty()) {
      auto it = blocks.find(block);
      if (it == blocks.end()) {
        std::unique_ptr<MapReader> r;
        if (auto node = m.opt(block)) {
          if (!node->is_map()) node->fail(str("expected a mapping of ", block, " keys"));
          r = std::make_unique<MapReader>(*node);
        }
        it = blocks.emplace(block, std::move(r)).first;
        block_order.push_back(block);
      }
      reader = it->second.get();
      if (!reader) continue;  // the block is absent: every arm of it at its default
    }
    const std::string fallback = a.default_value();
    std::string value;
    switch (a.type) {
      case ArmType::boolean:
        value = reader->opt_bool(a.key(), fallback == "on") ? "on" : "off";
        break;
      case ArmType::choice:
        value = reader->opt_choice(a.key(), fallback, a.choices);
        break;
      case ArmType::integer:
        value = str(reader->opt_int(a.key(), std::stoll(fallback), a.min, a.max));
        break;
      case ArmType::real:
        if (auto node = reader->opt(a.key())) {
          const double d = node->as_double(a.real_min, a.real_max);
          if (a.real_min_exclusive && d <= a.real_min) node->fail(str("expected a value in ", a.allowed()));
          value = real_text(d);
        } else {
          value = fallback;
        }
        break;
      case ArmType::text:
        if (auto node = reader->opt(a.key())) {
          if (!node->is_scalar()) node->fail(str("expected one of ", a.allowed()));
          try {
            a.set(arms, canonical_value(*node));  // YAML booleans as on / off
          } catch (const Error& e) {
            node->fail(e.message());
          }
        }
        continue;
    }
    a.set(arms, value);
  }
  for (const auto& b : block_order)
    if (blocks[b]) blocks[b]->finish();
  // Arms not in effect take their defaults: the point is the same point whatever they were set to.
  const Arms as_read = arms;
  for (const auto& a : arm_registry())
    if (!a.in_effect(as_read)) a.set(arms, a.default_value());
  return arms;
}

std::string real_text(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  MTP_REQUIRE(res.ec == std::errc(), "cannot format ", v);
  return std::string(buf, res.ptr);
}

std::vector<std::pair<std::string, std::string>> named(const Arms& arms) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& a : arm_registry()) out.emplace_back(a.name, a.get(arms));
  return out;
}

void emit_canonical(const Arms& arms, YAML::Emitter& e) {
  // Top-level arms in registry order, then each nested block as one mapping.
  std::vector<std::string> blocks;
  for (const auto& a : arm_registry()) {
    const std::string v = a.get(arms);
    if (a.omit_at_default && v == a.default_value()) continue;
    if (!a.block().empty()) {
      if (std::find(blocks.begin(), blocks.end(), a.block()) == blocks.end()) blocks.push_back(a.block());
      continue;
    }
    e << YAML::Key << a.name << YAML::Value << v;
  }
  for (const auto& b : blocks) {
    e << YAML::Key << b << YAML::Value << YAML::BeginMap;
    for (const auto& a : arm_registry()) {
      if (a.block() != b) continue;
      const std::string v = a.get(arms);
      if (a.omit_at_default && v == a.default_value()) continue;
      e << YAML::Key << a.key() << YAML::Value << v;
    }
    e << YAML::EndMap;
  }
}

void check_arms(const Arms& arms, int world, const std::string& backend, const model::ModelConfig& model) {
  const int graphs = backend == "cpu" ? 0 : backend == "cuda" ? 1 : -1;
  drafter::check_options(arms.drafter, drafter::OptionsContext{world, model.vocab, graphs});
  ops::validate(arms.kernels);
  const ReplayOptions& r = arms.replay;
  if (r.verify == Verify::sampling) {
    // The intrinsic ranges are the registry's; these are the rules against the other arms.
    MTP_REQUIRE(std::isfinite(r.temperature) && r.temperature > 0, "temperature ", r.temperature,
                " must be > 0 with verify: sampling");
    MTP_REQUIRE(r.top_p > 0 && r.top_p <= 1, "top_p ", r.top_p, " must be in (0, 1] with verify: sampling");
    MTP_REQUIRE(r.top_k >= 0 && r.top_k <= model.vocab, "top_k ", r.top_k, " must be in [0, model.vocab ",
                model.vocab, "] with verify: sampling (0: off)");
    MTP_REQUIRE(arms.drafter.skip == drafter::Skip::none,
                "verify: sampling needs the drafter's head and block "
                "(skip: none), got skip: ",
                drafter::to_string(arms.drafter.skip),
                " (the skip arms time parts of a step; they give no distribution to verify)");
    MTP_REQUIRE(r.replay == ReplayMode::speculative,
                "replay: teacher_forced with verify: sampling is not supported yet (teacher-forced depth "
                "figures are greedy: draft j == trace token j); use verify: greedy");
  }
}

}  // namespace mtplab::harness
