// The results writer: the root's provenance and identity, the resume check of an existing file
// (which names the keys that differ), the removal of a killed writer's temporaries, and the append
// of one point (its group, then the derived tables, in one commit).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "harness/replay_teacher.hpp"
#include "harness/results.hpp"
#include "harness/results_format.hpp"
#include "harness/uncertainty.hpp"
#include "io/output.hpp"

extern char** environ;

namespace mtplab::harness {
namespace {

using io::Group;
using io::H5File;

using results_format::kIdentityKeysAttr;
using results_format::kIdentityValuesAttr;

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
  f.set_attr("experiment_identity", results_identity(ex.configuration, prov.identity_inputs));
  std::vector<std::string> keys, values;
  for (const auto& [k, v] : prov.identity_inputs) {
    keys.push_back(k);
    values.push_back(v);
  }
  f.set_attr(kIdentityKeysAttr, keys);
  f.set_attr(kIdentityValuesAttr, values);
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
  f.set_attr("arms", arm_names());
  f.create_group("points");
}

// The keys whose values differ between two YAML documents (mappings, flattened to dotted key
// paths), as "key: A (a_label) vs B (b_label)".
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

// The differences between two key -> value maps, each side named by its label.
std::vector<std::string> map_differences(const std::map<std::string, std::string>& a,
                                         const std::map<std::string, std::string>& b,
                                         const std::string& a_label, const std::string& b_label) {
  std::vector<std::string> out;
  for (const auto& [key, v] : a) {
    auto it = b.find(key);
    if (it == b.end())
      out.push_back(str(key, ": ", v, " (", a_label, ") vs absent (", b_label, ")"));
    else if (it->second != v)
      out.push_back(str(key, ": ", v, " (", a_label, ") vs ", it->second, " (", b_label, ")"));
  }
  for (const auto& [key, v] : b)
    if (!a.count(key)) out.push_back(str(key, ": absent (", a_label, ") vs ", v, " (", b_label, ")"));
  return out;
}

std::vector<std::string> config_differences(const std::string& a_yaml, const std::string& b_yaml,
                                            const std::string& a_label = "in the file",
                                            const std::string& b_label = "this run") {
  std::map<std::string, std::string> a, b;
  try {
    flatten(YAML::Load(a_yaml), "", a);
    flatten(YAML::Load(b_yaml), "", b);
  } catch (const YAML::Exception&) {
    return {"(the stored configuration is not readable YAML)"};
  }
  return map_differences(a, b, a_label, b_label);
}

bool pid_alive(long pid) {
  if (pid <= 0) return false;
  if (pid == static_cast<long>(::getpid())) return true;
  // kill(pid, 0) delivers nothing: 0 or EPERM (another user's process) means it exists.
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

namespace results_format {

// What a reader needs to judge the point's acceptance (repeat 0, as the figures above): the
// accepted-length histogram, 95% intervals of acceptance rate and tau by a bootstrap over
// sequences, and for teacher-forced points the per-depth accuracy with its intervals.
void write_acceptance_reading(Group& g, int point_index, bool teacher_forced, const PointResult& r) {
  const int k = r.k;
  std::vector<int32_t> seq0, acc0;
  std::vector<double> exp0;
  std::vector<uint8_t> rep0(r.sequence.size(), 0);
  const bool has_expected = r.expected_accepted.size() == r.sequence.size();
  for (size_t row = 0; row < r.sequence.size(); ++row) {
    if (r.repeat[row] != 0) continue;
    rep0[row] = 1;
    seq0.push_back(r.sequence[row]);
    acc0.push_back(r.accepted[row]);
    if (has_expected) exp0.push_back(r.expected_accepted[row]);
  }
  g.set_attr("accepted_hist", accepted_histogram(acc0, k));
  const uint64_t seed = acceptance_bootstrap_seed(point_index);
  const SequenceSums sums = sums_by_sequence(seq0, acc0, exp0);
  const AcceptanceIntervals ci = acceptance_intervals(sums, k, seed);
  g.set_attr("acceptance_rate_ci", std::vector<double>{ci.acceptance_rate.lo, ci.acceptance_rate.hi});
  g.set_attr("tau_ci", std::vector<double>{ci.tau.lo, ci.tau.hi});
  // The expected figures' intervals from the same resamples (NaN bounds without expected lengths).
  g.set_attr("expected_acceptance_rate_ci",
             std::vector<double>{ci.expected_acceptance_rate.lo, ci.expected_acceptance_rate.hi});
  g.set_attr("expected_tau_ci", std::vector<double>{ci.expected_tau.lo, ci.expected_tau.hi});
  g.set_attr("bootstrap_units", "sequences");
  g.set_attr("bootstrap_resamples", static_cast<int64_t>(kBootstrapResamples));
  g.set_attr("bootstrap_seed", static_cast<int64_t>(seed));
  if (!teacher_forced) return;
  // Per depth j: positions whose draft j equals its target, over positions; the interval from the
  // same bootstrap over sequences (one numerator per depth, the same resamples).
  std::vector<double> rate = depth_hit_rates(r.drafts, r.targets, k, rep0);
  rate.resize(static_cast<size_t>(k), std::numeric_limits<double>::quiet_NaN());
  std::vector<std::vector<double>> hits(static_cast<size_t>(k),
                                        std::vector<double>(sums.sequence.size(), 0.0));
  std::map<int32_t, size_t> unit;
  for (size_t u = 0; u < sums.sequence.size(); ++u) unit[sums.sequence[u]] = u;
  for (size_t row = 0; row < r.sequence.size(); ++row) {
    if (!rep0[row]) continue;
    const size_t u = unit.at(r.sequence[row]);
    for (size_t j = 0; j < static_cast<size_t>(k); ++j)
      hits[j][u] += r.drafts[row * static_cast<size_t>(k) + j] == r.targets[row * static_cast<size_t>(k) + j];
  }
  const std::vector<Interval> depth_ci = bootstrap_ratio_intervals(sums.steps, hits, seed);
  std::vector<double> lo, hi;
  for (const Interval& i : depth_ci) {
    lo.push_back(i.lo);
    hi.push_back(i.hi);
  }
  g.set_attr("teacher_forced_rate", rate);
  g.set_attr("teacher_forced_rate_ci_lo", lo);
  g.set_attr("teacher_forced_rate_ci_hi", hi);
}

std::string schema_problem(const io::H5File& f, const std::string& path, const std::string& command) {
  if (!f.has_attr("schema") || f.attr_info("schema").kind != io::AttrKind::string ||
      f.attr_string("schema") != kResultsSchema)
    return str(path, ": not an mtplab results file (", io::describe_existing_file(path), ")");
  if (!f.has_attr("schema_version") || f.attr_info("schema_version").kind != io::AttrKind::integer)
    return str(path, ": a results file without an integer schema_version attribute");
  const int64_t version = f.attr_int("schema_version");
  if (version < kResultsSchemaVersion)
    return str(path, ": results schema version ", version, "; ", command, " reads version ",
               kResultsSchemaVersion, " only: run `mtplab upgrade ", path,
               " NEW.h5` and use NEW.h5 (docs/results-schema.md, \"Upgrading older files\")");
  if (version > kResultsSchemaVersion)
    return str(path, ": results schema version ", version,
               ", written by a newer mtplab; this one reads version ", kResultsSchemaVersion);
  return "";
}

IdentityParts identity_parts(const io::H5File& f) {
  IdentityParts p;
  p.yaml = f.attr_string("experiment_yaml");
  p.world = f.attr_int("world_size");
  const auto keys = f.attr_strings(kIdentityKeysAttr);
  const auto values = f.attr_strings(kIdentityValuesAttr);
  MTP_REQUIRE(keys.size() == values.size(), f.path(), ": ", kIdentityKeysAttr, " has ", keys.size(),
              " entries but ", kIdentityValuesAttr, " has ", values.size());
  for (size_t i = 0; i < keys.size(); ++i) p.inputs.emplace_back(keys[i], values[i]);
  return p;
}

std::vector<std::string> identity_differences(const IdentityParts& a, const IdentityParts& b,
                                              const std::string& a_label, const std::string& b_label) {
  std::vector<std::string> diffs = config_differences(a.yaml, b.yaml, a_label, b_label);
  std::erase_if(diffs, [](const std::string& d) { return d.starts_with("output:"); });
  if (a.world != b.world)
    diffs.push_back(str("world size: ", a.world, " (", a_label, ") vs ", b.world, " (", b_label, ")"));
  const std::map<std::string, std::string> ia(a.inputs.begin(), a.inputs.end());
  const std::map<std::string, std::string> ib(b.inputs.begin(), b.inputs.end());
  const std::vector<std::string> inputs = map_differences(ia, ib, a_label, b_label);
  diffs.insert(diffs.end(), inputs.begin(), inputs.end());
  return diffs;
}

}  // namespace results_format

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

AcceptanceMeaning acceptance_meaning(const WeightsSpec& weights) {
  if (!weights.synthetic) return {};
  return {false,
          str("synthetic weights (seed ", weights.seed,
              "): the drafter is random and unrelated to the target that made the trace, so its drafts "
              "are accepted by chance only; acceptance needs a checkpoint's weights (docs/acceptance.md)")};
}

AcceptanceMeaning acceptance_meaning_of_config(const std::string& config_yaml, const std::string& where) {
  YAML::Node doc;
  try {
    doc = YAML::Load(config_yaml);
  } catch (const YAML::Exception& e) {
    MTP_FAIL(where, ": the point's config is not readable YAML: ", e.msg);
  }
  const YAML::Node w = doc.IsMap() ? doc["weights"] : YAML::Node();
  MTP_REQUIRE(w && w.IsMap() && (w["synthetic"] || w["checkpoint"]), where,
              ": the point's config names no weights (synthetic or checkpoint)");
  WeightsSpec spec;
  spec.synthetic = static_cast<bool>(w["synthetic"]);
  if (spec.synthetic && w["synthetic"].IsMap() && w["synthetic"]["seed"])
    spec.seed = w["synthetic"]["seed"].as<uint64_t>(1);
  return acceptance_meaning(spec);
}

const std::vector<std::string>& timing_columns() {
  static const std::vector<std::string> cols = {"step_ms",     "propose_ms",      "block_ms",    "head_ms",
                                                "exchange_ms", "after_verify_ms", "catch_up_ms", "stats_ms"};
  return cols;
}

std::string results_identity(const std::string& configuration, const IdentityInputs& inputs) {
  std::string text = configuration;
  for (const auto& [k, v] : inputs) text += str("\n", k, "=", v);
  return hex16(fnv1a64(text));
}

namespace {
// Every file the experiment reads: the experiment, model configs, traces and checkpoints.
std::vector<std::string> experiment_inputs(const Experiment& ex) {
  std::vector<std::string> in = {ex.file};
  for (const auto& p : ex.points) {
    if (!p.model.source.empty()) in.push_back(p.model.source);
    if (!p.trace.synthetic) in.push_back(p.trace.path);
    if (!p.weights.synthetic) in.push_back(p.weights.checkpoint);
  }
  std::sort(in.begin(), in.end());
  in.erase(std::unique(in.begin(), in.end()), in.end());
  return in;
}
}  // namespace

std::string kernels_not_recorded(int64_t from_version) {
  return str("not recorded (results schema version ", from_version, ")");
}

std::vector<std::string> kernel_record_entries(const std::vector<KernelRecordEntries>& per_rank) {
  std::map<std::string, std::vector<std::string>> by_op;  // op -> kernels per rank ("-": not run)
  for (size_t rank = 0; rank < per_rank.size(); ++rank)
    for (const auto& [op, kernels] : per_rank[rank]) {
      auto& ks = by_op[op];
      ks.resize(per_rank.size(), "-");
      ks[rank] = kernels;
    }
  std::vector<std::string> out;
  for (auto& [op, ks] : by_op) {
    ks.resize(per_rank.size(), "-");
    if (std::all_of(ks.begin(), ks.end(), [&](const std::string& k) { return k == ks[0]; })) {
      out.push_back(str(op, "=", ks[0]));
      continue;
    }
    std::vector<std::string> parts;
    for (size_t rank = 0; rank < ks.size(); ++rank) parts.push_back(str("rank ", rank, ": ", ks[rank]));
    out.push_back(str(op, "=", join(parts, "; ")));
  }
  return out;
}

ResumeState inspect_results_file(const std::string& path, const Experiment& ex,
                                 const IdentityInputs& inputs) {
  ResumeState st;
  // The output rule (io/output.hpp): links and spellings resolved, never an input, never a file of
  // another kind; an existing results file is resumed (checked below).
  const io::OutputCheck out = io::check_output("mtplab run", path, {"results file", "schema", kResultsSchema},
                                               experiment_inputs(ex), io::OutputMode::resume);
  st.exists = out.exists || !out.problems.empty();
  if (!out.problems.empty()) {
    for (const auto& p : out.problems) st.problems.push_back(str(p, " (--out)"));
    return st;
  }
  if (!out.exists) return st;
  try {
    const H5File f = H5File::open_read(path);
    if (const std::string problem = results_format::schema_problem(f, path, "mtplab run (resume)");
        !problem.empty()) {
      st.problems.push_back(str(problem, "; or choose another output (--out)"));
      return st;
    }
    const Group points = f.open_group("points");
    const std::vector<std::string> names = points.children();
    st.points_in_file = static_cast<int64_t>(names.size());
    if (f.attr_string("experiment_identity") != results_identity(ex.configuration, inputs)) {
      results_format::IdentityParts run{ex.resolved_yaml, ex.world, inputs};
      const std::vector<std::string> diffs = results_format::identity_differences(
          results_format::identity_parts(f), run, "in the file", "this run");
      st.problems.push_back(str(
          path, ": holds results of a different experiment configuration (", f.attr_string("experiment_file"),
          "); it differs from this run (", ex.file,
          ") in: ", diffs.empty() ? std::string("(no key: a different mtplab wrote it)") : join(diffs, "; "),
          ". A results file holds one configuration on one set of inputs: choose another output (--out) "
          "or delete the file",
          names.empty() ? " (it holds no point: deleting it loses nothing)" : ""));
      return st;
    }
    for (const auto& name : names) {
      const Group g = points.open_group(name);
      const int64_t i = g.attr_int("index");
      if (i < 0 || i >= static_cast<int64_t>(ex.points.size())) {
        st.problems.push_back(
            str(path, ": ", g.path(), ": point index ", i, " is not a point of this experiment"));
        continue;
      }
      const auto& p = ex.points[static_cast<size_t>(i)];
      if (g.attr_string("config") != p.canonical) {
        st.problems.push_back(str(
            path, ": ", g.path(), ": its configuration differs from point ", i,
            " of this run in: ", join(config_differences(g.attr_string("config"), p.canonical), "; "),
            "; refusing to mix them (a kernel choice set by an MTPLAB_* variable counts: the point records "
            "kernel_env_overrides)"));
        continue;
      }
      if (g.attr_string("status") == "ok") st.done.insert(static_cast<int>(i));
    }
  } catch (const Error& e) {
    st.problems.push_back(
        str(path, ": cannot be read as a results file: ", e.message(), "; choose another output (--out)"));
  }
  return st;
}

std::vector<std::string> stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string prefix = target.filename().string() + ".tmp.";
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix) || name.size() == prefix.size()) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (!std::all_of(pid_text.begin(), pid_text.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (pid_text.size() > 9 || pid_alive(std::stol(pid_text))) continue;
    out.push_back((target.parent_path() / name).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  std::vector<std::string> removed;
  for (const auto& tmp : stale_temporaries(path)) {
    std::error_code ec;
    if (std::filesystem::remove(tmp, ec)) {
      log_info("removed ", tmp, ": a temporary file of a killed writer (its pid is not alive on this host)");
      removed.push_back(tmp);
    } else if (ec) {
      log_warn("cannot remove the stale temporary file ", tmp, ": ", ec.message());
    }
  }
  return removed;
}

std::set<int> prepare_results_file(const std::string& path, const Experiment& ex, const RunProvenance& prov) {
  remove_stale_temporaries(path);
  ResumeState st = inspect_results_file(path, ex, prov.identity_inputs);
  MTP_REQUIRE(st.problems.empty(), join(st.problems, "\n"));
  if (!st.exists) {
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    H5File f = H5File::create(path);
    write_root(f, ex, prov);
    results_format::rebuild_derived_tables(f);
    f.commit();
  }
  return st.done;
}

void append_point(const std::string& path, const Experiment& ex, const PointConfig& point,
                  const PointResult& r, const RunProvenance& prov) {
  // Checked before the file is touched: a point written half is worse than none.
  const size_t rows = static_cast<size_t>(r.rows());
  MTP_REQUIRE(r.batch_step.size() == rows && r.batch_rows.size() == rows && r.batch_experts.size() == rows,
              point.name(), ": the step table's batch columns hold ", r.batch_step.size(), ", ",
              r.batch_rows.size(), " and ", r.batch_experts.size(), " rows for ", rows, " steps");
  H5File f = H5File::open_append(path);
  MTP_REQUIRE(
      f.attr_string("experiment_identity") == results_identity(ex.configuration, prov.identity_inputs), path,
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
  for (const auto& a : arm_registry()) results_format::set_arm_attr(g, a, a.get(point.arms));
  // The kernel each op ran (docs/results-schema.md); the policy that chose them is in the arms.
  MTP_REQUIRE(!r.kernels.empty(), point.name(), ": no kernel record (every backend notes the ops it runs)");
  g.set_attr("kernels", r.kernels);
  // The run settings: `mode` on every point, the online group's on an online point only (in a
  // replay point they are not in effect).
  for (const auto& rs : run_settings()) {
    if (rs.name != "mode" && point.mode != RunMode::online) continue;
    const std::string v = rs.get(point);
    if (rs.type == SettingType::integer)
      g.set_attr(rs.name, static_cast<int64_t>(std::stoll(v)));
    else
      g.set_attr(rs.name, v);
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
  // Acceptance (repeat 0; docs/model.md, "Acceptance").
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
  const AcceptanceMeaning meaning = acceptance_meaning(point.weights);
  g.set_attr("acceptance_meaningful", meaning.meaningful);
  g.set_attr("acceptance_note", meaning.reason);
  results_format::write_acceptance_reading(g, point.index,
                                           point.arms.replay.replay == ReplayMode::teacher_forced, r);
  if (r.online) {
    // Tokens per second over the measured steps, with intervals over sequences (uncertainty.hpp).
    const Throughput t = online_throughput(r.sequence, r.accepted, r.warmup, r.timing[0], r.batch_rows,
                                           prov.world, acceptance_bootstrap_seed(point.index));
    g.set_attr("tokens_per_s_per_sequence", t.per_sequence);
    g.set_attr("tokens_per_s_per_sequence_ci",
               std::vector<double>{t.per_sequence_ci.lo, t.per_sequence_ci.hi});
    g.set_attr("tokens_per_s_per_gpu", t.per_gpu);
    g.set_attr("tokens_per_s_per_gpu_ci", std::vector<double>{t.per_gpu_ci.lo, t.per_gpu_ci.hi});
    g.set_attr("measured_tokens", t.tokens);
    g.set_attr("measured_s", t.seconds);
    int64_t generated = 0;
    for (size_t i = 0; i < r.seq_length.size(); ++i) generated += r.seq_length[i] - r.seq_prompt_len[i];
    g.set_attr("generated_tokens", generated);
  }

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
  steps.write("batch_experts", r.batch_experts, results_format::column_options());
  steps.write("expected_accepted", r.expected_accepted, results_format::column_options());
  for (size_t c = 0; c < timing_columns().size(); ++c)
    steps.write(timing_columns()[c], r.timing[c], results_format::column_options());
  if (r.online) {
    MTP_REQUIRE(r.draft_ms.size() == n && r.verify_ms.size() == n, point.name(), ": ", r.draft_ms.size(),
                " and ", r.verify_ms.size(), " draft / verify times for ", n, " steps");
    steps.write("draft_ms", r.draft_ms, results_format::column_options());
    steps.write("verify_ms", r.verify_ms, results_format::column_options());
  }
  // Per draft [rows, k]. A point of draft_len 0 (online, MTP off) drafts nothing and has none of
  // them (docs/results-schema.md).
  if (k > 0) {
    g.write("drafts", r.drafts, n, k, results_format::column_options());
    g.write("targets", r.targets, n, k, results_format::column_options());
    if (!r.draft_margin.empty()) {
      MTP_REQUIRE(r.draft_margin.size() == n * k && r.draft_logprob.size() == n * k, point.name(), ": ",
                  r.draft_margin.size(), " draft margins for ", n, " steps of ", k, " drafts");
      g.write("draft_margin", r.draft_margin, n, k, results_format::column_options());
      g.write("draft_logprob", r.draft_logprob, n, k, results_format::column_options());
    }
    g.write("accept_prob", r.accept_prob, n, k, results_format::column_options());
    Group per_draft = g.create_group("per_draft");
    per_draft.write("block_ms", r.block_ms, n, k, results_format::column_options());
    per_draft.write("head_ms", r.head_ms, n, k, results_format::column_options());
    per_draft.write("exchange_ms", r.exchange_ms, n, k, results_format::column_options());
  }
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
  // The timing columns, then an online point's draft_ms and verify_ms.
  std::vector<std::pair<std::string, const std::vector<double>*>> timed;
  for (size_t c = 0; c < timing_columns().size(); ++c) timed.emplace_back(timing_columns()[c], &r.timing[c]);
  if (r.online) {
    timed.emplace_back("draft_ms", &r.draft_ms);
    timed.emplace_back("verify_ms", &r.verify_ms);
  }
  for (size_t c = 0; c < timed.size(); ++c) {
    std::vector<double> x;
    const std::vector<double>& column = *timed[c].second;
    // Each (batched) step once: its first row (every row of a step carries the step's times).
    for (size_t row = 0; row < n; ++row)
      if (!r.warmup[row] && (row == 0 || r.batch_step[row] != r.batch_step[row - 1]))
        x.push_back(column[row]);
    const Summary s = summarize(x, 0x5EED0000ull + static_cast<uint64_t>(point.index) * 64 + c);
    metric.push_back(timed[c].first);
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
    const std::string m = timed[c].first;
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
