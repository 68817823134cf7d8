// Experiment schema, sweep expansion and summaries, without MPI:
// - defaults, the cartesian product in axis order (last axis fastest), exclude: entries;
// - --set overrides (arms, measure keys, grid axes, model keys on a preset) and strictness
//   (unknown keys, bad values, the file:line:col of a grid value);
// - points that cannot run at the given world size are reported together, unless excluded;
// - canonical configs ignore spelling (on / true) but not values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>

#include "common/error_of.hpp"
#include "experiment_text.hpp"
#include "harness/experiment.hpp"
#include "harness/results.hpp"

using namespace mtplab;
using namespace mtplab::harness;

namespace {

const std::string kBase = test::tiny_experiment(
    "sequences: 2, prompt_len: 8, new_tokens: 16, seed: 5, layers: 1", R"(measure: {warmup_steps: 1}
output: out.h5
backend: cpu
sweep:
  grid:
    head_sharding: [none, vocab]
    head_fp8: [off, on]
    skip: [none, head, block]
)");

// One point, no sweep, backend auto: every arm value can run there at 2 ranks.
const std::string kSingle = test::tiny_experiment(
    "sequences: 2, prompt_len: 8, new_tokens: 40, seed: 5, layers: 1", "output: out.h5\n");

// kSingle with its trace sampled at T = 1 (top_k 0, top_p 1: the sampling arms' defaults), so that
// `verify: sampling` can run on it too (greedy verification replays any trace).
const std::string kSingleSampled = test::tiny_experiment(
    "sequences: 2, prompt_len: 8, new_tokens: 40, seed: 5, layers: 1, sampling: sampling",
    "output: out.h5\n");

std::string message_of(const std::function<void()>& f) { return mtplab::test::error_of(f); }

}  // namespace

TEST(Experiment, DefaultsAndProductOrder) {
  const Experiment ex = parse_experiment(kBase, "exp.yaml", {}, 2);
  ASSERT_EQ(ex.points.size(), 12u);
  ASSERT_EQ(ex.axes.size(), 3u);
  // Last axis fastest.
  EXPECT_EQ(ex.points[0].label(), "head_sharding=none head_fp8=off skip=none");
  EXPECT_EQ(ex.points[1].label(), "head_sharding=none head_fp8=off skip=head");
  EXPECT_EQ(ex.points[3].label(), "head_sharding=none head_fp8=on skip=none");
  EXPECT_EQ(ex.points[11].label(), "head_sharding=vocab head_fp8=on skip=block");
  const PointConfig& p = ex.points[11];
  EXPECT_EQ(p.index, 11);
  EXPECT_EQ(p.name(), "p0011");
  EXPECT_EQ(p.arms.drafter.head_sharding, drafter::HeadSharding::vocab);
  EXPECT_TRUE(p.arms.drafter.head_fp8);
  EXPECT_EQ(p.arms.drafter.skip, drafter::Skip::block);
  EXPECT_EQ(p.arms.drafter.draft_len, 3);  // default
  EXPECT_EQ(p.arms.drafter.exchange, drafter::Exchange::packed_u64);
  EXPECT_EQ(p.model.name, "tiny");
  EXPECT_EQ(p.model.max_seq_len, 128);  // preset 4096, overridden
  EXPECT_EQ(p.weights.seed, 3u);
  EXPECT_TRUE(p.trace.synthetic);
  EXPECT_EQ(p.trace.new_tokens, 16);
  EXPECT_EQ(p.measure.warmup_steps, 1);
  EXPECT_EQ(p.measure.repeats, 1);
  EXPECT_EQ(ex.output, "out.h5");
  // Same document, same configuration; the world size is part of it.
  EXPECT_EQ(parse_experiment(kBase, "exp.yaml", {}, 2).configuration, ex.configuration);
  EXPECT_NE(parse_experiment(kBase, "exp.yaml", {}, 1).configuration, ex.configuration);
  // The output does not change it (array tasks write different files).
  EXPECT_EQ(parse_experiment(kBase, "exp.yaml", {"output=other.h5"}, 2).configuration, ex.configuration);
}

TEST(Experiment, ExcludeRemovesPartialAssignments) {
  const std::string text =
      std::string(kBase) + "  exclude:\n    - {head_sharding: none, skip: [head, block]}\n";
  const Experiment ex = parse_experiment(text, "exp.yaml", {}, 2);
  EXPECT_EQ(ex.points.size(), 12u - 4u);
  for (const auto& p : ex.points)
    EXPECT_FALSE(p.arms.drafter.head_sharding == drafter::HeadSharding::none &&
                 p.arms.drafter.skip != drafter::Skip::none)
        << p.label();
  // Numbering is dense after exclusion.
  for (size_t i = 0; i < ex.points.size(); ++i) EXPECT_EQ(ex.points[i].index, static_cast<int>(i));
  EXPECT_EQ(ex.find_point({{"head_sharding", "none"}, {"head_fp8", "off"}, {"skip", "head"}}), -1);
  EXPECT_GE(ex.find_point({{"head_sharding", "vocab"}, {"head_fp8", "off"}, {"skip", "head"}}), 0);
  // An exclude value that is not an axis value is a typo, reported with its location.
  const std::string bad = std::string(kBase) + "  exclude:\n    - {skip: heads}\n";
  const std::string msg = message_of([&] { parse_experiment(bad, "exp.yaml", {}, 2); });
  EXPECT_NE(msg.find("exp.yaml:16:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"heads\" is not among the values of axis skip"), std::string::npos) << msg;
}

TEST(Experiment, OverridesFromTheCommandLine) {
  const Experiment ex = parse_experiment(kBase, "exp.yaml",
                                         {"draft_len=5", "measure.sequences=1", "sweep.grid.head_fp8=[on]",
                                          "model.index_topk=8", "exchange=allgather_pairs"},
                                         2);
  ASSERT_EQ(ex.points.size(), 6u);
  for (const auto& p : ex.points) {
    EXPECT_EQ(p.arms.drafter.draft_len, 5);
    EXPECT_TRUE(p.arms.drafter.head_fp8);
    EXPECT_EQ(p.measure.sequences, 1);
    EXPECT_EQ(p.model.index_topk, 8);
    EXPECT_EQ(p.model.max_seq_len, 128);  // the file's override survives a --set of another key
    EXPECT_EQ(p.arms.drafter.exchange, drafter::Exchange::allgather_pairs);
  }
  // A model key on a plain preset name works too.
  std::string plain = kBase;
  plain.replace(plain.find("model:\n  preset: tiny\n  max_seq_len: 128\n"), 40, "model: tiny\n");
  const Experiment ex2 = parse_experiment(plain, "exp.yaml", {"model.max_seq_len=64"}, 2);
  EXPECT_EQ(ex2.points[0].model.max_seq_len, 64);
  // Bad values and unknown keys name the override.
  std::string msg = message_of([&] { parse_experiment(kBase, "exp.yaml", {"measure.warmup=3"}, 2); });
  EXPECT_NE(msg.find("unknown key \"warmup\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("--set measure.warmup=3"), std::string::npos) << msg;
  msg = message_of([&] { parse_experiment(kBase, "exp.yaml", {"draft_len=17"}, 2); });
  EXPECT_NE(msg.find("draft_len: value 17 is out of range [0, 16]"), std::string::npos) << msg;
  msg = message_of([&] { parse_experiment(kBase, "exp.yaml", {"draft_len=0"}, 2); });
  EXPECT_NE(msg.find("draft_len 0 (MTP off: the target decodes alone) needs mode: online"), std::string::npos)
      << msg;
  msg = message_of([&] { parse_experiment(kBase, "exp.yaml", {"draft_len"}, 2); });
  EXPECT_NE(msg.find("expected key.path=value"), std::string::npos) << msg;
}

TEST(Experiment, StrictKeysWithLocations) {
  std::string text = kBase;
  text.replace(text.find("measure: {warmup_steps: 1}"), 26, "measure: {warmup_step: 1}");
  std::string msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 2); });
  EXPECT_NE(msg.find("exp.yaml:7:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("measure.warmup_step: unknown key"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean \"warmup_steps\""), std::string::npos) << msg;

  text = kBase;
  text.replace(text.find("skip: [none, head, block]"), 25, "skip: [none, hed]");
  msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 2); });
  EXPECT_NE(msg.find("exp.yaml:14:18"), std::string::npos) << msg;  // the value in the grid
  EXPECT_NE(msg.find("\"hed\" is not one of"), std::string::npos) << msg;

  text = std::string(kBase) + "    output: [a.h5, b.h5]\n";
  msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 2); });
  EXPECT_NE(msg.find("\"output\" cannot be swept"), std::string::npos) << msg;

  // backend neither: one run resolves and binds one backend (docs/experiments.md, Sweeps). A
  // swept backend used to expand into points that all ran on the first point's backend.
  text = std::string(kBase) + "    backend: [cpu, cuda]\n";
  msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 2); });
  EXPECT_NE(msg.find("exp.yaml:15:14: sweep.grid.backend: \"backend\" cannot be swept"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(one run uses one backend: run each backend into its own output)"), std::string::npos)
      << msg;
  msg = message_of([&] { parse_experiment(kBase, "exp.yaml", {"sweep.grid.backend=[cpu]"}, 2); });
  EXPECT_NE(msg.find("\"backend\" cannot be swept"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(from --set sweep.grid.backend=[cpu])"), std::string::npos) << msg;

  msg = message_of([&] { parse_experiment("model: tiny\n", "exp.yaml", {}, 2); });
  EXPECT_NE(msg.find("missing required key \"trace\""), std::string::npos) << msg;
}

TEST(Experiment, UnrunnablePointsReportedAtExpansion) {
  const std::string text = std::string(kBase) + "    exchange: [packed_u64, bf16_lanes]\n";
  // bf16_lanes with a vocab-sharded head runs on exactly 2 ranks: fine at 2 ...
  EXPECT_EQ(parse_experiment(text, "exp.yaml", {}, 2).points.size(), 24u);
  // ... not at 4 (tiny's 8 heads divide over 4): 6 points cannot run, all reported at once.
  const std::string msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 4); });
  EXPECT_NE(msg.find("6 of 24 sweep point(s) cannot run with 4 rank(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bf16_lanes"), std::string::npos) << msg;
  // Excluding them makes the rest runnable.
  const std::string excluded = text + "  exclude:\n    - {head_sharding: vocab, exchange: bf16_lanes}\n";
  EXPECT_EQ(parse_experiment(excluded, "exp.yaml", {}, 4).points.size(), 18u);
  // Heads that do not divide over the world: every point.
  const std::string m3 = message_of([&] { parse_experiment(kBase, "exp.yaml", {}, 3); });
  EXPECT_NE(m3.find("n_heads"), std::string::npos) << m3;
  // cuda_graph on the cpu backend is refused.
  const std::string mg = message_of([&] { parse_experiment(kBase, "exp.yaml", {"cuda_graph=on"}, 2); });
  EXPECT_NE(mg.find("cuda_graph: on needs the cuda backend"), std::string::npos) << mg;
  // A synthetic trace longer than the context.
  const std::string ml =
      message_of([&] { parse_experiment(kBase, "exp.yaml", {"trace.synthetic.new_tokens=200"}, 2); });
  EXPECT_NE(ml.find("exceeds model.max_seq_len"), std::string::npos) << ml;
  // The synthetic target's batch: 1 .. 128, named when out of range.
  for (const char* bad :
       {"trace.synthetic.batch=0", "trace.synthetic.batch=129", "trace.synthetic.batch=two"}) {
    const std::string mb = message_of([&] { parse_experiment(kBase, "exp.yaml", {bad}, 2); });
    EXPECT_NE(mb.find("batch"), std::string::npos) << bad << ": " << mb;
  }
}

// The synthetic target's batch is part of a point's configuration (on CUDA it may change the
// trace's bits), 128 unless given.
TEST(Experiment, SyntheticTraceBatchIsConfiguration) {
  const Experiment a = parse_experiment(kBase, "exp.yaml", {}, 2);
  const Experiment b = parse_experiment(kBase, "exp.yaml", {"trace.synthetic.batch=1"}, 2);
  EXPECT_EQ(a.points[0].trace.batch, 128);
  EXPECT_EQ(b.points[0].trace.batch, 1);
  EXPECT_NE(a.configuration, b.configuration);
  EXPECT_NE(a.points[0].canonical.find("batch: 128"), std::string::npos) << a.points[0].canonical;
}

TEST(Experiment, CanonicalConfigIgnoresSpelling) {
  std::string a = kBase, b = kBase;
  b.replace(b.find("head_fp8: [off, on]"), 19, "head_fp8: [false, true]");
  const Experiment ea = parse_experiment(a, "exp.yaml", {}, 2);
  const Experiment eb = parse_experiment(b, "exp.yaml", {}, 2);
  ASSERT_EQ(ea.points.size(), eb.points.size());
  for (size_t i = 0; i < ea.points.size(); ++i) {
    EXPECT_EQ(ea.points[i].canonical, eb.points[i].canonical);
    EXPECT_EQ(ea.points[i].assignment, eb.points[i].assignment);
  }
  EXPECT_NE(ea.points[0].canonical, ea.points[1].canonical);
  const Experiment ec = parse_experiment(a, "exp.yaml", {"model.index_topk=8"}, 2);
  EXPECT_NE(ea.points[0].canonical, ec.points[0].canonical);  // the resolved model is part of it
}

// The arm registry: every arm reads from the YAML, sweeps, and appears in the canonical config
// with every value it allows; a bad value names the arm and its values. Walks the registry, so a
// new arm is covered by adding its entry.
std::vector<std::string> sample_values(const ArmSpec& a) {
  if (a.type == SettingType::text) {
    // The words of the listed values that are canonical values themselves ("auto (or 0), 1 .. 1024"
    // gives auto, 1 and 1024).
    std::vector<std::string> out;
    std::string words = a.text_values;
    for (char& c : words)
      if (c == ',' || c == '(' || c == ')') c = ' ';
    for (const auto& w : split(words, ' ')) {
      if (w.empty() || std::find(out.begin(), out.end(), w) != out.end()) continue;
      Arms scratch;
      try {
        a.set(scratch, w);
      } catch (const Error&) {
        continue;
      }
      if (a.get(scratch) == w) out.push_back(w);
    }
    return out;
  }
  if (a.type == SettingType::real) {
    // The top of the range, a value inside it, and the bottom where it is allowed.
    std::vector<std::string> out = {real_text(a.real_max),
                                    real_text(a.real_min + (a.real_max - a.real_min) * 0.35)};
    if (!a.real_min_exclusive) out.push_back(real_text(a.real_min));
    return out;
  }
  if (a.type != SettingType::integer) return a.choices;
  return {str(a.min), str((a.min + a.max) / 2), str(a.max)};
}

// An arm in effect only with another arm's value (ArmSpec::only_with): read from a mapping that
// sets that value, without the point's other rules (which may tie the arm to the trace, as the
// sampling arms are: tests/harness/test_sampling.cpp sweeps them on a matching trace).
Arms read_with(const ArmSpec& a, const std::string& v) {
  const auto eq = a.only_with.find('=');
  const std::string text =
      str(a.only_with.substr(0, eq), ": ", a.only_with.substr(eq + 1), "\n", a.name, ": ", v, "\n");
  YamlNode doc = YamlNode::load_string(text, "arms.yaml");
  MapReader m(doc);
  Arms arms = read_arms(m);
  m.finish();
  return arms;
}

TEST(ArmRegistry, EveryArmEveryValue) {
  ASSERT_FALSE(arm_registry().empty());
  for (const ArmSpec& a : arm_registry()) {
    SCOPED_TRACE(a.name);
    ASSERT_EQ(find_arm(a.name), &a);
    for (const std::string& v : sample_values(a)) {
      Arms arms;
      a.set(arms, v);
      EXPECT_EQ(a.get(arms), v);
      if (!a.only_with.empty()) {
        const Arms read = read_with(a, v);
        EXPECT_EQ(a.get(read), v);
        YAML::Emitter e;
        e << YAML::BeginMap;
        emit_canonical(read, e);
        e << YAML::EndMap;
        const std::string canonical = str("\n", e.c_str());
        EXPECT_NE(canonical.find(str("\n", a.name, ": ", v)), std::string::npos) << canonical;
        // Not in effect (the registry's default for the other arm): normalised to the default.
        const Experiment ex = parse_experiment(kSingleSampled, "exp.yaml", {str(a.name, "=", v)}, 2);
        EXPECT_EQ(a.get(ex.points[0].arms), a.default_value());
        continue;
      }
      // Set through the YAML (--set), read back through the point and its canonical text.
      // draft_len 0 (MTP off) is an online point's value (test_online.cpp: a replay refuses it).
      std::vector<std::string> sets = {str(a.name, "=", v)};
      if (a.name == "draft_len" && v == "0") sets.push_back("mode=online");
      const Experiment ex = parse_experiment(kSingleSampled, "exp.yaml", sets, 2);
      for (const auto& p : ex.points) {
        const auto n = named(p.arms);
        const auto it = std::find_if(n.begin(), n.end(), [&](const auto& kv) { return kv.first == a.name; });
        ASSERT_NE(it, n.end());
        EXPECT_EQ(it->second, v);
        // In the canonical text as `key: value` (a nested block's key indented under it), at
        // every value, its default included.
        const std::string entry =
            a.block().empty() ? str("\n", a.name, ": ", v) : str("\n  ", a.key(), ": ", v);
        EXPECT_NE(p.canonical.find(entry), std::string::npos) << p.canonical;
      }
    }
    // A value outside the arm's values is refused, naming the arm.
    const std::string bad = a.type == SettingType::integer ? str(a.max + 1)
                            : a.type == SettingType::real  ? str(a.real_max * 2 + 1)
                                                           : "sometimes";
    ASSERT_FALSE(sample_values(a).empty());
    const std::string msg =
        message_of([&] { parse_experiment(kSingleSampled, "exp.yaml", {str(a.name, "=", bad)}, 2); });
    EXPECT_NE(msg.find(a.key()), std::string::npos) << msg;
    // Sweepable arms sweep: one axis of two values doubles the points.
    if (a.sweepable && a.only_with.empty()) {
      const auto vals = sample_values(a);
      const std::vector<std::string> mode =
          a.name == "draft_len" ? std::vector<std::string>{"mode=online"} : std::vector<std::string>{};
      const Experiment one = parse_experiment(kSingleSampled, "exp.yaml", mode, 2);
      std::vector<std::string> sets = mode;
      sets.push_back(str("sweep.grid.", a.name, "=[", vals.front(), ",", vals.back(), "]"));
      const Experiment swept = parse_experiment(kSingleSampled, "exp.yaml", sets, 2);
      EXPECT_EQ(swept.points.size(), 2 * one.points.size());
    }
  }
}

TEST(ArmRegistry, DefaultsComeFromTheOptionStructs) {
  const drafter::DrafterOptions d;
  EXPECT_EQ(find_arm("draft_len")->default_value(), str(d.draft_len));
  EXPECT_EQ(find_arm("head_fp8")->default_value(), d.head_fp8 ? "on" : "off");
  EXPECT_EQ(find_arm("exchange")->default_value(), drafter::to_string(d.exchange));
  const Experiment ex = parse_experiment(kBase, "exp.yaml", {}, 2);
  EXPECT_EQ(ex.points[0].arms.drafter.draft_len, d.draft_len);
}

// The rules between arms live in one function (drafter::check_options), which the expansion
// runs for every point and the drafter's constructor runs again.
TEST(ArmRegistry, RulesAreCheckedAtExpansion) {
  const std::string bf16 = message_of([] {
    parse_experiment(kBase, "exp.yaml", {"exchange=bf16_lanes", "sweep.grid.head_sharding=[vocab]"}, 4);
  });
  EXPECT_NE(bf16.find("exactly 2 ranks"), std::string::npos) << bf16;
  const std::string graph = message_of([] {
    parse_experiment(kBase, "exp.yaml", {"cuda_graph=on", "backend=cpu"}, 1);
  });
  EXPECT_NE(graph.find("cuda_graph"), std::string::npos) << graph;
  drafter::DrafterOptions o;
  o.head_sharding = drafter::HeadSharding::vocab;
  o.exchange = drafter::Exchange::bf16_lanes;
  o.cuda_graph = true;
  EXPECT_THROW(drafter::check_options(o, {2, 4096, 1}), Error);
  o.cuda_graph = false;
  EXPECT_NO_THROW(drafter::check_options(o, {2, 4096, 1}));
  EXPECT_THROW(drafter::check_options(o, {2, int64_t{1} << 25, 1}), Error);
}

TEST(Experiment, ShippedBatchQidxExperiment) {
  // experiments/batch-qidx.yaml: batch_qidx off and on at context_rows full, mapped onto the
  // drafter's options (the selection check on), sparse selections in the prefill.
  const char* src = std::getenv("MTPLAB_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "MTPLAB_SOURCE_DIR is not set";
  const Experiment ex = load_experiment(std::string(src) + "/experiments/batch-qidx.yaml", {}, 1);
  ASSERT_EQ(ex.points.size(), 2u);
  for (const PointConfig& p : ex.points) {
    EXPECT_EQ(p.model.name, "glm5.3-flash");
    EXPECT_EQ(p.arms.drafter.context_rows, drafter::ContextRows::full);
    EXPECT_EQ(p.backend, "cuda");
    EXPECT_GT(p.trace.prompt_len - 1, p.model.index_topk + p.model.index_kpool - 1);
    const drafter::DrafterOptions o = p.arms.drafter;
    EXPECT_EQ(o.batch_qidx, p.arms.drafter.batch_qidx);
    EXPECT_TRUE(o.selection_check);
  }
  EXPECT_FALSE(ex.points[0].arms.drafter.batch_qidx);
  EXPECT_TRUE(ex.points[1].arms.drafter.batch_qidx);
}

TEST(Experiment, IdentityHashIsStandardFnv1a) {
  // A results file's identity is the standard FNV-1a 64 (values from a Python loop over its
  // definition) of the configuration text, then "\n" key "=" value per input.
  EXPECT_EQ(results_identity("", {}), "cbf29ce484222325");
  EXPECT_EQ(results_identity("model: tiny\nworld=2", {}), "45f53a297b0f6467");
  EXPECT_EQ(results_identity("model: tiny", {{"world", "2"}}), "45f53a297b0f6467");
  // The configuration: the resolved YAML without `output`, and the world size.
  EXPECT_EQ(configuration_text("output: x.h5\nmodel: tiny", 2), "model: tiny\nworld=2");
  const Experiment ex = parse_experiment(kBase, "exp.yaml", {}, 2);
  EXPECT_EQ(ex.configuration, configuration_text(ex.resolved_yaml, 2));
  EXPECT_EQ(ex.configuration.find("output"), std::string::npos);
  EXPECT_NE(results_identity(ex.configuration, {}),
            results_identity(parse_experiment(kBase, "exp.yaml", {}, 1).configuration, {}));
}

// A point's model section is every field of the model table in table order, reals with 6
// significant digits: its bytes are hashed into every results file's point identity, so they are
// pinned here (a change of order or number format would orphan the results already written).
TEST(Experiment, ModelSectionOfThePointIdentityIsPinned) {
  const Experiment ex = parse_experiment(kBase, "exp.yaml", {}, 2);
  const std::string& text = ex.points[0].canonical;
  const size_t end = text.find("\nweights:");
  ASSERT_NE(end, std::string::npos) << text;
  EXPECT_EQ(text.substr(0, end),
            "model:\n"
            "  spec: tiny\n"
            "  name: tiny\n"
            "  hidden: 128\n"
            "  vocab: 4096\n"
            "  rms_norm_eps: 1e-05\n"
            "  n_heads: 8\n"
            "  qk_nope_head_dim: 32\n"
            "  qk_rope_head_dim: 0\n"
            "  v_head_dim: 32\n"
            "  q_lora_rank: 64\n"
            "  kv_lora_rank: 64\n"
            "  index_n_heads: 4\n"
            "  index_head_dim: 32\n"
            "  index_topk: 16\n"
            "  index_kpool: 4\n"
            "  index_norm_eps: 1e-06\n"
            "  n_routed_experts: 8\n"
            "  num_experts_per_tok: 2\n"
            "  n_shared_experts: 1\n"
            "  moe_intermediate_size: 64\n"
            "  n_group: 1\n"
            "  topk_group: 1\n"
            "  routed_scaling_factor: 2.5\n"
            "  swiglu_limit: 10\n"
            "  max_seq_len: 128\n"
            "  block_size: 64\n"
            "  mtp_layer_index: 45\n"
            "  embed_tokens_name: model.language_model.embed_tokens.weight\n"
            "  lm_head_name: lm_head.weight\n"
            "  mtp_prefix: model.language_model.layers.45.");
}

// The `kernels:` block: read strictly into the point's kernel policy, part of its canonical
// config (so of the resume check); an MTPLAB_* variable overrides a field and is recorded.
TEST(ArmRegistry, KernelsBlock) {
  const std::string text = std::string(kSingle) + "kernels:\n  gemv_variant: rows4\n  pdl: false\n";
  const Experiment ex = parse_experiment(text, "exp.yaml", {}, 1);
  const PointConfig& p = ex.points.at(0);
  EXPECT_EQ(p.arms.kernels.gemv_variant, ops::GemvVariant::rows4);
  EXPECT_FALSE(p.arms.kernels.pdl);
  EXPECT_NE(p.canonical.find("kernels:\n  gemv_variant: rows4\n"), std::string::npos) << p.canonical;
  EXPECT_NE(p.canonical.find("\n  pdl: off\n"), std::string::npos) << p.canonical;
  EXPECT_TRUE(p.kernel_env_overrides.empty());
  // At the defaults the block is in the canonical text too, every field at its value.
  const std::string plain = parse_experiment(kSingle, "exp.yaml", {}, 1).points[0].canonical;
  EXPECT_NE(plain.find("kernels:\n  gemv_variant: auto\n  gemv_split: auto\n"), std::string::npos) << plain;
  // A typo in the block, and a bad value, name the key.
  const std::string typo = message_of(
      [] { parse_experiment(std::string(kSingle) + "kernels: {gemv_varient: rows4}\n", "exp.yaml", {}, 1); });
  EXPECT_NE(typo.find("gemv_variant"), std::string::npos) << typo;
  const std::string bad = message_of(
      [] { parse_experiment(std::string(kSingle) + "kernels: {mla_decode: v3}\n", "exp.yaml", {}, 1); });
  EXPECT_NE(bad.find("mla_decode"), std::string::npos) << bad;
  EXPECT_NE(bad.find("v1, v2"), std::string::npos) << bad;
  // A kernel kept only for comparison says where it went; a retired field is an unknown key.
  const std::string moved = message_of(
      [] { parse_experiment(std::string(kSingle) + "kernels: {gemv_variant: rows2}\n", "exp.yaml", {}, 1); });
  EXPECT_NE(moved.find("auto, v1, rows4, occ"), std::string::npos) << moved;
  EXPECT_NE(moved.find("dev/cuda/gemv.cu"), std::string::npos) << moved;
  const std::string swept = message_of(
      [] { parse_experiment(kSingle, "exp.yaml", {"sweep.grid.kernels.mla_batch=[shared2,shared]"}, 1); });
  EXPECT_NE(swept.find("dev/cuda/mla.cu"), std::string::npos) << swept;
  const std::string pipeline = message_of([] {
    parse_experiment(std::string(kSingle) + "kernels: {moe_pipeline: spread}\n", "exp.yaml", {}, 1);
  });
  EXPECT_NE(pipeline.find("auto, v1, slots, ringpf"), std::string::npos) << pipeline;
  EXPECT_NE(pipeline.find("dev/cuda/moe.cu"), std::string::npos) << pipeline;
  const std::string retired =
      message_of([] { parse_experiment(kSingle, "exp.yaml", {"kernels.indexer_select=v1"}, 1); });
  EXPECT_NE(retired.find("indexer_select"), std::string::npos) << retired;
  // Swept like any arm.
  EXPECT_EQ(parse_experiment(kSingle, "exp.yaml", {"sweep.grid.kernels.indexer_scores=[pools4,tiled]"}, 1)
                .points.size(),
            2u);
  // The environment overrides a field, and the point records it.
  ASSERT_EQ(setenv("MTPLAB_GEMV_SPLIT", "4", 1), 0);
  const Experiment env = parse_experiment(text, "exp.yaml", {}, 1);
  unsetenv("MTPLAB_GEMV_SPLIT");
  const PointConfig& q = env.points.at(0);
  EXPECT_EQ(q.arms.kernels.gemv_split, 4);
  ASSERT_EQ(q.kernel_env_overrides.size(), 1u);
  EXPECT_NE(q.kernel_env_overrides[0].find("MTPLAB_GEMV_SPLIT"), std::string::npos);
  EXPECT_NE(q.canonical.find("gemv_split: 4"), std::string::npos) << q.canonical;
  EXPECT_NE(q.canonical, p.canonical);
}

TEST(Experiment, ShippedBatchScalingExperiment) {
  // experiments/batch-scaling.yaml: batch_size 1 .. 128 x head_fp8 x cuda_graph at the glm5.3-flash
  // shape, a trace with enough sequences to fill B = 128.
  const char* src = std::getenv("MTPLAB_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "MTPLAB_SOURCE_DIR is not set";
  const Experiment ex = load_experiment(std::string(src) + "/experiments/batch-scaling.yaml", {}, 1);
  ASSERT_EQ(ex.points.size(), 32u);
  int largest = 0;
  for (const PointConfig& p : ex.points) {
    EXPECT_EQ(p.model.name, "glm5.3-flash");
    EXPECT_EQ(p.backend, "cuda");
    largest = std::max(largest, p.arms.replay.batch_size);
    EXPECT_GE(p.trace.sequences, p.arms.replay.batch_size);
  }
  EXPECT_EQ(largest, 128);
  EXPECT_EQ(ex.axes.at(0).name, "batch_size");
  EXPECT_EQ(ex.axes.at(0).type, ValueType::integer);
}

// ---- messages that point at the cause -------------------------------------------------------------

TEST(Experiment, InvalidSweptValueIsNamedAsWhatItIs) {
  // An arm's bad value: the grid entry, the value and the allowed values, once, not a list of
  // points that "cannot run with N ranks".
  std::string text = kBase;
  text.replace(text.find("skip: [none, head, block]"), 25, "skip: [none, hed]");
  std::string msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 2); });
  EXPECT_EQ(msg.find("exp.yaml:14:18: sweep.grid.skip[1]: \"hed\" is not one of {none, head, block}"), 0u)
      << msg;
  EXPECT_EQ(msg.find("cannot run"), std::string::npos) << msg;
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"sweep.grid.skip=[none,heda]"}, 2); });
  EXPECT_NE(msg.find("sweep.grid.skip[1]: \"heda\" is not one of {none, head, block}"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(from --set sweep.grid.skip=[none,heda])"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("cannot run"), std::string::npos) << msg;
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"sweep.grid.draft_len=[3,20]"}, 2); });
  EXPECT_NE(msg.find("sweep.grid.draft_len[1]: value 20 is out of range [0, 16]"), std::string::npos) << msg;
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"sweep.grid.kernels.mla_decode=[v2,v9]"}, 2); });
  EXPECT_NE(msg.find("sweep.grid.kernels.mla_decode[1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("v1, v2"), std::string::npos) << msg;
  // A value of another axis is checked when its point is read, and reported as a bad value too.
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"sweep.grid.measure.repeats=[1,0]"}, 2); });
  EXPECT_NE(msg.find("12 of 24 sweep point(s) have a swept value that is not valid for its key"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("measure.repeats: value 0 is out of range [1, 1000]"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("cannot run"), std::string::npos) << msg;
}

TEST(Experiment, UnrunnablePointsAreCountedAfterExclude) {
  const std::string text =
      std::string(kBase) + "    exchange: [packed_u64, bf16_lanes]\n" + "  exclude:\n    - {skip: head}\n";
  const Experiment ok = parse_experiment(text, "exp.yaml", {}, 2);
  EXPECT_EQ(ok.points.size(), 16u);
  EXPECT_EQ(ok.excluded, 8);
  // At 4 ranks, bf16_lanes with the vocab-sharded head cannot run: 2 (head_fp8) x 2 (skip none,
  // block) of the 16 points exclude: leaves, not "of 24".
  const std::string msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 4); });
  EXPECT_NE(msg.find("exp.yaml: 4 of 16 sweep point(s) (after exclude: removed 8) cannot run with 4 rank(s)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(parse_experiment(kBase, "exp.yaml", {}, 2).excluded, 0);
}

TEST(Experiment, MisspeltKeysAndAxesSayWhatWasMeant) {
  std::string text = kBase;
  text.replace(text.find("trace:\n"), 7, "trce:\n");
  std::string msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 2); });
  EXPECT_NE(
      msg.find(
          "exp.yaml:5:1: trce: missing required key \"trace\" (did you mean \"trace\" instead of \"trce\"?)"),
      std::string::npos)
      << msg;
  text = kBase;
  text.replace(text.find("measure: {warmup_steps: 1}"), 26, "mesure: {warmup_steps: 1}");
  msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 2); });
  EXPECT_NE(msg.find("exp.yaml:7:1: mesure: unknown key \"mesure\" (did you mean \"measure\"?)"),
            std::string::npos)
      << msg;
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"measure.warmup=3"}, 2); });
  EXPECT_NE(msg.find("did you mean \"warmup_steps\""), std::string::npos) << msg;  // a prefix of it
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"draft_lenn=4"}, 2); });
  EXPECT_NE(msg.find("unknown key \"draft_lenn\" (did you mean \"draft_len\"?)"), std::string::npos) << msg;
  // Axes: over the arm registry's names; an exclude entry's axis: over the grid's axes.
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"sweep.grid.hed_fp8=[off,on]"}, 2); });
  EXPECT_NE(msg.find("\"hed_fp8\" cannot be swept (did you mean \"head_fp8\"?)"), std::string::npos) << msg;
  msg = message_of(
      [] { parse_experiment(std::string(kBase) + "  exclude:\n    - {skp: head}\n", "exp.yaml", {}, 2); });
  EXPECT_NE(
      msg.find(
          "exp.yaml:16:13: sweep.exclude[0].skp: \"skp\" is not a sweep.grid axis (did you mean \"skip\"?)"),
      std::string::npos)
      << msg;
}

TEST(Experiment, QuotedNumbersAreRefusedWhereverWritten) {
  std::string text = kSingle;
  text += "draft_len: \"3\"\n";
  std::string msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 1); });
  EXPECT_NE(msg.find("exp.yaml:8:12: draft_len: expected an integer, got the quoted text \"3\""),
            std::string::npos)
      << msg;
  msg = message_of([] { parse_experiment(kSingle, "exp.yaml", {"draft_len=\"3\""}, 1); });
  EXPECT_NE(msg.find("draft_len: expected an integer, got the quoted text \"3\""), std::string::npos) << msg;
  msg = message_of([] { parse_experiment(kSingle, "exp.yaml", {"sweep.grid.draft_len=[\"3\", 4]"}, 1); });
  EXPECT_NE(msg.find("sweep.grid.draft_len[0]: expected an integer, got the quoted text \"3\""),
            std::string::npos)
      << msg;
  // Bare, it reads; a quoted choice is the word it is.
  EXPECT_EQ(
      parse_experiment(kSingle, "exp.yaml", {"draft_len=3", "skip=\"head\""}, 1).points[0].arms.drafter.skip,
      drafter::Skip::head);
}

TEST(Experiment, TextProblemsAreReportedWhereTheyAre) {
  std::string msg = message_of([] {
    parse_experiment("model: tiny\noutput: \"results/x.h5\ntrace: {synthetic: {}}\n", "exp.yaml", {}, 1);
  });
  EXPECT_NE(msg.find("exp.yaml:2:9: unclosed quote"), std::string::npos) << msg;
  msg = message_of([] { parse_experiment(std::string(kSingle) + "---\nmodel: small\n", "exp.yaml", {}, 1); });
  EXPECT_NE(msg.find("exp.yaml:8:1: a second YAML document starts here (---)"), std::string::npos) << msg;
}

TEST(Experiment, BadKernelVariableIsReportedOnceByName) {
  ASSERT_EQ(setenv("MTPLAB_GEMV_SPLIT", "3", 1), 0);
  const std::string msg = message_of([] { parse_experiment(kBase, "exp.yaml", {}, 2); });
  unsetenv("MTPLAB_GEMV_SPLIT");
  EXPECT_NE(msg.find("MTPLAB_GEMV_SPLIT"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("sweep point(s)"), std::string::npos) << msg;
}

// An empty value is an error naming the key, in the file or from --set (never the key's default);
// an error in a --set value says which --set, not a line of the file.
TEST(Experiment, EmptyValueIsAnErrorInTheFileAndFromSet) {
  for (const char* empty : {"~", "null", ""}) {
    std::string text = kBase;
    text.replace(text.find("measure: {warmup_steps: 1}"), 26, std::string("measure:\n  max_steps: ") + empty);
    const std::string msg = message_of([&] { parse_experiment(text, "exp.yaml", {}, 2); });
    EXPECT_NE(msg.find("measure.max_steps: the value is empty"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("exp.yaml:"), 0u) << msg;  // file:line:col
  }
  std::string msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"measure.max_steps=~"}, 2); });
  EXPECT_NE(msg.find("measure.max_steps: the value is empty"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(from --set measure.max_steps=~)"), std::string::npos) << msg;
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"measure.max_steps="}, 2); });
  EXPECT_NE(msg.find("from --set measure.max_steps=: the value is empty"), std::string::npos) << msg;
  msg = message_of([] { parse_experiment(kBase, "exp.yaml", {"trace.synthetic={sequences: x}"}, 2); });
  EXPECT_NE(msg.find("trace.synthetic.sequences: expected an integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(from --set trace.synthetic={sequences: x})"), std::string::npos) << msg;
  const size_t file = msg.find("exp.yaml:");  // the file may be named, not a line of it
  EXPECT_TRUE(file == std::string::npos || !std::isdigit(static_cast<unsigned char>(msg[file + 9]))) << msg;
}
