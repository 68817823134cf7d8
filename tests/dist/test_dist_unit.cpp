// dist rules that need neither MPI nor a GPU: the device choice and its refusals, the timeout
// setting, run_guarded without MPI (what it prints, its exit codes, argument errors printed once),
// the element types of the host collectives, the NCCL communicator's watchdog, the start-up
// timeout's setting, and the second stop signal removing the temporaries.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/error.hpp"
#include "core/temp_files.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "dist/startup.hpp"
#include "dist/stop_signals.hpp"
#include "dist/watchdog.hpp"
#include "dist/world_ops.hpp"

using namespace mtplab;
using namespace mtplab::dist;

namespace {
std::string refusal(int local_rank, int local_size, int visible, const char* cvd) {
  try {
    choose_device(local_rank, local_size, visible, cvd, "node7");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}
bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(DeviceRule, LocalRankWhenEnoughGpus) {
  EXPECT_EQ(choose_device(0, 2, 2, nullptr, "h"), 0);
  EXPECT_EQ(choose_device(1, 2, 2, nullptr, "h"), 1);
  EXPECT_EQ(choose_device(5, 8, 8, "0,1,2,3,4,5,6,7", "h"), 5);
  EXPECT_EQ(choose_device(1, 2, 4, nullptr, "h"), 1);  // spare GPUs are fine
}

TEST(DeviceRule, OneGpuPerTaskFromTheScheduler) {
  // srun --gpus-per-task=1: every task sees its own GPU as ordinal 0.
  EXPECT_EQ(choose_device(3, 4, 1, "3", "h"), 0);
  EXPECT_EQ(choose_device(0, 1, 1, nullptr, "h"), 0);
}

TEST(DeviceRule, RefusesMoreRanksThanGpus) {
  const std::string m = refusal(2, 3, 2, nullptr);
  EXPECT_TRUE(has(m, "3 ranks run on host node7 but only 2 GPU(s) are visible")) << m;
  EXPECT_TRUE(has(m, "CUDA_VISIBLE_DEVICES unset")) << m;
  // One GPU and no CUDA_VISIBLE_DEVICES: the ranks really would share it.
  EXPECT_TRUE(has(refusal(0, 2, 1, nullptr), "2 ranks run on host node7 but only 1 GPU(s)"));
  // An empty CUDA_VISIBLE_DEVICES is not a scheduler binding.
  EXPECT_FALSE(refusal(0, 2, 1, "").empty());
  EXPECT_TRUE(has(refusal(0, 4, 2, "0,1"), "CUDA_VISIBLE_DEVICES=0,1"));
  EXPECT_TRUE(has(refusal(0, 1, 0, "none"), "no GPU is visible on host node7"));
}

TEST(DeviceRule, RefusesTwoRanksOnOneGpu) {
  EXPECT_NO_THROW(check_distinct_gpus({"0000:3b:00.0", "0000:5E:00.0"}, {4, 5}, "h"));
  try {
    check_distinct_gpus({"0000:3B:00.0", "0000:5e:00.0", "0000:3b:00.0"}, {8, 9, 10}, "node7");
    FAIL() << "two ranks on one GPU were accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(
        has(e.message(), "ranks 8 and 10 on host node7 would share the GPU at PCI bus id 0000:3b:00.0"))
        << e.message();
  }
  EXPECT_THROW(check_distinct_gpus({"a"}, {1, 2}, "h"), Error);
}

TEST(Timeout, ParsesSecondsStrictly) {
  EXPECT_DOUBLE_EQ(parse_timeout_s("60", "x"), 60.0);
  EXPECT_DOUBLE_EQ(parse_timeout_s(" 2.5 ", "x"), 2.5);
  for (const char* bad : {"", "0", "-1", "abc", "5s", "inf", "nan", "1e999"}) {
    try {
      parse_timeout_s(bad, "MTPLAB_COLLECTIVE_TIMEOUT_S");
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const Error& e) {
      EXPECT_TRUE(has(e.message(), "MTPLAB_COLLECTIVE_TIMEOUT_S")) << e.message();
    }
  }
}

TEST(Timeout, FromEnvironment) {
  unsetenv(kCollectiveTimeoutEnv);
  EXPECT_DOUBLE_EQ(collective_timeout_s(), kDefaultCollectiveTimeoutS);
  setenv(kCollectiveTimeoutEnv, "7.5", 1);
  EXPECT_DOUBLE_EQ(collective_timeout_s(), 7.5);
  setenv(kCollectiveTimeoutEnv, "soon", 1);
  EXPECT_THROW(collective_timeout_s(), Error);
  unsetenv(kCollectiveTimeoutEnv);
}

TEST(WorldOps, ElementTypesAndNames) {
  using detail::elem_of;
  static_assert(elem_of<int8_t>() == Elem::i8 && elem_of<uint8_t>() == Elem::u8);
  static_assert(elem_of<int16_t>() == Elem::i16 && elem_of<uint16_t>() == Elem::u16);
  static_assert(elem_of<int32_t>() == Elem::i32 && elem_of<uint32_t>() == Elem::u32);
  static_assert(elem_of<int64_t>() == Elem::i64 && elem_of<uint64_t>() == Elem::u64);
  static_assert(elem_of<long>() == Elem::i64 && elem_of<const int>() == Elem::i32);
  static_assert(elem_of<float>() == Elem::f32 && elem_of<double>() == Elem::f64);
  static_assert(elem_of<bf16>() == Elem::u16, "BF16 travels as its bits");
  static_assert(!detail::reducible<bf16>() && detail::reducible<double>());
  // The names come from one table per enum, in the enum's order: check every entry.
  const char* names[] = {"int8",   "uint8", "int16",  "uint16",  "int32",
                         "uint32", "int64", "uint64", "float32", "float64"};
  for (int i = 0; i <= static_cast<int>(Elem::f64); ++i)
    EXPECT_STREQ(to_string(static_cast<Elem>(i)), names[i]) << i;
  EXPECT_STREQ(to_string(ReduceOp::min), "min");
  EXPECT_STREQ(to_string(ReduceOp::max), "max");
  EXPECT_STREQ(to_string(ReduceOp::sum), "sum");
}

TEST(Guard, ReturnsTheBodyCodeOrOneWithoutMpi) {
  EXPECT_EQ(run_guarded([] { return 7; }), 7);
  set_process_identity(0, 1);
  set_error_locations(false);
  testing::internal::CaptureStderr();
  const int rc = run_guarded([]() -> int { MTP_FAIL("no such file \"x.yaml\""); });
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, kExitError);
  EXPECT_EQ(err, "[rank 0@" + process_identity().host + "] no such file \"x.yaml\"\n");
  // The source location only when asked for (MTPLAB_DEBUG=1, mtplab -v).
  set_error_locations(true);
  testing::internal::CaptureStderr();
  run_guarded([]() -> int { MTP_FAIL("no such file"); });
  err = testing::internal::GetCapturedStderr();
  set_error_locations(false);
  EXPECT_TRUE(has(err, "] no such file (test_dist_unit.cpp:")) << err;
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_guarded([]() -> int { throw 42; }), 1);
  EXPECT_TRUE(has(testing::internal::GetCapturedStderr(), "unknown exception"));
  // A collective timeout has its own exit code.
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_guarded([]() -> int { throw CollectiveTimeout("NCCL wait timed out", __FILE__, __LINE__); }),
            kExitCollectiveTimeout);
  EXPECT_TRUE(has(testing::internal::GetCapturedStderr(), "NCCL wait timed out"));
}

// An error of the command line is the same on every rank: printed by the launcher's rank 0 only.
TEST(Guard, ArgumentErrorsArePrintedByTheLaunchersRankZero) {
  set_process_identity(-1, 1);
  const auto argument_error = []() -> int {
    throw ArgumentError(Error("mtplab run: unknown option \"--pont\"", __FILE__, __LINE__));
  };
  for (const char* v : {"PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) unsetenv(v);
  EXPECT_EQ(launcher_rank(), -1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_guarded(argument_error), kExitError);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "mtplab run: unknown option \"--pont\"\n");  // no tag
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  EXPECT_EQ(launcher_rank(), 0);
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_guarded(argument_error), kExitError);
  EXPECT_FALSE(testing::internal::GetCapturedStderr().empty());
  setenv("PMIX_RANK", "3", 1);  // the first of the variables wins
  EXPECT_EQ(launcher_rank(), 3);
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_guarded(argument_error), kExitError);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  setenv("PMIX_RANK", "x", 1);
  EXPECT_EQ(launcher_rank(), -1);
  unsetenv("PMIX_RANK");
  unsetenv("OMPI_COMM_WORLD_RANK");
  set_process_identity(0, 1);
}

TEST(Guard, AgreedWithoutMpiOnlyRunsTheStep) {
  int runs = 0;
  run_agreed([&] { ++runs; });
  EXPECT_EQ(runs, 1);
  EXPECT_THROW(run_agreed([] { MTP_FAIL("alone"); }), Error);
  EXPECT_FALSE(failure_agreed());
  set_process_identity(2, 4);
  const AgreedError mine(Error("bad file", __FILE__, __LINE__), 2), theirs("rank 0 failed", 0);
  EXPECT_TRUE(mine.reports());
  EXPECT_FALSE(theirs.reports());
  set_process_identity(0, 1);
}

// ---- the NCCL communicator's watchdog (dist/watchdog.hpp), alone --------------------------------

namespace {
using WClock = Watchdog::Clock;
using namespace std::chrono_literals;

/// Polls `pred` every millisecond for up to 5 s (a loaded CI machine can be slow to schedule the
/// watchdog's thread; only correctness is asserted, never a speed).
template <typename Pred>
bool eventually(Pred pred) {
  const auto until = WClock::now() + 5s;
  while (!pred()) {
    if (WClock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}
}  // namespace

TEST(Watchdog, DoesNotFireForACallDisarmedInTime) {
  std::atomic<int> fired{0};
  Watchdog w([&] { ++fired; }, 2ms);
  for (int i = 0; i < 100; ++i) {
    w.arm(WClock::now() + 10s);
    EXPECT_FALSE(w.disarm());
  }
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(fired.load(), 0);
}

TEST(Watchdog, FiresOnceAfterTheDeadlineAndDisarmSaysSo) {
  std::atomic<int> fired{0};
  std::atomic<int64_t> fired_at{0};
  Watchdog w(
      [&] {
        fired_at = WClock::now().time_since_epoch().count();
        ++fired;
      },
      2ms);
  const auto deadline = WClock::now() + 30ms;
  w.arm(deadline);
  ASSERT_TRUE(eventually([&] { return fired.load() == 1; }));
  EXPECT_GE(fired_at.load(), deadline.time_since_epoch().count()) << "fired before its deadline";
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(fired.load(), 1) << "a fired call fires once";
  EXPECT_TRUE(w.disarm());
  // Re-armed after firing: disarmed in time it stays quiet, overrun it fires again.
  w.arm(WClock::now() + 10s);
  EXPECT_FALSE(w.disarm());
  w.arm(WClock::now());
  ASSERT_TRUE(eventually([&] { return fired.load() == 2; }));
  EXPECT_TRUE(w.disarm());
}

TEST(Watchdog, DisarmReturnsOnlyAfterTheCallbackHasReturned) {
  // The communicator relies on this: after disarm() says "fired", the abort is complete.
  std::atomic<bool> started{false}, finished{false};
  Watchdog w(
      [&] {
        started = true;
        std::this_thread::sleep_for(100ms);
        finished = true;
      },
      1ms);
  w.arm(WClock::now());
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  EXPECT_TRUE(w.disarm());
  EXPECT_TRUE(finished.load());
}

TEST(Watchdog, StopsPromptlyWhileACallIsArmed) {
  std::atomic<int> fired{0};
  const auto t0 = WClock::now();
  {
    Watchdog w([&] { ++fired; }, 1s);
    w.arm(WClock::now() + 60s);
  }  // the destructor wakes the thread instead of waiting out its period
  EXPECT_LT(WClock::now() - t0, 900ms);
  EXPECT_EQ(fired.load(), 0);
}

// Two quick SIGTERMs: the first only asks to stop, the second stops at once, with its note, and
// removes the temporary file of a point being written (no stale FILE.tmp.<pid> is left).
TEST(StopSignals, SecondSignalStopsAtOnceAndRemovesTheTemporaries) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) /
                            ("mtplab-stop-" + std::to_string(::getpid()) + ".h5.tmp.1"))
                               .string();
  EXPECT_EXIT(
      {
        if (std::FILE* f = std::fopen(path.c_str(), "w")) {
          std::fputs("half a point", f);
          std::fclose(f);
        }
        register_temporary(path);
        install_stop_handlers("r.h5 keeps every completed point");
        std::raise(SIGTERM);  // the first: a flag, and a note
        if (stop_signal() != SIGTERM) std::_Exit(3);
        std::raise(SIGTERM);  // the second: stops at once
        std::_Exit(4);
      },
      ::testing::ExitedWithCode(143),
      "signal 15 \\(Terminated\\): stopping at the next step boundary; r.h5 keeps every completed "
      "point(.|\n)*"
      "signal 15 \\(Terminated\\) again: stopping now, exit 143; r.h5 keeps every completed point, since a "
      "point is written whole or not at all \\(no temporary file is left\\)");
  EXPECT_FALSE(std::filesystem::exists(path)) << path << " was left behind";
  std::filesystem::remove(path);
}

TEST(Startup, TimeoutSetting) {
  ::unsetenv(detail::kStartupTimeoutEnv);
  EXPECT_EQ(detail::startup_timeout_s(), 60.0);
  ::setenv(detail::kStartupTimeoutEnv, "2.5", 1);
  EXPECT_EQ(detail::startup_timeout_s(), 2.5);
  for (const char* bad : {"0", "-1", "soon", "inf", "nan", "3s"}) {
    ::setenv(detail::kStartupTimeoutEnv, bad, 1);
    std::string m;
    try {
      (void)detail::startup_timeout_s();
    } catch (const Error& e) {
      m = e.message();
    }
    EXPECT_TRUE(has(m, "MTPLAB_STARTUP_TIMEOUT_S")) << bad << ": " << m;
    EXPECT_TRUE(has(m, "is not a timeout in seconds")) << bad << ": " << m;
  }
  ::unsetenv(detail::kStartupTimeoutEnv);
}
