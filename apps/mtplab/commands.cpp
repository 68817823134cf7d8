#include "commands.hpp"

#include <cstdio>
#include <exception>

#include "core/error.hpp"

namespace mtplab::app {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"info", "per-rank host, device, and library versions", cmd_info},
  };
  return table;
}

int run_guarded(const Command& command, int /*argc*/, char** /*argv*/, const Args& args) {
  try {
    return command.run(args);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.describe().c_str());
  } catch (const std::exception& e) {
    const auto& id = process_identity();
    std::fprintf(stderr, "[rank %d@%s] %s\n", id.rank, id.host.c_str(), e.what());
  }
  return 1;
}

}  // namespace mtplab::app
