// What `mtplab run` and `mtplab check` make of the arguments they share (the experiment file,
// --set, --out, --point, the rank count): one code path, so that `check` runs exactly the checks
// that `run` runs before it creates its output (docs/experiments.md, "Checking the inputs").
//
// Invariants:
// - Both commands load the experiment, resolve the output (--out, else output:; a link followed,
//   io/output.hpp), check --point, resolve the backend and build the input check's options here;
//   the input check itself is harness::check_inputs, called by both.
// - The advice that `run` prints when its inputs are refused is the `mtplab check` command line of
//   the same arguments: the experiment, every --set in order, --out, --point and, for a job of
//   more than one rank, --ranks N (a process alone then checks every rank's shard in turn).
#pragma once
#include <string>
#include <vector>

#include "dist/runtime.hpp"
#include "harness/check.hpp"
#include "harness/experiment.hpp"

namespace mtplab::harness {

/// The arguments `run` and `check` share, as given on the command line.
struct RunArgs {
  std::string file;               ///< the experiment file
  std::vector<std::string> sets;  ///< --set key=value, in order
  std::string out;                ///< --out ("": the experiment's output:)
  int point = -1;                 ///< --point (-1: every point)
  int ranks = 0;                  ///< the world size to check for (check's --ranks; 0: the job's)
};

/// The experiment loaded for the world size, the output to write and the points to run.
struct Preflight {
  Experiment ex;
  std::string output;     ///< --out or output:, a link at its end followed ("" when neither is set)
  std::vector<int> todo;  ///< the points this run runs (--point, else all)
};

/// Loads the experiment (with the overrides, for args.ranks or the job's world) and resolves the
/// output and the points. Throws an Error naming what is wrong (the experiment, --point out of
/// range). An empty output is left to the input check, which reports it.
Preflight prepare_run(const dist::Runtime& rt, const RunArgs& args);

/// The experiment's backend, `auto` resolved alike on every rank: cuda when this build has it and
/// every rank sees a GPU, else cpu (collective over the world when `auto`).
std::string resolve_backend(const dist::Runtime& rt, const Experiment& ex);

/// The input check's options for running `pre` on `backend`: the output, the points to load
/// (those to run), the points already in the output skipped.
CheckOptions run_check_options(const Preflight& pre, const std::string& backend);

/// `mtplab check ...` with the same arguments, shell-quoted, for a job of `world` ranks.
std::string check_command(const RunArgs& args, int world);

/// `text` quoted for a POSIX shell when it needs it ('...' with ' as '\'').
std::string shell_quote(const std::string& text);

}  // namespace mtplab::harness
