// `mtplab run EXP.yaml [--point i] [--set key=value ...] [--out f.h5]`: runs the points of an
// experiment under the launcher's ranks (mpirun / srun, one process per rank) and writes the
// results (docs/results-schema.md). A rerun with the same experiment and output skips the
// points already written; SIGTERM / SIGINT stop at the next step with the file intact.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/error.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "harness/experiment.hpp"
#include "harness/runner.hpp"
#include "io/output.hpp"

namespace mtplab::app {
namespace {

cli::Parser run_cli() {
  return command_parser("run", "EXP.yaml [--point i] [--set key=value ...] [--out results.h5]",
                        "Runs every point of the experiment (or one), one process per rank:\n"
                        "  mpirun -np 2 mtplab run experiments/quickstart.yaml\n"
                        "  srun --mpi=pmix mtplab run EXP.yaml --point $SLURM_ARRAY_TASK_ID --out task.h5\n")
      .integer("point", "i", "run only point i (see mtplab list)", 0, INT32_MAX)
      .repeatable_text("set", "key=value", "override a key (dotted path, YAML value); may be repeated")
      .text("out", "FILE", "results file (default: the experiment's output:)")
      .positionals("one experiment file", 1, 1)
      .epilogue(
          "Points already in the results file with the same configuration are skipped. SIGTERM or\n"
          "SIGINT stops at the next step boundary; completed points stay in the file. The same signal\n"
          "again stops at once; the file is still valid (a point is written whole or not at all).\n"
          "A collective (MPI or NCCL) that waits longer than MTPLAB_COLLECTIVE_TIMEOUT_S seconds\n"
          "(default 60) for a rank ends the job with a message naming the ranks that did not arrive.\n"
          "\n"
          "Exit codes (every rank's; mpirun passes the first non-zero one on):\n"
          "  0    every requested point is in the results file\n"
          "  1    an error: the message says which (a bad experiment or option, ...)\n"
          "  2    a problem with the inputs (the check's report above the message: a trace, a\n"
          "       checkpoint, or an output holding another experiment): nothing ran\n"
          "  124  a collective timed out (a rank stopped, hung or died)\n"
          "  130  stopped by SIGINT (Ctrl-C)\n"
          "  143  stopped by SIGTERM (scancel, a time limit; mpirun sends it for a Ctrl-C too)\n"
          "A signal sent to mpirun itself makes mpirun end the job and exit 1, whatever the ranks did.\n");
}

}  // namespace

int cmd_run(const Args& args) {
  const auto cli = parse_or_help(run_cli(), args);
  if (!cli) return 0;
  const std::string file = cli->positional().front();
  const std::string out = cli->text("out");
  const std::vector<std::string> sets = cli->texts("set");
  const int point = static_cast<int>(cli->integer("point", -1));

  dist::Runtime rt;
  harness::Experiment ex;
  harness::RunOptions options;
  // Every rank reads the same file: an error in it is known everywhere, printed once, and ends
  // the job cleanly (no MPI_Abort).
  dist::run_agreed([&] {
    ex = harness::load_experiment(file, sets, rt.world());
    // A link is written through, never replaced (io/output.hpp: the rest of the output rule is
    // the input check's, harness::inspect_results_file).
    options.output = io::follow_output_link(out.empty() ? ex.output : out);
    MTP_REQUIRE(!options.output.empty(), file, ": no output: key and no --out");
    const int n = static_cast<int>(ex.points.size());
    MTP_REQUIRE(point < n, file, ": --point ", point, " is out of range: the experiment has ", n,
                " point(s), 0..", n - 1);
  });
  options.point = point;
  options.argv = {"mtplab", "run"};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  return harness::run_experiment(rt, ex, options);
}

}  // namespace mtplab::app
