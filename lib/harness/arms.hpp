// The arm registry: every arm of an experiment, each described once by a setting descriptor
// (core/setting.hpp) where its options struct is: the drafter's arms by drafter::drafter_settings(),
// the replay's by the table in arms.cpp, the backend's kernel choices by
// ops::kernel_policy_settings() (as `kernels.<field>`). This registry lifts those tables into Arms
// and adds what is the harness's own (the layer, the arms in effect only with another's value).
// The YAML reader, the sweep expansion, the canonical text (a point's identity), `mtplab list`, the
// results writer (attributes and /index columns), `mtplab upgrade`, the divergence table and the
// tests all walk this one table; none of them spells an arm by hand.
//
// Adding an arm is one entry in its struct's table plus its implementation in the layer that
// consumes it (docs/architecture.md, "Adding an arm", walks through one).
//
// Invariants:
// - An arm's default is the value of its field in a default-constructed Arms: defaults live in
//   the option structs (drafter::DrafterOptions, ...), nowhere else.
// - Canonical values are the YAML spellings: booleans as off/on, choices as listed, integers in
//   decimal. get(set(v)) == v for every allowed v (tested over the whole registry).
// - Every arm is in a point's canonical text and results at every value, its default included.
// - The rules between arms are checked in one function, check_arms(), which the sweep expansion
//   calls for every point before anything runs (it defers to drafter::check_options for the
//   drafter's arms, which the drafter's constructor also calls).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/setting.hpp"
#include "core/yaml.hpp"
#include "drafter/options.hpp"
#include "model/config.hpp"
#include "ops/kernel_policy.hpp"

namespace mtplab::harness {

/// `replay`: what a replay estimates (docs/experiments.md, "Replay modes"). speculative: serving
/// steps, each starting where the previous one ended (harness/replay.hpp); teacher_forced: k
/// drafts at every position of the trace, the chain fed the trace's tokens
/// (harness/replay_teacher.hpp).
enum class ReplayMode { speculative, teacher_forced };
inline constexpr const char* kReplayModeNames[] = {"speculative", "teacher_forced"};
/// `verify`: how replay decides which drafts the target accepts (docs/acceptance.md).
enum class Verify { greedy, sampling };
inline constexpr const char* kVerifyNames[] = {"greedy", "sampling"};
/// `draft_proposal` (sampling verification): the drafter's token x ~ q (sampled) or argmax q.
enum class DraftProposal { greedy, sampled };
inline constexpr const char* kDraftProposalNames[] = {"greedy", "sampled"};

/// The replay's own arms (harness/replay.hpp).
struct ReplayOptions {
  /// `batch_size`: B trace sequences stepped together, one batched propose for all of them
  /// (continuous batching); 1 replays one sequence at a time through the single-sequence path.
  int batch_size = 1;
  /// `replay`: speculative steps or teacher-forced positions.
  ReplayMode replay = ReplayMode::speculative;
  /// `record_margins`: every propose also computes each draft's DraftStats (the head's top-1 minus
  /// top-2 logit margin and the draft's log-probability), recorded as draft_margin /
  /// draft_logprob. Off saves the stats pass (on the CPU at the tiny preset about 75% of a step).
  bool record_margins = true;
  /// `verify`: greedy (a draft is accepted when it equals the trace's token) or sampling
  /// (speculative sampling at `temperature` / `top_k` / `top_p`, from a trace sampled with them).
  Verify verify = Verify::greedy;
  /// The transform both distributions go through under sampling verification: temperature > 0,
  /// top_k (0: off), top_p in (0, 1] (1: off).
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
  /// `draft_proposal`: what the drafter proposes under sampling verification. greedy (argmax q)
  /// is what vLLM's and SGLang's MTP drafters propose by default.
  DraftProposal draft_proposal = DraftProposal::greedy;
  /// `sampling_seed`: the seed of the acceptance coins (one uniform per sequence and trace
  /// position, counter-based: harness::verify_uniform).
  int64_t sampling_seed = 1;
  friend bool operator==(const ReplayOptions&, const ReplayOptions&) = default;
};

/// Every arm's value for one point. The drafter's arms live in the drafter's own options struct,
/// which crosses to the drafter as it is; the replay's and the backend's kernel policy sit beside
/// it, each the struct its layer consumes.
struct Arms {
  drafter::DrafterOptions drafter;
  ReplayOptions replay;
  /// The `kernels:` block: the backend's kernel choices (ops/kernel_policy.hpp). After expansion
  /// it holds the effective policy, MTPLAB_* environment overrides applied.
  ops::KernelPolicy kernels;
};

/// The layer whose code reads the arm's value.
enum class ArmLayer { drafter, harness, backend };
const char* to_string(ArmLayer layer);

/// One arm: its setting descriptor over Arms (name, type, values, canonical text, parser, where it
/// is recorded) and what the harness adds to it.
struct ArmSpec : Setting<Arms> {
  /// "arm=value": the arm is in effect only when that other arm has that value; otherwise
  /// read_arms normalises it to its default, so that points that differ only in an arm not in
  /// effect are the same point (e.g. temperature under verify: greedy). Empty: always in effect.
  std::string only_with;
  bool sweepable = true;
  ArmLayer layer = ArmLayer::drafter;

  /// The YAML block the arm sits in ("" for the top level) and its key within it.
  std::string block() const;
  std::string key() const;
  /// Whether the arm is in effect for `arms` (only_with).
  bool in_effect(const Arms& arms) const;
};

/// Every arm, in schema order (the order of the canonical text and the results columns).
const std::vector<ArmSpec>& arm_registry();
/// The arm named `name`, or nullptr.
const ArmSpec* find_arm(const std::string& name);
/// The names of the arms, in schema order.
const std::vector<std::string>& arm_names();

/// Canonical text of a scalar value (experiment.hpp).
std::string canonical_value(const YamlNode& node);

/// The value of choice setting `s` at `node`: one of its choices, else an Error at the node with
/// the descriptor's own refusal where it says more than the choices (a kernel kept only for
/// comparison says where it went, ops/kernel_policy.cpp).
template <class Owner>
std::string setting_choice(const Setting<Owner>& s, const YamlNode& node) {
  if (node.is_scalar()) {
    const std::string v = node.as_string();
    if (std::find(s.choices.begin(), s.choices.end(), v) != s.choices.end()) return v;
    Owner scratch{};
    try {
      s.set(scratch, v);
    } catch (const Error& e) {
      node.fail(e.message());
    }
  }
  return node.as_choice(s.choices);
}

/// Reads setting `s` from `key` of `reader` into `owner`, or sets its default when the key is
/// absent; a bad value is an Error at the value naming the key and the allowed values (the arms'
/// reader, read_arms, reads each arm this way).
template <class Owner>
void read_setting(MapReader& reader, const std::string& key, const Setting<Owner>& s, Owner& owner) {
  const std::string fallback = s.default_value();
  std::string value;
  switch (s.type) {
    case SettingType::boolean:
      value = reader.opt_bool(key, fallback == "on") ? "on" : "off";
      break;
    case SettingType::choice:
      if (auto node = reader.opt(key))
        value = setting_choice(s, *node);
      else
        value = fallback;
      break;
    case SettingType::integer:
      value = str(reader.opt_int(key, std::stoll(fallback), s.min, s.max));
      break;
    case SettingType::real:
      if (auto node = reader.opt(key)) {
        const double d = node->as_double(s.real_min, s.real_max);
        if (s.real_min_exclusive && d <= s.real_min) node->fail(str("expected a value in ", s.allowed()));
        value = real_text(d);
      } else {
        value = fallback;
      }
      break;
    case SettingType::text:
      if (auto node = reader.opt(key)) {
        if (!node->is_scalar()) node->fail(str("expected one of ", s.allowed()));
        try {
          s.set(owner, canonical_value(*node));  // YAML booleans as on / off
        } catch (const Error& e) {
          node->fail(e.message());
        }
      } else {
        s.set(owner, fallback);
      }
      return;
  }
  s.set(owner, value);
}

/// Reads every arm from the point's mapping `m` (arms of a nested block from that block, which is
/// then finished: unknown keys in it are errors). Values are checked against the registry; arms
/// not in effect (ArmSpec::only_with) are normalised to their defaults.
Arms read_arms(MapReader& m);
/// A choice arm's value at `node`: one of its choices, else an Error at the node with the message
/// of the arm's descriptor (the value and the choices, and what more it says: a retired kernel
/// names where it went).
std::string choice_value(const ArmSpec& a, const YamlNode& node);
/// (name, canonical value) of every arm in schema order.
std::vector<std::pair<std::string, std::string>> named(const Arms& arms);

/// Every arm as canonical YAML mapping entries in schema order (the top-level arms, then each
/// nested block as one sub-mapping), at every value: the arms' part of a point's canonical text.
/// `value_of(arm)` gives each arm's canonical text.
void emit_canonical(const std::function<std::string(const ArmSpec&)>& value_of, YAML::Emitter& e);
/// The same with the values of `arms`.
void emit_canonical(const Arms& arms, YAML::Emitter& e);

/// The rules between a point's arms and its context: the world size, the backend ("cpu",
/// "cuda", or "auto" when not yet known) and the model. Throws naming the arm that is wrong.
void check_arms(const Arms& arms, int world, const std::string& backend, const model::ModelConfig& model);

}  // namespace mtplab::harness
