// `mtplab merge`: joins the per-task results files of one experiment (a Slurm array) into one,
// copying the point groups as they are and rebuilding the derived tables. Inputs of different
// identities are refused, naming the keys that differ; inputs of an older schema version with the
// advice to upgrade them. The copy of groups and attributes is shared with `mtplab upgrade`.
#include <filesystem>
#include <map>

#include "core/error.hpp"
#include "core/log.hpp"
#include "harness/results.hpp"
#include "harness/results_format.hpp"
#include "io/output.hpp"

namespace mtplab::harness {
namespace {

using io::DType;
using io::Group;
using io::H5File;

template <typename T>
void copy_typed(const io::Dataset& d, Group& dst, const std::string& name) {
  const auto data = d.read<T>();
  io::Dataset out = d.rank() == 2
                        ? dst.write(name, data, d.rows(), d.cols(), results_format::column_options())
                        : dst.write(name, data, results_format::column_options());
  results_format::copy_attrs(d, out);
}

}  // namespace

namespace results_format {

void copy_attrs(const io::Object& src, io::Object& dst) {
  for (const auto& name : src.attr_names()) {
    const io::AttrInfo info = src.attr_info(name);
    // One attribute of a kind, scalar or array, through the reader pair of that kind.
    auto copy = [&](auto one, auto many) {
      if (info.scalar)
        dst.set_attr(name, (src.*one)(name));
      else
        dst.set_attr(name, (src.*many)(name));
    };
    switch (info.kind) {
      case io::AttrKind::integer:
        copy(&io::Object::attr_int, &io::Object::attr_ints);
        break;
      case io::AttrKind::floating:
        copy(&io::Object::attr_double, &io::Object::attr_doubles);
        break;
      case io::AttrKind::string:
        copy(&io::Object::attr_string, &io::Object::attr_strings);
        break;
      case io::AttrKind::other:
        MTP_FAIL(src.file_name(), ": ", src.path(), ": attribute '", name,
                 "' has a type merge does not copy");
    }
  }
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
        using CopyFn = void (*)(const io::Dataset&, Group&, const std::string&);
        static const std::map<DType, CopyFn> copy_of = {
            {DType::i8, &copy_typed<int8_t>},    {DType::u8, &copy_typed<uint8_t>},
            {DType::u16, &copy_typed<uint16_t>}, {DType::i32, &copy_typed<int32_t>},
            {DType::i64, &copy_typed<int64_t>},  {DType::f32, &copy_typed<float>},
            {DType::f64, &copy_typed<double>},   {DType::bf16, &copy_typed<bf16>}};
        if (d.dtype() == DType::string) {
          io::Dataset out = dst.write_strings(name, d.read_strings());
          copy_attrs(d, out);
        } else {
          copy_of.at(d.dtype())(d, dst, name);
        }
        break;
      }
      case io::NodeKind::other:
        MTP_FAIL(src.file_name(), ": ", src.path(), "/", name,
                 ": not a group or dataset; merge does not copy it");
    }
  }
}

}  // namespace results_format

int merge_results(const std::string& out_arg, const std::vector<std::string>& inputs, bool overwrite,
                  const std::vector<std::string>& argv) {
  MTP_REQUIRE(!inputs.empty(), "merge: no input files");
  // The output rule (io/output.hpp): a results file that is none of the inputs (under any
  // spelling or link), replaced only with --force; a link is written through, never replaced.
  const std::string out =
      io::resolve_output("mtplab merge", out_arg, {"results file", "schema", kResultsSchema}, inputs,
                         overwrite ? io::OutputMode::replace : io::OutputMode::create);
  remove_stale_temporaries(out);
  std::vector<H5File> files;
  for (const auto& in : inputs) {
    files.push_back(H5File::open_read(in));
    const H5File& f = files.back();
    const std::string problem = results_format::schema_problem(f, in, "mtplab merge");
    MTP_REQUIRE(problem.empty(), problem);
    if (f.attr_string("experiment_identity") != files.front().attr_string("experiment_identity")) {
      const std::vector<std::string> diffs = results_format::identity_differences(
          results_format::identity_parts(files.front()), results_format::identity_parts(f),
          str("in ", inputs.front()), str("in ", in));
      MTP_FAIL(
          in, ": a different experiment configuration than ", inputs.front(), "; they differ in: ",
          diffs.empty() ? std::string("(no key: different mtplab versions wrote them)") : join(diffs, "; "),
          ". Only task files of one experiment on the same inputs can be merged");
    }
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
  results_format::copy_attrs(files.front(), o);
  o.set_attr("merged_from", inputs);
  o.set_attr("merge_argv", argv);
  o.set_attr("merged_at", utc_now());
  Group points = o.create_group("points");
  for (const auto& [name, src] : chosen) {
    Group g = points.create_group(name);
    results_format::copy_group(files[src.first].open_group("points").open_group(name), g);
  }
  const int64_t expected = files.front().attr_int("num_points");
  std::vector<std::string> missing;
  for (int64_t i = 0; i < expected; ++i) {
    PointConfig tmp;
    tmp.index = static_cast<int>(i);
    if (!chosen.count(tmp.name())) missing.push_back(tmp.name());
  }
  results_format::rebuild_derived_tables(o);
  o.commit();
  if (!missing.empty())
    log_warn("merge: ", out, " lacks ", missing.size(), " of ", expected, " points: ", join(missing, " "));
  return static_cast<int>(chosen.size());
}

}  // namespace mtplab::harness
