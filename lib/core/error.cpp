#include "core/error.hpp"

#include <unistd.h>

#include <array>
#include <cstring>

namespace mtplab {
namespace {
ProcessIdentity& identity_storage() {
  static ProcessIdentity id = [] {
    ProcessIdentity p;
    std::array<char, 256> buf{};
    if (gethostname(buf.data(), buf.size() - 1) == 0) p.host = buf.data();
    if (p.host.empty()) p.host = "?";
    return p;
  }();
  return id;
}
const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

const ProcessIdentity& process_identity() { return identity_storage(); }

void set_process_identity(int rank, int world) {
  identity_storage().rank = rank;
  identity_storage().world = world;
}

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(message),
      message_(std::move(message)),
      rank_(process_identity().rank),
      host_(process_identity().host),
      file_(basename_of(file)),
      line_(line) {}

std::string Error::describe() const {
  return str("[rank ", rank_, "@", host_, "] ", message_, " (", file_, ":", line_, ")");
}

}  // namespace mtplab
