// The tail of a single-process benchmark's main(): runs the body and turns an exception into
// its message on stderr and exit status 1 (the MPI benchmark uses dist::run_guarded instead).
#pragma once
#include <cstdio>
#include <exception>
#include <functional>

#include "core/error.hpp"

namespace mtplab::bench {

inline int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.describe().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

}  // namespace mtplab::bench
