// The message of the mtplab::Error a piece of code throws, for tests that check what an error
// says (which file, key, option or value it names).
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "core/error.hpp"

namespace mtplab::test {

/// Runs `fn`, expects an mtplab::Error and returns its message (without location or rank).
/// Nothing thrown, or another exception, is a test failure and returns "".
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const mtplab::Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected mtplab::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected mtplab::Error, nothing was thrown";
  return "";
}

}  // namespace mtplab::test
