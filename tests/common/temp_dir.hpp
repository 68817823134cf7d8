// Small helpers of the tests that write files: a fresh temporary directory, and the check that a
// message (an error, a report) contains a part.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "core/error.hpp"

namespace mtplab::test {

/// A fresh directory under the system's temporary directory, named `<prefix>-XXXXXX`, removed with
/// its contents when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    MTP_REQUIRE(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Expects `text` to contain `part`.
inline void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "text:\n" << text << "\nexpected to contain: " << part;
}

}  // namespace mtplab::test
