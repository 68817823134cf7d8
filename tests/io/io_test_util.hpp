// Helpers for the io tests: a fresh temporary directory per test and a seeded generator whose
// seed is printed with any failure, so a failing draw can be replayed.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "common/random.hpp"
#include "common/seed.hpp"
#include "core/error.hpp"

namespace mtplab::io::testing_util {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string base = ::testing::TempDir();
    if (base.empty()) base = "/tmp/";
    std::string templ = (std::filesystem::path(base) / "mtplab_io_XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << "cannot create a temporary directory under " << base;
    dir_ = templ;
    seed_ = mtplab::test::env_seed_or_fresh();  // MTPLAB_TEST_SEED replays a failing draw
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "[ seed     ] " << mtplab::test::seed_note(seed_) << "\n";
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  /// Names of the entries of the temporary directory (to see stray temporaries).
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::filesystem::path dir_;
  std::uint64_t seed_ = 0;
  mtplab::test::Rng rng_;  ///< tests/common/random.hpp, seeded with seed_
};

using mtplab::test::error_of;

}  // namespace mtplab::io::testing_util
