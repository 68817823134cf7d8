// The plan YAML and its overrides (planner.hpp, load_plan_spec).
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/str.hpp"
#include "core/yaml.hpp"
#include "harness/experiment.hpp"
#include "model/config.hpp"
#include "plan/planner.hpp"

namespace mtplab::plan {

namespace {

std::vector<std::string> strings(const YamlNode& n) {
  if (n.is_scalar()) return {n.as_string()};
  if (!n.is_sequence()) n.fail("expected a file name or a list of file names");
  std::vector<std::string> out;
  for (const auto& item : n.items()) out.push_back(item.as_string());
  if (out.empty()) n.fail("an empty list");
  return out;
}

// Removes the key at a dotted path that set_yaml_path has just set (its parents are mappings).
void remove_yaml_path(YAML::Node root, const std::string& path) {
  const std::vector<std::string> parts = split(path, '.');
  YAML::Node cur;
  cur.reset(root);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = cur[parts[i]];
    cur.reset(next);
  }
  cur.remove(parts.back());
}

ModelShape read_model(const YamlNode& n) {
  ModelShape m;
  std::string spec;
  std::optional<int64_t> layers, dense;
  if (n.is_scalar()) {
    spec = n.as_string();
  } else {
    MapReader r(n);
    spec = r.req_string("preset");
    if (auto l = r.opt("layers")) layers = l->as_int(1, 100000);
    if (auto d = r.opt("dense_layers")) dense = d->as_int(0, 100000);
    r.finish();
  }
  m.name = spec;
  model::ModelConfig cfg;
  try {
    cfg = model::load_model_preset(spec);
  } catch (const Error& e) {
    n.fail(str("model \"", spec, "\": ", e.message()));
  }
  m.config = cfg.name;
  m.layers = layers ? static_cast<int>(*layers) : cfg.num_hidden_layers;
  m.dense_layers = dense ? static_cast<int>(*dense) : cfg.first_k_dense_replace;
  if (m.layers < 1)
    n.fail(
        str("model \"", spec, "\" gives no num_hidden_layers (the target's layer count): set model.layers"));
  if (m.dense_layers > m.layers)
    n.fail(str("dense_layers ", m.dense_layers, " is more than the model's ", m.layers, " layers"));
  return m;
}

}  // namespace

PlanSpec load_plan_spec(const std::string& path,
                        const std::vector<std::pair<std::string, std::string>>& overrides) {
  PlanSpec s;
  s.file = path;
  YamlNode doc = path.empty() ? YamlNode::load_string("{}", "(command line)") : YamlNode::load_file(path);
  if (!doc.is_map()) doc.fail("a plan is a mapping of keys (docs/planning.md, \"The plan file\")");
  if (!overrides.empty()) {
    YAML::Node root = YAML::Clone(doc.raw());
    for (const auto& [key, value] : overrides) {
      YAML::Node v;
      try {
        v = YAML::Load(value);
      } catch (const YAML::Exception& e) {
        MTP_FAIL("--set ", key, "=", value, ": the value is not valid YAML: ", e.msg);
      }
      harness::set_yaml_path(root, key, v, str("--set ", key));
      if (v.IsNull()) remove_yaml_path(root, key);  // ~: the key removed, back to its default
    }
    YAML::Emitter e;
    e << root;
    doc = YamlNode::load_string(e.c_str(),
                                path.empty() ? "(command line)" : path + " (after the command line)");
  }
  {
    YAML::Emitter e;
    e << doc.raw();
    s.resolved_yaml = e.c_str();
  }
  MapReader r(doc);
  const std::optional<YamlNode> model = r.opt("model");
  if (!model)
    doc.fail(
        "no model: give the model preset (or config file) whose trunk the plan runs (model: or --model)");
  s.model = read_model(*model);
  s.model.gpus = static_cast<int>(r.opt_int("gpus", 1, 1, 1 << 20));

  const std::optional<YamlNode> acc = r.opt("acceptance");
  if (!acc) doc.fail("no acceptance: give acceptance.profile or acceptance.results (--profile / --results)");
  {
    MapReader a(*acc);
    auto profile = a.opt("profile");
    auto results = a.opt("results");
    auto points = a.opt("points");
    if (profile.has_value() == results.has_value()) acc->fail("give one of profile or results");
    if (profile) s.profile = profile->as_string();
    if (results) s.results.files = strings(*results);
    if (points) {
      if (!results) points->fail("points select points of results files: give acceptance.results");
      if (!points->is_sequence()) points->fail("expected a list of points (p8, p0008 or 8)");
      for (const auto& p : points->items()) s.results.points.push_back(p.as_string());
    }
    a.finish();
  }

  const std::optional<YamlNode> costs = r.opt("costs");
  if (!costs)
    doc.fail(
        "no costs: give costs.step and costs.verify (--step / --verify), or costs.online with online_terms: "
        "all");
  {
    MapReader c(*costs);
    if (auto o = c.opt("online")) s.costs.online.files = strings(*o);
    if (auto points = c.opt("online_points")) {
      if (s.costs.online.files.empty()) points->fail("online_points select points of costs.online: give it");
      if (!points->is_sequence()) points->fail("expected a list of points (p8, p0008 or 8)");
      for (const auto& p : points->items()) s.costs.online.points.push_back(p.as_string());
    }
    if (auto terms = c.opt("online_terms")) {
      if (s.costs.online.files.empty()) terms->fail("online_terms says what costs.online gives: give it");
      s.costs.online_all = terms->as_choice({"fixed", "all"}) == "all";
    }
    if (s.costs.online_all) {
      for (const char* key : {"step", "verify"})
        if (auto f = c.opt(key))
          f->fail(
              "online_terms: all takes the draft and verify costs from costs.online: give no costs.step "
              "/ costs.verify");
    } else {
      s.costs.step_files = strings(c.req("step"));
      s.costs.verify_files = strings(c.req("verify"));
    }
    if (auto sel = c.opt("step_select")) {
      if (!sel->is_map()) sel->fail("expected a mapping of bench_step_batch columns to values");
      for (const auto& [col, v] : sel->entries()) s.costs.step_select[col] = v.as_string();
    }
    if (auto h = c.opt("head")) {
      const std::string head = h->as_choice({"bf16", "fp8"});
      s.costs.draft_head = s.costs.target_head = head;
    }
    s.costs.draft_head = c.opt_choice("draft_head", s.costs.draft_head, {"bf16", "fp8"});
    s.costs.target_head = c.opt_choice("target_head", s.costs.target_head, {"bf16", "fp8"});
    if (auto f = c.opt("fixed_us")) s.costs.fixed_us = f->as_double(0, 1e9);
    s.costs.dense_as_moe = c.opt_choice("dense_layers", "measured", {"measured", "as_moe"}) == "as_moe";
    c.finish();
  }
  if (auto b = r.opt("batch")) {
    if (!b->is_sequence()) b->fail("expected a list of batch sizes");
    for (const auto& item : b->items()) {
      const int v = static_cast<int>(item.as_int(1, 1 << 20));
      if (!s.batch.empty() && v <= s.batch.back()) item.fail("batch sizes must increase");
      s.batch.push_back(v);
    }
    if (s.batch.empty()) b->fail("an empty list");
  }
  s.k_max = static_cast<int>(r.opt_int("k_max", 0, 1, 64));
  s.resamples = static_cast<int>(r.opt_int("resamples", 2000, 100, 1000000));
  s.seed = static_cast<uint64_t>(r.opt_int("seed", 1, 0, INT64_MAX));
  s.max_batch = static_cast<int>(r.opt_int("max_batch", 4096, 1, 1 << 20));
  s.output = r.opt_string("output", "");
  s.exports = r.opt_string("exports", "");
  r.finish();
  if (!s.batch.empty() && s.max_batch < s.batch.back())
    doc.fail(str("max_batch ", s.max_batch, " is below the largest planned batch size ", s.batch.back()));
  return s;
}

}  // namespace mtplab::plan
