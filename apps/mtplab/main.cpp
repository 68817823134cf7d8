// mtplab: one binary, sub-commands. Every error ends in `[rank r@host] message` on stderr and a
// non-zero exit on every rank (MPI_Abort when more than one rank runs).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/error.hpp"

namespace {
void usage(FILE* out) {
  std::fprintf(out,
               "usage: mtplab <command> [options]\n\n"
               "commands:\n");
  for (const auto& c : mtplab::app::commands()) std::fprintf(out, "  %-8s %s\n", c.name, c.summary);
  std::fprintf(out, "\n`mtplab <command> --help` describes a command.\n");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : mtplab::app::commands()) {
    if (argv[1] == std::string(c.name)) return mtplab::app::run_guarded(c, argc, argv, args);
  }
  std::fprintf(stderr, "mtplab: unknown command \"%s\"\n\n", argv[1]);
  usage(stderr);
  return 2;
}
