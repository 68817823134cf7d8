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
#include "harness/preflight.hpp"
#include "harness/runner.hpp"

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
          "       checkpoint, an output holding another experiment or written by another run):\n"
          "       nothing ran; the `mtplab check` command it names repeats the checks\n"
          "  124  a collective, or the start-up (MTPLAB_STARTUP_TIMEOUT_S), timed out (a rank\n"
          "       stopped, hung or died)\n"
          "  130  stopped by SIGINT (Ctrl-C)\n"
          "  143  stopped by SIGTERM (scancel, a time limit; mpirun sends it for a Ctrl-C too)\n"
          "A signal sent to mpirun itself makes mpirun end the job and exit 1, whatever the ranks did.\n");
}

}  // namespace

int cmd_run(const Args& args) {
  const auto cli = parse_or_help(run_cli(), args);
  if (!cli) return 0;
  harness::RunArgs run_args;
  run_args.file = cli->positional().front();
  run_args.out = cli->text("out");
  run_args.sets = cli->texts("set");
  run_args.point = static_cast<int>(cli->integer("point", -1));

  // A stop signal during the start-up (MPI, the experiment, the input check) is noted and acted
  // on before the first point, never the default action's silent end.
  harness::install_stop_handlers();
  dist::Runtime rt;
  harness::Preflight pre;
  // Every rank reads the same file: an error in it is known everywhere, printed once, and ends
  // the job cleanly (no MPI_Abort). The rest of the checks are the input check's, as in `check`.
  dist::run_agreed([&] { pre = harness::prepare_run(rt, run_args); });
  harness::RunOptions options;
  options.argv = {"mtplab", "run"};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.check_command = harness::check_command(run_args, rt.world());
  return harness::run_experiment(rt, pre, options);
}

}  // namespace mtplab::app
