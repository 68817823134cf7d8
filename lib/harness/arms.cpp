// The arm registry (arms.hpp): the replay's arms described here, the drafter's and the kernel
// policy's lifted from their structs' tables, and the readers and writers that walk the registry.
#include "harness/arms.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "core/error.hpp"
#include "drafter/drafter.hpp"
#include "harness/experiment.hpp"

namespace mtplab::harness {
namespace {

// The replay's own arms (ReplayOptions), in schema order; the sampling verification's arms after
// `verify` are in effect with verify: sampling only.
std::vector<Setting<ReplayOptions>> replay_settings() {
  using R = ReplayOptions;
  std::vector<Setting<R>> r;
  r.push_back(int_setting("batch_size", &R::batch_size, 1, drafter::kMaxBatch,
                          "trace sequences drafted together in one batched step (continuous batching)"));
  r.push_back(choice_setting("replay", &R::replay, kReplayModeNames,
                             "speculative steps (serving acceptance) or teacher-forced drafts at every "
                             "position"));
  r.push_back(bool_setting("record_margins", &R::record_margins,
                           "record each draft's top-1 minus top-2 logit margin and log-probability (a stats "
                           "pass per step)"));
  r.push_back(choice_setting("verify", &R::verify, kVerifyNames,
                             "greedy verification (draft == trace token) or speculative sampling at a "
                             "temperature, from a sampled trace (docs/acceptance.md)"));
  r.push_back(real_setting("temperature", &R::temperature, 0.0, true, 100.0,
                           "sampling verification: the temperature of both distributions (the trace's)"));
  r.push_back(int_setting("top_k", &R::top_k, 0, 1 << 24,
                          "sampling verification: keep the top_k largest logits (0: off; the trace's)"));
  r.push_back(real_setting("top_p", &R::top_p, 0.0, true, 1.0,
                           "sampling verification: keep the smallest top set of mass top_p (1: off; the "
                           "trace's)"));
  r.push_back(choice_setting("draft_proposal", &R::draft_proposal, kDraftProposalNames,
                             "sampling verification: the drafter proposes argmax q (greedy) or x ~ q "
                             "(sampled)"));
  r.push_back(int_setting("sampling_seed", &R::sampling_seed, 0, int64_t{1} << 62,
                          "sampling verification: the seed of the acceptance coins (one per sequence and "
                          "position)"));
  return r;
}

// The arms sampling verification brings: in effect with verify: sampling only.
bool sampling_only(const std::string& name) {
  return name == "temperature" || name == "top_k" || name == "top_p" || name == "draft_proposal" ||
         name == "sampling_seed";
}

ArmSpec arm_of(Setting<Arms> s, ArmLayer layer) {
  ArmSpec a;
  static_cast<Setting<Arms>&>(a) = std::move(s);
  a.layer = layer;
  return a;
}

std::vector<ArmSpec> build_registry() {
  std::vector<ArmSpec> r;
  for (const auto& s : drafter::drafter_settings())
    r.push_back(arm_of(nested(s, &Arms::drafter), ArmLayer::drafter));
  for (const auto& s : replay_settings()) {
    r.push_back(arm_of(nested(s, &Arms::replay), ArmLayer::harness));
    if (sampling_only(s.name)) r.back().only_with = "verify=sampling";
  }
  for (const auto& s : ops::kernel_policy_settings())
    r.push_back(arm_of(nested(s, &Arms::kernels, "kernels"), ArmLayer::backend));
  return r;
}

}  // namespace

const char* to_string(ArmLayer layer) {
  static const char* const names[] = {"drafter", "harness", "backend"};
  return names[static_cast<size_t>(layer)];
}

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

const std::vector<ArmSpec>& arm_registry() {
  static const std::vector<ArmSpec> registry = [] {
    std::vector<ArmSpec> r = build_registry();
    check_settings(r, "arm registry");
    for (const ArmSpec& a : r) {
      if (a.only_with.empty()) continue;
      const std::string other = a.only_with.substr(0, a.only_with.find('='));
      MTP_REQUIRE(std::any_of(r.begin(), r.end(), [&](const ArmSpec& b) { return b.name == other; }),
                  "arm registry: ", a.name, " is only in effect with the unknown arm \"", a.only_with, "\"");
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
    read_setting<Arms>(*reader, a.key(), a, arms);
  }
  for (const auto& b : block_order)
    if (blocks[b]) blocks[b]->finish();
  // Arms not in effect take their defaults: the point is the same point whatever they were set to.
  const Arms as_read = arms;
  for (const auto& a : arm_registry())
    if (!a.in_effect(as_read)) a.set(arms, a.default_value());
  return arms;
}

std::string choice_value(const ArmSpec& a, const YamlNode& node) { return setting_choice(a, node); }

std::vector<std::pair<std::string, std::string>> named(const Arms& arms) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& a : arm_registry()) out.emplace_back(a.name, a.get(arms));
  return out;
}

void emit_canonical(const std::function<std::string(const ArmSpec&)>& value_of, YAML::Emitter& e) {
  // Top-level arms in registry order, then each nested block as one mapping.
  std::vector<std::string> blocks;
  for (const auto& a : arm_registry()) {
    if (!a.block().empty()) {
      if (std::find(blocks.begin(), blocks.end(), a.block()) == blocks.end()) blocks.push_back(a.block());
      continue;
    }
    e << YAML::Key << a.name << YAML::Value << value_of(a);
  }
  for (const auto& b : blocks) {
    e << YAML::Key << b << YAML::Value << YAML::BeginMap;
    for (const auto& a : arm_registry())
      if (a.block() == b) e << YAML::Key << a.key() << YAML::Value << value_of(a);
    e << YAML::EndMap;
  }
}

void emit_canonical(const Arms& arms, YAML::Emitter& e) {
  emit_canonical([&](const ArmSpec& a) { return a.get(arms); }, e);
}

void check_arms(const Arms& arms, int world, const std::string& backend, const model::ModelConfig& model) {
  const int graphs = backend == "cpu" ? 0 : backend == "cuda" ? 1 : -1;
  // draft_len 0 (online, MTP off) runs no drafter; the drafter's other options still choose the
  // target's head sharding and exchange, so they are checked as a drafter's.
  drafter::DrafterOptions d = arms.drafter;
  if (d.draft_len == 0) d.draft_len = 1;
  drafter::check_options(d, drafter::OptionsContext{world, model.vocab, graphs});
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
