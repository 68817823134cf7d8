// `mtplab check EXP.yaml [--ranks N] [--point i] [--out PATH] [--set key=value ...]`: opens and
// checks every input of every point (model, weights, trace, output and its resume state) without
// running anything, and prints one line per input, then OK or the number of problems (exit 0 or 2).
// `mtplab run` runs the same checks, through the same code, before it creates its output
// (harness/preflight.hpp, harness/check.hpp).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/error.hpp"
#include "dist/runtime.hpp"
#include "harness/check.hpp"
#include "harness/experiment.hpp"
#include "harness/preflight.hpp"

namespace mtplab::app {
namespace {

cli::Parser check_cli() {
  return command_parser(
             "check", "EXP.yaml [--ranks N] [--point i] [--out PATH] [--set key=value ...]",
             "Checks every input of every point before anything runs, exactly as `mtplab run` does with\n"
             "the same arguments: the model config, the checkpoint (names, shapes, dtypes, NaN / Inf in\n"
             "the tensors the points read), the trace (sizes against the model, token ids, NaN / Inf\n"
             "hiddens, lengths against max_seq_len and draft_len, measure.sequences against its count,\n"
             "its sampling against each point's verification), the output (its directory writable, the\n"
             "resume state of an existing output, another run writing it). Prints one line per input,\n"
             "then OK (exit 0) or N problem(s) (exit 2).\n")
      .integer("ranks", "N",
               "the world size to check for (default: this job's ranks); alone, the process loads\n"
               "every rank's checkpoint shard in turn",
               1, 65536)
      .integer("point", "i", "check as `run --point i` would: only point i's checkpoint shards load", 0,
               INT32_MAX)
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
  harness::RunArgs run_args;
  run_args.file = cli->positional().front();
  run_args.out = cli->text("out");
  run_args.sets = cli->texts("set");
  run_args.point = static_cast<int>(cli->integer("point", -1));
  run_args.ranks = static_cast<int>(cli->integer("ranks", 0));

  dist::Runtime rt;
  harness::CheckReport report;
  harness::Preflight pre;
  bool loaded = true;
  try {
    pre = harness::prepare_run(rt, run_args);  // as run: every rank reads the same file alike
  } catch (const Error& e) {
    report = harness::experiment_failed(run_args.file, e.message());
    loaded = false;
  }
  if (loaded) {
    const std::string backend = harness::resolve_backend(rt, pre.ex);
    report = harness::check_inputs(rt, pre.ex, harness::run_check_options(pre, backend));
  }
  if (rt.rank() == 0) {
    std::fputs(report.text().c_str(), stdout);
    std::fflush(stdout);
  }
  return report.total_problems > 0 ? 2 : 0;
}

}  // namespace mtplab::app
