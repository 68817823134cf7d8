// `mtplab upgrade`: a results file of schema version 1 or 2 rewritten as version 3. What older
// versions left out is filled here, in one place, so that every other reader and writer knows
// version 3 only (docs/results-schema.md, "Upgrading older files"):
// - every arm in each point's config and attributes: an arm the old file left out (at its
//   default, or written before the arm existed) takes its default; record_margins, which did not
//   exist when the first files recorded no margins, is on where the point recorded margins (or
//   ran no head), else off; the trace's greedy sampling written out;
// - version 1: the typed assignment (assignment_index, sweep.<axis>, sweep_types.<axis>) from the
//   `axis=value` texts;
// - what a reader needs and the steps determine: the acceptance histogram and bootstrap intervals
//   (the writer's computation), and under greedy verification the expected figures, the expected
//   accepted counts and the acceptance probabilities; at batch_size 1 the batch columns;
// - the identity, recomputed from the recorded configuration and inputs (a file that recorded no
//   inputs gets one input that says so, so it resumes and merges with no run of today's).
// Every dataset is copied as it is; /index and /divergence are rebuilt.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "core/log.hpp"
#include "harness/results.hpp"
#include "harness/results_format.hpp"
#include "io/output.hpp"

namespace mtplab::harness {
namespace {

using io::Group;
using io::H5File;

// The canonical emission of a loaded config node: mappings as block mappings, scalars as the text
// they hold (the writer emits every value as a string, so this re-emits its text byte for byte).
void emit_node(const YAML::Node& n, YAML::Emitter& e) {
  if (n.IsMap()) {
    e << YAML::BeginMap;
    for (auto it = n.begin(); it != n.end(); ++it) {
      e << YAML::Key << it->first.Scalar() << YAML::Value;
      emit_node(it->second, e);
    }
    e << YAML::EndMap;
  } else if (n.IsScalar()) {
    e << n.Scalar();
  } else {
    e << n;
  }
}

// The value the old config records for arm `a` (its key, or its block's key), if any.
std::optional<std::string> recorded(const YAML::Node& doc, const ArmSpec& a) {
  const YAML::Node at = a.block().empty() ? doc[a.name]
                        : doc[a.block()]  ? doc[a.block()][a.key()]
                                          : YAML::Node();
  if (!at || !at.IsScalar()) return std::nullopt;
  return at.Scalar();
}

struct UpgradedConfig {
  std::string text;
  std::map<std::string, std::string> arms;  // every arm's canonical value
  std::vector<std::string> filled;          // the arms the old config left out
};

// `text` (a point's config of an older version) as version 3 writes it: the keys other than the
// arms in their order (the synthetic trace's greedy sampling written out), then every arm in
// schema order, each at its recorded value or `absent(arm)`.
UpgradedConfig upgrade_config(const std::string& text, const std::string& where,
                              const std::function<std::string(const ArmSpec&, const YAML::Node&)>& absent) {
  YAML::Node doc;
  try {
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    MTP_FAIL(where, ": config is not readable YAML: ", e.what());
  }
  MTP_REQUIRE(doc.IsMap(), where, ": config is not a mapping");
  UpgradedConfig u;
  std::vector<std::string> arm_keys;  // top-level keys that belong to the arms
  for (const ArmSpec& a : arm_registry()) {
    arm_keys.push_back(a.block().empty() ? a.name : a.block());
    if (const auto v = recorded(doc, a)) {
      if (!a.allows(*v))
        log_warn(where, ": ", a.name, " \"", *v, "\" is not among its values ", a.allowed(),
                 " in this mtplab; copied as recorded");
      u.arms[a.name] = *v;
    } else {
      u.arms[a.name] = absent(a, doc);
      u.filled.push_back(a.name);
    }
  }
  YAML::Emitter e;
  e << YAML::BeginMap;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (std::find(arm_keys.begin(), arm_keys.end(), key) != arm_keys.end()) continue;
    YAML::Node value = YAML::Clone(it->second);
    if (key == "trace" && value.IsMap() && value["synthetic"] && value["synthetic"].IsMap() &&
        !value["synthetic"]["sampling"])
      value["synthetic"]["sampling"] = "greedy";
    e << YAML::Key << key << YAML::Value;
    emit_node(value, e);
  }
  emit_canonical([&](const ArmSpec& a) { return u.arms.at(a.name); }, e);
  e << YAML::EndMap;
  u.text = e.c_str();
  return u;
}

// An arm the old config left out: its default, except record_margins (the first files recorded no
// margins and had no such arm): on where the point recorded margins or ran no head, else off.
std::string absent_value(const ArmSpec& a, const YAML::Node& doc, const Group& point) {
  if (a.name == "record_margins") {
    const YAML::Node skip = doc["skip"];
    const bool no_head = skip && skip.IsScalar() && skip.Scalar() == "head";
    return point.exists("draft_margin") || no_head ? "on" : "off";
  }
  return a.default_value();
}

// Counts of what was filled, for the report: name -> points.
using Tally = std::map<std::string, int64_t>;

// Version 1's assignment ("axis=value" texts) as version 3's assignment_index and sweep.<axis>.
void typed_assignment(Group& g, const H5File& in, const std::string& where) {
  const std::vector<std::string> axes = results_format::string_list_attr(in, "sweep_axes");
  const std::vector<std::string> texts = results_format::string_list_attr(g, "assignment");
  std::map<std::string, std::string> value_of;
  for (const auto& t : texts) {
    const auto eq = t.find('=');
    MTP_REQUIRE(eq != std::string::npos, where, ": assignment entry \"", t, "\" is not axis=value");
    value_of[t.substr(0, eq)] = t.substr(eq + 1);
  }
  std::vector<int64_t> index;
  for (const auto& axis : axes) {
    const auto it = value_of.find(axis);
    MTP_REQUIRE(it != value_of.end(), where, ": assignment has no value of the sweep axis ", axis);
    const auto values = results_format::string_list_attr(in, results_format::axis_values_attr(axis));
    const auto at = std::find(values.begin(), values.end(), it->second);
    MTP_REQUIRE(at != values.end(), where, ": ", axis, "=", it->second, " is not among sweep_values.", axis);
    index.push_back(at - values.begin());
    const std::string attr = results_format::point_axis_attr(axis);
    switch (axis_value_type(axis, values)) {
      case ValueType::integer:
        g.set_attr(attr, *parse_int64(it->second));
        break;
      case ValueType::floating:
        g.set_attr(attr, *parse_double(it->second));
        break;
      case ValueType::text:
        g.set_attr(attr, it->second);
        break;
    }
  }
  g.set_attr("assignment_index", index);
  g.remove_attr("assignment");
}

// The steps' columns and attributes that the steps determine and the old point lacks.
void fill_from_steps(Group& g, const Group& src, const UpgradedConfig& u, const std::string& where,
                     Tally& tally) {
  Group steps = g.open_group("steps");
  const std::vector<int32_t> repeat = steps.open_dataset("repeat").read<int32_t>();
  const std::vector<int32_t> sequence = steps.open_dataset("sequence").read<int32_t>();
  const std::vector<int32_t> accepted = steps.open_dataset("accepted").read<int32_t>();
  const io::Dataset dd = g.open_dataset("drafts");
  const std::vector<int32_t> drafts = dd.read<int32_t>();
  const std::vector<int32_t> targets = g.open_dataset("targets").read<int32_t>();
  const size_t n = repeat.size();
  const uint64_t k = dd.cols();
  const bool greedy = u.arms.at("verify") == "greedy";
  // What only greedy verification determines from the drafts: a = the matching prefix, so
  // E[a] = a and a_i = [d_i == y_i].
  auto need_greedy = [&](const std::string& what) {
    MTP_REQUIRE(greedy, where, ": lacks ", what, " under verify: ", u.arms.at("verify"),
                "; only a greedy point's can be computed from its steps");
    ++tally[what];
  };
  std::vector<double> expected(accepted.begin(), accepted.end());
  if (steps.exists("expected_accepted")) {
    expected = steps.open_dataset("expected_accepted").read<double>();
  } else {
    need_greedy("steps/expected_accepted");
    steps.write("expected_accepted", expected, results_format::column_options());
  }
  if (!g.exists("accept_prob")) {
    need_greedy("accept_prob");
    std::vector<float> ap(drafts.size());
    for (size_t i = 0; i < ap.size(); ++i) ap[i] = drafts[i] == targets[i] ? 1.f : 0.f;
    g.write("accept_prob", ap, n, k, results_format::column_options());
  }
  if (!g.has_attr("expected_acceptance_rate")) {
    need_greedy("expected_acceptance_rate, expected_tau");
    g.set_attr("expected_acceptance_rate", g.attr_double("acceptance_rate"));
    g.set_attr("expected_tau", g.attr_double("tau"));
  }
  if (!steps.exists("batch_step") || !steps.exists("batch_rows")) {
    MTP_REQUIRE(u.arms.at("batch_size") == "1", where, ": lacks steps/batch_step at batch_size ",
                u.arms.at("batch_size"));
    std::vector<int32_t> step(n), rows(n, 1);
    for (size_t i = 0; i < n; ++i) step[i] = static_cast<int32_t>(i);  // every row its own step
    if (!steps.exists("batch_step")) steps.write("batch_step", step, results_format::column_options());
    if (!steps.exists("batch_rows")) steps.write("batch_rows", rows, results_format::column_options());
    ++tally["steps/batch_step, steps/batch_rows"];
  }
  const bool teacher = u.arms.at("replay") == "teacher_forced";
  bool complete = true;
  for (const char* a : {"accepted_hist", "acceptance_rate_ci", "tau_ci", "expected_acceptance_rate_ci",
                        "expected_tau_ci", "bootstrap_units", "bootstrap_resamples", "bootstrap_seed"})
    complete = complete && g.has_attr(a);
  if (teacher) complete = complete && g.has_attr("teacher_forced_rate");
  if (!complete) {
    PointResult r;
    r.k = static_cast<int>(k);
    r.repeat = repeat;
    r.sequence = sequence;
    r.accepted = accepted;
    r.expected_accepted = expected;
    r.drafts = drafts;
    r.targets = targets;
    results_format::write_acceptance_reading(g, static_cast<int>(g.attr_int("index")), teacher, r);
    // What the old file recorded stays as recorded: only the missing attributes are new.
    results_format::copy_attrs(src, g);
    ++tally["accepted_hist and the bootstrap intervals"];
  }
}

// The recorded identity inputs less a kernel field that is no longer an identity input of this
// mtplab (a retired field: kernels.mla_clusters) where it was `auto` at every point: the automatic
// choice, which every run of today makes. At another value it stays, so that the file takes no
// run of today's: its bits came from a choice that no run makes any more.
IdentityInputs todays_identity_inputs(const IdentityInputs& recorded, UpgradeReport& report) {
  IdentityInputs out;
  for (const auto& [key, value] : recorded) {
    const ArmSpec* arm = find_arm(key);
    if (starts_with(key, "kernels.") && !(arm && arm->record.identity_input)) {
      if (value == "auto") {
        report.notes.push_back(str("identity input ", key,
                                   ": auto in the old file, left out (no longer an identity input; today's "
                                   "runs make the automatic choice)"));
        continue;
      }
      report.notes.push_back(str("identity input ", key, ": ", value,
                                 " kept (no longer an identity input; the file resumes and merges only with "
                                 "files that recorded the same)"));
    }
    out.emplace_back(key, value);
  }
  return out;
}

}  // namespace

UpgradeReport upgrade_results(const std::string& in, const std::string& out_arg, bool overwrite,
                              const std::vector<std::string>& argv) {
  MTP_REQUIRE(std::filesystem::exists(in), in, ": no such file (mtplab upgrade OLD.h5 NEW.h5)");
  UpgradeReport report;
  H5File f = H5File::open_read(in);
  MTP_REQUIRE(f.has_attr("schema") && f.attr_info("schema").kind == io::AttrKind::string &&
                  f.attr_string("schema") == kResultsSchema,
              in, ": not an mtplab results file (", io::describe_existing_file(in), ")");
  MTP_REQUIRE(f.has_attr("schema_version") && f.attr_info("schema_version").kind == io::AttrKind::integer, in,
              ": a results file without an integer schema_version attribute");
  report.from_version = f.attr_int("schema_version");
  MTP_REQUIRE(report.from_version != kResultsSchemaVersion, in, ": already results schema version ",
              kResultsSchemaVersion, "; there is nothing to upgrade");
  MTP_REQUIRE(report.from_version >= 1 && report.from_version < kResultsSchemaVersion, in,
              ": results schema version ", report.from_version, "; mtplab upgrade reads versions 1 to ",
              kResultsSchemaVersion - 1);
  for (const char* key : {"experiment_yaml", "world_size", "sweep_axes", "num_points"})
    MTP_REQUIRE(f.has_attr(key), in, ": results file without the root attribute ", key);
  MTP_REQUIRE(f.exists("points"), in, ": results file without /points");
  // The output rule (io/output.hpp), as merge applies it.
  const std::string out =
      io::resolve_output("mtplab upgrade", out_arg, {"results file", "schema", kResultsSchema}, {in},
                         overwrite ? io::OutputMode::replace : io::OutputMode::create);
  remove_stale_temporaries(out);

  H5File o = H5File::create(out);
  results_format::copy_attrs(f, o);
  o.set_attr("schema_version", kResultsSchemaVersion);
  if (o.has_attr("configuration_identity")) o.remove_attr("configuration_identity");
  IdentityInputs inputs;
  if (f.has_attr(results_format::kIdentityKeysAttr)) {
    inputs = todays_identity_inputs(results_format::identity_parts(f).inputs, report);
    std::vector<std::string> keys, values;
    for (const auto& [k, v] : inputs) {
      keys.push_back(k);
      values.push_back(v);
    }
    o.set_attr(results_format::kIdentityKeysAttr, keys);
    o.set_attr(results_format::kIdentityValuesAttr, values);
  } else {
    inputs.emplace_back("inputs", str("not recorded (results schema version ", report.from_version,
                                      " before results files recorded their inputs)"));
    std::vector<std::string> keys = {inputs[0].first}, values = {inputs[0].second};
    o.set_attr(results_format::kIdentityKeysAttr, keys);
    o.set_attr(results_format::kIdentityValuesAttr, values);
    report.notes.push_back(
        "identity inputs: not recorded in the old file; the new file resumes and merges "
        "only with files upgraded from its kind");
  }
  o.set_attr("experiment_identity",
             results_identity(configuration_text(f.attr_string("experiment_yaml"), f.attr_int("world_size")),
                              inputs));
  for (const auto& axis : results_format::string_list_attr(f, "sweep_axes")) {
    const std::string type_attr = results_format::axis_type_attr(axis);
    if (!o.has_attr(type_attr))
      o.set_attr(type_attr, to_string(axis_value_type(axis, results_format::string_list_attr(
                                                                f, results_format::axis_values_attr(axis)))));
  }
  o.set_attr("arms", arm_names());
  o.set_attr("upgraded_from", in);
  o.set_attr("upgraded_from_version", report.from_version);
  o.set_attr("upgrade_argv", argv);
  o.set_attr("upgraded_at", utc_now());

  Tally filled_arms, computed;
  int64_t from_weights = 0;  // points given acceptance_meaningful from their config's weights
  const Group src_points = f.open_group("points");
  Group points = o.create_group("points");
  for (const auto& name : src_points.children()) {
    const Group src = src_points.open_group(name);
    const std::string where = str(in, ": /points/", name);
    Group g = points.create_group(name);
    results_format::copy_group(src, g);
    MTP_REQUIRE(src.has_attr("config"), where, ": point without a config attribute");
    const UpgradedConfig u =
        upgrade_config(src.attr_string("config"), where,
                       [&](const ArmSpec& a, const YAML::Node& doc) { return absent_value(a, doc, src); });
    for (const auto& a : u.filled) ++filled_arms[a];
    fill_from_steps(g, src, u, where, computed);
    if (!g.has_attr("acceptance_meaningful")) {
      const AcceptanceMeaning meaning = acceptance_meaning_of_config(u.text, where);
      g.set_attr("acceptance_meaningful", meaning.meaningful);
      g.set_attr("acceptance_note", meaning.reason);
      ++from_weights;
    }
    if (!g.has_attr("assignment_index")) typed_assignment(g, f, where);
    g.set_attr("config", u.text);
    for (const ArmSpec& a : arm_registry()) results_format::set_arm_attr(g, a, u.arms.at(a.name));
    // The kernel each op ran: the old file did not record it (its policy is in the kernels.* arms).
    g.set_attr("kernels", std::vector<std::string>{kernels_not_recorded(report.from_version)});
    ++report.points;
  }
  results_format::rebuild_derived_tables(o);
  o.commit();
  // The arms filled in, in schema order, grouped by how many points lacked them.
  std::map<int64_t, std::vector<std::string>> by_count;
  for (const ArmSpec& a : arm_registry())
    if (filled_arms.count(a.name)) by_count[filled_arms.at(a.name)].push_back(a.name);
  for (const auto& [count, arms] : by_count)
    report.notes.push_back(
        str("written where the old file left them out (", count,
            " point(s); at the default, record_margins as the point recorded margins): ", join(arms, ", ")));
  for (const auto& [what, count] : computed)
    report.notes.push_back(str("computed from the steps: ", what, " (", count, " point(s))"));
  if (from_weights)
    report.notes.push_back(str("from the weights of the config: acceptance_meaningful, acceptance_note (",
                               from_weights, " point(s))"));
  return report;
}

}  // namespace mtplab::harness
