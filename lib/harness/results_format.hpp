// What the results writer, the derived tables and merge share: the column storage options, the
// names of the root's per-axis attributes, and the rebuild of the derived tables.
#pragma once
#include <string>
#include <vector>

#include "harness/results.hpp"
#include "io/hdf5.hpp"

namespace mtplab::harness::results_format {

/// Step columns: chunked and compressed, hence checksummed (docs/hdf5.md).
const io::DatasetOptions& column_options();

/// Root attributes per sweep axis: its canonical values (str[]) and its value type ("int",
/// "float", "str"; experiment.hpp ValueType).
inline std::string axis_values_attr(const std::string& axis) { return "sweep_values." + axis; }
inline std::string axis_type_attr(const std::string& axis) { return "sweep_types." + axis; }
/// The point attribute holding the point's value of `axis`, typed as the axis is.
inline std::string point_axis_attr(const std::string& axis) { return "sweep." + axis; }

/// A string-list attribute, or empty when absent.
std::vector<std::string> string_list_attr(const io::Object& o, const std::string& name);

/// Rebuilds /index and /divergence from the point groups (after points were added).
void rebuild_derived_tables(io::H5File& f);

/// The root attributes that hold the identity inputs (keys and values, in key order).
inline constexpr const char* kIdentityKeysAttr = "identity_input_keys";
inline constexpr const char* kIdentityValuesAttr = "identity_input_values";

/// The problem with the schema of the results file `f` (at `path`) for `command` ("mtplab
/// merge"), or "" when it is a results file of this version: another kind of file, a newer
/// version, or an older one with the advice to run `mtplab upgrade PATH NEW.h5` first.
std::string schema_problem(const io::H5File& f, const std::string& path, const std::string& command);

/// Sets the point attribute of arm `a` (named as the arm) to the canonical text `value`, typed by
/// the arm's type: integer arms int64, real arms f64, the others str.
void set_arm_attr(io::Object& g, const ArmSpec& a, const std::string& value);

/// Copies every attribute of `src` onto `dst`; every group and dataset below `src` into `dst`
/// (datasets with column_options()). An attribute or node this wrapper cannot read is an Error
/// naming the file and path.
void copy_attrs(const io::Object& src, io::Object& dst);
void copy_group(const io::Group& src, io::Group& dst);

/// The attributes a reader judges a point's acceptance by (repeat 0): accepted_hist, the
/// bootstrap intervals of the acceptance figures and their seed, and for a teacher-forced point the
/// per-depth accuracy with its intervals. From r's k, repeat, sequence, accepted,
/// expected_accepted, drafts and targets (the writer's and `mtplab upgrade`'s one computation).
void write_acceptance_reading(io::Group& g, int point_index, bool teacher_forced, const PointResult& r);

/// What a results file's identity is made of, as a file's root or a run holds it.
struct IdentityParts {
  std::string yaml;  ///< experiment_yaml: the resolved experiment
  int64_t world = 0;
  IdentityInputs inputs;
};
/// The parts recorded at a results file's root.
IdentityParts identity_parts(const io::H5File& f);
/// The keys in which `a` and `b` differ, as "key: A (a_label) vs B (b_label)": the configuration
/// (flattened YAML keys, `output` left out), the world size and every identity input.
std::vector<std::string> identity_differences(const IdentityParts& a, const IdentityParts& b,
                                              const std::string& a_label, const std::string& b_label);

}  // namespace mtplab::harness::results_format
