// The input check (check.hpp): the experiment's models, weights, traces and output, each opened and
// checked, the scans and fingerprints of the file inputs, and the report.
#include "harness/check.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "dist/world_ops.hpp"
#include "harness/replay.hpp"
#include "io/output.hpp"
#include "io/trace.hpp"
#include "model/safetensors.hpp"
#include "model/sharding.hpp"
#include "model/weights.hpp"
#include "ops/ops.hpp"

namespace mtplab::harness {
namespace {

static_assert(std::endian::native == std::endian::little, "the content digests read little-endian words");

using Clock = std::chrono::steady_clock;

// Inputs above this size get progress lines while they are scanned.
constexpr uint64_t kProgressBytes = uint64_t{256} << 20;
constexpr double kProgressSeconds = 2.0;

// FNV-1a 64 over little-endian 64-bit words (one XOR and one multiply per 8 bytes), the tail
// bytes one at a time. Fed in pieces whose sizes are multiples of 8 except the last, it gives the
// value of one call over the whole.
struct WordDigest {
  uint64_t h = kFnv1a64OffsetBasis;
  void update(const uint8_t* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h ^= w;
      h *= kFnv1a64Prime;
    }
    for (; i < n; ++i) {
      h ^= p[i];
      h *= kFnv1a64Prime;
    }
  }
};

uint64_t digest_bytes(const void* p, size_t n) {
  WordDigest d;
  d.update(static_cast<const uint8_t*>(p), n);
  return d.h;
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// "p0000-p0003, p0007": the points, consecutive ones as ranges.
std::string point_list(std::vector<int> points) {
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  auto name = [](int i) {
    PointConfig p;
    p.index = i;
    return p.name();
  };
  std::vector<std::string> parts;
  for (size_t i = 0; i < points.size();) {
    size_t j = i;
    while (j + 1 < points.size() && points[j + 1] == points[j] + 1) ++j;
    parts.push_back(j == i ? name(points[i]) : str(name(points[i]), "-", name(points[j])));
    i = j + 1;
  }
  return str(points.size() == 1 ? "point " : "points ", join(parts, ", "));
}

// Messages with the points they concern: the same message for several points is reported once.
struct Grouped {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> points;
  void add(const std::string& message, int point) {
    auto [it, fresh] = points.try_emplace(message);
    if (fresh) order.push_back(message);
    it->second.push_back(point);
  }
  void into(std::vector<std::string>& out) const {
    for (const auto& m : order) out.push_back(str(m, " (", point_list(points.at(m)), ")"));
  }
};

// "[3, 17]" of element `flat` of a tensor of `shape`.
std::string element_at(int64_t flat, const std::vector<int64_t>& shape) {
  if (shape.empty()) return "[]";
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t n = std::max<int64_t>(shape[d], 1);
    idx[d] = flat % n;
    flat /= n;
  }
  return str("[", join(idx, ", "), "]");
}

// The first element of `n` bytes of `dtype` that is NaN or +-Inf, or -1; `what` describes it.
int64_t first_nonfinite(model::DType dtype, const uint8_t* p, size_t n, std::string& what) {
  using model::DType;
  auto find16 = [&](uint16_t exp_mask, uint16_t man_mask) -> int64_t {
    const size_t count = n / 2;
    for (size_t i = 0; i < count;) {
      // Blocks of 4096 with a branch-free test first, so that the common case vectorises.
      const size_t end = std::min(count, i + 4096);
      bool any = false;
      for (size_t j = i; j < end; ++j) {
        uint16_t v;
        std::memcpy(&v, p + 2 * j, 2);
        any |= (v & exp_mask) == exp_mask;
      }
      if (any)
        for (size_t j = i; j < end; ++j) {
          uint16_t v;
          std::memcpy(&v, p + 2 * j, 2);
          if ((v & exp_mask) == exp_mask) {
            what = (v & man_mask) ? "NaN" : ((v & 0x8000) ? "-Inf" : "+Inf");
            return static_cast<int64_t>(j);
          }
        }
      i = end;
    }
    return -1;
  };
  switch (dtype) {
    case DType::bf16:
      return find16(0x7F80, 0x007F);
    case DType::f16:
      return find16(0x7C00, 0x03FF);
    case DType::f32:
      for (size_t j = 0; j < n / 4; ++j) {
        uint32_t v;
        std::memcpy(&v, p + 4 * j, 4);
        if ((v & 0x7F800000u) == 0x7F800000u) {
          what = (v & 0x007FFFFFu) ? "NaN" : ((v & 0x80000000u) ? "-Inf" : "+Inf");
          return static_cast<int64_t>(j);
        }
      }
      return -1;
    case DType::f64:
      for (size_t j = 0; j < n / 8; ++j) {
        uint64_t v;
        std::memcpy(&v, p + 8 * j, 8);
        if ((v & 0x7FF0000000000000ull) == 0x7FF0000000000000ull) {
          what = (v & 0x000FFFFFFFFFFFFFull) ? "NaN" : ((v >> 63) ? "-Inf" : "+Inf");
          return static_cast<int64_t>(j);
        }
      }
      return -1;
    case DType::f8_e4m3:  // OCP "fn": no infinities, S.1111.111 is NaN
      for (size_t j = 0; j < n; ++j)
        if ((p[j] & 0x7F) == 0x7F) {
          what = "NaN";
          return static_cast<int64_t>(j);
        }
      return -1;
    case DType::f8_e5m2:
      for (size_t j = 0; j < n; ++j)
        if ((p[j] & 0x7C) == 0x7C) {
          what = (p[j] & 0x03) ? "NaN" : ((p[j] & 0x80) ? "-Inf" : "+Inf");
          return static_cast<int64_t>(j);
        }
      return -1;
    default:  // integers and booleans are always finite
      return -1;
  }
}

bool readable_weight_dtype(model::DType t) {
  using model::DType;
  return t == DType::bf16 || t == DType::f16 || t == DType::f32 || t == DType::f8_e4m3;
}

// The checkpoint tensors `cfg` reads from.
bool read_by(const model::ModelConfig& cfg, const std::string& name) {
  return name == cfg.embed_tokens_name || name == cfg.lm_head_name || name.starts_with(cfg.mtp_prefix);
}

// Prints "<what>: scanned X of Y (p%)" at most every kProgressSeconds while `done` < `total`.
class ScanProgress {
 public:
  ScanProgress(std::string what, uint64_t total) : what_(std::move(what)), total_(total) {
    enabled_ = total_ >= kProgressBytes;
    if (enabled_) log_info(what_, ": scanning ", human_bytes(total_), " (NaN / Inf, fingerprint)");
    last_ = Clock::now();
  }
  void update(uint64_t done) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - last_).count() < kProgressSeconds) return;
    last_ = now;
    log_info(what_, ": scanned ", human_bytes(done), " of ", human_bytes(total_), " (",
             static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total_)), "%)");
  }

 private:
  std::string what_;
  uint64_t total_;
  bool enabled_ = false;
  Clock::time_point last_;
};

// A key that changes when the file (or a directory's files) change: device, inode (a commit
// renames a new file into place), size and modification time.
std::string stat_key(const std::string& path) {
  namespace fs = std::filesystem;
  auto one = [](const std::string& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return str(p, ":missing");
    return str(p, ":", st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
               st.st_mtim.tv_nsec);
  };
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return one(path);
  std::vector<std::string> parts;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    parts.push_back(one(it->path().string()));
  std::sort(parts.begin(), parts.end());
  return join(parts, "\n");
}

// One process scans an input once: cached by path, the names the model reads, and the files' stats.
const CheckpointScan& cached_checkpoint_scan(const model::ModelConfig& cfg, const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, CheckpointScan> cache;
  const std::string key =
      str(cfg.embed_tokens_name, "\n", cfg.lm_head_name, "\n", cfg.mtp_prefix, "\n", stat_key(path));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, scan_checkpoint(cfg, path)).first;
  return it->second;
}

const TraceScan& cached_trace_scan(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, TraceScan> cache;
  const std::string key = stat_key(path);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, scan_trace(path)).first;
  return it->second;
}

// The cheap digest every rank computes of its copy of a trace: sizes, offsets, prompt lengths and
// tokens (all read and validated when the trace opens).
std::string trace_header_digest(const io::TraceReader& r) {
  WordDigest d;
  const int64_t head[3] = {r.hidden(), r.vocab(), r.num_sequences()};
  d.update(reinterpret_cast<const uint8_t*>(head), sizeof head);
  for (int64_t s = 0; s < r.num_sequences(); ++s) {
    const int64_t meta[3] = {r.sequence_offset(s), r.sequence_length(s), r.prompt_length(s)};
    const auto toks = r.tokens(s);
    d.update(reinterpret_cast<const uint8_t*>(meta), sizeof meta);
    d.update(reinterpret_cast<const uint8_t*>(toks.data()), toks.size_bytes() & ~size_t{7});
    d.update(reinterpret_cast<const uint8_t*>(toks.data()) + (toks.size_bytes() & ~size_t{7}),
             toks.size_bytes() & 7);
  }
  return hex16(d.h);
}

// ... and of its copy of a checkpoint: the header entries (name, dtype, shape, bytes) of the
// tensors the model reads.
std::string checkpoint_header_digest(const model::ModelConfig& cfg, const model::Checkpoint& ckpt) {
  std::string text;
  for (const auto& name : ckpt.names()) {
    if (!read_by(cfg, name)) continue;
    const model::TensorInfo& t = ckpt.info(name);
    text += str(name, " ", model::dtype_name(t.dtype), " ", model::shape_str(t.shape), " ", t.nbytes, "\n");
  }
  return hex16(fnv1a64(text));
}

std::string describe_trace_spec(const TraceSpec& t, uint64_t weights_seed) {
  return str(t.sequences, " sequence(s) of ", t.prompt_len, " + ", t.new_tokens, " tokens, seed ", t.seed,
             ", ", t.layers, " layer(s), weights seed ", weights_seed);
}

// The points (indices) that use the input keyed `key`: its entry of `groups`, added at the end
// when it has none, so the inputs keep the order the points first name them in.
template <typename K>
std::vector<int>& users_of(std::vector<std::pair<K, std::vector<int>>>& groups,
                           const std::type_identity_t<K>& key) {
  const auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
  if (it != groups.end()) return it->second;
  groups.push_back({key, {}});
  return groups.back().second;
}

// Opens the input at `path` as a T; when it cannot be opened, records why in `r`, marks this
// process's copy "unreadable" and returns null.
template <typename T>
std::unique_ptr<T> open_or_report(const std::string& path, InputReport& r, std::string& local_digest) {
  try {
    return std::make_unique<T>(path);
  } catch (const Error& e) {
    r.problems.push_back(e.message());
    local_digest = "unreadable";
    return nullptr;
  }
}

// A batch larger than the sequences a point reads runs as a batch of the sequences read: said, as
// the point records the batch_size it was given.
std::string batch_above_sequences(const PointConfig& p, int64_t read) {
  const int b = p.arms.replay.batch_size;
  if (b <= read) return "";
  return str("batch_size ", b, " is above the ", read, " sequence(s) the point reads: at most ", read,
             " run together, so it measures batches of ", read, " while its configuration says ", b);
}

// What one process checks for one trace file: its copy, opened; then per model reading it, the
// sizes and lengths the points need.
void check_trace_file(const std::string& path, const std::vector<int>& users, const Experiment& ex, int rank,
                      InputReport& r, std::string& local_digest, IdentityInputs& identity) {
  const auto reader = open_or_report<io::TraceReader>(path, r, local_digest);
  if (!reader) return;
  const io::TraceReader& t = *reader;
  local_digest = trace_header_digest(t);
  const int64_t n = t.num_sequences();
  int64_t min_len = INT64_MAX, max_len = 0;
  for (int64_t s = 0; s < n; ++s) {
    min_len = std::min(min_len, t.sequence_length(s));
    max_len = std::max(max_len, t.sequence_length(s));
  }

  Grouped problems, warnings;
  for (int i : users) {
    const PointConfig& p = ex.points[static_cast<size_t>(i)];
    const model::ModelConfig& m = p.model;
    if (t.hidden() != m.hidden || t.vocab() != m.vocab) {
      problems.add(str("hidden ", t.hidden(), " and vocab ", t.vocab(), " do not match model ", m.name,
                       " (hidden ", m.hidden, ", vocab ", m.vocab, ")"),
                   i);
      continue;
    }
    const bool online = p.mode == RunMode::online;
    // Sampling verification against the sampling the trace was recorded with: the check run
    // makes before it starts (check_trace_file), here on the copy just opened. An online point
    // reads the prompts only, and samples from its own target.
    try {
      if (!online) check_trace_sampling(p.arms.replay, t.sampling(), path);
    } catch (const Error& e) {
      problems.add(e.message(), i);
      continue;
    }
    const int want = p.measure.sequences;
    if (want > n) {
      problems.add(str("measure.sequences ", want, " exceeds the trace's ", n,
                       " sequence(s): the points would replay ", n, " and record ", want),
                   i);
      continue;
    }
    const int64_t take = want > 0 ? want : n;
    if (const std::string w = batch_above_sequences(p, take); !w.empty()) warnings.add(w, i);
    const int k = p.arms.drafter.draft_len;
    if (online) {
      // An online sequence holds its prompt and max_new_tokens positions.
      int64_t too_long = 0, first_long = -1;
      for (int64_t s = 0; s < take; ++s)
        if (t.prompt_length(s) + p.online.max_new_tokens > m.max_seq_len && too_long++ == 0) first_long = s;
      if (too_long > 0)
        problems.add(
            str(too_long, " of the ", take, " prompt(s) read + online.max_new_tokens ",
                p.online.max_new_tokens, " exceed model.max_seq_len ", m.max_seq_len, " (first: sequence ",
                first_long, ", a prompt of ", t.prompt_length(first_long), " tokens)"),
            i);
      continue;
    }
    int64_t too_long = 0, first_long = -1, too_short = 0, first_short = -1;
    for (int64_t s = 0; s < take; ++s) {
      const int64_t len = t.sequence_length(s);
      if (len > m.max_seq_len) {
        ++too_long;
        if (first_long < 0) first_long = s;
      }
      // replay: a step needs k targets after the prompt, L + k <= len - 1 with L = prompt length.
      if (t.prompt_length(s) + k > len - 1) {
        ++too_short;
        if (first_short < 0) first_short = s;
      }
    }
    if (too_long > 0)
      problems.add(
          str(too_long, " of the ", take, " sequence(s) read exceed model.max_seq_len ", m.max_seq_len,
              " (first: sequence ", first_long, ", ", t.sequence_length(first_long), " positions)"),
          i);
    if (too_short > 0) {
      const std::string why = str("a step needs prompt_length + draft_len + 1 positions; first: sequence ",
                                  first_short, ", prompt ", t.prompt_length(first_short), " of ",
                                  t.sequence_length(first_short), " positions");
      if (too_short == take)
        problems.add(str("no sequence of the ", take, " read is long enough for one step at draft_len ", k,
                         " (", why, ")"),
                     i);
      else
        warnings.add(str(too_short, " of the ", take, " sequence(s) read have no step at draft_len ", k, " (",
                         why, "): they are prefilled and measured for nothing"),
                     i);
    }
  }
  problems.into(r.problems);
  warnings.into(r.warnings);

  std::string content = "hiddens not scanned on this rank";
  if (rank == 0) {
    TraceScan failed;
    const TraceScan* found = nullptr;
    try {
      found = &cached_trace_scan(path);
    } catch (const Error& e) {
      failed.problem = e.message();
      found = &failed;
    }
    const TraceScan& scan = *found;
    if (!scan.problem.empty()) {
      r.problems.push_back(scan.problem);
      content = "a hidden is not finite";
    } else {
      content = str("hiddens finite; fingerprint ", scan.fingerprint);
    }
    identity.emplace_back(str("trace ", path),
                          str("fnv1a64 ", scan.fingerprint, " (", scan.sequences, " sequences, ",
                              scan.positions, " positions, hidden ", t.hidden(), ", vocab ", t.vocab(), ")"));
  }
  r.summary = str(n, " sequence(s) of ", min_len, "..", max_len, " positions (", t.total_positions(),
                  " in all), hidden ", t.hidden(), ", vocab ", t.vocab(), "; token ids < vocab; ", content);
}

// Whether `problem` says something `problems` does not already: the same text, or another message
// about the same tensor of the same file (the scan and the loader both name it), is not news.
bool is_news(const std::vector<std::string>& problems, const std::string& problem) {
  // `tensor "NAME" in FILE`, the subject of both messages.
  auto subject = [](const std::string& m) -> std::string {
    if (!m.starts_with("tensor \"")) return m;
    const auto q = m.find('"', 8);
    if (q == std::string::npos || m.compare(q + 1, 4, " in ") != 0) return m;
    const auto end = m.find(' ', q + 5);
    return end == std::string::npos ? m : m.substr(0, end);
  };
  const std::string mine = subject(problem);
  return std::none_of(problems.begin(), problems.end(),
                      [&](const std::string& p) { return subject(p) == mine; });
}

// The ranks whose shards this process loads: its own under a launcher, every rank alone.
std::vector<int> ranks_to_load(const dist::Runtime& rt, int world) {
  if (rt.world() > 1) return {rt.rank()};
  std::vector<int> all(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

std::string rank_range(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return str("rank ", ranks.front());
  return str("ranks ", ranks.front(), "-", ranks.back());
}

void check_checkpoint(dist::Runtime& rt, const std::string& path, const model::ModelConfig& cfg,
                      bool several_models, InputReport& r, std::string& local_digest,
                      IdentityInputs& identity) {
  const auto ckpt = open_or_report<model::Checkpoint>(path, r, local_digest);
  if (!ckpt) return;
  local_digest = checkpoint_header_digest(cfg, *ckpt);
  for (const std::string& name : {cfg.embed_tokens_name, cfg.lm_head_name})
    if (!ckpt->contains(name))
      r.problems.push_back(str(path, ": has no tensor \"", name, "\" (model ", cfg.name, "'s checkpoint.",
                               name == cfg.embed_tokens_name ? "embed_tokens" : "lm_head", ")"));

  std::string content = "not scanned on this rank";
  if (rt.rank() == 0) {
    CheckpointScan failed;
    const CheckpointScan* found = nullptr;
    try {
      found = &cached_checkpoint_scan(cfg, path);
    } catch (const Error& e) {
      failed.problems.push_back(e.message());
      found = &failed;
    }
    const CheckpointScan& scan = *found;
    r.problems.insert(r.problems.end(), scan.problems.begin(), scan.problems.end());
    content = str(scan.tensors, " tensor(s) read (", human_bytes(scan.bytes), "), ",
                  scan.problems.empty() ? "dtypes readable, values finite" : "bad tensors", "; fingerprint ",
                  scan.fingerprint);
    if (scan.tensors == 0)
      r.problems.push_back(str(path, ": no tensor under checkpoint.mtp_prefix \"", cfg.mtp_prefix,
                               "\" (model ", cfg.name, "): the prefix or the mtp_layer_index is wrong"));
    identity.emplace_back(
        several_models ? str("checkpoint ", path, " [model ", cfg.name, "]") : str("checkpoint ", path),
        str("fnv1a64 ", scan.fingerprint, " (", scan.tensors, " tensors, ", scan.bytes, " bytes)"));
  }

  r.summary = content;
}

// Names, shapes and the values a shard reads, through the loader itself, for one point of those
// this run loads: one with the head replicated when there is one, since its whole lm_head covers
// the rows of any vocab-sharded head (every other tensor's slice does not depend on the point).
void load_checkpoint_shards(dist::Runtime& rt, const Experiment& ex, const CheckOptions& options,
                            const std::string& path, const std::vector<int>& users, const std::set<int>& skip,
                            InputReport& r) {
  std::vector<const PointConfig*> to_load;
  for (int i : users) {
    if (!options.load_points.empty() &&
        std::find(options.load_points.begin(), options.load_points.end(), i) == options.load_points.end())
      continue;
    if (skip.count(i)) continue;
    const PointConfig& p = ex.points[static_cast<size_t>(i)];
    if (to_load.empty())
      to_load.push_back(&p);
    else if (to_load.front()->arms.drafter.head_sharding != model::HeadSharding::none &&
             p.arms.drafter.head_sharding == model::HeadSharding::none)
      to_load.front() = &p;
  }
  std::string loaded = "no point to run loads it";
  if (!to_load.empty()) {
    const std::vector<int> ranks =
        options.load_weights ? std::vector<int>{rt.rank()} : ranks_to_load(rt, ex.world);
    bool failed = false;
    for (const PointConfig* p : to_load) {
      for (int rank : ranks) {
        try {
          if (options.load_weights) {
            options.load_weights(*p);
          } else {
            const auto plan = model::make_shard_plan(p->model, rank, ex.world, p->arms.drafter.head_sharding);
            (void)model::load_mtp_weights(p->model, plan, path);
          }
        } catch (const Error& e) {
          if (is_news(r.problems, e.message()))
            r.problems.push_back(
                str(ranks.size() > 1 ? str("rank ", rank, "'s shard: ") : std::string(), e.message()));
          failed = true;
          break;
        }
      }
      if (failed) break;
    }
    loaded = failed ? "a shard does not load"
             : rt.world() > 1
                 ? "every rank's shard loads (names, shapes, finite values)"
                 : str("the shards of ", rank_range(ranks), " load (names, shapes, finite values)");
  }
  r.summary += str("; ", loaded);
}

}  // namespace

size_t CheckReport::problems() const {
  size_t n = 0;
  for (const auto& i : inputs) n += i.problems.size();
  return n;
}

size_t CheckReport::warnings() const {
  size_t n = 0;
  for (const auto& i : inputs) n += i.warnings.size();
  return n;
}

std::string CheckReport::text() const {
  std::string out;
  for (const auto& i : inputs) {
    const char* status = !i.problems.empty() ? "PROBLEM" : !i.warnings.empty() ? "warning" : "ok";
    out += str(status, std::string(9 - std::strlen(status), ' '), i.label, i.summary.empty() ? "" : ": ",
               i.summary, "\n");
    for (const auto& p : i.problems) out += str("           problem: ", p, "\n");
    for (const auto& w : i.warnings) out += str("           warning: ", w, "\n");
  }
  const size_t n = std::max(problems(), total_problems);
  const size_t w = warnings();
  if (n == 0)
    out += w == 0 ? "OK\n" : str("OK (", w, " warning(s))\n");
  else
    out += str(n, " problem(s)", w ? str(", ", w, " warning(s)") : std::string(), "\n");
  return out;
}

CheckReport experiment_failed(const std::string& file, const std::string& message) {
  CheckReport rep;
  rep.inputs.push_back(InputReport{str("experiment ", file), "does not load", {message}, {}});
  rep.total_problems = 1;
  return rep;
}

CheckpointScan scan_checkpoint(const model::ModelConfig& cfg, const std::string& path) {
  CheckpointScan out;
  const model::Checkpoint ckpt(path);
  struct Item {
    std::string name, file;
    model::TensorInfo info;
    const uint8_t* bytes = nullptr;
    uint64_t digest = 0;
    std::string problem;
  };
  std::vector<Item> items;
  std::map<std::string, std::unique_ptr<model::SafetensorsFile>> files;
  for (const auto& name : ckpt.names()) {
    if (!read_by(cfg, name)) continue;
    Item it;
    it.name = name;
    it.file = ckpt.file_of(name);
    auto& f = files[it.file];
    if (!f) f = std::make_unique<model::SafetensorsFile>(it.file);
    const model::TensorInfo* info = f->find(name);
    MTP_REQUIRE(info, it.file, ": tensor \"", name, "\" vanished between two openings");
    it.info = *info;
    it.bytes = f->bytes(*info);
    out.bytes += info->nbytes;
    items.push_back(std::move(it));
  }
  out.tensors = items.size();

  // Largest first over the threads; each tensor's digest and first bad element on its own.
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return items[a].info.nbytes > items[b].info.nbytes; });
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> scanned{0};
  std::atomic<size_t> finished{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) {
      Item& it = items[order[k]];
      const size_t esize = model::dtype_size(it.info.dtype);
      WordDigest d;
      bool found = false;
      constexpr size_t kBlock = size_t{1} << 20;  // a multiple of 8 and of every element size
      for (size_t off = 0; off < it.info.nbytes; off += kBlock) {
        const size_t n = std::min<size_t>(kBlock, it.info.nbytes - off);
        d.update(it.bytes + off, n);
        if (!found) {
          std::string what;
          const int64_t bad = first_nonfinite(it.info.dtype, it.bytes + off, n, what);
          if (bad >= 0) {
            const int64_t flat = static_cast<int64_t>(off / esize) + bad;
            it.problem =
                str("tensor \"", it.name, "\" in ", it.file, " (", model::dtype_name(it.info.dtype), " ",
                    model::shape_str(it.info.shape), "): element ", element_at(flat, it.info.shape),
                    " (flat index ", flat, ") is ", what, ", the first non-finite value");
            found = true;
          }
        }
        scanned.fetch_add(n);
      }
      if (!readable_weight_dtype(it.info.dtype))
        it.problem =
            str("tensor \"", it.name, "\" in ", it.file, ": dtype ", model::dtype_name(it.info.dtype),
                " cannot be read as a weight (BF16, F16, F32 or F8_E4M3)");
      it.digest = d.h;
      finished.fetch_add(1);
    }
  };
  const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t nt = std::min(hw, std::max<size_t>(1, items.size()));
  ScanProgress progress(str("checkpoint ", path), out.bytes);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < nt; ++t) threads.emplace_back(work);
  while (finished.load() < items.size()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    progress.update(scanned.load());
  }
  for (auto& th : threads) th.join();

  std::string lines;
  for (const Item& it : items) {  // name order (Checkpoint::names is sorted)
    lines += str(it.name, " ", model::dtype_name(it.info.dtype), " ", model::shape_str(it.info.shape), " ",
                 hex16(it.digest), "\n");
    if (!it.problem.empty()) out.problems.push_back(it.problem);
  }
  out.fingerprint = hex16(fnv1a64(lines));
  return out;
}

TraceScan scan_trace(const std::string& path) {
  TraceScan out;
  const io::TraceReader r(path);
  out.sequences = r.num_sequences();
  out.positions = r.total_positions();
  std::string lines =
      str("hidden ", r.hidden(), " vocab ", r.vocab(), " sequences ", r.num_sequences(), "\n");
  ScanProgress progress(str("trace ", path), static_cast<uint64_t>(r.total_positions()) *
                                                 static_cast<uint64_t>(r.hidden()) * sizeof(bf16));
  std::vector<bf16> buf;
  uint64_t done = 0;
  for (int64_t s = 0; s < r.num_sequences(); ++s) {
    const auto toks = r.tokens(s);
    buf.resize(static_cast<size_t>(r.sequence_length(s) * r.hidden()));
    try {
      r.read_hiddens(s, buf);  // checks every value finite
    } catch (const Error& e) {
      out.problem = e.message();
      break;
    }
    lines += str(s, " ", r.prompt_length(s), " ", r.sequence_length(s), " ",
                 hex16(digest_bytes(toks.data(), toks.size_bytes())), " ",
                 hex16(digest_bytes(buf.data(), buf.size() * sizeof(bf16))), "\n");
    done += buf.size() * sizeof(bf16);
    progress.update(done);
  }
  out.fingerprint = hex16(fnv1a64(lines));
  return out;
}

namespace {

// The checks of one experiment, in the order the report lists them. Every rank runs the same
// steps in the same order, so that the inputs' reports line up across ranks and the collectives
// (the done set, the gathers, the verdict) match.
struct Checker {
  dist::Runtime& rt;
  const Experiment& ex;
  const CheckOptions& options;
  const int rank;
  const dist::Group world;
  CheckReport rep;
  IdentityInputs identity;
  std::vector<std::string> local_digests;  ///< this rank's digest of each file input
  std::vector<size_t> digest_input;        ///< the input (index into rep.inputs) of each digest
  struct ToLoad {
    size_t input;
    std::string path;
    std::vector<int> users;
  };
  std::vector<ToLoad> to_load;  ///< the checkpoints that opened, to load after the output is known
  std::set<int> cannot_run;     ///< the points that cannot run on the backend (a problem already)

  Checker(dist::Runtime& r, const Experiment& e, const CheckOptions& o)
      : rt(r), ex(e), options(o), rank(r.rank()), world(r.world_group()) {}

  // The experiment, and what the expansion could not know: the resolved backend.
  void experiment() {
    rep.inputs.push_back(
        InputReport{str("experiment ", ex.file),
                    str(ex.points.size(), " point(s) for ", ex.world, " rank(s), backend ", options.backend),
                    {},
                    {}});
    if (rt.world() > 1 && rt.world() != ex.world)
      rep.inputs.back().problems.push_back(str("expanded for ", ex.world, " rank(s) but the job has ",
                                               rt.world(), "; leave out --ranks under a launcher"));

    {
      Grouped unrunnable;
      for (const auto& p : ex.points) {
        try {
          check_point_runnable(p, ex.world, options.backend);
        } catch (const Error& e) {
          unrunnable.add(str("cannot run on the ", options.backend, " backend: ", e.message()), p.index);
          cannot_run.insert(p.index);  // nothing of it is loaded
        }
      }
      unrunnable.into(rep.inputs.back().problems);
      if (options.backend == "cuda") {
        // Why a GPU cannot be used, told apart: no CUDA in this build, no driver or device, none
        // visible. Every rank that sees none says so (gathered to rank 0 with its rank and host).
        const int least = rt.min_visible_gpus();  // collective; the branch is the same on every rank
        const std::string why = dist::gpu_unusable_reason(rt.host());
        if (least == 0 && !why.empty()) rep.inputs.back().problems.push_back(str("backend cuda: ", why));
      }
    }
  }

  // The MTPLAB_* variables of every rank against each other (collective): a kernel or logging
  // variable set on some ranks only would make the ranks run different kernels, while the results
  // record rank 0's policy as the point's. Each differing variable is a problem naming the ranks.
  void environment() {
    if (rt.world() <= 1) return;
    std::vector<std::string> mine;
    for (char** e = environ; e && *e; ++e)
      if (std::strncmp(*e, "MTPLAB_", 7) == 0) mine.emplace_back(*e);
    std::sort(mine.begin(), mine.end());
    const auto all = rt.gather_strings(join(mine, std::string(1, '\n')));
    const auto hosts = rt.gather_strings(rt.host());
    if (rank != 0) return;
    std::map<std::string, std::map<int, std::string>> values;  // name -> rank -> value
    for (size_t r = 0; r < all.size(); ++r)
      for (const auto& entry : split(all[r], '\n')) {
        const auto eq = entry.find('=');
        if (eq != std::string::npos) values[entry.substr(0, eq)][static_cast<int>(r)] = entry.substr(eq + 1);
      }
    for (const auto& [name, by_rank] : values) {
      std::map<std::string, std::vector<int>> groups;  // value ("" : unset) -> ranks
      for (int r = 0; r < rt.world(); ++r) {
        const auto it = by_rank.find(r);
        groups[it == by_rank.end() ? std::string("\x01unset") : it->second].push_back(r);
      }
      if (groups.size() <= 1) continue;
      std::vector<std::string> parts;
      for (const auto& [value, ranks] : groups) {
        std::vector<std::string> where;
        for (int r : ranks) where.push_back(str(r, " (", hosts[static_cast<size_t>(r)], ")"));
        parts.push_back(str(value == "\x01unset" ? std::string("unset") : str("\"", value, "\""), " on rank",
                            ranks.size() == 1 ? " " : "s ", join(where, ", ")));
      }
      rep.inputs.front().problems.push_back(
          str(name, " is not the same on every rank: ", join(parts, "; "),
              ". Every rank must see the same MTPLAB_* variables (mpirun -x ", name,
              ", srun --export=ALL): set on some ranks only, a kernel variable would run other kernels there "
              "than the point records"));
    }
  }

  void models() {
    // Models (checked for the world size at expansion; listed so that the report says which).
    std::vector<std::pair<const model::ModelConfig*, std::vector<int>>> models;
    for (const auto& p : ex.points) {
      auto it =
          std::find_if(models.begin(), models.end(), [&](const auto& m) { return *m.first == p.model; });
      if (it == models.end()) {
        models.push_back({&p.model, {}});
        it = models.end() - 1;
      }
      it->second.push_back(p.index);
    }
    for (const auto& [m, users] : models) {
      const PointConfig& first = ex.points[static_cast<size_t>(users.front())];
      rep.inputs.push_back(
          InputReport{str("model ", m->name,
                          first.model_spec == m->name ? std::string() : str(" (", first.model_spec, ")")),
                      str("hidden ", m->hidden, ", vocab ", m->vocab, ", ", m->n_heads, " heads, ",
                          m->n_routed_experts, " experts, max_seq_len ", m->max_seq_len, "; valid for ",
                          ex.world, " rank(s) (", point_list(users), ")"),
                      {},
                      {}});
    }
  }

  // The identity inputs that are not files: the backend and the arms recorded as identity inputs
  // (the kernel choices that change bits, ops::kernel_policy_settings), each with its values over
  // the points.
  void backend_and_kernels() {
    identity.emplace_back("backend", options.backend);
    for (const ArmSpec& arm : arm_registry()) {
      if (!arm.record.identity_input) continue;
      std::vector<std::string> values;
      for (const auto& p : ex.points) {
        const std::string v = arm.get(p.arms);
        if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
      }
      identity.emplace_back(arm.name, join(values, ", "));
    }
  }

  void weights() {
    // Weights: synthetic ones by seed; checkpoints by (path, model), since the model names the
    // tensors read.
    {
      std::vector<std::pair<uint64_t, std::vector<int>>> seeds;
      std::vector<std::tuple<std::string, const model::ModelConfig*, std::vector<int>>> ckpts;
      for (const auto& p : ex.points) {
        if (p.weights.synthetic) {
          users_of(seeds, p.weights.seed).push_back(p.index);
        } else {
          auto it = std::find_if(ckpts.begin(), ckpts.end(), [&](const auto& c) {
            return std::get<0>(c) == p.weights.checkpoint && *std::get<1>(c) == p.model;
          });
          if (it == ckpts.end()) {
            ckpts.emplace_back(p.weights.checkpoint, &p.model, std::vector<int>{});
            it = ckpts.end() - 1;
          }
          std::get<2>(*it).push_back(p.index);
        }
      }
      std::vector<std::string> seed_texts;
      for (const auto& [seed, users] : seeds) {
        rep.inputs.push_back(InputReport{str("weights synthetic seed ", seed),
                                         str("generated from the seed (", point_list(users), ")"),
                                         {},
                                         {}});
        seed_texts.push_back(str("seed ", seed));
      }
      if (!seed_texts.empty()) identity.emplace_back("weights synthetic", join(seed_texts, "; "));
      for (const auto& [path, cfg, users] : ckpts) {
        const bool several = std::count_if(ckpts.begin(), ckpts.end(),
                                           [&](const auto& c) { return std::get<0>(c) == path; }) > 1;
        InputReport r;
        r.label = several ? str("checkpoint ", path, " [model ", cfg->name, "]") : str("checkpoint ", path);
        std::string digest;
        check_checkpoint(rt, path, *cfg, several, r, digest, identity);
        local_digests.push_back(digest);
        digest_input.push_back(rep.inputs.size());
        if (digest != "unreadable") to_load.push_back({rep.inputs.size(), path, users});
        rep.inputs.push_back(std::move(r));
      }
    }
  }

  void traces() {
    // Traces: synthetic ones by their generator settings, files by path.
    {
      std::vector<std::pair<std::string, std::vector<int>>> synthetic;
      std::vector<std::pair<std::string, std::vector<int>>> files;
      Grouped synthetic_problems, synthetic_warnings;
      for (const auto& p : ex.points) {
        if (p.trace.synthetic) {
          const std::string d = describe_trace_spec(p.trace, p.weights.seed);
          users_of(synthetic, d).push_back(p.index);
          const int read =
              p.measure.sequences > 0 ? std::min(p.measure.sequences, p.trace.sequences) : p.trace.sequences;
          if (const std::string w = batch_above_sequences(p, read); !w.empty())
            synthetic_warnings.add(w, p.index);
          if (p.measure.sequences > p.trace.sequences)
            synthetic_problems.add(
                str("measure.sequences ", p.measure.sequences, " exceeds trace.synthetic.sequences ",
                    p.trace.sequences, ": the points would replay ", p.trace.sequences, " and record ",
                    p.measure.sequences),
                p.index);
        } else {
          users_of(files, p.trace.path).push_back(p.index);
        }
      }
      std::vector<std::string> synthetic_texts;
      for (const auto& [d, users] : synthetic) {
        bool all_online = true;
        for (int i : users)
          all_online = all_online && ex.points[static_cast<size_t>(i)].mode == RunMode::online;
        InputReport r{str("trace synthetic (", d, ")"),
                      all_online ? str("its prompts only, for online points (", point_list(users), ")")
                                 : str("generated by the synthetic target (", point_list(users), ")"),
                      {},
                      {}};
        for (const auto& m : synthetic_problems.order) {
          std::vector<int> mine;
          for (int i : synthetic_problems.points.at(m))
            if (std::find(users.begin(), users.end(), i) != users.end()) mine.push_back(i);
          if (!mine.empty()) r.problems.push_back(str(m, " (", point_list(mine), ")"));
        }
        for (const auto& m : synthetic_warnings.order) {
          std::vector<int> mine;
          for (int i : synthetic_warnings.points.at(m))
            if (std::find(users.begin(), users.end(), i) != users.end()) mine.push_back(i);
          if (!mine.empty()) r.warnings.push_back(str(m, " (", point_list(mine), ")"));
        }
        rep.inputs.push_back(std::move(r));
        synthetic_texts.push_back(d);
      }
      if (!synthetic_texts.empty()) identity.emplace_back("trace synthetic", join(synthetic_texts, "; "));
      for (const auto& [path, users] : files) {
        InputReport r;
        r.label = str("trace ", path);
        std::string digest;
        check_trace_file(path, users, ex, rank, r, digest, identity);
        if (!r.summary.empty()) r.summary += str(" (", point_list(users), ")");
        local_digests.push_back(digest);
        digest_input.push_back(rep.inputs.size());
        rep.inputs.push_back(std::move(r));
      }
    }
  }

  void output() {
    // The output and its resume state (rank 0 writes it).
    if (rank == 0) {
      InputReport r;
      r.label = str("output ", options.output.empty() ? std::string("(none)") : options.output);
      if (options.output.empty()) {
        r.problems.push_back(str(ex.file, ": no output: key and no --out"));
      } else {
        namespace fs = std::filesystem;
        const auto stale = stale_temporaries(options.output);
        if (!stale.empty())
          r.warnings.push_back(str(stale.size(), " temporary file(s) of a killed writer (", join(stale, ", "),
                                   "): the next run into this output removes them"));
        rep.resume = inspect_results_file(options.output, ex, rep.identity);
        // Another run writing this output holds its claim (io::OutputLock): a run now is refused.
        const std::string holder = io::output_lock_holder(options.output);
        if (!holder.empty()) r.problems.push_back(io::another_writer_message(options.output, holder));
        r.problems.insert(r.problems.end(), rep.resume.problems.begin(), rep.resume.problems.end());
        if (rep.resume.exists) {
          if (rep.resume.problems.empty()) {
            r.summary = str("exists, same configuration and inputs: ", rep.resume.done.size(), " of ",
                            ex.points.size(), " point(s) done, a run adds the other ",
                            ex.points.size() - rep.resume.done.size());
            // A point is added by writing FILE.tmp.<pid> beside the file and renaming it onto it:
            // the directory must be writable, or the run fails after computing its first point.
            fs::path dir = fs::path(options.output).parent_path();
            if (dir.empty()) dir = ".";
            if (::access(dir.c_str(), W_OK | X_OK) != 0)
              r.problems.push_back(str("directory ", dir.string(), " is not writable (", std::strerror(errno),
                                       "), so no point can be added to ", options.output,
                                       " (a point is written to a temporary file beside it, then renamed)"));
          } else {
            r.summary =
                str("exists, ", rep.resume.points_in_file, " point(s) in it; cannot take this run's points");
          }
        } else {
          // The nearest existing directory above the file must let us create it (and the
          // directories between).
          fs::path dir = fs::path(options.output).parent_path();
          std::vector<std::string> to_create;
          std::error_code ec;
          while (!dir.empty() && !fs::exists(dir, ec)) {
            to_create.push_back(dir.filename().string());
            dir = dir.parent_path();
          }
          if (dir.empty()) dir = ".";
          if (!fs::is_directory(dir, ec))
            r.problems.push_back(
                str(dir.string(), " is not a directory, so ", options.output, " cannot be created"));
          else if (::access(dir.c_str(), W_OK | X_OK) != 0)
            r.problems.push_back(str("directory ", dir.string(), " is not writable (", std::strerror(errno),
                                     "), so ", options.output, " cannot be created"));
          else
            r.summary = to_create.empty() ? str("new file in ", dir.string(), " (writable)")
                                          : str("new file; ", to_create.size(), " director",
                                                to_create.size() == 1 ? "y" : "ies", " to create under ",
                                                dir.string(), " (writable)");
        }
      }
      rep.inputs.push_back(std::move(r));
    }
  }

  void loads() {
    // The points already in the output need no load (rank 0 read the file; every rank learns it).
    {
      std::vector<int32_t> done(rep.resume.done.begin(), rep.resume.done.end());
      dist::broadcast(world, done);
      // Not loaded: the points already in the output (the run skips them) and those that cannot run.
      std::set<int> skip = cannot_run;
      if (options.skip_done) skip.insert(done.begin(), done.end());
      for (const ToLoad& l : to_load) {
        load_checkpoint_shards(rt, ex, options, l.path, l.users, skip, rep.inputs[l.input]);
        rep.inputs[l.input].summary += str(" (", point_list(l.users), ")");
      }
    }
  }

  void gather() {
    // Every rank's findings to rank 0: its problems per input, and its copies' digests, which must
    // equal rank 0's.
    if (rt.world() > 1) {
      constexpr char kSep = '\x1f', kLine = '\x1e';
      std::vector<std::string> lines;
      for (size_t i = 0; i < rep.inputs.size(); ++i)
        for (const auto& p : rep.inputs[i].problems) lines.push_back(str("P", i, kSep, p));
      for (size_t d = 0; d < local_digests.size(); ++d) lines.push_back(str("D", d, kSep, local_digests[d]));
      const auto all = rt.gather_strings(join(lines, std::string(1, kLine)));
      const auto hosts = rt.gather_strings(rt.host());
      if (rank == 0) {
        for (size_t r = 1; r < all.size(); ++r) {
          if (all[r].empty()) continue;
          for (const auto& line : split(all[r], kLine)) {
            const auto sep = line.find(kSep);
            if (sep == std::string::npos || sep < 2) continue;
            const size_t idx = std::stoul(line.substr(1, sep - 1));
            const std::string text = line.substr(sep + 1);
            if (line[0] == 'P' && idx < rep.inputs.size()) {
              auto& probs = rep.inputs[idx].problems;
              if (is_news(probs, text)) probs.push_back(str("rank ", r, " (", hosts[r], "): ", text));
            } else if (line[0] == 'D' && idx < local_digests.size() && text != local_digests[idx] &&
                       text != "unreadable" && local_digests[idx] != "unreadable") {
              rep.inputs[digest_input[idx]].problems.push_back(
                  str("rank ", r, " (", hosts[r],
                      ") opens a different file there (its names, shapes, tokens or "
                      "offsets differ from rank 0's copy): every rank must read the same input"));
            }
          }
        }
      }
    }
  }

  // The verdict, on every rank.
  CheckReport verdict() {
    int64_t total = static_cast<int64_t>(rep.problems());
    dist::broadcast(world, total);
    rep.total_problems = static_cast<size_t>(total);
    return std::move(rep);
  }
};

}  // namespace

CheckReport check_inputs(dist::Runtime& rt, const Experiment& ex, const CheckOptions& options) {
  Checker c(rt, ex, options);
  c.experiment();
  c.environment();
  c.models();
  c.backend_and_kernels();
  c.weights();
  c.traces();
  std::sort(c.identity.begin(), c.identity.end());
  c.rep.identity = c.identity;
  c.output();  // needs the identity (rank 0)
  c.loads();   // after the output: points already in it load nothing
  c.gather();
  return c.verdict();
}

}  // namespace mtplab::harness
