// wait_bounded: MPI_Test against the deadline with a backoff, the arrival probes, the report of a
// timeout; PatientWait; the MPI timeout setting.
#include "dist/mpi_wait.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/str.hpp"
#include "dist/check.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/poll.hpp"
#include "dist/world_ops.hpp"

namespace mtplab::dist {
namespace {

using detail::Backoff;
using detail::Clock;
using detail::to_duration;

constexpr int kProbeTag = 7101;  // "what are you doing?", one int
constexpr int kReplyTag = 7102;  // the answer, kReplyBytes of text
constexpr size_t kReplyBytes = 256;
constexpr auto kAnswerAfter = std::chrono::milliseconds(20);  // start answering probes

struct WatchState {
  MPI_Comm probe = MPI_COMM_NULL;
  int rank = -1;
  int world = 0;
  double timeout_s = kDefaultCollectiveTimeoutS;
  int patient = 0;  // PatientWait depth
  std::string patient_why;
  bool patient_noted = false;
};
WatchState& state() {
  static WatchState s;
  return s;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.1f" : "%.0f", s);
  return buf;
}

/// Answers every probe that has arrived with `doing()` (what this rank is doing). Best effort, so
/// its MPI calls are not checked: probes come only from a rank that is ending the job.
template <typename Doing>
void answer_probes(const Doing& doing) {
  const WatchState& w = state();
  if (w.probe == MPI_COMM_NULL) return;
  while (true) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kProbeTag, w.probe, &flag, &st) != MPI_SUCCESS || !flag) return;
    int token = 0;
    if (MPI_Recv(&token, 1, MPI_INT, st.MPI_SOURCE, kProbeTag, w.probe, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    std::array<char, kReplyBytes> reply{};
    std::snprintf(reply.data(), reply.size(), "%s", doing().c_str());
    // A few hundred bytes go eagerly: the send returns without waiting for the asker.
    MPI_Send(reply.data(), static_cast<int>(reply.size()), MPI_CHAR, st.MPI_SOURCE, kReplyTag, w.probe);
  }
}

/// The world ranks of `comm`'s members, in its rank order.
std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 0;
  if (MPI_Comm_size(comm, &size) != MPI_SUCCESS) return {};
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  std::vector<int> in(static_cast<size_t>(size)), out(static_cast<size_t>(size), MPI_UNDEFINED);
  for (int i = 0; i < size; ++i) in[static_cast<size_t>(i)] = i;
  if (MPI_Comm_group(comm, &group) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS)
    MPI_Group_translate_ranks(group, size, in.data(), world, out.data());
  if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
  return out;
}

// The prefix of every answer (what answer_probes sends): "waiting in <collective> for 2.1 s", or
// "waiting in <collective> (timed out)" from a rank that is reporting.
constexpr const char* kWaitingIn = "waiting in ";

/// The end of a collective that did not complete in time: ask, report once, abort the job.
[[noreturn]] void on_timeout(MPI_Comm comm, const detail::CallName& what) {
  const WatchState& w = state();
  const std::string op = what();
  const double timeout = w.timeout_s;
  // The grace for the answers: a tenth of the timeout, between 0.5 s and 5 s.
  const double grace = std::clamp(timeout / 10, 0.5, 5.0);
  std::map<int, std::string> answers;  // world rank -> what it said
  if (w.probe != MPI_COMM_NULL && w.world > 1) {
    std::vector<std::array<char, kReplyBytes>> replies(static_cast<size_t>(w.world));
    std::vector<MPI_Request> recvs(static_cast<size_t>(w.world), MPI_REQUEST_NULL);
    std::vector<MPI_Request> sends(static_cast<size_t>(w.world), MPI_REQUEST_NULL);
    static int token = 1;  // outlives the sends, which may still be pending when the job ends
    for (int r = 0; r < w.world; ++r) {
      if (r == w.rank) continue;
      const auto i = static_cast<size_t>(r);
      MPI_Irecv(replies[i].data(), static_cast<int>(kReplyBytes), MPI_CHAR, r, kReplyTag, w.probe, &recvs[i]);
      MPI_Isend(&token, 1, MPI_INT, r, kProbeTag, w.probe, &sends[i]);
    }
    const auto until = Clock::now() + to_duration(grace);
    size_t pending = static_cast<size_t>(w.world - 1);
    Backoff backoff;
    while (pending > 0 && Clock::now() < until) {
      for (int r = 0; r < w.world; ++r) {
        auto& req = recvs[static_cast<size_t>(r)];
        if (req == MPI_REQUEST_NULL) continue;
        int done = 0;
        if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
          answers[r] = std::string(replies[static_cast<size_t>(r)].data(),
                                   strnlen(replies[static_cast<size_t>(r)].data(), kReplyBytes));
          --pending;
        }
      }
      answer_probes([&] { return str(kWaitingIn, op, " (timed out)"); });
      backoff.pause();
    }
    // Requests still pending stay so: the job ends below.
  }

  // Who else waits: the lowest of the waiting ranks reports, so the message comes once.
  int reporter = w.rank;
  for (const auto& [r, text] : answers)
    if (starts_with(text, kWaitingIn)) reporter = std::min(reporter, r);

  const std::vector<int> members = world_ranks_of(comm);
  std::vector<std::string> missing, others;
  for (const int r : members) {
    if (r == w.rank || r == MPI_UNDEFINED) continue;
    const auto it = answers.find(r);
    if (it == answers.end()) {
      missing.push_back(str(r));
    } else if (it->second.find(op) == std::string::npos) {
      others.push_back(str("rank ", r, " is ", it->second, " instead"));  // another collective
    }
  }
  std::string peers;
  if (w.probe == MPI_COMM_NULL) {
    peers = "which peer is missing is unknown (no arrival probes yet)";
  } else if (!missing.empty()) {
    peers = str(missing.size() == 1 ? "rank " : "ranks ", join(missing, ", "),
                missing.size() == 1 ? " has" : " have", " not arrived (no answer within ", str(grace),
                " s: stopped, hung, or busy outside a collective)");
  } else {
    peers = others.empty() ? "every other rank of its group is waiting in it too" : "no rank is missing";
  }
  if (!others.empty()) peers += str("; ", join(others, "; "), " (the ranks are in different collectives)");
  int group_size = 0;
  MPI_Comm_size(comm, &group_size);
  const std::string line =
      str(rank_tag(), "MPI ", op, " did not complete within ", str(timeout), " s (", kCollectiveTimeoutEnv,
          ", group of ", group_size, " rank(s)): ", peers, "; ending the job");
  if (reporter != w.rank) {
    // Rank `reporter` waits too and ends the job; stay quiet, and answer its probes, unless the job
    // is still alive one timeout later.
    const auto until = Clock::now() + to_duration(timeout + grace);
    while (Clock::now() < until) {
      answer_probes([&] { return str(kWaitingIn, op, " (timed out)"); });
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  fail_job(line.c_str(), kExitCollectiveTimeout);
  std::_Exit(kExitCollectiveTimeout);  // fail_job returns only without MPI
}

}  // namespace

double mpi_timeout_s() { return state().timeout_s; }

void set_mpi_timeout_s(double seconds) {
  MTP_REQUIRE(std::isfinite(seconds) && seconds > 0,
              "the MPI collective timeout must be a finite number > 0 s (got ", seconds, ")");
  state().timeout_s = seconds;
}

PatientWait::PatientWait(std::string why) : previous_why_(state().patient_why) {
  WatchState& w = state();
  ++w.patient;
  w.patient_why = std::move(why);
  w.patient_noted = false;
}

PatientWait::~PatientWait() {
  WatchState& w = state();
  --w.patient;
  w.patient_why = previous_why_;
}

namespace detail {

void wait_bounded(MPI_Request& request, MPI_Comm comm, const CallName& what) {
  int done = 0;
  int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  if (rc == MPI_SUCCESS && done) return;
  WatchState& w = state();
  const auto start = Clock::now();
  auto deadline = start + to_duration(w.timeout_s);
  // A poll comes every 500 us at most; a much longer gap means that this rank did not run (it was
  // stopped, or the machine did not schedule it): that time is not the peers' to answer for, so
  // the deadline moves by it. A rank continued after SIGSTOP thus does not blame the others.
  const auto not_running = to_duration(std::min(1.0, w.timeout_s / 3));
  auto last = start;
  Backoff backoff;
  bool answering = false;
  while (rc == MPI_SUCCESS && !done) {
    const auto now = Clock::now();
    if (now - last > not_running) deadline += now - last;
    last = now;
    if (answering || now - start > kAnswerAfter) {
      answering = true;
      answer_probes([&] { return str(kWaitingIn, what(), " for ", seconds_text(since(start)), " s"); });
    }
    if (now > deadline) {
      if (w.patient == 0) on_timeout(comm, what);
      if (!w.patient_noted) {
        w.patient_noted = true;
        log_info("waiting in MPI ", what(), " longer than the collective timeout (", str(w.timeout_s),
                 " s) for: ", w.patient_why, " (not bounded)");
      }
    }
    backoff.pause();
    rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  }
  if (rc != MPI_SUCCESS) MTP_FAIL("MPI ", what(), " failed: ", mpi_error_string(rc));
}

void watch_start(int world_rank, int world_size) {
  WatchState& w = state();
  if (w.probe != MPI_COMM_NULL) return;
  MTP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &w.probe));
  w.rank = world_rank;
  w.world = world_size;
}

void watch_stop() noexcept {
  WatchState& w = state();
  if (w.probe == MPI_COMM_NULL) return;
  int finalised = 0;
  if (MPI_Finalized(&finalised) == MPI_SUCCESS && !finalised) MPI_Comm_free(&w.probe);
  w.probe = MPI_COMM_NULL;
}

}  // namespace detail
}  // namespace mtplab::dist
