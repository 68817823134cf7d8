// The benchmarks' command-line reader: `--name value` options, strict integers (a typo or a value
// out of range is a message and exit status 2, never a silent 0), and the usage line on anything
// unknown. Shared by mtplab_bench_kernels, mtplab_bench_step and mtplab_bench_exchange.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace mtplab::bench {

class BenchArgs {
 public:
  BenchArgs(int argc, char** argv, std::string usage) : argc_(argc), argv_(argv), usage_(std::move(usage)) {}

  /// Advances to the next option; false when none is left.
  bool next() {
    if (++i_ >= argc_) return false;
    name_ = argv_[i_];
    return true;
  }
  bool is(const char* name) const { return name_ == name; }

  std::string value() {
    if (i_ + 1 >= argc_) fail(name_ + " needs a value");
    return argv_[++i_];
  }
  int64_t integer(int64_t min, int64_t max) {
    const std::string v = value();
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0) fail(name_ + " expects an integer, got \"" + v + "\"");
    if (x < min || x > max)
      fail(name_ + " " + v + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
    return x;
  }
  /// An unknown option: the usage line, exit status 2.
  [[noreturn]] void unknown() const { fail("unknown option " + name_); }
  /// Any other bad value: the message, the usage line, exit status 2.
  [[noreturn]] void fail(const std::string& message) const {
    std::fprintf(stderr, "%s: %s\nusage: %s %s\n", argv_[0], message.c_str(), argv_[0], usage_.c_str());
    std::exit(2);
  }

 private:
  int argc_;
  char** argv_;
  std::string usage_;
  int i_ = 0;
  std::string name_;
};

}  // namespace mtplab::bench
