// `mtplab merge OUT.h5 IN1.h5 IN2.h5 ... [--force]`: joins the per-task results files of a Slurm
// array job into one. The inputs must be of one experiment (same identity); a point found in
// several inputs must have the same configuration there (kept once), otherwise nothing is
// written. /index and /divergence are rebuilt. No MPI: run it anywhere.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "harness/results.hpp"

namespace mtplab::app {
namespace {

cli::Parser merge_cli() {
  return command_parser(
             "merge", "OUT.h5 IN1.h5 [IN2.h5 ...] [--force]",
             "Joins results files of one experiment (e.g. the tasks of a Slurm array) into OUT.h5.\n"
             "Points present in several inputs must have the same configuration; a missing point is\n"
             "reported but not an error.\n")
      .flag("force",
            "replace OUT.h5 when it is an existing results file (any other file is never\n"
            "replaced; OUT.h5 may not be an input under any spelling or link)")
      .positionals("OUT.h5 and at least one input", 2, SIZE_MAX);
}

}  // namespace

int cmd_merge(const Args& args) {
  const auto cli = parse_or_help(merge_cli(), args);
  if (!cli) return 0;
  check_logging_env();  // no Runtime here to check them
  const std::vector<std::string>& files = cli->positional();
  const bool force = cli->flag("force");
  const std::string out = files.front();
  const std::vector<std::string> inputs(files.begin() + 1, files.end());
  std::vector<std::string> argv = {"mtplab", "merge"};
  argv.insert(argv.end(), args.begin(), args.end());
  // The output is claimed as `run` claims it: a merge never replaces a results file that a run is
  // adding points to.
  const io::OutputLock claim = claim_output(out, argv);
  const int points = harness::merge_results(out, inputs, force, argv);
  std::printf("merged %d point(s) from %zu file(s) into %s\n", points, inputs.size(), out.c_str());
  return 0;
}

}  // namespace mtplab::app
