// `mtplab list EXP.yaml [--ranks N] [--set key=value ...] [--count]`: the numbered points of an
// experiment and their arms, after the sweep expansion and every check that needs no GPU. The
// point numbers are what `mtplab run --point i` and a Slurm array task index take.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "harness/experiment.hpp"

namespace mtplab::app {
namespace {

cli::Parser list_cli() {
  return command_parser(
             "list", "EXP.yaml [--ranks N] [--set key=value ...] [--count]",
             "Prints the points of the experiment, numbered from 0, with their sweep values and arms.\n"
             "Points that cannot run with N ranks are reported as errors (exit 1).\n")
      .integer("ranks", "N", "the world size to check the points for (default: this job's ranks)", 1, 65536)
      .repeatable_text("set", "key=value",
                       "override a key (dotted path, YAML value), e.g. --set measure.sequences=2,\n"
                       "--set sweep.grid.head_fp8=[off,on]; may be repeated")
      .flag("count", "print only the number of points (for scripts)")
      .positionals("one experiment file", 1, 1);
}

}  // namespace

int cmd_list(const Args& args) {
  const auto cli = parse_or_help(list_cli(), args);
  if (!cli) return 0;
  const std::string file = cli->positional().front();
  const std::vector<std::string> sets = cli->texts("set");
  int ranks = static_cast<int>(cli->integer("ranks", 0));
  const bool count_only = cli->flag("count");

  // Without --ranks the world of this job decides (1 when started without a launcher).
  std::unique_ptr<dist::Runtime> rt;
  if (ranks == 0) {
    rt = std::make_unique<dist::Runtime>();
    ranks = rt->world();
  } else {
    check_logging_env();  // the Runtime checks them otherwise
  }
  // Every rank reads the file; an error in it is agreed, so rank 0 alone prints it.
  harness::Experiment ex;
  dist::run_agreed([&] { ex = harness::load_experiment(file, sets, ranks); });
  if (rt && rt->rank() != 0) return 0;
  if (count_only) {
    std::printf("%zu\n", ex.points.size());
    return 0;
  }
  std::printf("%s: %zu point(s) for %d rank(s)%s; output %s\n", ex.file.c_str(), ex.points.size(), ranks,
              ex.excluded ? str(" (", ex.excluded, " excluded)").c_str() : "",
              ex.output.empty() ? "(not set)" : ex.output.c_str());
  if (!ex.axes.empty()) {
    std::printf("axes:");
    for (const auto& a : ex.axes) std::printf(" %s [%s]", a.name.c_str(), join(a.values, ", ").c_str());
    std::printf("\n");
  }
  for (const auto& p : ex.points) {
    std::vector<std::string> arms;
    for (const auto& [k, v] : harness::named(p.arms)) arms.push_back(str(k, "=", v));
    std::printf("%4d  %s\n      model %s, %s\n", p.index, p.label().c_str(), p.model.name.c_str(),
                join(arms, " ").c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace mtplab::app
