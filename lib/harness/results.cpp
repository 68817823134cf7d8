// Results file writing, resume checks, merging and the derived tables (/index, /divergence).
#include "harness/results.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

extern char** environ;

namespace mtplab::harness {
namespace {

using io::DatasetOptions;
using io::DType;
using io::Group;
using io::H5File;

// Chunked and compressed, hence checksummed (docs/hdf5.md).
DatasetOptions column_options() {
  DatasetOptions o;
  o.deflate = 4;
  return o;
}
const DatasetOptions kColumn = column_options();

std::string axis_values_attr(const std::string& axis) { return "sweep_values." + axis; }

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
    f.set_attr(axis_values_attr(a.name), a.values);
  }
  f.set_attr("sweep_axes", axes);
  f.create_group("points");
}

std::vector<std::string> string_list_attr(const io::Object& o, const std::string& name) {
  if (!o.has_attr(name)) return {};
  return o.attr_strings(name);
}

// ---- generic copy (merge) ----------------------------------------------------------------------

void copy_attrs(const io::Object& src, io::Object& dst) {
  for (const auto& name : src.attr_names()) {
    const io::AttrInfo info = src.attr_info(name);
    switch (info.kind) {
      case io::AttrKind::integer:
        if (info.scalar)
          dst.set_attr(name, src.attr_int(name));
        else
          dst.set_attr(name, src.attr_ints(name));
        break;
      case io::AttrKind::floating:
        if (info.scalar)
          dst.set_attr(name, src.attr_double(name));
        else
          dst.set_attr(name, src.attr_doubles(name));
        break;
      case io::AttrKind::string:
        if (info.scalar)
          dst.set_attr(name, src.attr_string(name));
        else
          dst.set_attr(name, src.attr_strings(name));
        break;
      case io::AttrKind::other:
        MTP_FAIL(src.file_name(), ": ", src.path(), ": attribute '", name,
                 "' has a type merge does not copy");
    }
  }
}

template <typename T>
void copy_typed(const io::Dataset& d, Group& dst, const std::string& name) {
  const auto data = d.read<T>();
  io::Dataset out =
      d.rank() == 2 ? dst.write(name, data, d.rows(), d.cols(), kColumn) : dst.write(name, data, kColumn);
  copy_attrs(d, out);
}

void copy_group(const Group& src, Group& dst) {
  copy_attrs(src, dst);
  for (const auto& name : src.children()) {
    switch (src.kind(name)) {
      case io::NodeKind::group: {
        Group g = dst.create_group(name);
        copy_group(src.open_group(name), g);
        break;
      }
      case io::NodeKind::dataset: {
        const io::Dataset d = src.open_dataset(name);
        switch (d.dtype()) {
          case DType::i8:
            copy_typed<int8_t>(d, dst, name);
            break;
          case DType::u8:
            copy_typed<uint8_t>(d, dst, name);
            break;
          case DType::u16:
            copy_typed<uint16_t>(d, dst, name);
            break;
          case DType::i32:
            copy_typed<int32_t>(d, dst, name);
            break;
          case DType::i64:
            copy_typed<int64_t>(d, dst, name);
            break;
          case DType::f32:
            copy_typed<float>(d, dst, name);
            break;
          case DType::f64:
            copy_typed<double>(d, dst, name);
            break;
          case DType::bf16:
            copy_typed<bf16>(d, dst, name);
            break;
          case DType::string: {
            const auto v = d.read_strings();
            io::Dataset out = dst.write_strings(name, v);
            copy_attrs(d, out);
            break;
          }
        }
        break;
      }
      case io::NodeKind::other:
        MTP_FAIL(src.file_name(), ": ", src.path(), "/", name,
                 ": not a group or dataset; merge does not copy it");
    }
  }
}

// ---- derived tables ------------------------------------------------------------------------------

// /index: one row per point, from the point groups' attributes.
void rebuild_index(H5File& f) {
  if (f.exists("index")) f.remove("index");
  Group idx = f.create_group("index");
  const Group points = f.open_group("points");
  const std::vector<std::string> names = points.children();
  const std::vector<std::string> axes = string_list_attr(f, "sweep_axes");
  const std::vector<std::string> float_cols = {"acceptance_rate",       "tau",
                                               "step_ms_median",        "step_ms_p90",
                                               "step_ms_p99",           "step_ms_ci95_lo",
                                               "step_ms_ci95_hi",       "step_ms_rel_spread",
                                               "propose_ms_median",     "wall_s",
                                               "qidx_check_differ_rate"};
  // qidx_check_*: -1 (NaN for the rate) where the point ran no selection check.
  const std::vector<std::string> int_cols = {"point",
                                             "steps",
                                             "draft_len",
                                             "ranks_agree",
                                             "repeat_mismatches",
                                             "qidx_check_rows",
                                             "qidx_check_rows_differ"};
  // Every other arm and swept axis is a string column; a name is a column once.
  std::vector<std::string> string_cols = {"name", "status", "label"};
  auto taken = [&](const std::string& c) {
    for (const std::vector<std::string>* list : {&std::as_const(string_cols), &int_cols, &float_cols})
      if (std::find(list->begin(), list->end(), c) != list->end()) return true;
    return false;
  };
  for (const auto& a : arm_names())
    if (!taken(a)) string_cols.push_back(a);
  for (const auto& a : axes)
    if (!taken(a)) string_cols.push_back(a);
  std::map<std::string, std::vector<std::string>> s;
  std::map<std::string, std::vector<double>> d;
  std::map<std::string, std::vector<int64_t>> i;
  for (const auto& n : names) {
    const Group g = points.open_group(n);
    std::map<std::string, std::string> assigned;
    for (const auto& kv : string_list_attr(g, "assignment")) {
      const auto eq = kv.find('=');
      if (eq != std::string::npos) assigned[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& c : string_cols) {
      std::string v;
      if (g.has_attr(c) && g.attr_info(c).kind == io::AttrKind::string)
        v = g.attr_string(c);
      else if (g.has_attr(c) && g.attr_info(c).kind == io::AttrKind::integer)
        v = str(g.attr_int(c));
      else if (assigned.count(c))
        v = assigned[c];
      s[c].push_back(v);
    }
    for (const auto& c : float_cols) d[c].push_back(g.has_attr(c) ? g.attr_double(c) : NAN);
    for (const auto& c : int_cols) {
      const std::string attr = c == "point" ? "index" : c;
      i[c].push_back(g.has_attr(attr) ? g.attr_int(attr) : -1);
    }
  }
  for (const auto& c : int_cols) idx.write(c, i[c]);
  for (const auto& c : string_cols) idx.write_strings(c, s[c]);
  for (const auto& c : float_cols) idx.write(c, d[c]);
  idx.set_attr("columns", [&] {
    std::vector<std::string> all = int_cols;
    all.insert(all.end(), string_cols.begin(), string_cols.end());
    all.insert(all.end(), float_cols.begin(), float_cols.end());
    return all;
  }());
}

void write_divergence(H5File& f, const std::vector<Divergence>& rows) {
  if (f.exists("divergence")) f.remove("divergence");
  Group g = f.create_group("divergence");
  std::vector<int64_t> point, reference, steps, common, any, first;
  std::vector<std::string> axis, value, ref_value;
  std::vector<double> rate_any, rate_first;
  for (const auto& r : rows) {
    point.push_back(r.point);
    reference.push_back(r.reference);
    axis.push_back(r.axis);
    value.push_back(r.value);
    ref_value.push_back(r.reference_value);
    steps.push_back(r.steps);
    common.push_back(r.common_steps);
    any.push_back(r.differ_any);
    first.push_back(r.differ_first);
    rate_any.push_back(r.common_steps ? static_cast<double>(r.differ_any) / r.common_steps : NAN);
    rate_first.push_back(r.common_steps ? static_cast<double>(r.differ_first) / r.common_steps : NAN);
  }
  g.write("point", point);
  g.write("reference", reference);
  g.write_strings("axis", axis);
  g.write_strings("value", value);
  g.write_strings("reference_value", ref_value);
  g.write("steps", steps);
  g.write("common_steps", common);
  g.write("differ_any", any);
  g.write("differ_first", first);
  g.write("rate_any", rate_any);
  g.write("rate_first", rate_first);
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
  static const std::vector<std::string> cols = {"step_ms",     "propose_ms",      "block_ms",   "head_ms",
                                                "exchange_ms", "after_verify_ms", "catch_up_ms"};
  return cols;
}

std::set<int> prepare_results_file(const std::string& path, const Experiment& ex, const RunProvenance& prov) {
  std::set<int> done;
  if (!std::filesystem::exists(path)) {
    const auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    H5File f = H5File::create(path);
    write_root(f, ex, prov);
    rebuild_index(f);
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
    MTP_FAIL(path, ": holds results of a different experiment configuration (",
             f.attr_string("experiment_file"), ", ", f.attr_int("world_size"), " rank(s), identity ",
             identity, "); this run is ", ex.file, " with ", ex.world, " rank(s), identity ", ex.identity,
             ". A results file holds one configuration: choose another output (--out) or delete the file");
  }
  const Group points = f.open_group("points");
  for (const auto& name : points.children()) {
    const Group g = points.open_group(name);
    const int64_t i = g.attr_int("index");
    MTP_REQUIRE(i >= 0 && i < static_cast<int64_t>(ex.points.size()), path, ": ", g.path(), ": point index ",
                i, " is not a point of this experiment");
    const auto& p = ex.points[static_cast<size_t>(i)];
    MTP_REQUIRE(g.attr_string("config") == p.canonical, path, ": ", g.path(),
                ": its configuration differs from point ", i, " of this run; refusing to mix them");
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
  std::vector<std::string> assignment;
  for (const auto& [k, v] : point.assignment) assignment.push_back(str(k, "=", v));
  g.set_attr("assignment", assignment);
  for (const auto& [k, v] : point.arms.named()) {
    if (k == "draft_len")
      g.set_attr(k, static_cast<int64_t>(point.arms.draft_len));
    else
      g.set_attr(k, v);
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
  std::vector<double> per_pos = r.acceptance.per_position();
  per_pos.resize(static_cast<size_t>(r.k), 0.0);
  g.set_attr("per_position", per_pos);

  // Steps: one row per step of every repeat.
  const uint64_t n = static_cast<uint64_t>(r.rows());
  const uint64_t k = static_cast<uint64_t>(r.k);
  Group steps = g.create_group("steps");
  steps.write("repeat", r.repeat, kColumn);
  steps.write("sequence", r.sequence, kColumn);
  steps.write("position", r.position, kColumn);
  steps.write("accepted", r.accepted, kColumn);
  steps.write("warmup", r.warmup, kColumn);
  for (size_t c = 0; c < timing_columns().size(); ++c) steps.write(timing_columns()[c], r.timing[c], kColumn);
  g.write("drafts", r.drafts, n, k, kColumn);
  g.write("targets", r.targets, n, k, kColumn);
  Group per_draft = g.create_group("per_draft");
  per_draft.write("block_ms", r.block_ms, n, k, kColumn);
  per_draft.write("head_ms", r.head_ms, n, k, kColumn);
  per_draft.write("exchange_ms", r.exchange_ms, n, k, kColumn);
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
    for (size_t row = 0; row < n; ++row)
      if (!r.warmup[row]) x.push_back(r.timing[c][row]);
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

  rebuild_index(f);
  // Derived tables change with the points in the same commit, so that a killed run never leaves
  // them out of date.
  write_divergence(f, compute_divergence(f));
  f.commit();
}

std::vector<Divergence> compute_divergence(const Group& root) {
  std::vector<Divergence> out;
  if (!root.exists("points")) return out;
  const std::vector<std::string> axes = string_list_attr(root, "sweep_axes");
  std::map<std::string, std::string> first_value;
  for (const auto& a : axes) {
    const auto vals = string_list_attr(root, axis_values_attr(a));
    if (!vals.empty()) first_value[a] = vals.front();
  }
  const Group points = root.open_group("points");
  struct P {
    int64_t index;
    std::map<std::string, std::string> assignment;
    std::string key;
  };
  std::vector<P> ps;
  std::map<std::string, size_t> by_key;
  auto key_of = [](const std::map<std::string, std::string>& a) {
    std::string k;
    for (const auto& [ax, v] : a) k += ax + "=" + v + "\n";
    return k;
  };
  const auto names = points.children();
  for (const auto& n : names) {
    const Group g = points.open_group(n);
    P p;
    p.index = g.attr_int("index");
    for (const auto& kv : string_list_attr(g, "assignment")) {
      const auto eq = kv.find('=');
      if (eq != std::string::npos) p.assignment[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    p.key = key_of(p.assignment);
    by_key[p.key] = ps.size();
    ps.push_back(std::move(p));
  }
  // Repeat-0 steps of a point: (sequence, position) -> drafts.
  using StepKey = std::pair<int32_t, int32_t>;
  auto load = [&](size_t i) {
    const Group g = points.open_group(names[i]);
    const Group s = g.open_group("steps");
    const auto rep = s.open_dataset("repeat").read<int32_t>();
    const auto seq = s.open_dataset("sequence").read<int32_t>();
    const auto pos = s.open_dataset("position").read<int32_t>();
    const io::Dataset dd = g.open_dataset("drafts");
    const auto drafts = dd.read<int32_t>();
    const size_t k = static_cast<size_t>(dd.cols());
    std::map<StepKey, std::vector<int32_t>> m;
    for (size_t r = 0; r < rep.size(); ++r)
      if (rep[r] == 0)
        m[{seq[r], pos[r]}] = std::vector<int32_t>(drafts.begin() + static_cast<std::ptrdiff_t>(r * k),
                                                   drafts.begin() + static_cast<std::ptrdiff_t>((r + 1) * k));
    return m;
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    for (const auto& [axis, value] : ps[i].assignment) {
      auto fv = first_value.find(axis);
      if (fv == first_value.end() || fv->second == value) continue;
      auto ref_assignment = ps[i].assignment;
      ref_assignment[axis] = fv->second;
      auto it = by_key.find(key_of(ref_assignment));
      if (it == by_key.end()) continue;
      const auto mine = load(i);
      const auto ref = load(it->second);
      Divergence d;
      d.point = ps[i].index;
      d.reference = ps[it->second].index;
      d.axis = axis;
      d.value = value;
      d.reference_value = fv->second;
      d.steps = static_cast<int64_t>(mine.size());
      for (const auto& [sk, drafts] : mine) {
        auto r = ref.find(sk);
        if (r == ref.end()) continue;
        ++d.common_steps;
        const size_t k = std::min(drafts.size(), r->second.size());
        bool any = false;
        for (size_t j = 0; j < k; ++j) any = any || drafts[j] != r->second[j];
        d.differ_any += any;
        d.differ_first += k > 0 && drafts[0] != r->second[0];
      }
      out.push_back(d);
    }
  }
  std::sort(out.begin(), out.end(), [](const Divergence& a, const Divergence& b) {
    return std::tie(a.point, a.axis) < std::tie(b.point, b.axis);
  });
  return out;
}

int merge_results(const std::string& out, const std::vector<std::string>& inputs, bool overwrite,
                  const std::vector<std::string>& argv) {
  MTP_REQUIRE(!inputs.empty(), "merge: no input files");
  for (const auto& in : inputs)
    MTP_REQUIRE(std::filesystem::absolute(in) != std::filesystem::absolute(out), "merge: the output ", out,
                " is also an input; write the merge to a new file");
  MTP_REQUIRE(overwrite || !std::filesystem::exists(out), "merge: ", out,
              " exists; remove it or pass --force to replace it");
  std::vector<H5File> files;
  for (const auto& in : inputs) {
    files.push_back(H5File::open_read(in));
    const H5File& f = files.back();
    MTP_REQUIRE(f.has_attr("schema") && f.attr_string("schema") == kResultsSchema, in,
                ": not an mtplab results file");
    MTP_REQUIRE(f.attr_int("schema_version") == kResultsSchemaVersion, in, ": results schema version ",
                f.attr_int("schema_version"), ", expected ", kResultsSchemaVersion);
    MTP_REQUIRE(f.attr_string("experiment_identity") == files.front().attr_string("experiment_identity"), in,
                ": a different experiment configuration (identity ", f.attr_string("experiment_identity"),
                ") than ", inputs.front(), " (", files.front().attr_string("experiment_identity"),
                "); only task files of one experiment can be merged");
  }
  // Which input provides each point; conflicting configs are refused before anything is written.
  std::map<std::string, std::pair<size_t, std::string>> chosen;  // point name -> (input, config)
  for (size_t i = 0; i < files.size(); ++i) {
    const Group points = files[i].open_group("points");
    for (const auto& name : points.children()) {
      const Group g = points.open_group(name);
      const std::string config = g.attr_string("config");
      auto it = chosen.find(name);
      if (it == chosen.end()) {
        chosen[name] = {i, config};
      } else if (it->second.second != config) {
        MTP_FAIL("merge: point ", name, " has different configurations in ", inputs[it->second.first],
                 " and ", inputs[i], "; refusing to merge conflicting points");
      } else {
        log_warn("merge: point ", name, " is in both ", inputs[it->second.first], " and ", inputs[i],
                 " with the same configuration; keeping the first");
      }
    }
  }
  H5File o = H5File::create(out);
  copy_attrs(files.front(), o);
  o.set_attr("merged_from", inputs);
  o.set_attr("merge_argv", argv);
  o.set_attr("merged_at", utc_now());
  Group points = o.create_group("points");
  for (const auto& [name, src] : chosen) {
    Group g = points.create_group(name);
    copy_group(files[src.first].open_group("points").open_group(name), g);
  }
  rebuild_index(o);
  const int64_t expected = files.front().attr_int("num_points");
  std::vector<std::string> missing;
  for (int64_t i = 0; i < expected; ++i) {
    PointConfig tmp;
    tmp.index = static_cast<int>(i);
    if (!chosen.count(tmp.name())) missing.push_back(tmp.name());
  }
  write_divergence(o, compute_divergence(o));
  o.commit();
  if (!missing.empty())
    log_warn("merge: ", out, " lacks ", missing.size(), " of ", expected, " points: ", join(missing, " "));
  return static_cast<int>(chosen.size());
}

}  // namespace mtplab::harness
