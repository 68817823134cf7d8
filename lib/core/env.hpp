// Environment switches: read strictly, so that a typo is an error naming the variable instead of
// a run that silently measured the default.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace mtplab {

/// The value of environment variable `name` when it is set and not empty: it must be one of
/// `allowed` (else mtplab::Error naming the variable, its value and the allowed values); nullopt
/// when unset or empty.
std::optional<std::string> env_choice(const char* name, std::initializer_list<std::string_view> allowed);

/// An integer switch in [lo, hi]; nullopt when unset or empty; anything else is an error.
std::optional<long> env_int(const char* name, long lo, long hi);

/// A number of seconds, finite and >= 0; nullopt when unset or empty; anything else is an error.
std::optional<double> env_seconds(const char* name);

/// The logging variables, checked: MTPLAB_LOG (error, warn, info, debug) and MTPLAB_PROGRESS_S
/// (seconds between progress lines, >= 0). A bad value is an Error naming the variable (it used to
/// be ignored). The commands call it once at start, before anything logs.
void check_logging_env();

}  // namespace mtplab
