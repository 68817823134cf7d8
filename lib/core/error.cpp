#include "core/error.hpp"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
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
std::atomic<bool>& locations_storage() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("MTPLAB_DEBUG");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return on;
}
}  // namespace

const ProcessIdentity& process_identity() { return identity_storage(); }

void set_process_identity(int rank, int world) {
  identity_storage().rank = rank;
  identity_storage().world = world;
}

std::string rank_tag() {
  const auto& id = process_identity();
  return id.rank < 0 ? std::string() : str("[rank ", id.rank, "@", id.host, "] ");
}

bool error_locations() { return locations_storage().load(std::memory_order_relaxed); }
void set_error_locations(bool on) { locations_storage().store(on, std::memory_order_relaxed); }

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(message),
      message_(std::move(message)),
      rank_(process_identity().rank),
      host_(process_identity().host),
      file_(basename_of(file)),
      line_(line) {}

std::string Error::describe() const {
  std::string out = rank_ < 0 ? message_ : str("[rank ", rank_, "@", host_, "] ", message_);
  if (error_locations()) out += str(" (", file_, ":", line_, ")");
  return out;
}

}  // namespace mtplab
