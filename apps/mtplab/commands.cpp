// The command table and the guard every command runs under.
#include "commands.hpp"

#include <cstdio>
#include <filesystem>

#include "core/error.hpp"
#include "dist/guard.hpp"
#include "harness/preflight.hpp"

namespace mtplab::app {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"info", "per-rank host, device, and library versions", cmd_info},
      {"trace", "write a trace from the target (synthetic or a checkpoint's trunk)", cmd_trace},
      {"routing", "distinct routed experts of verify-shaped batches of a trace's routing", cmd_routing},
      {"list", "print the numbered points of an experiment", cmd_list},
      {"check", "check every input of an experiment without running it", cmd_check},
      {"run", "run an experiment's points (all, or --point i)", cmd_run},
      {"merge", "join the results files of an array job", cmd_merge},
      {"upgrade", "rewrite a results file of an older schema version as the current one", cmd_upgrade},
      {"plan", "the best draft length per concurrency from acceptance and costs", cmd_plan},
  };
  return table;
}

cli::Parser command_parser(const std::string& name, const std::string& synopsis, const std::string& about) {
  cli::Parser p("mtplab " + name, "mtplab " + name + " " + synopsis);
  p.about(about);
  return p;
}

std::optional<cli::Args> parse_or_help(const cli::Parser& parser, const Args& args) {
  cli::Args parsed;
  try {
    parsed = parser.parse(args);
  } catch (const Error& e) {
    throw dist::ArgumentError(e);  // every rank has the same command line: printed once
  }
  if (!parsed.help()) return parsed;
  std::fputs(parser.help().c_str(), stdout);
  return std::nullopt;
}

io::OutputLock claim_output(const std::string& out, const std::vector<std::string>& argv) {
  const std::string target = io::follow_output_link(out);
  const auto dir = std::filesystem::path(target).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir.empty() ? std::filesystem::path(".") : dir, ec)) return {};
  std::vector<std::string> words;
  for (const auto& a : argv) words.push_back(harness::shell_quote(a));
  return io::OutputLock(target, join(words, " "));
}

// Creates nothing itself (each command owns its dist::Runtime): on an exception dist::run_guarded
// prints the error once and ends the job (dist/guard.hpp: MPI_Finalize and exit 1 when every rank
// knows the verdict, else MPI_Abort from the failing rank, so no rank is left waiting in a
// collective).
int run_guarded(const Command& command, int /*argc*/, char** /*argv*/, const Args& args) {
  return dist::run_guarded([&] { return command.run(args); });
}

}  // namespace mtplab::app
