#include <cstdio>

#include "commands.hpp"
#include "core/build_info.hpp"

namespace mtplab::app {

int cmd_info(const Args& /*args*/) {
  std::printf("mtplab %s (git %s%s)\n", project_version(), git_sha(), git_dirty() ? ", dirty" : "");
  return 0;
}

}  // namespace mtplab::app
