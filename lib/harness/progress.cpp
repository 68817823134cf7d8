#include "harness/progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/env.hpp"
#include "core/log.hpp"
#include "core/str.hpp"

namespace mtplab::harness {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 3600) return str(t / 3600, "h", (t % 3600) / 60 < 10 ? "0" : "", (t % 3600) / 60, "m");
  if (t >= 60) return str(t / 60, "m", t % 60 < 10 ? "0" : "", t % 60, "s");
  return str(t, "s");
}

Progress::Progress(bool enabled, int points_to_run) : enabled_(enabled), points_(points_to_run) {
  tty_ = enabled_ && ::isatty(STDERR_FILENO) == 1;
  // Checked strictly when the command starts (check_logging_env): a bad value never gets here.
  if (const auto v = env_seconds("MTPLAB_PROGRESS_S")) interval_s_ = *v;
  run_start_ = Clock::now();
  last_emit_ = run_start_ - std::chrono::hours(1);
}

void Progress::emit(const std::string& line, bool force) {
  const auto now = Clock::now();
  if (!force && std::chrono::duration<double>(now - last_emit_).count() < interval_s_) return;
  last_emit_ = now;
  if (tty_) {
    // Pad to clear a longer previous line; no newline, so the next update overwrites it.
    std::string padded = line;
    if (padded.size() < 100) padded.resize(100, ' ');
    std::fprintf(stderr, "\r%s", padded.c_str());
    std::fflush(stderr);
    line_open_ = true;
  } else {
    log_info(line);
  }
}

void Progress::finish_line() {
  if (!enabled_ || !line_open_) return;
  std::fputc('\n', stderr);
  std::fflush(stderr);
  line_open_ = false;
}

void Progress::point_begin(int ordinal, int index, const std::string& label) {
  if (!enabled_) return;
  ordinal_ = ordinal;
  index_ = index;
  label_ = label;
  point_start_ = Clock::now();
  have_first_ = false;
  finish_line();
  log_info("point ", ordinal_ + 1, "/", points_, " (p", index_, ") ", label_);
}

void Progress::update(double fraction, long steps) {
  if (!enabled_) return;
  const auto now = Clock::now();
  if (!have_first_) {
    have_first_ = true;
    first_t_ = now;
    first_fraction_ = fraction;
    setup_s_ = std::chrono::duration<double>(now - point_start_).count();
  }
  // Pace from the first update on; no estimate until half a second and some progress have passed
  // ("?" is printed), so a slow first step (the setup) does not give an ETA of days.
  const double dt = std::chrono::duration<double>(now - first_t_).count();
  const double df = fraction - first_fraction_;
  const bool paced = dt >= 0.5 && df > 0;
  const double point_eta = paced ? dt / df * (1 - fraction) : NAN;
  // Remaining points are assumed to take as long as the finished ones did on average (or this one:
  // its setup plus its steps at the current pace).
  const double this_point = paced ? setup_s_ + dt / df * (1 - first_fraction_) : NAN;
  const double per_point = done_points_ > 0 ? done_seconds_ / done_points_ : this_point;
  const double all_eta = point_eta + per_point * (points_ - ordinal_ - 1);
  emit(str("point ", ordinal_ + 1, "/", points_, " [", label_, "] ", steps, " steps, ",
           std::lround(100 * fraction), "%, point ETA ", format_duration(point_eta), ", run ETA ",
           format_duration(all_eta)),
       false);
}

void Progress::point_end(const std::string& result) {
  if (!enabled_) return;
  const double took = std::chrono::duration<double>(Clock::now() - point_start_).count();
  done_seconds_ += took;
  ++done_points_;
  finish_line();
  log_info("point ", ordinal_ + 1, "/", points_, " (p", index_, ") done in ", format_duration(took), ": ",
           result);
}

void Progress::skipped(int index, const std::string& label) {
  if (!enabled_) return;
  finish_line();
  log_info("p", index, " ", label, ": already in the results file, skipped");
}

}  // namespace mtplab::harness
