// `mtplab run EXP.yaml [--point i] [--set key=value ...] [--out f.h5]`: runs the points of an
// experiment under the launcher's ranks (mpirun / srun, one process per rank) and writes the
// results (docs/results-schema.md). A rerun with the same experiment and output skips the
// points already written; SIGTERM / SIGINT stop at the next step with the file intact.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/error.hpp"
#include "dist/runtime.hpp"
#include "harness/experiment.hpp"
#include "harness/runner.hpp"

namespace mtplab::app {
namespace {

const char* kRunHelp =
    "usage: mtplab run EXP.yaml [--point i] [--set key=value ...] [--out results.h5]\n\n"
    "Runs every point of the experiment (or one), one process per rank:\n"
    "  mpirun -np 2 mtplab run experiments/quickstart.yaml\n"
    "  srun --mpi=pmix mtplab run EXP.yaml --point $SLURM_ARRAY_TASK_ID --out task.h5\n"
    "  --point i        run only point i (see mtplab list)\n"
    "  --set key=value  override a key (dotted path, YAML value); may be repeated\n"
    "  --out FILE       results file (default: the experiment's output:)\n"
    "Points already in the results file with the same configuration are skipped. SIGTERM or\n"
    "SIGINT stops at the next step boundary; completed points stay in the file (exit 128+signal).\n";

}  // namespace

int cmd_run(const Args& args) {
  std::string file, out;
  std::vector<std::string> sets;
  int point = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag) {
      MTP_REQUIRE(i + 1 < args.size(), "mtplab run: ", flag, " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kRunHelp, stdout);
      return 0;
    } else if (a == "--point") {
      const std::string v = value("--point");
      size_t used = 0;
      try {
        point = std::stoi(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      MTP_REQUIRE(used == v.size() && point >= 0, "mtplab run: --point \"", v,
                  "\" is not a point number (0, 1, ...)");
    } else if (a == "--set") {
      sets.push_back(value("--set"));
    } else if (starts_with(a, "--set=")) {
      sets.push_back(a.substr(6));
    } else if (a == "--out") {
      out = value("--out");
    } else if (starts_with(a, "--out=")) {
      out = a.substr(6);
    } else if (starts_with(a, "-")) {
      MTP_FAIL("mtplab run: unknown option \"", a, "\" (see mtplab run --help)");
    } else {
      MTP_REQUIRE(file.empty(), "mtplab run: one experiment file, got \"", file, "\" and \"", a, "\"");
      file = a;
    }
  }
  MTP_REQUIRE(!file.empty(), "mtplab run: no experiment file (see mtplab run --help)");

  dist::Runtime rt;
  const harness::Experiment ex = harness::load_experiment(file, sets, rt.world());
  harness::RunOptions options;
  options.output = out.empty() ? ex.output : out;
  MTP_REQUIRE(!options.output.empty(), file, ": no output: key and no --out");
  options.point = point;
  options.argv = {"mtplab", "run"};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  return harness::run_experiment(rt, ex, options);
}

}  // namespace mtplab::app
