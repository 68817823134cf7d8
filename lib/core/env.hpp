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

}  // namespace mtplab
