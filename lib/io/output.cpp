// The output rule (output.hpp).
#include "io/output.hpp"

#include <filesystem>
#include <system_error>

#include "core/error.hpp"
#include "io/hdf5.hpp"

namespace mtplab::io {
namespace {

namespace fs = std::filesystem;

std::string article(const std::string& what) {
  return (!what.empty() && std::string("aeiou").find(what[0]) != std::string::npos ? "an " : "a ") + what;
}

}  // namespace

std::string describe_existing_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st)) return "a directory";
  if (!fs::is_regular_file(st)) return "something other than a regular file";
  try {
    const H5File f = H5File::open_read(path);
    // The kinds mtplab writes (io/trace.hpp, harness/results.hpp).
    if (f.has_attr("format") && f.attr_info("format").kind == AttrKind::string &&
        f.attr_string("format") == "mtplab-trace")
      return "an mtplab trace";
    if (f.has_attr("schema") && f.attr_info("schema").kind == AttrKind::string &&
        f.attr_string("schema") == "mtplab-results")
      return "an mtplab results file";
    return "an HDF5 file that mtplab did not write";
  } catch (const Error&) {
    return "a file that is not HDF5 (or that HDF5 cannot read)";
  }
}

std::string follow_output_link(const std::string& path) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return path;
  const fs::path canonical = fs::canonical(path, ec);
  return ec ? path : canonical.string();
}

OutputCheck check_output(const std::string& command, const std::string& path, const OutputKind& kind,
                         const std::vector<std::string>& inputs, OutputMode mode) {
  OutputCheck out;
  out.path = path;
  if (path.empty()) {
    out.problems.push_back(str(command, ": the output path is empty"));
    return out;
  }
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    // A link is followed to what it points at; one that points nowhere is refused (writing it
    // would replace the link with a regular file).
    out.path = follow_output_link(path);
    if (out.path == path) {
      std::error_code ec2;
      out.problems.push_back(str(path, ": is a symbolic link to ", fs::read_symlink(path, ec2).string(),
                                 ", which does not exist; ", command,
                                 " never replaces a link: give the path of the file to write"));
      return out;
    }
  }
  const std::string shown = out.path == path ? path : str(path, " (", out.path, ")");
  const fs::file_status st = fs::status(out.path, ec);
  if (!fs::exists(st)) return out;
  for (const auto& in : inputs) {
    std::error_code e;
    if (!in.empty() && fs::equivalent(out.path, in, e) && !e) {
      out.problems.push_back(str(shown, ": is also an input of ", command, " (", in,
                                 "; another spelling or a link of the same file); write to a new file"));
      return out;
    }
  }
  if (!fs::is_regular_file(st)) {
    out.problems.push_back(str(shown, ": exists and is ", describe_existing_file(out.path), "; ", command,
                               " writes ", article(kind.what), ": choose another output"));
    return out;
  }
  bool own = false;
  try {
    const H5File f = H5File::open_read(out.path);
    own = f.has_attr(kind.attribute) && f.attr_info(kind.attribute).kind == AttrKind::string &&
          f.attr_string(kind.attribute) == kind.value;
  } catch (const Error&) {
    own = false;
  }
  if (!own) {
    out.problems.push_back(str(shown, ": exists and is ", describe_existing_file(out.path), ", not ",
                               article(kind.what), "; ", command,
                               " never replaces another kind of file (not even with --force): "
                               "choose another output or delete the file yourself"));
    return out;
  }
  out.exists = true;
  if (mode == OutputMode::create)
    out.problems.push_back(str(shown, ": exists (", article(kind.what), "); ", command,
                               " replaces it only with --force: pass --force, or choose another output"));
  return out;
}

std::string resolve_output(const std::string& command, const std::string& path, const OutputKind& kind,
                           const std::vector<std::string>& inputs, OutputMode mode) {
  const OutputCheck c = check_output(command, path, kind, inputs, mode);
  MTP_REQUIRE(c.problems.empty(), join(c.problems, "\n"));
  return c.path;
}

}  // namespace mtplab::io
