// Rank-prefixed logging to stderr (`[rank r@host] level: message`; no tag before the rank is
// known). Level from MTPLAB_LOG (error|warn|info|debug), default info.
#pragma once
#include <string>

#include "core/str.hpp"

namespace mtplab {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };
LogLevel log_level();
void set_log_level(LogLevel level);
void log_line(LogLevel level, const std::string& message);

template <typename... Args>
void log_info(const Args&... args) {
  if (log_level() >= LogLevel::info) log_line(LogLevel::info, str(args...));
}
template <typename... Args>
void log_warn(const Args&... args) {
  if (log_level() >= LogLevel::warn) log_line(LogLevel::warn, str(args...));
}
template <typename... Args>
void log_debug(const Args&... args) {
  if (log_level() >= LogLevel::debug) log_line(LogLevel::debug, str(args...));
}
template <typename... Args>
void log_error(const Args&... args) {
  log_line(LogLevel::error, str(args...));
}

}  // namespace mtplab
