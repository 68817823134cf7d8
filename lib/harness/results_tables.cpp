// The derived tables of a results file: /index (one typed row per point) and /divergence (a
// point's drafts against its reference point's). Both are rebuilt from the point groups whenever
// points are added, so they never disagree with them.
#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "harness/experiment.hpp"
#include "harness/results.hpp"
#include "harness/results_format.hpp"
#include "harness/uncertainty.hpp"

namespace mtplab::harness {
namespace results_format {

const io::DatasetOptions& column_options() {
  static const io::DatasetOptions o = [] {
    io::DatasetOptions d;
    d.deflate = 4;
    return d;
  }();
  return o;
}

std::vector<std::string> string_list_attr(const io::Object& o, const std::string& name) {
  if (!o.has_attr(name)) return {};
  return o.attr_strings(name);
}

void set_arm_attr(io::Object& g, const ArmSpec& a, const std::string& value) {
  switch (a.type) {
    case SettingType::integer: {
      const auto v = parse_int64(value);
      MTP_REQUIRE(v, g.file_name(), ": ", g.path(), ": ", a.name, " \"", value, "\" is not a whole number");
      g.set_attr(a.name, *v);
      return;
    }
    case SettingType::real: {
      const auto v = parse_double(value);
      MTP_REQUIRE(v, g.file_name(), ": ", g.path(), ": ", a.name, " \"", value, "\" is not a number");
      g.set_attr(a.name, *v);
      return;
    }
    case SettingType::choice:
    case SettingType::boolean:
    case SettingType::text:
      g.set_attr(a.name, value);
      return;
  }
}

}  // namespace results_format

namespace {

using io::Group;
using io::H5File;
using results_format::point_axis_attr;
using results_format::string_list_attr;

// /index: one row per point, from the point groups' attributes. Fixed metric columns, then every
// arm (typed as the registry says) and every other sweep axis (typed as the root records it).
void rebuild_index(H5File& f, const std::vector<Divergence>& divergence) {
  if (f.exists("index")) f.remove("index");
  Group idx = f.create_group("index");
  const Group points = f.open_group("points");
  const std::vector<std::string> names = points.children();
  const std::vector<std::string> axes = string_list_attr(f, "sweep_axes");
  std::vector<std::string> float_cols = {"acceptance_rate",
                                         "tau",
                                         "expected_acceptance_rate",
                                         "expected_tau",
                                         "step_ms_median",
                                         "step_ms_p90",
                                         "step_ms_p99",
                                         "step_ms_ci95_lo",
                                         "step_ms_ci95_hi",
                                         "step_ms_rel_spread",
                                         "propose_ms_median",
                                         "wall_s",
                                         "qidx_check_differ_rate",
                                         "tokens_per_s_per_sequence",
                                         "tokens_per_s_per_gpu"};
  // qidx_check_*: -1 (NaN for the rate) where the point ran no selection check;
  // acceptance_meaningful: -1 where the point does not record it.
  std::vector<std::string> int_cols = {"point",
                                       "steps",
                                       "ranks_agree",
                                       "repeat_mismatches",
                                       "qidx_check_rows",
                                       "qidx_check_rows_differ",
                                       "acceptance_meaningful"};
  // mode: "" for a point written before online runs existed (a replay); the tokens_per_s_*: NaN
  // for a replay point.
  std::vector<std::string> string_cols = {"name", "status", "label", "mode"};
  // Columns read from a point attribute of another name: the axes' `sweep.<axis>`.
  std::map<std::string, std::string> source;
  auto taken = [&](const std::string& c) {
    for (const std::vector<std::string>* list : {&string_cols, &int_cols, &float_cols})
      if (std::find(list->begin(), list->end(), c) != list->end()) return true;
    return false;
  };
  for (const auto& a : arm_registry()) {
    if (taken(a.name)) continue;
    (a.type == SettingType::integer ? int_cols
     : a.type == SettingType::real  ? float_cols
                                    : string_cols)
        .push_back(a.name);
  }
  for (const auto& a : axes) {
    if (taken(a)) continue;
    const std::string type_attr = results_format::axis_type_attr(a);
    const ValueType t = f.has_attr(type_attr) ? parse_value_type(f.attr_string(type_attr)) : ValueType::text;
    (t == ValueType::integer ? int_cols : t == ValueType::floating ? float_cols : string_cols).push_back(a);
    source[a] = point_axis_attr(a);
  }
  auto attr_of = [&](const std::string& c) {
    if (c == "point") return std::string("index");
    auto it = source.find(c);
    return it == source.end() ? c : it->second;
  };
  std::map<std::string, std::vector<std::string>> s;
  std::map<std::string, std::vector<double>> d;
  std::map<std::string, std::vector<int64_t>> i;
  for (const auto& n : names) {
    const Group g = points.open_group(n);
    for (const auto& c : string_cols) {
      const std::string a = attr_of(c);
      s[c].push_back(g.has_attr(a) && g.attr_info(a).kind == io::AttrKind::string ? g.attr_string(a) : "");
    }
    for (const auto& c : float_cols) {
      const std::string a = attr_of(c);
      d[c].push_back(g.has_attr(a) ? g.attr_double(a) : NAN);
    }
    for (const auto& c : int_cols) {
      const std::string a = attr_of(c);
      i[c].push_back(g.has_attr(a) && g.attr_info(a).kind == io::AttrKind::integer ? g.attr_int(a) : -1);
    }
  }
  // batch_draft_mismatches: the divergence of a point against its batch_size reference (the point
  // with the same assignment at the axis' first value, normally batch_size 1): steps whose drafts
  // differ (docs/results-schema.md); -1 where the point has no such reference.
  {
    std::map<int64_t, int64_t> mismatches;
    for (const auto& dv : divergence)
      if (dv.axis == "batch_size") mismatches[dv.point] = dv.differ_any;
    std::vector<int64_t>& col = i["batch_draft_mismatches"];
    for (int64_t point : i["point"]) col.push_back(mismatches.count(point) ? mismatches[point] : -1);
    int_cols.push_back("batch_draft_mismatches");
  }
  for (const auto& c : int_cols) idx.write(c, i[c]);
  for (const auto& c : string_cols) idx.write_strings(c, s[c]);
  for (const auto& c : float_cols) idx.write(c, d[c]);
  std::vector<std::string> all = int_cols;
  all.insert(all.end(), string_cols.begin(), string_cols.end());
  all.insert(all.end(), float_cols.begin(), float_cols.end());
  idx.set_attr("columns", all);
}

void write_divergence(H5File& f, const std::vector<Divergence>& rows) {
  if (f.exists("divergence")) f.remove("divergence");
  Group g = f.create_group("divergence");
  std::vector<int64_t> point, reference, steps, common, any, first, with_margin, near_tie;
  std::vector<std::string> axis, value, ref_value;
  std::vector<double> rate_any, rate_first, near_tie_rate;
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
    with_margin.push_back(r.differ_with_margin);
    near_tie.push_back(r.differ_near_tie);
    near_tie_rate.push_back(
        r.differ_with_margin ? static_cast<double>(r.differ_near_tie) / r.differ_with_margin : NAN);
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
  g.write("differ_with_margin", with_margin);
  g.write("differ_near_tie", near_tie);
  g.write("near_tie_rate", near_tie_rate);
}

}  // namespace

void results_format::rebuild_derived_tables(H5File& f) {
  const std::vector<Divergence> divergence = compute_divergence(f);
  rebuild_index(f, divergence);
  write_divergence(f, divergence);
}

std::vector<Divergence> compute_divergence(const Group& root) {
  std::vector<Divergence> out;
  if (!root.exists("points")) return out;
  const std::vector<std::string> axes = string_list_attr(root, "sweep_axes");
  std::vector<std::vector<std::string>> values;
  for (const auto& a : axes) values.push_back(string_list_attr(root, results_format::axis_values_attr(a)));
  const Group points = root.open_group("points");
  struct P {
    int64_t index;
    std::vector<int64_t> at;  // assignment_index
  };
  std::vector<P> ps;
  std::map<std::vector<int64_t>, size_t> by_assignment;
  const auto names = points.children();
  for (const auto& n : names) {
    const Group g = points.open_group(n);
    P p;
    p.index = g.attr_int("index");
    p.at = g.attr_ints("assignment_index");
    MTP_REQUIRE(p.at.size() == axes.size(), root.file_name(), ": ", g.path(), ": assignment_index has ",
                p.at.size(), " entries for ", axes.size(), " sweep axes");
    for (size_t a = 0; a < axes.size(); ++a)
      MTP_REQUIRE(p.at[a] >= 0 && p.at[a] < static_cast<int64_t>(values[a].size()), root.file_name(), ": ",
                  g.path(), ": assignment_index of axis ", axes[a], " is ", p.at[a], ", outside its ",
                  values[a].size(), " values");
    by_assignment[p.at] = ps.size();
    ps.push_back(std::move(p));
  }
  // Repeat-0 steps of a point: (sequence, position) -> drafts, and the drafts' margins where the
  // point recorded them (draft_margin; empty otherwise).
  using StepKey = std::pair<int32_t, int32_t>;
  struct Step {
    std::vector<int32_t> drafts;
    std::vector<float> margins;
  };
  auto load = [&](size_t i) {
    const Group g = points.open_group(names[i]);
    const Group s = g.open_group("steps");
    const auto rep = s.open_dataset("repeat").read<int32_t>();
    const auto seq = s.open_dataset("sequence").read<int32_t>();
    const auto pos = s.open_dataset("position").read<int32_t>();
    // A point of draft_len 0 (online, MTP off) has no drafts dataset: no draft at any step.
    std::vector<int32_t> drafts;
    size_t k = 0;
    if (g.exists("drafts")) {
      const io::Dataset dd = g.open_dataset("drafts");
      drafts = dd.read<int32_t>();
      k = static_cast<size_t>(dd.cols());
    }
    const std::vector<float> margins =
        g.exists("draft_margin") ? g.open_dataset("draft_margin").read<float>() : std::vector<float>{};
    MTP_REQUIRE(margins.empty() || margins.size() == drafts.size(), root.file_name(), ": ", g.path(),
                ": draft_margin has ", margins.size(), " values for ", drafts.size(), " drafts");
    std::map<StepKey, Step> m;
    for (size_t r = 0; r < rep.size(); ++r) {
      if (rep[r] != 0) continue;
      const auto at = static_cast<std::ptrdiff_t>(r * k), end = static_cast<std::ptrdiff_t>((r + 1) * k);
      Step& st = m[{seq[r], pos[r]}];
      st.drafts.assign(drafts.begin() + at, drafts.begin() + end);
      if (!margins.empty()) st.margins.assign(margins.begin() + at, margins.begin() + end);
    }
    return m;
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    for (size_t a = 0; a < axes.size(); ++a) {
      if (ps[i].at[a] == 0) continue;  // the reference value itself
      std::vector<int64_t> ref_at = ps[i].at;
      ref_at[a] = 0;
      auto it = by_assignment.find(ref_at);
      if (it == by_assignment.end()) continue;
      const auto mine = load(i);
      const auto ref = load(it->second);
      Divergence d;
      d.point = ps[i].index;
      d.reference = ps[it->second].index;
      d.axis = axes[a];
      d.value = values[a][static_cast<size_t>(ps[i].at[a])];
      d.reference_value = values[a][0];
      d.steps = static_cast<int64_t>(mine.size());
      for (const auto& [sk, step] : mine) {
        auto r = ref.find(sk);
        if (r == ref.end()) continue;
        ++d.common_steps;
        const std::vector<int32_t>& drafts = step.drafts;
        const std::vector<int32_t>& theirs = r->second.drafts;
        const size_t k = std::min(drafts.size(), theirs.size());
        size_t first_diff = k;  // the first differing draft: the flip (later ones follow from it)
        for (size_t j = 0; j < k && first_diff == k; ++j)
          if (drafts[j] != theirs[j]) first_diff = j;
        if (first_diff == k) continue;
        ++d.differ_any;
        d.differ_first += first_diff == 0;
        if (r->second.margins.empty()) continue;
        ++d.differ_with_margin;
        d.differ_near_tie += margin_below_bf16_step(r->second.margins[first_diff]);
      }
      out.push_back(d);
    }
  }
  std::sort(out.begin(), out.end(), [](const Divergence& x, const Divergence& y) {
    return std::tie(x.point, x.axis) < std::tie(y.point, y.axis);
  });
  return out;
}

}  // namespace mtplab::harness
