// Progress of a run on rank 0: point i/N, its arms, steps done and an ETA. On a terminal
// (stderr is a tty) one line rewritten in place with `\r`; otherwise (Slurm logs, pipes) plain
// log lines. Either way at most one update per interval (MTPLAB_PROGRESS_S, default 2 s), so a
// long sweep does not flood its log.
#pragma once
#include <chrono>
#include <string>

namespace mtplab::harness {

class Progress {
 public:
  /// `enabled` false (ranks other than 0) makes every call a no-op.
  Progress(bool enabled, int points_to_run);
  void point_begin(int ordinal, int index, const std::string& label);
  /// `fraction` of the point done (0..1), `steps` done in it.
  void update(double fraction, long steps);
  void point_end(const std::string& result);
  void skipped(int index, const std::string& label);
  /// Ends a live line (before other output).
  void finish_line();

 private:
  using Clock = std::chrono::steady_clock;
  void emit(const std::string& line, bool force);
  bool enabled_;
  bool tty_;
  double interval_s_ = 2.0;
  int points_ = 0;
  int ordinal_ = 0;
  int done_points_ = 0;
  int index_ = 0;
  std::string label_;
  Clock::time_point run_start_, point_start_, last_emit_;
  double done_seconds_ = 0;  ///< time spent in finished points
  // The point's rate is measured from its first update on: the first step carries the point's
  // setup (weights, a synthetic trace, the prefill), which said nothing about the steps' pace.
  bool have_first_ = false;
  Clock::time_point first_t_;
  double first_fraction_ = 0;
  double setup_s_ = 0;
  bool line_open_ = false;
};

/// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace mtplab::harness
