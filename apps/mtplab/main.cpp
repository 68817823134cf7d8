// mtplab: one binary, sub-commands. An error is printed once, as `[rank r@host] message` on
// stderr (without the tag before MPI is up), and every rank exits non-zero: with MPI_Finalize when
// every rank knows the verdict, with MPI_Abort when one rank failed alone (dist/guard.hpp).
//
// Options before (or among) a command's arguments: -v / --verbose (error messages carry the
// source location of the throw, as with MTPLAB_DEBUG=1); before the command only: --version,
// -h / --help.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/build_info.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"

namespace {
void usage(FILE* out) {
  std::fprintf(out,
               "usage: mtplab [-v] <command> [options]\n"
               "       mtplab --version\n\n"
               "commands:\n");
  for (const auto& c : mtplab::app::commands()) std::fprintf(out, "  %-8s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\n`mtplab <command> --help` describes a command.\n"
               "-v, --verbose  error messages carry the source file:line of the error (as MTPLAB_DEBUG=1)\n"
               "--version      the version, the git commit and the backends of this build\n");
}

void version() {
  std::printf("mtplab %s\n", mtplab::project_version());
  std::printf("git %s%s\n", mtplab::git_sha(),
              mtplab::git_dirty() ? " (dirty: built with uncommitted changes)" : "");
#if defined(MTPLAB_HAVE_CUDA)
  std::printf("backends: cpu, cuda%s\n", mtplab::dist::nccl_available() ? " (NCCL collectives)" : "");
#else
  std::printf("backends: cpu (built without CUDA)\n");
#endif
}

bool verbose_flag(const std::string& a) { return a == "-v" || a == "--verbose"; }

/// A usage error of the binary itself, printed once under a launcher (every rank has it).
int usage_error(const std::string& line) {
  if (mtplab::dist::launcher_rank() <= 0) {
    std::fprintf(stderr, "%s\n\n", line.c_str());
    usage(stderr);
  }
  return mtplab::dist::kExitUsage;
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> all(argv + 1, argv + argc);
  size_t first = 0;
  bool verbose = false;
  for (; first < all.size() && !all[first].empty() && all[first][0] == '-'; ++first) {
    const std::string& a = all[first];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (a == "--version") {
      version();
      return 0;
    }
    if (!verbose_flag(a)) return usage_error("mtplab: unknown option \"" + a + "\"");
    verbose = true;
  }
  if (first == all.size()) {
    if (mtplab::dist::launcher_rank() <= 0) usage(stderr);
    return mtplab::dist::kExitUsage;
  }
  const std::string name = all[first];
  // -v among the command's arguments too (before a `--`); no command declares an option of that name.
  std::vector<std::string> args;
  bool options_done = false;
  for (size_t i = first + 1; i < all.size(); ++i) {
    options_done = options_done || all[i] == "--";
    if (!options_done && verbose_flag(all[i])) {
      verbose = true;
      continue;
    }
    args.push_back(all[i]);
  }
  const mtplab::app::Command* command = nullptr;
  for (const auto& c : mtplab::app::commands())
    if (name == c.name) command = &c;
  if (!command) return usage_error("mtplab: unknown command \"" + name + "\"");
  const int env = mtplab::dist::run_guarded([&] {
    try {
      // MTPLAB_DEBUG is read strictly: a typo is an error naming it, not silently "off".
      const auto debug = mtplab::env_choice("MTPLAB_DEBUG", {"0", "1"});
      mtplab::set_error_locations(verbose || (debug && *debug == "1"));
    } catch (const mtplab::Error& e) {
      throw mtplab::dist::ArgumentError(e);  // the same environment on every rank
    }
    return 0;
  });
  if (env != 0) return env;
  return mtplab::app::run_guarded(*command, argc, argv, args);
}
