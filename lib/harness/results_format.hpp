// What the results writer, the derived tables and merge share: the column storage options, the
// names of the root's per-axis attributes, and the rebuild of the derived tables.
#pragma once
#include <string>
#include <vector>

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

}  // namespace mtplab::harness::results_format
