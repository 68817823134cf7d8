// The sub-commands of mtplab. Each lives in its own cmd_<name>.cpp.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/cli.hpp"
#include "io/output.hpp"

namespace mtplab::app {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);
};

const std::vector<Command>& commands();

/// Runs a command; any exception becomes `[rank r@host] message` on stderr, printed once, and a
/// non-zero exit of the whole job instead of a hang (dist::run_guarded).
int run_guarded(const Command& command, int argc, char** argv, const Args& args);

/// The option reader of `mtplab <name>`: its usage line is "mtplab <name> <synopsis>", and
/// `about` opens its help text.
cli::Parser command_parser(const std::string& name, const std::string& synopsis, const std::string& about);

/// Parses a command's arguments with its declared options (core/cli.hpp). Asked for --help, it
/// prints the help on stdout and returns nothing (the command then returns 0); a bad command
/// line throws dist::ArgumentError naming the option (printed by one rank under a launcher).
std::optional<cli::Args> parse_or_help(const cli::Parser& parser, const Args& args);

/// The claim on the output `out` of a command without MPI (merge, upgrade), as `run` claims its
/// own (io::OutputLock, named by `argv`): refused while another run or merge writes it. Nothing
/// is claimed when the output's directory does not exist (the command's own error follows).
io::OutputLock claim_output(const std::string& out, const std::vector<std::string>& argv);

int cmd_info(const Args& args);
int cmd_trace(const Args& args);
int cmd_routing(const Args& args);
int cmd_list(const Args& args);
int cmd_check(const Args& args);
int cmd_run(const Args& args);
int cmd_merge(const Args& args);
int cmd_upgrade(const Args& args);
int cmd_plan(const Args& args);

}  // namespace mtplab::app
