// StartupWatch: the thread that bounds MPI initialisation, and its report of the ranks of this host
// that have not arrived, read from /proc (startup.hpp).
#include "dist/startup.hpp"

#include <dirent.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "core/str.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"

namespace mtplab::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kThreadName = "mtplab-startup";  // at most 15 characters (pthread_setname_np)
// The launcher's rank, in the order launcher_rank() reads them.
constexpr const char* kRankVars[] = {"PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
// What identifies the job across its processes.
constexpr const char* kJobVars[] = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_STEP_ID"};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A process's environment (NUL-separated NAME=value), as a map; empty when unreadable.
std::map<std::string, std::string> environment_of(int pid) {
  std::map<std::string, std::string> env;
  const std::string raw = read_file(str("/proc/", pid, "/environ"));
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    const std::string entry = raw.substr(start, end - start);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
    start = end + 1;
  }
  return env;
}

/// State letter and parent pid from /proc/PID/stat ("1234 (name) S 1000 ..."); state 0 when gone.
struct ProcStat {
  char state = 0;
  int ppid = -1;
};
ProcStat stat_of(int pid) {
  ProcStat st;
  const std::string text = read_file(str("/proc/", pid, "/stat"));
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 4 > text.size()) return st;
  std::istringstream rest(text.substr(close + 2));
  rest >> st.state >> st.ppid;
  return st;
}

/// Whether a thread of `pid` carries the start-up watch's name: it reached the start-up.
bool in_startup(int pid) {
  const std::string dir = str("/proc/", pid, "/task");
  DIR* d = ::opendir(dir.c_str());
  if (!d) return false;
  bool found = false;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string name = read_file(str(dir, "/", e->d_name, "/comm"));
    while (!name.empty() && name.back() == '\n') name.pop_back();
    if (name == kThreadName) {
      found = true;
      break;
    }
  }
  ::closedir(d);
  return found;
}

std::optional<int> env_rank(const std::map<std::string, std::string>& env) {
  for (const char* name : kRankVars) {
    const auto it = env.find(name);
    if (it == env.end() || it->second.empty()) continue;
    const auto v = parse_int64(it->second);
    if (v && *v >= 0 && *v <= INT_MAX) return static_cast<int>(*v);
    return std::nullopt;
  }
  return std::nullopt;
}

/// The job's identity in an environment: the first of kJobVars set (Slurm's with the job id).
std::string job_key(const std::map<std::string, std::string>& env) {
  for (const char* name : kJobVars) {
    const auto it = env.find(name);
    if (it == env.end() || it->second.empty()) continue;
    if (std::string(name) == "SLURM_STEP_ID") {
      const auto job = env.find("SLURM_JOB_ID");
      return str(name, "=", job == env.end() ? std::string() : job->second, ".", it->second);
    }
    return str(name, "=", it->second);
  }
  return "";
}

/// A rank of this job seen on this host.
struct Peer {
  int pid = 0;
  bool stopped = false;
  bool waiting = false;  // reached the start-up (its watch thread is there)
};

/// The other processes of this job on this host, by launcher rank.
std::map<int, Peer> peers_on_this_host(const std::string& my_key) {
  std::map<int, Peer> peers;
  const int self = static_cast<int>(::getpid());
  const int parent = static_cast<int>(::getppid());
  DIR* d = ::opendir("/proc");
  if (!d) return peers;
  while (const dirent* e = ::readdir(d)) {
    const auto pid64 = parse_int64(e->d_name);
    if (!pid64 || *pid64 <= 0 || *pid64 > INT_MAX) continue;
    const int pid = static_cast<int>(*pid64);
    if (pid == self) continue;
    const ProcStat st = stat_of(pid);
    if (st.state == 0) continue;
    const auto env = environment_of(pid);
    if (env.empty()) continue;
    const bool same_job = my_key.empty() ? st.ppid == parent : job_key(env) == my_key;
    if (!same_job) continue;
    const auto rank = env_rank(env);
    if (!rank) continue;
    Peer& p = peers[*rank];  // a wrapper and the process it started share a rank: merged
    const bool stopped = st.state == 'T' || st.state == 't';
    const bool waiting = in_startup(pid);
    if (p.pid == 0 || stopped || waiting) p.pid = pid;
    p.stopped = p.stopped || stopped;
    p.waiting = p.waiting || waiting;
  }
  ::closedir(d);
  return peers;
}

/// "1", "2-4, 7": the ranks, consecutive ones as ranges.
std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? str(ranks[i]) : str(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return join(parts, ", ");
}

std::string ranks_word(const std::vector<int>& ranks) {
  return str(ranks.size() == 1 ? "rank " : "ranks ", rank_list(ranks));
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

double startup_timeout_s() {
  const char* env = std::getenv(kStartupTimeoutEnv);
  if (!env) return kDefaultStartupTimeoutS;
  return parse_timeout_s(env, kStartupTimeoutEnv);
}

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "PMI_SIZE"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    const auto n = parse_int64(v);
    return n && *n >= 1 && *n <= INT_MAX ? static_cast<int>(*n) : -1;
  }
  return -1;
}

StartupWatch::StartupWatch(double timeout_s, std::string phase)
    : timeout_s_(timeout_s), phase_(std::move(phase)) {
  thread_ = std::thread([this] { loop(); });
  pthread_setname_np(thread_.native_handle(), kThreadName);
}

StartupWatch::~StartupWatch() { stop(); }

void StartupWatch::phase(std::string what) {
  std::lock_guard<std::mutex> lock(m_);
  phase_ = std::move(what);
}

void StartupWatch::stop() {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void StartupWatch::loop() {
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(timeout_s_ / 100, 0.01, 0.1)));
  const double not_running = std::min(1.0, timeout_s_ / 3);
  double ran = 0;  // seconds this process ran since the watch began
  auto last = Clock::now();
  std::unique_lock<std::mutex> lock(m_);
  while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
    const auto now = Clock::now();
    const double gap = std::chrono::duration<double>(now - last).count();
    last = now;
    if (gap < not_running) ran += gap;  // a longer gap: this process was stopped, not waiting
    if (ran > timeout_s_) {
      const std::string phase = phase_;
      lock.unlock();
      expire(phase);
    }
  }
}

void StartupWatch::expire(const std::string& phase) {
  const int me = launcher_rank();
  const int world = launcher_world_size();
  const std::string my_key = job_key(environment_of(static_cast<int>(::getpid())));
  const std::map<int, Peer> peers = peers_on_this_host(my_key);

  std::vector<int> stopped, busy, waiting, elsewhere;
  std::vector<std::string> stopped_pids, busy_pids;
  for (const auto& [rank, p] : peers) {
    if (rank == me) continue;
    if (p.stopped) {
      stopped.push_back(rank);
      stopped_pids.push_back(str(p.pid));
    } else if (p.waiting) {
      waiting.push_back(rank);
    } else {
      busy.push_back(rank);
      busy_pids.push_back(str(p.pid));
    }
  }
  for (int r = 0; r < world; ++r)
    if (r != me && !peers.count(r)) elsewhere.push_back(r);

  std::vector<std::string> parts;
  if (!stopped.empty())
    parts.push_back(str(ranks_word(stopped), stopped.size() == 1 ? " is" : " are", " stopped (pid ",
                        join(stopped_pids, ", "), " on this host: SIGSTOP, a debugger or a suspended job)"));
  if (!busy.empty())
    parts.push_back(str(ranks_word(busy), busy.size() == 1 ? " has" : " have", " not reached it (pid ",
                        join(busy_pids, ", "), " on this host, running: busy or hung before MPI starts)"));
  if (!elsewhere.empty())
    parts.push_back(str(ranks_word(elsewhere), elsewhere.size() == 1 ? " is" : " are",
                        " not on this host (not started, exited, or on another host: each host reports its "
                        "own ranks)"));
  if (parts.empty())
    parts.push_back(world > 0 ? "every rank of the job on this host is waiting in it too"
                              : "the launcher's rank and world size are unknown (no launcher variables)");
  if (!waiting.empty() && (stopped.empty() && busy.empty()))
    parts.push_back(
        str(ranks_word(waiting), " on this host ", waiting.size() == 1 ? "waits" : "wait", " too"));

  const std::string tag = me >= 0 ? str("[rank ", me, "@", host_name(), "] ") : std::string();
  const std::string line =
      str(tag, "start-up did not complete within ", seconds_text(timeout_s_), " s (", kStartupTimeoutEnv,
          "): waiting in ", phase, ", which needs every rank of the job; ", join(parts, "; "),
          "; ending the job");

  // One report per host: the lowest waiting rank of the host reports; the others stay quiet one
  // timeout longer, and report then if the job is still alive.
  const bool reporter = me < 0 || waiting.empty() || me < waiting.front();
  if (!reporter) {
    const double grace = std::clamp(timeout_s_ / 10, 0.5, 5.0);
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s_ + grace));
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(kExitCollectiveTimeout);
}

}  // namespace mtplab::dist::detail
