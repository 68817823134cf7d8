// The one exception type of mtplab. It carries the rank and host of the process that raised it
// and the source file and line of the throw, so `main` can print `[rank r@host] message` (with
// `(file:line)` when source locations are asked for) and end the whole job instead of leaving
// other ranks hanging in a collective.
#pragma once
#include <stdexcept>
#include <string>

#include "core/str.hpp"

namespace mtplab {

/// Identity of this process, set once the launcher is known (before that: rank -1, "?").
struct ProcessIdentity {
  int rank = -1;
  int world = 1;
  std::string host;
};
const ProcessIdentity& process_identity();
void set_process_identity(int rank, int world);  ///< also reads the host name

/// `[rank r@host] ` once the rank is known, "" before (an argument error, a tool without MPI).
std::string rank_tag();

/// Whether messages carry the source location (file:line) of the throw: MTPLAB_DEBUG=1 in the
/// environment (read once, at first use) or set_error_locations(true) (`mtplab -v`). Off by
/// default: a location helps whoever debugs mtplab, not whoever fixes an experiment file.
bool error_locations();
void set_error_locations(bool on);

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line);
  /// The bare message, without location or rank.
  const std::string& message() const { return message_; }
  int rank() const { return rank_; }
  const std::string& host() const { return host_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  /// `[rank r@host] message`, plus ` (file:line)` when error_locations(); no rank tag while the
  /// rank is unknown (rank -1).
  std::string describe() const;

 private:
  std::string message_;
  int rank_;
  std::string host_;
  std::string file_;
  int line_;
};

}  // namespace mtplab

/// Throws mtplab::Error with the streamed arguments as message.
#define MTP_FAIL(...) throw ::mtplab::Error(::mtplab::message(__VA_ARGS__), __FILE__, __LINE__)
/// Throws mtplab::Error when `cond` is false.
#define MTP_REQUIRE(cond, ...)          \
  do {                                  \
    if (!(cond)) MTP_FAIL(__VA_ARGS__); \
  } while (0)
