#include "core/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

namespace mtplab {
namespace {
LogLevel parse_level() {
  const char* env = std::getenv("MTPLAB_LOG");
  if (!env) return LogLevel::info;
  if (!std::strcmp(env, "error")) return LogLevel::error;
  if (!std::strcmp(env, "warn")) return LogLevel::warn;
  if (!std::strcmp(env, "debug")) return LogLevel::debug;
  return LogLevel::info;
}
LogLevel& level_storage() {
  static LogLevel level = parse_level();
  return level;
}
}  // namespace

LogLevel log_level() { return level_storage(); }
void set_log_level(LogLevel level) { level_storage() = level; }

void log_line(LogLevel level, const std::string& message) {
  static const char* names[] = {"error", "warn", "info", "debug"};
  // One fprintf per line so lines of different ranks do not interleave mid-line.
  std::fprintf(stderr, "%s%s: %s\n", rank_tag().c_str(), names[static_cast<int>(level)], message.c_str());
  std::fflush(stderr);
}

}  // namespace mtplab
