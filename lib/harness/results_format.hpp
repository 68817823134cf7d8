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

/// What a results file's identity is made of, as a file's root or a run holds it.
struct IdentityParts {
  std::string yaml;  ///< experiment_yaml: the resolved experiment
  int64_t world = 0;
  IdentityInputs inputs;
  bool has_inputs = true;  ///< false: a file written before the identity held its inputs
};
/// The parts recorded at a results file's root.
IdentityParts identity_parts(const io::H5File& f);
/// The keys in which `a` and `b` differ, as "key: A (a_label) vs B (b_label)": the configuration
/// (flattened YAML keys, `output` left out), the world size and every identity input.
std::vector<std::string> identity_differences(const IdentityParts& a, const IdentityParts& b,
                                              const std::string& a_label, const std::string& b_label);

}  // namespace mtplab::harness::results_format
