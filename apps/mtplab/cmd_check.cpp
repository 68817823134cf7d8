// `mtplab check EXP.yaml [--ranks N] [--out PATH] [--set key=value ...]`: opens and checks every
// input of every point (model, weights, trace, output and its resume state) without running
// anything, and prints one line per input, then OK or the number of problems (exit 0 or 2).
// `mtplab run` runs the same checks before it creates its output (harness/check.hpp).
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/error.hpp"
#include "dist/runtime.hpp"
#include "harness/check.hpp"
#include "harness/experiment.hpp"
#include "io/output.hpp"
#include "ops/ops.hpp"

namespace mtplab::app {
namespace {

cli::Parser check_cli() {
  return command_parser(
             "check", "EXP.yaml [--ranks N] [--out PATH] [--set key=value ...]",
             "Checks every input of every point before anything runs: the model config, the checkpoint\n"
             "(names, shapes, dtypes, NaN / Inf in the tensors the points read), the trace (sizes against\n"
             "the model, token ids, NaN / Inf hiddens, lengths against max_seq_len and draft_len,\n"
             "measure.sequences against its count), the output's directory and the resume state of an\n"
             "existing output. Prints one line per input, then OK (exit 0) or N problem(s) (exit 2).\n")
      .integer("ranks", "N",
               "the world size to check for (default: this job's ranks); alone, the process loads\n"
               "every rank's checkpoint shard in turn",
               1, 65536)
      .text("out", "PATH", "the results file to check (default: the experiment's output:)")
      .repeatable_text("set", "key=value",
                       "override a key (dotted path, YAML value), as run takes it; may be repeated")
      .positionals("one experiment file", 1, 1)
      .epilogue(
          "Under mpirun every rank opens its own copies of the traces and checkpoints; rank 0 prints.\n");
}

}  // namespace

int cmd_check(const Args& args) {
  const auto cli = parse_or_help(check_cli(), args);
  if (!cli) return 0;
  const std::string file = cli->positional().front();
  const std::vector<std::string> sets = cli->texts("set");

  dist::Runtime rt;
  const int ranks = static_cast<int>(cli->integer("ranks", rt.world()));
  harness::CheckReport report;
  harness::Experiment ex;
  bool loaded = true;
  try {
    ex = harness::load_experiment(file, sets, ranks);  // every rank reads the same file alike
  } catch (const Error& e) {
    report = harness::experiment_failed(file, e.message());
    loaded = false;
  }
  if (loaded) {
    harness::CheckOptions options;
    options.output = io::follow_output_link(cli->has("out") ? cli->text("out") : ex.output);  // as run
    options.backend = ex.points.front().backend;
    if (options.backend == "auto")
      options.backend = ops::cuda_backend_available() && rt.min_visible_gpus() > 0 ? "cuda" : "cpu";
    report = harness::check_inputs(rt, ex, options);
  }
  if (rt.rank() == 0) {
    std::fputs(report.text().c_str(), stdout);
    std::fflush(stdout);
  }
  return report.total_problems > 0 ? 2 : 0;
}

}  // namespace mtplab::app
