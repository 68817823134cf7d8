// The results writer: the root's provenance, the resume check of an existing file, and the
// append of one point (its group, then the derived tables, in one commit).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "harness/results.hpp"
#include "harness/results_format.hpp"

extern char** environ;

namespace mtplab::harness {
namespace {

using io::Group;
using io::H5File;

void write_root(H5File& f, const Experiment& ex, const RunProvenance& prov) {
  f.set_attr("schema", kResultsSchema);
  f.set_attr("schema_version", kResultsSchemaVersion);
  f.set_attr("mtplab_version", project_version());
  f.set_attr("git_sha", git_sha());
  f.set_attr("git_dirty", git_dirty());
  f.set_attr("created_at", prov.started_at);
  f.set_attr("argv", prov.argv);
  f.set_attr("experiment_file", ex.file);
  f.set_attr("experiment_yaml", ex.resolved_yaml);
  f.set_attr("experiment_identity", ex.identity);
  f.set_attr("num_points", static_cast<int64_t>(ex.points.size()));
  f.set_attr("world_size", static_cast<int64_t>(prov.world));
  f.set_attr("backend", prov.backend);
  f.set_attr("hosts", prov.hosts);
  f.set_attr("devices", prov.devices);
  for (const auto& [lib, v] : prov.versions) f.set_attr("version." + lib, v);
  f.set_attr("environment", prov.environment);
  std::vector<std::string> axes;
  for (const auto& a : ex.axes) {
    axes.push_back(a.name);
    f.set_attr(results_format::axis_values_attr(a.name), a.values);
    f.set_attr(results_format::axis_type_attr(a.name), to_string(a.type));
  }
  f.set_attr("sweep_axes", axes);
  f.create_group("points");
}

// The keys whose values differ between two YAML documents (mappings, flattened to dotted key
// paths), as "key: A (in the file) vs B (this run)".
void flatten(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it)
      flatten(it->second, prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar(), out);
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << n;
  out[prefix] = e.c_str();
}

std::vector<std::string> config_differences(const std::string& in_file, const std::string& this_run) {
  std::map<std::string, std::string> a, b;
  try {
    flatten(YAML::Load(in_file), "", a);
    flatten(YAML::Load(this_run), "", b);
  } catch (const YAML::Exception&) {
    return {"(the stored configuration is not readable YAML)"};
  }
  // An arm that the canonical text leaves out at its default reads as its default.
  for (const auto& arm : arm_registry())
    if (arm.omit_at_default)
      for (auto* m : {&a, &b})
        if (!m->count(arm.name)) (*m)[arm.name] = arm.default_value();
  std::vector<std::string> out;
  for (const auto& [key, v] : a) {
    auto it = b.find(key);
    if (it == b.end())
      out.push_back(str(key, ": ", v, " (in the file) vs absent (this run)"));
    else if (it->second != v)
      out.push_back(str(key, ": ", v, " (in the file) vs ", it->second, " (this run)"));
  }
  for (const auto& [key, v] : b)
    if (!a.count(key)) out.push_back(str(key, ": absent (in the file) vs ", v, " (this run)"));
  return out;
}

}  // namespace

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<std::string> provenance_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    for (const char* prefix :
         {"NCCL_", "SLURM_", "OMPI_", "PMIX_RANK=", "CUDA_VISIBLE_DEVICES=", "MTPLAB_"}) {
      if (starts_with(kv, prefix)) {
        out.push_back(kv);
        break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string>& timing_columns() {
  static const std::vector<std::string> cols = {"step_ms",     "propose_ms",      "block_ms",    "head_ms",
                                                "exchange_ms", "after_verify_ms", "catch_up_ms", "stats_ms"};
  return cols;
}

std::set<int> prepare_results_file(const std::string& path, const Experiment& ex, const RunProvenance& prov) {
  std::set<int> done;
  if (!std::filesystem::exists(path)) {
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    H5File f = H5File::create(path);
    write_root(f, ex, prov);
    results_format::rebuild_derived_tables(f);
    f.commit();
    return done;
  }
  const H5File f = H5File::open_read(path);
  MTP_REQUIRE(f.has_attr("schema") && f.attr_string("schema") == kResultsSchema, path,
              ": exists and is not an mtplab results file; choose another output (--out)");
  const int64_t version = f.attr_int("schema_version");
  MTP_REQUIRE(version == kResultsSchemaVersion, path, ": results schema version ", version,
              ", this mtplab writes ", kResultsSchemaVersion, "; choose another output (--out)");
  const std::string identity = f.attr_string("experiment_identity");
  if (identity != ex.identity) {
    std::vector<std::string> diffs = config_differences(f.attr_string("experiment_yaml"), ex.resolved_yaml);
    std::erase_if(diffs, [](const std::string& d) { return d.starts_with("output:"); });
    if (f.attr_int("world_size") != ex.world)
      diffs.push_back(
          str("world size: ", f.attr_int("world_size"), " (in the file) vs ", ex.world, " (this run)"));
    MTP_FAIL(path, ": holds results of a different experiment configuration (",
             f.attr_string("experiment_file"), "); it differs from this run (", ex.file, ") in: ",
             diffs.empty() ? std::string("(no key: a different mtplab wrote it)") : join(diffs, "; "),
             ". A results file holds one configuration: choose another output (--out) or delete the file");
  }
  const Group points = f.open_group("points");
  for (const auto& name : points.children()) {
    const Group g = points.open_group(name);
    const int64_t i = g.attr_int("index");
    MTP_REQUIRE(i >= 0 && i < static_cast<int64_t>(ex.points.size()), path, ": ", g.path(), ": point index ",
                i, " is not a point of this experiment");
    const auto& p = ex.points[static_cast<size_t>(i)];
    if (g.attr_string("config") != p.canonical)
      MTP_FAIL(
          path, ": ", g.path(), ": its configuration differs from point ", i,
          " of this run in: ", join(config_differences(g.attr_string("config"), p.canonical), "; "),
          "; refusing to mix them (a kernel choice set by an MTPLAB_* variable counts: the point records "
          "kernel_env_overrides)");
    if (g.attr_string("status") == "ok") done.insert(static_cast<int>(i));
  }
  return done;
}

void append_point(const std::string& path, const Experiment& ex, const PointConfig& point,
                  const PointResult& r, const RunProvenance& prov) {
  H5File f = H5File::open_append(path);
  MTP_REQUIRE(f.attr_string("experiment_identity") == ex.identity, path,
              ": was replaced by a file of another experiment while this run was going");
  Group points = f.open_group("points");
  if (points.exists(point.name())) points.remove(point.name());
  Group g = points.create_group(point.name());
  g.set_attr("index", static_cast<int64_t>(point.index));
  g.set_attr("name", point.name());
  g.set_attr("label", point.label());
  g.set_attr("status", "ok");
  g.set_attr("config", point.canonical);
  // The assignment, typed: the index of each axis' value (0 = the axis' first value, the
  // divergence reference), and each axis' value as an attribute of the axis' type.
  g.set_attr("assignment_index", point.assignment_index);
  for (size_t a = 0; a < ex.axes.size(); ++a) {
    const Axis& axis = ex.axes[a];
    const std::string& v = point.assignment[a].second;
    const std::string name = results_format::point_axis_attr(axis.name);
    switch (axis.type) {
      case ValueType::integer:
        g.set_attr(name, static_cast<int64_t>(std::stoll(v)));
        break;
      case ValueType::floating:
        g.set_attr(name, std::stod(v));
        break;
      case ValueType::text:
        g.set_attr(name, v);
        break;
    }
  }
  for (const auto& a : arm_registry()) {
    if (a.type == ArmType::integer)
      g.set_attr(a.name, static_cast<int64_t>(std::stoll(a.get(point.arms))));
    else if (a.type == ArmType::real)
      g.set_attr(a.name, std::stod(a.get(point.arms)));
    else
      g.set_attr(a.name, a.get(point.arms));
  }
  g.set_attr("model", point.model.name);
  g.set_attr("model_spec", point.model_spec);
  g.set_attr("backend", prov.backend);
  g.set_attr("world_size", static_cast<int64_t>(prov.world));
  g.set_attr("argv", prov.argv);
  g.set_attr("hosts", prov.hosts);
  g.set_attr("git_sha", git_sha());
  g.set_attr("git_dirty", git_dirty());
  g.set_attr("started_at", r.started_at);
  g.set_attr("finished_at", r.finished_at);
  g.set_attr("wall_s", r.wall_s);
  g.set_attr("warmup_steps", static_cast<int64_t>(point.measure.warmup_steps));
  g.set_attr("repeats", static_cast<int64_t>(point.measure.repeats));
  g.set_attr("arms_not_applied", r.arms_not_applied);
  g.set_attr("kernel_env_overrides", point.kernel_env_overrides);
  g.set_attr("ranks_agree", r.ranks_agree);
  g.set_attr("repeat_mismatches", r.repeat_mismatches);
  if (r.selection_checked) {
    // The batch_qidx selection check (drafter/selection_check.hpp), over every context row of
    // every repeat of the point.
    const drafter::SelectionCheck& c = r.selection_check;
    g.set_attr("qidx_check_rows", c.rows_checked);
    g.set_attr("qidx_check_rows_differ", c.rows_differ);
    g.set_attr("qidx_check_entries_differ", c.entries_differ);
    g.set_attr("qidx_check_rows_multi", c.rows_multi);
    g.set_attr("qidx_check_differ_rate", c.rows_checked ? c.differ_rate() : NAN);
  }
  // Acceptance (repeat 0; MODEL.md "Acceptance in replay").
  g.set_attr("steps", r.acceptance.steps);
  g.set_attr("drafted", r.acceptance.drafted);
  g.set_attr("accepted", r.acceptance.accepted);
  g.set_attr("acceptance_rate", r.acceptance.rate());
  g.set_attr("tau", r.acceptance.tau());
  // The same with each step's expected accepted count (docs/acceptance.md; equal to the realised
  // figures under greedy verification).
  g.set_attr("expected_acceptance_rate", r.acceptance.expected_rate());
  g.set_attr("expected_tau", r.acceptance.expected_tau());
  std::vector<double> per_pos = r.acceptance.per_position();
  per_pos.resize(static_cast<size_t>(r.k), 0.0);
  g.set_attr("per_position", per_pos);

  // Steps: one row per step of every repeat.
  const uint64_t n = static_cast<uint64_t>(r.rows());
  const uint64_t k = static_cast<uint64_t>(r.k);
  Group steps = g.create_group("steps");
  steps.write("repeat", r.repeat, results_format::column_options());
  steps.write("sequence", r.sequence, results_format::column_options());
  steps.write("position", r.position, results_format::column_options());
  steps.write("accepted", r.accepted, results_format::column_options());
  steps.write("warmup", r.warmup, results_format::column_options());
  steps.write("batch_step", r.batch_step, results_format::column_options());
  steps.write("batch_rows", r.batch_rows, results_format::column_options());
  steps.write("expected_accepted", r.expected_accepted, results_format::column_options());
  for (size_t c = 0; c < timing_columns().size(); ++c)
    steps.write(timing_columns()[c], r.timing[c], results_format::column_options());
  g.write("drafts", r.drafts, n, k, results_format::column_options());
  g.write("targets", r.targets, n, k, results_format::column_options());
  g.write("accept_prob", r.accept_prob, n, k, results_format::column_options());
  Group per_draft = g.create_group("per_draft");
  per_draft.write("block_ms", r.block_ms, n, k, results_format::column_options());
  per_draft.write("head_ms", r.head_ms, n, k, results_format::column_options());
  per_draft.write("exchange_ms", r.exchange_ms, n, k, results_format::column_options());
  Group seqs = g.create_group("sequences");
  seqs.write("sequence", r.seq_index);
  seqs.write("prompt_len", r.seq_prompt_len);
  seqs.write("length", r.seq_length);
  seqs.write("steps", r.seq_steps);
  seqs.write("prefill_ms", r.seq_prefill_ms);

  // Summaries over the measured (non-warm-up) steps of every repeat.
  Group sum = g.create_group("summary");
  std::vector<std::string> metric;
  std::vector<int64_t> count;
  std::vector<double> mean, median, p10, p90, p99, mn, mx, lo, hi, spread;
  for (size_t c = 0; c < timing_columns().size(); ++c) {
    std::vector<double> x;
    // Each (batched) step once: its first row (every row of a step carries the step's times).
    for (size_t row = 0; row < n; ++row)
      if (!r.warmup[row] && (row == 0 || r.batch_step[row] != r.batch_step[row - 1]))
        x.push_back(r.timing[c][row]);
    const Summary s = summarize(x, 0x5EED0000ull + static_cast<uint64_t>(point.index) * 64 + c);
    metric.push_back(timing_columns()[c]);
    count.push_back(s.n);
    mean.push_back(s.mean);
    median.push_back(s.median);
    p10.push_back(s.p10);
    p90.push_back(s.p90);
    p99.push_back(s.p99);
    mn.push_back(s.min);
    mx.push_back(s.max);
    lo.push_back(s.ci95_lo);
    hi.push_back(s.ci95_hi);
    spread.push_back(s.rel_spread);
    const std::string m = timing_columns()[c];
    const std::string base = m.substr(0, m.size() - 3);  // "step_ms" -> "step"
    g.set_attr(base + "_ms_median", s.median);
    g.set_attr(base + "_ms_p90", s.p90);
    g.set_attr(base + "_ms_p99", s.p99);
    g.set_attr(base + "_ms_ci95_lo", s.ci95_lo);
    g.set_attr(base + "_ms_ci95_hi", s.ci95_hi);
    g.set_attr(base + "_ms_rel_spread", s.rel_spread);
  }
  sum.write_strings("metric", metric);
  sum.write("n", count);
  sum.write("mean", mean);
  sum.write("median", median);
  sum.write("p10", p10);
  sum.write("p90", p90);
  sum.write("p99", p99);
  sum.write("min", mn);
  sum.write("max", mx);
  sum.write("ci95_lo", lo);
  sum.write("ci95_hi", hi);
  sum.write("rel_spread", spread);

  // Derived tables change with the points in the same commit, so that a killed run never leaves
  // them out of date.
  results_format::rebuild_derived_tables(f);
  f.commit();
}

}  // namespace mtplab::harness
