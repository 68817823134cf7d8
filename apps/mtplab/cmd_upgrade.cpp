// `mtplab upgrade OLD.h5 NEW.h5 [--force]`: rewrites a results file of an older schema version
// (1 or 2) as the current one (docs/results-schema.md, "Upgrading older files"). OLD.h5 is only
// read; NEW.h5 follows the output rule of every writer (io/output.hpp). No MPI: run it anywhere.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "harness/results.hpp"

namespace mtplab::app {
namespace {

cli::Parser upgrade_cli() {
  return command_parser(
             "upgrade", "OLD.h5 NEW.h5 [--force]",
             "Writes the results file OLD.h5 (schema version 1 or 2) as NEW.h5 in the current schema\n"
             "version, which `mtplab run` (resume), `mtplab merge` and analysis/mtplab_results.py read:\n"
             "every arm written at its value (those OLD.h5 left out at their default), the identity\n"
             "recomputed, the attributes the steps determine filled in, every dataset copied.\n"
             "OLD.h5 is not changed.\n")
      .flag("force",
            "replace NEW.h5 when it is an existing results file (any other file is never\n"
            "replaced; NEW.h5 may not be OLD.h5 under any spelling or link)")
      .positionals("OLD.h5 and NEW.h5", 2, 2);
}

}  // namespace

int cmd_upgrade(const Args& args) {
  const auto cli = parse_or_help(upgrade_cli(), args);
  if (!cli) return 0;
  check_logging_env();  // no Runtime here to check them
  const std::vector<std::string>& files = cli->positional();
  std::vector<std::string> argv = {"mtplab", "upgrade"};
  argv.insert(argv.end(), args.begin(), args.end());
  // Its output claimed as `run` claims its own: never replaced while a run or merge writes it.
  const io::OutputLock claim = claim_output(files[1], argv);
  const harness::UpgradeReport r = harness::upgrade_results(files[0], files[1], cli->flag("force"), argv);
  std::printf("upgraded %s (results schema version %lld) to %s (version %lld): %lld point(s)\n",
              files[0].c_str(), static_cast<long long>(r.from_version), files[1].c_str(),
              static_cast<long long>(harness::kResultsSchemaVersion), static_cast<long long>(r.points));
  for (const auto& note : r.notes) std::printf("  %s\n", note.c_str());
  return 0;
}

}  // namespace mtplab::app
