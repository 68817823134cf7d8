// Experiment parsing and sweep expansion. Each point is read from its own fresh copy of the
// document with the overrides and the point's axis values written into it, through the same
// strict reader as the base document, so a value is checked the same way wherever it came from.
// (yaml-cpp's Clone drops source marks, hence a fresh parse per point rather than a clone.)
#include "harness/experiment.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/log.hpp"
#include "drafter/target.hpp"
#include "harness/replay.hpp"
#include "model/fields.hpp"

namespace mtplab::harness {
namespace {

const std::vector<std::string> kBackends = {"auto", "cpu", "cuda"};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A copy of `n` without source marks (values from the command line have no file position); a
// quoted scalar stays quoted, so `--set draft_len='"3"'` is refused like `draft_len: "3"`.
YAML::Node strip_marks(const YAML::Node& n) {
  if (!n || n.IsNull()) return YAML::Node(YAML::NodeType::Null);
  if (n.IsScalar()) {
    YAML::Node out(n.Scalar());
    if (n.Tag() == "!") out.SetTag("!");  // quoted: text, wherever it came from
    return out;
  }
  if (n.IsSequence()) {
    YAML::Node out(YAML::NodeType::Sequence);
    for (const auto& item : n) out.push_back(strip_marks(item));
    return out;
  }
  YAML::Node out(YAML::NodeType::Map);
  for (auto it = n.begin(); it != n.end(); ++it) out[it->first.Scalar()] = strip_marks(it->second);
  return out;
}

// "key.path=value" -> key, returns the value text.
std::string split_override(const std::string& o, std::string& key) {
  const auto eq = o.find('=');
  MTP_REQUIRE(eq != std::string::npos && eq > 0, "--set \"", o, "\": expected key.path=value");
  key = trim(o.substr(0, eq));
  return o.substr(eq + 1);
}

struct Override {
  std::string key;
  YAML::Node value;
  std::string text;  // "--set key=value"
};

std::vector<Override> parse_overrides(const std::vector<std::string>& overrides) {
  std::vector<Override> out;
  for (const auto& o : overrides) {
    Override ov;
    const std::string value = split_override(o, ov.key);
    ov.text = str("--set ", o);
    MTP_REQUIRE(!trim(value).empty(), "from ", ov.text,
                ": the value is empty: give a value (YAML), or leave the --set out "
                "to keep the file's");
    try {
      ov.value = strip_marks(YAML::Load(value));
    } catch (const YAML::Exception& e) {
      MTP_FAIL(ov.text, ": the value is not valid YAML: ", e.msg);
    }
    MTP_REQUIRE(ov.key != "sweep" && ov.key != "sweep.grid", ov.text,
                ": set single axes (sweep.grid.<axis>=[...]) or sweep.exclude");
    out.push_back(std::move(ov));
  }
  return out;
}

bool is_sweepable_arm(const std::string& k) {
  const ArmSpec* a = find_arm(k);
  return a && a->sweepable;
}

// Reads the keys shared by the document root and one point.
struct DocReader {
  const std::string& file;

  WeightsSpec weights(const std::optional<YamlNode>& node) {
    WeightsSpec w;
    if (!node) return w;
    MapReader m(*node);
    auto syn = m.opt("synthetic");
    auto ckpt = m.opt("checkpoint");
    if (syn && ckpt) node->fail("give one of synthetic or checkpoint, not both");
    if (ckpt) {
      w.synthetic = false;
      w.checkpoint = ckpt->as_string();
      if (w.checkpoint.empty()) ckpt->fail("empty checkpoint path");
    } else if (syn) {
      MapReader s(*syn);
      w.seed = static_cast<uint64_t>(s.opt_int("seed", 1, 0, INT64_MAX));
      s.finish();
    }
    m.finish();
    return w;
  }

  TraceSpec trace(const YamlNode& node) {
    TraceSpec t;
    MapReader m(node);
    auto path = m.opt("path");
    auto syn = m.opt("synthetic");
    if (path && syn) node.fail("give one of path or synthetic, not both");
    if (!path && !syn) node.fail("expected path: file.h5 or synthetic: {...}");
    if (path) {
      t.path = path->as_string();
      if (t.path.empty()) path->fail("empty trace path");
    } else {
      t.synthetic = true;
      MapReader s(*syn);
      t.sequences = static_cast<int>(s.opt_int("sequences", t.sequences, 1, 1 << 20));
      t.prompt_len = static_cast<int>(s.opt_int("prompt_len", t.prompt_len, 2, 1 << 24));
      t.new_tokens = static_cast<int>(s.opt_int("new_tokens", t.new_tokens, 1, 1 << 24));
      t.seed = static_cast<uint64_t>(s.opt_int("seed", 1, 0, INT64_MAX));
      t.layers = static_cast<int>(s.opt_int("layers", t.layers, 1, 64));
      t.batch = static_cast<int>(s.opt_int("batch", t.batch, 1, drafter::kMaxTargetBatch));
      io::TraceSampling& smp = t.sampling;
      smp.sampled = s.opt_choice("sampling", "greedy", {"greedy", "sampling"}) == "sampling";
      // Read (and checked) either way; not in effect, hence normalised, when greedy.
      const double temperature = s.opt_double("temperature", smp.temperature, 0.0, 100.0);
      if (temperature <= 0) s.req("temperature").fail("expected a temperature in (0, 100]");
      const int64_t top_k = s.opt_int("top_k", smp.top_k, 0, 1 << 24);
      const double top_p = s.opt_double("top_p", smp.top_p, 0.0, 1.0);
      if (top_p <= 0) s.req("top_p").fail("expected a value in (0, 1]");
      const int64_t seed = s.opt_int("sampling_seed", 1, 0, int64_t{1} << 62);
      if (smp.sampled) {
        smp.temperature = temperature;
        smp.top_k = top_k;
        smp.top_p = top_p;
        smp.seed = seed;
      }
      s.finish();
    }
    m.finish();
    return t;
  }

  MeasureSpec measure(const std::optional<YamlNode>& node) {
    MeasureSpec ms;
    if (!node) return ms;
    MapReader m(*node);
    ms.warmup_steps = static_cast<int>(m.opt_int("warmup_steps", ms.warmup_steps, 0, 1 << 30));
    ms.sequences = static_cast<int>(m.opt_int("sequences", ms.sequences, 0, 1 << 30));
    ms.max_steps = static_cast<int>(m.opt_int("max_steps", ms.max_steps, 0, 1 << 30));
    ms.repeats = static_cast<int>(m.opt_int("repeats", ms.repeats, 1, 1000));
    m.finish();
    return ms;
  }

  // model: preset name / path, {preset: name, <key>: override ...}, or a whole inline mapping.
  model::ModelConfig model(const YamlNode& node, std::string& spec) {
    if (node.is_scalar()) {
      spec = node.as_string();
      try {
        return model::load_model_preset(spec);
      } catch (const Error& e) {
        node.fail(e.message());
      }
    }
    MapReader m(node);
    if (!m.has("preset")) {
      spec = "inline";
      return model::parse_model_config(node);
    }
    YamlNode preset = m.req("preset");
    spec = preset.as_string();
    model::ModelConfig base;
    try {
      base = model::load_model_preset(spec);
    } catch (const Error& e) {
      preset.fail(e.message());
    }
    // The preset's keys without marks (they were checked when the preset loaded), then the
    // overrides with theirs, read as one mapping so that cross-key checks see both. A Hugging
    // Face config's keys are its derived preset keys.
    YAML::Node merged = base.source_format == "hf" ? model::to_preset_yaml(base)
                                                   : strip_marks(YamlNode::load_file(base.source).raw());
    for (const auto& [key, value] : node.entries()) {
      if (key == "preset") continue;
      if (key == "checkpoint" && value.is_map() && merged["checkpoint"] && merged["checkpoint"].IsMap()) {
        for (const auto& [ck, cv] : value.entries()) merged["checkpoint"][ck] = cv.raw();
      } else {
        merged[key] = value.raw();
      }
    }
    model::ModelConfig cfg = model::parse_model_config(
        YamlNode(merged, std::make_shared<const std::string>(node.file()), node.path()));
    cfg.source = base.source;
    cfg.source_format = base.source_format;
    return cfg;
  }

  // `mode` and the `online:` group (run_settings()); the group is read and checked in either mode,
  // and normalised to its defaults in a replay point (said, as an arm not in effect is).
  void read_run_settings(MapReader& m, const YamlNode& root, PointConfig& p) {
    std::unique_ptr<MapReader> online;
    if (auto node = m.opt("online")) {
      if (!node->is_map())
        node->fail("expected a mapping of online keys (max_new_tokens, target_layers, ...)");
      online = std::make_unique<MapReader>(*node);
    }
    for (const auto& s : run_settings()) {
      const bool in_online = starts_with(s.name, "online.");
      if (!in_online) {
        read_setting<PointConfig>(m, s.name, s, p);
      } else if (online) {
        read_setting<PointConfig>(*online, s.name.substr(7), s, p);
      }
    }
    if (online) online->finish();
    if (p.mode != RunMode::online) {
      p.online = OnlineOptions{};
      const YAML::Node block = root.raw()["online"];
      if (block && block.IsMap() && block.size() > 0)
        p.ignored_arms.push_back("online (not in effect without mode=online)");
    }
  }

  // Reads everything but `sweep` (taken, not read: the root reads it separately).
  PointConfig point(const YamlNode& root, std::string* output) {
    PointConfig p;
    MapReader m(root);
    p.model = model(m.req("model"), p.model_spec);
    p.weights = weights(m.opt("weights"));
    p.trace = trace(m.req("trace"));
    p.measure = measure(m.opt("measure"));
    const std::string out = m.opt_string("output", "");
    if (output) *output = out;
    p.backend = m.opt_choice("backend", "auto", kBackends);
    read_run_settings(m, root, p);
    p.arms = read_arms(m);
    // Arms written but not in effect under the others (read_arms normalised them): said, not dropped.
    for (const auto& a : arm_registry()) {
      if (a.in_effect(p.arms)) continue;
      const YAML::Node block = a.block().empty() ? root.raw() : root.raw()[a.block()];
      if (block && block.IsMap() && block[a.key()])
        p.ignored_arms.push_back(str(a.name, " (not in effect without ", a.only_with, ")"));
    }
    (void)m.opt("sweep");
    m.finish();
    return p;
  }
};

void emit_model(YAML::Emitter& e, const PointConfig& p) {
  const model::ModelConfig& c = p.model;
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "spec" << YAML::Value << p.model_spec;
  // Every field of the table's identity, in table order (a results file's point identity).
  for (const model::ModelField& f : model::model_fields())
    if (f.in_identity) e << YAML::Key << f.name << YAML::Value << field_text(c, f.member);
  e << YAML::EndMap;
}

std::string canonical_text(const PointConfig& p) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  emit_model(e, p);
  e << YAML::Key << "weights" << YAML::Value << YAML::BeginMap;
  if (p.weights.synthetic)
    e << YAML::Key << "synthetic" << YAML::Value << YAML::BeginMap << YAML::Key << "seed" << YAML::Value
      << str(p.weights.seed) << YAML::EndMap;
  else
    e << YAML::Key << "checkpoint" << YAML::Value << p.weights.checkpoint;
  e << YAML::EndMap;
  e << YAML::Key << "trace" << YAML::Value << YAML::BeginMap;
  if (p.trace.synthetic) {
    e << YAML::Key << "synthetic" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "sequences" << YAML::Value << str(p.trace.sequences);
    e << YAML::Key << "prompt_len" << YAML::Value << str(p.trace.prompt_len);
    e << YAML::Key << "new_tokens" << YAML::Value << str(p.trace.new_tokens);
    e << YAML::Key << "seed" << YAML::Value << str(p.trace.seed);
    e << YAML::Key << "layers" << YAML::Value << str(p.trace.layers);
    e << YAML::Key << "batch" << YAML::Value << str(p.trace.batch);
    if (!p.trace.sampling.sampled) {
      e << YAML::Key << "sampling" << YAML::Value << "greedy";  // the other keys are not in effect
    } else {
      const io::TraceSampling& smp = p.trace.sampling;
      e << YAML::Key << "sampling" << YAML::Value << "sampling";
      e << YAML::Key << "temperature" << YAML::Value << real_text(smp.temperature);
      e << YAML::Key << "top_k" << YAML::Value << str(smp.top_k);
      e << YAML::Key << "top_p" << YAML::Value << real_text(smp.top_p);
      e << YAML::Key << "sampling_seed" << YAML::Value << str(smp.seed);
    }
    e << YAML::EndMap;
  } else {
    e << YAML::Key << "path" << YAML::Value << p.trace.path;
  }
  e << YAML::EndMap;
  e << YAML::Key << "measure" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "warmup_steps" << YAML::Value << str(p.measure.warmup_steps);
  e << YAML::Key << "sequences" << YAML::Value << str(p.measure.sequences);
  e << YAML::Key << "max_steps" << YAML::Value << str(p.measure.max_steps);
  e << YAML::Key << "repeats" << YAML::Value << str(p.measure.repeats);
  e << YAML::EndMap;
  e << YAML::Key << "backend" << YAML::Value << p.backend;
  if (p.mode == RunMode::online) {
    // Only an online point has them: a replay point's canonical text is what it was before.
    e << YAML::Key << "mode" << YAML::Value << to_string(p.mode);
    e << YAML::Key << "online" << YAML::Value << YAML::BeginMap;
    for (const auto& o : online_settings()) e << YAML::Key << o.name << YAML::Value << o.get(p.online);
    e << YAML::EndMap;
  }
  emit_canonical(p.arms, e);
  e << YAML::EndMap;
  return e.c_str();
}

// Where a sweep value came from, for messages: "exp.yaml:12:20" or "--set ...".
std::string origin_of(const YamlNode& n) {
  const YAML::Mark m = n.raw().Mark();
  if (m.line >= 0 && !(m.line == 0 && m.column == 0 && m.pos == 0))
    return str(n.file(), ":", m.line + 1, ":", m.column + 1);
  return "the command line";
}

// The names a sweep axis may have, for the suggestion of a misspelt one.
std::vector<std::string> axis_names() {
  std::vector<std::string> names;
  for (const auto& a : arm_registry())
    if (a.sweepable) names.push_back(a.name);
  names.push_back("model");
  names.push_back("backend");
  for (const auto& s : run_settings()) names.push_back(s.name);
  return names;
}

std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string meant = suggest_key(key, candidates);
  return meant.empty() ? std::string() : str(" (did you mean \"", meant, "\"?)");
}

// A value of an arm's axis, checked as the arm's key would be: an error names the grid entry
// (file:line:col and sweep.grid.<arm>[i]), the value and the arm's values.
void check_arm_value(const ArmSpec& a, const YamlNode& v) {
  switch (a.type) {
    case SettingType::boolean:
      (void)v.as_bool();
      return;
    case SettingType::choice:
      (void)choice_value(a, v);
      return;
    case SettingType::integer:
      (void)v.as_int(a.min, a.max);
      return;
    case SettingType::real: {
      const double d = v.as_double(a.real_min, a.real_max);
      if (a.real_min_exclusive && d <= a.real_min) v.fail(str("expected a value in ", a.allowed()));
      return;
    }
    case SettingType::text: {
      if (!v.is_scalar()) v.fail(str("expected one of ", a.allowed()));
      Arms scratch;
      try {
        a.set(scratch, canonical_value(v));
      } catch (const Error& e) {
        v.fail(e.message());
      }
      return;
    }
  }
}

bool axis_allowed(const std::string& a) {
  // Not `backend`: one process runs every point on one backend (the run resolves and binds it
  // once, and a results file records one); compare backends with one run into one file each.
  if (is_sweepable_arm(a) || a == "model" || a == "mode") return true;
  for (const char* prefix : {"model.", "measure.", "weights.", "trace.", "online."})
    if (starts_with(a, prefix) && a.size() > std::string(prefix).size()) return true;
  return false;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  MTP_REQUIRE(in, path, ": cannot open the experiment file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Appends "(from --set k=v)" to messages about a key some override set.
[[noreturn]] void rethrow_with_overrides(const Error& e, const std::vector<Override>& ovs) {
  std::string msg = e.message();
  for (const auto& o : ovs)
    if ((msg.find(str(": ", o.key, ":")) != std::string::npos ||
         msg.find(str("\"", o.key, "\"")) != std::string::npos ||
         msg.find(str(": ", o.key, "[")) != std::string::npos ||
         msg.find(str(": ", o.key, ".")) != std::string::npos) &&
        msg.find(str("from ", o.text)) == std::string::npos)
      msg += str(" (from ", o.text, ")");
  throw Error(msg, e.file().c_str(), e.line());
}

}  // namespace

// set_yaml_path (experiment.hpp): writes `value` at the dotted `path` of `root`, creating mappings on the
// way. A scalar `model:` met on the way becomes {preset: <scalar>} so that model.<key> overrides a preset's
// key.
void set_yaml_path(YAML::Node root, const std::string& path, const YAML::Node& value,
                   const std::string& origin) {
  std::vector<std::string> parts = split(path, '.');
  for (const auto& p : parts) MTP_REQUIRE(!p.empty(), origin, ": empty component in key path \"", path, "\"");
  // A sweep axis is one key of sweep.grid, dots and all ("sweep.grid.kernels.pdl" sets the axis
  // "kernels.pdl", as `kernels.pdl: [...]` under grid: does in the file).
  if (parts.size() > 3 && parts[0] == "sweep" && parts[1] == "grid") {
    std::vector<std::string> axis(parts.begin() + 2, parts.end());
    parts.resize(2);
    parts.push_back(join(axis, "."));
  }
  YAML::Node cur;
  cur.reset(root);
  MTP_REQUIRE(cur.IsMap(), origin, ": the document is not a mapping");
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const YAML::Node& ccur = cur;
    YAML::Node child = ccur[parts[i]];
    if (child && child.IsScalar() && i == 0 && parts[0] == "model") {
      YAML::Node m(YAML::NodeType::Map);
      m["preset"] = YAML::Node(child.Scalar());
      cur[parts[i]] = m;
    } else if (!child || child.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
    } else if (!child.IsMap()) {
      MTP_FAIL(origin, ": \"", join(std::vector<std::string>(parts.begin(), parts.begin() + i + 1), "."),
               "\" is not a mapping, so \"", path, "\" cannot be set");
    }
    YAML::Node next = cur[parts[i]];
    cur.reset(next);
  }
  cur[parts.back()] = value;
}

const char* to_string(ValueType t) {
  static const char* const names[] = {"int", "float", "str"};
  return names[static_cast<size_t>(t)];
}

ValueType parse_value_type(const std::string& s) {
  if (s == "int") return ValueType::integer;
  if (s == "float") return ValueType::floating;
  MTP_REQUIRE(s == "str", "value type \"", s, "\" is not one of {int, float, str}");
  return ValueType::text;
}

ValueType axis_value_type(const std::string& name, const std::vector<std::string>& values) {
  auto of = [](SettingType t) {
    return t == SettingType::integer ? ValueType::integer
           : t == SettingType::real  ? ValueType::floating
                                     : ValueType::text;
  };
  if (const ArmSpec* a = find_arm(name)) return of(a->type);
  for (const auto& s : run_settings())
    if (s.name == name) return of(s.type);
  auto all = [&](auto pred) { return std::all_of(values.begin(), values.end(), pred); };
  auto parses = [](const std::string& v, bool integer) {
    if (v.empty()) return false;
    char* end = nullptr;
    if (integer)
      (void)std::strtoll(v.c_str(), &end, 10);
    else
      (void)std::strtod(v.c_str(), &end);
    return end == v.c_str() + v.size();
  };
  if (all([&](const std::string& v) { return parses(v, true); })) return ValueType::integer;
  if (all([&](const std::string& v) { return parses(v, false); })) return ValueType::floating;
  return ValueType::text;
}

const std::vector<Setting<PointConfig>>& run_settings() {
  static const std::vector<Setting<PointConfig>> table = [] {
    std::vector<Setting<PointConfig>> r;
    r.push_back(choice_setting("mode", &PointConfig::mode, kRunModeNames,
                               "replay the trace, or run the target online from the trace's prompts"));
    for (const auto& s : online_settings()) r.push_back(nested(s, &PointConfig::online, "online"));
    check_settings(r, "run settings");
    return r;
  }();
  return table;
}

std::string PointConfig::name() const {
  std::string n = str(index);
  while (n.size() < 4) n = "0" + n;
  return "p" + n;
}

std::string PointConfig::label() const {
  if (assignment.empty()) return "(no sweep)";
  std::vector<std::string> parts;
  for (const auto& [k, v] : assignment) parts.push_back(str(k, "=", v));
  return join(parts, " ");
}

int Experiment::find_point(const std::vector<std::pair<std::string, std::string>>& assignment) const {
  for (const auto& p : points)
    if (p.assignment == assignment) return p.index;
  return -1;
}

std::string canonical_value(const YamlNode& node) {
  if (node.is_scalar()) {
    const std::string l = lower(node.raw().Scalar());
    if (l == "true" || l == "on" || l == "yes") return "on";
    if (l == "false" || l == "off" || l == "no") return "off";
    return node.raw().Scalar();
  }
  YAML::Emitter e;
  e << YAML::Flow << node.raw();
  return e.c_str();
}

std::string configuration_text(const std::string& resolved_yaml, int64_t world) {
  YAML::Node doc = YAML::Load(resolved_yaml);
  if (doc.IsMap()) doc.remove("output");
  YAML::Emitter e;
  e << doc;
  return str(e.c_str(), "\nworld=", world);
}

namespace {
// The rules of an online point (harness/online.hpp), beside the arms'.
void check_online(const PointConfig& p) {
  const model::ModelConfig& c = p.model;
  const OnlineOptions& o = p.online;
  const ReplayOptions& r = p.arms.replay;
  MTP_REQUIRE(r.replay == ReplayMode::speculative,
              "replay: teacher_forced is a replay of a trace; mode: online runs speculative steps (replay: "
              "speculative)");
  MTP_REQUIRE(
      r.verify != Verify::sampling || r.draft_proposal == DraftProposal::greedy,
      "draft_proposal: sampled with mode: online is not supported: the online drafter proposes its "
      "argmax (draft_proposal: greedy; speculative sampling is then exact with q the point mass at the "
      "draft)");
  MTP_REQUIRE(c.num_hidden_layers == 0 || o.target_layers <= c.num_hidden_layers, "online.target_layers ",
              o.target_layers, " exceeds model.num_hidden_layers ", c.num_hidden_layers);
  MTP_REQUIRE(
      o.target == TargetSource::synthetic || !p.weights.synthetic,
      "online.target: checkpoint loads the trunk from weights.checkpoint; these weights are synthetic "
      "(online.target: synthetic)");
  if (p.trace.synthetic) {
    const int total = p.trace.prompt_len + o.max_new_tokens;
    MTP_REQUIRE(total <= c.max_seq_len, "online.max_new_tokens ", o.max_new_tokens,
                " + trace.synthetic.prompt_len ", p.trace.prompt_len, " = ", total,
                " exceeds model.max_seq_len ", c.max_seq_len);
  }
  MTP_REQUIRE(o.max_new_tokens >= p.arms.drafter.draft_len + 1, "online.max_new_tokens ", o.max_new_tokens,
              " leaves no step for draft_len ", p.arms.drafter.draft_len, " (needs at least draft_len + 1)");
}
}  // namespace

void check_point_runnable(const PointConfig& p, int world, const std::string& backend) {
  const model::ModelConfig& c = p.model;
  MTP_REQUIRE(world >= 1, "world size ", world, " must be >= 1");
  c.validate(world, world);
  MTP_REQUIRE(c.vocab >= world, "model.vocab ", c.vocab, " is smaller than the ", world,
              " ranks it is split over");
  const bool online = p.mode == RunMode::online;
  MTP_REQUIRE(online || p.arms.drafter.draft_len >= 1,
              "draft_len 0 (MTP off: the target decodes alone) needs "
              "mode: online; a replay drafts 1 .. 16 tokens a step");
  check_arms(p.arms, world, backend, c);
  if (online) {
    check_online(p);
    return;
  }
  if (p.trace.synthetic) {
    const int total = p.trace.prompt_len + p.trace.new_tokens;
    MTP_REQUIRE(total <= c.max_seq_len, "trace.synthetic: prompt_len + new_tokens = ", total,
                " exceeds model.max_seq_len ", c.max_seq_len);
    MTP_REQUIRE(p.trace.new_tokens >= p.arms.drafter.draft_len + 1, "trace.synthetic.new_tokens ",
                p.trace.new_tokens, " leaves no step for draft_len ", p.arms.drafter.draft_len,
                " (needs at least draft_len + 1)");
    MTP_REQUIRE(
        p.weights.synthetic,
        "trace.synthetic needs weights.synthetic (the synthetic target shares the drafter's embedding and "
        "lm_head); use a recorded trace (trace.path) with checkpoint weights");
    MTP_REQUIRE(p.trace.sampling.top_k <= c.vocab, "trace.synthetic.top_k ", p.trace.sampling.top_k,
                " exceeds model.vocab ", c.vocab);
    check_trace_sampling(p.arms.replay, p.trace.sampling, "trace.synthetic");
  }
}

void check_trace_file(const PointConfig& p) {
  if (p.trace.synthetic || p.arms.replay.verify != Verify::sampling || p.mode == RunMode::online) return;
  check_trace_sampling(p.arms.replay, io::read_trace_sampling(p.trace.path), p.trace.path);
}

Experiment parse_experiment(const std::string& text, const std::string& name,
                            const std::vector<std::string>& overrides, int world) {
  const std::vector<Override> ovs = parse_overrides(overrides);
  auto load_doc = [&]() {
    YamlNode doc = YamlNode::load_string(text, name);
    if (!doc.is_map()) doc.fail("an experiment is a mapping (model:, trace:, sweep: ...)");
    for (const auto& o : ovs) set_yaml_path(doc.raw(), o.key, o.value, o.text);
    return doc;
  };

  Experiment ex;
  ex.file = name;
  ex.world = world;
  YamlNode root = load_doc();
  DocReader reader{name};
  // The base document is read once whole, so that errors outside the swept keys surface even
  // for a single point, and so that the sweep section is checked.
  std::vector<YamlNode> exclude_nodes;
  try {
    PointConfig base = reader.point(root, &ex.output);
    (void)base;
    // A bad MTPLAB_* kernel variable is reported once, naming it, not as a bad value of every point.
    (void)ops::env_overrides(ops::KernelPolicy{}, nullptr);
    MapReader top(root);
    if (auto sweep = top.opt("sweep")) {
      MapReader s(*sweep);
      if (auto grid = s.opt("grid")) {
        for (const auto& [axis, values] : grid->entries()) {
          if (!axis_allowed(axis))
            values.fail(str("\"", axis, "\" cannot be swept", did_you_mean(axis, axis_names()),
                            "; axes are the arms (", join(arm_names(), ", "),
                            "), model, model.<key>, measure.<key>, weights.<key>, trace.<key>, mode and "
                            "online.<key>",
                            axis == "backend"
                                ? " (one run uses one backend: run each backend into its own output)"
                                : ""));
          if (!values.is_sequence()) values.fail("expected a list of values, e.g. [off, on]");
          Axis a;
          a.name = axis;
          const ArmSpec* arm = find_arm(axis);
          for (const auto& v : values.items()) {
            // An arm's values are checked here, each once, where it is written; the values of
            // other axes (model.<key>, measure.<key>, ...) when each point is read.
            if (arm) check_arm_value(*arm, v);
            const std::string cv = canonical_value(v);
            if (std::find(a.values.begin(), a.values.end(), cv) != a.values.end())
              v.fail(str("value \"", cv, "\" appears twice"));
            a.values.push_back(cv);
            a.nodes.push_back(v);
          }
          if (a.values.empty()) values.fail("an axis needs at least one value");
          a.type = axis_value_type(a.name, a.values);
          ex.axes.push_back(std::move(a));
        }
      }
      if (auto ex_node = s.opt("exclude")) exclude_nodes = ex_node->items();
      s.finish();
    }
    for (const auto& a : ex.axes)
      for (const auto& b : ex.axes)
        if (&a != &b && starts_with(b.name, a.name + "."))
          MTP_FAIL(name, ": sweep.grid: axes \"", a.name, "\" and \"", b.name, "\" overlap");
  } catch (const Error& e) {
    rethrow_with_overrides(e, ovs);
  }

  // exclude: entries are partial assignments; a point matching every key of one is removed.
  std::vector<std::map<std::string, std::set<std::string>>> excludes;
  for (const auto& en : exclude_nodes) {
    std::map<std::string, std::set<std::string>> rule;
    for (const auto& [axis, v] : en.entries()) {
      auto it = std::find_if(ex.axes.begin(), ex.axes.end(), [&](const Axis& a) { return a.name == axis; });
      if (it == ex.axes.end()) {
        std::vector<std::string> names;
        for (const auto& a : ex.axes) names.push_back(a.name);
        v.fail(str("\"", axis, "\" is not a sweep.grid axis", did_you_mean(axis, names), "; the axes are ",
                   names.empty() ? std::string("none (sweep.grid is empty)") : join(names, ", ")));
      }
      std::vector<YamlNode> vals = v.is_sequence() ? v.items() : std::vector<YamlNode>{v};
      for (const auto& one : vals) {
        const std::string cv = canonical_value(one);
        if (std::find(it->values.begin(), it->values.end(), cv) == it->values.end())
          one.fail(
              str("\"", cv, "\" is not among the values of axis ", axis, " {", join(it->values, ", "), "}"));
        rule[axis].insert(cv);
      }
    }
    if (rule.empty()) en.fail("an exclude entry needs at least one axis");
    excludes.push_back(std::move(rule));
  }

  // The cartesian product, last axis fastest.
  std::vector<size_t> idx(ex.axes.size(), 0);
  // Problems grouped by message: message -> [where the values came from, point labels...]. A
  // point whose document does not read (a swept value that is wrong for its key) is kept apart
  // from a point that reads but cannot run with this world size (or backend).
  std::map<std::string, std::vector<std::string>> invalid, unrunnable;
  int candidates = 0;  // the points left after exclude:
  for (bool done = false; !done;) {
    std::vector<std::pair<std::string, std::string>> assignment;
    for (size_t a = 0; a < ex.axes.size(); ++a)
      assignment.emplace_back(ex.axes[a].name, ex.axes[a].values[idx[a]]);
    bool excluded = false;
    for (const auto& rule : excludes) {
      bool all = true;
      for (const auto& [axis, vals] : rule) {
        const auto& v = std::find_if(assignment.begin(), assignment.end(), [&](const auto& kv) {
                          return kv.first == axis;
                        })->second;
        all = all && vals.count(v) > 0;
      }
      excluded = excluded || all;
    }
    if (excluded) ++ex.excluded;
    if (!excluded) {
      ++candidates;
      PointConfig p;
      std::string where;
      bool read = false;
      try {
        YamlNode doc = load_doc();
        // `model` before model.<key>, so that a swept preset takes the key overrides.
        std::vector<size_t> order(ex.axes.size());
        for (size_t a = 0; a < order.size(); ++a) order[a] = a;
        std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
          return ex.axes[x].name == "model" && ex.axes[y].name != "model";
        });
        for (size_t a : order) {
          const YamlNode& v = ex.axes[a].nodes[idx[a]];
          set_yaml_path(doc.raw(), ex.axes[a].name, v.raw(), str("sweep.grid.", ex.axes[a].name));
          where += str(where.empty() ? "" : ", ", ex.axes[a].name, " from ", origin_of(v));
        }
        p = reader.point(doc, nullptr);
        // The environment overrides the kernel policy (benchmarks, tuning): applied here, so that
        // the effective policy is the point's configuration and identity, recorded and compared.
        p.arms.kernels = ops::env_overrides(p.arms.kernels, &p.kernel_env_overrides);
        read = true;
        p.index = static_cast<int>(ex.points.size());
        p.assignment = assignment;
        for (size_t a = 0; a < idx.size(); ++a) p.assignment_index.push_back(static_cast<int64_t>(idx[a]));
        check_point_runnable(p, world, p.backend);
        p.canonical = canonical_text(p);
        ex.points.push_back(std::move(p));
      } catch (const Error& e) {
        std::string label;
        for (const auto& [k, v] : assignment) label += str(label.empty() ? "" : " ", k, "=", v);
        std::string msg = e.message();
        for (const auto& o : ovs)
          if (msg.find(o.key) != std::string::npos) msg += str(" (", o.text, ")");
        auto& entry = (read ? unrunnable : invalid)[msg];
        if (entry.empty()) entry.push_back(where);
        entry.push_back(str("{", label.empty() ? "no sweep" : label, "}"));
      }
    }
    // Next index.
    size_t a = ex.axes.size();
    while (a > 0) {
      --a;
      if (++idx[a] < ex.axes[a].values.size()) break;
      idx[a] = 0;
      if (a == 0) done = true;
    }
    if (ex.axes.empty()) done = true;
  }
  // One error for every point of a kind, grouped by reason; the count is of the points that
  // exclude: leaves.
  auto report = [&](const std::map<std::string, std::vector<std::string>>& problems,
                    const std::string& what) {
    size_t bad = 0;
    std::vector<std::string> lines;
    for (const auto& [msg, entry] : problems) {
      const size_t count = entry.size() - 1;
      bad += count;
      std::vector<std::string> shown(
          entry.begin() + 1, entry.begin() + 1 + static_cast<std::ptrdiff_t>(std::min<size_t>(count, 3)));
      lines.push_back(str("  ", msg, "\n    in ", count, " point(s): ", join(shown, ", "),
                          count > 3 ? ", ..." : "",
                          entry[0].empty() ? "" : str("\n    (values: ", entry[0], ")")));
    }
    MTP_FAIL(name, ": ", bad, " of ", candidates, " sweep point(s)",
             ex.excluded ? str(" (after exclude: removed ", ex.excluded, ")") : std::string(), " ", what,
             ":\n", join(lines, "\n"));
  };
  if (!invalid.empty()) report(invalid, "have a swept value that is not valid for its key (fix the values)");
  if (!unrunnable.empty())
    report(unrunnable, str("cannot run with ", world,
                           " rank(s) (fix the values, or remove the points with sweep.exclude)"));
  MTP_REQUIRE(!ex.points.empty(), name, ": every sweep point is excluded; nothing to run");
  {
    // Arms written but not in effect: one line per arm, naming the points (rank 0, or no launcher).
    std::map<std::string, std::vector<std::string>> ignored;
    std::vector<std::string> order;
    for (const auto& p : ex.points)
      for (const auto& a : p.ignored_arms) {
        if (!ignored.count(a)) order.push_back(a);
        ignored[a].push_back(p.name());
      }
    if (process_identity().rank <= 0)
      for (const auto& a : order) {
        const auto& pts = ignored[a];
        log_info(name, ": ", a, ": ignored in ",
                 pts.size() == ex.points.size() ? "every point" : join(pts, ", "),
                 " (normalised to its default; the point is the same whatever it is set to)");
      }
  }

  // The resolved document: overrides applied, as YAML.
  {
    YAML::Emitter e;
    e << root.raw();
    ex.resolved_yaml = e.c_str();
    ex.configuration = configuration_text(ex.resolved_yaml, world);
  }
  return ex;
}

Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides, int world) {
  return parse_experiment(read_text(path), path, overrides, world);
}

}  // namespace mtplab::harness
