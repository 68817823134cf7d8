// mtplab_bench_kernels: event-timed benchmarks of the CUDA backend's memory-bound ops at the
// glm5.3-flash shapes, against the measured device-to-device copy bandwidth (the ceiling).
//
//   mtplab_bench_kernels [--out DIR] [--reps N] [--warmup N] [--only SUBSTRING[,SUBSTRING..]]
//                        [--device D] [--graph-launches R]
//
// --only runs the cases whose name contains any of the comma-separated substrings (the copy ceiling
// always runs; an --only that names no case is an error). The backend runs
// the default kernel policy with the MTPLAB_* overrides of the environment applied
// (ops::env_overrides, docs/kernels.md), e.g. MTPLAB_GEMV_VARIANT=rows4; the policy and what the
// environment set are printed first, and the policy and the GEMV variant are in the CSV's first line.
// The mla_decode cases run each kernel, named in the row, through the policy. (The comparison
// kernels no rule picks are timed by the playgrounds of dev/cuda, docs/kernels.md.)
// Method: inputs are random (never zeros); each case rotates over enough copies of its
// inputs (>= 512 MB in all) that L2 (60 MB) cannot hold them between calls; a spin kernel is
// queued ahead of each batch of measurements so the host has enqueued the whole batch before the
// GPU reaches it (no launch gaps inside a measurement). Each op is timed in two modes, N samples
// each, after a warm-up:
// - single: one call between two CUDA events. What the op costs on its own, launch included:
//   for small kernels this carries a fixed event / launch cost of several microseconds (the
//   figures kept for continuity with the earlier tables).
// - graph (R > 0, default 20): R consecutive calls, call i on input copy i mod copies as in the
//   single mode, recorded into one CUDA graph (Backend::begin_capture / end_capture); one replay
//   between two events, per-call time = elapsed / R (1/R of the graph's own start cost included,
//   as in a step's graph). What the op costs inside the draft step, which replays its kernels
//   back to back in a graph; the figure to hold against the copy bandwidth. Graphs cover the
//   rotation (as many as it takes for the i-th launch to use copy i mod copies across replays);
//   an op that cannot be captured (it synchronises with the host or allocates) reads "n/a" with
//   the reason. The copy_d2d ceiling is single large copies and has no graph figure.
//   --graph-launches 0 turns the mode off.
// Bytes are the fewest the op must move (each input read once, each output written once);
// bandwidth = bytes / median time, in each mode. Prints a table with both modes side by side and
// writes DIR/bench_kernels.csv (one row per case, single then graph columns) and
// DIR/bench_kernels_samples.csv (every sample, with its mode).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "bench_main.hpp"
#include "core/build_info.hpp"
#include "core/cli.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/stats.hpp"
#include "core/str.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/kernel_policy.hpp"
#include "ops/one_row.hpp"
#include "ops/ops.hpp"

namespace {

using mtplab::bf16;
using mtplab::fp8e4m3;
namespace ops = mtplab::ops;

/// The backend's kernel policy with `edit` applied for one scope; the one before is restored at its
/// end (cases that time one kernel of a choice: the policy is set before their graphs are recorded).
class PolicyScope {
 public:
  template <typename Edit>
  PolicyScope(ops::Backend& be, Edit&& edit) : be_(be), previous_(be.kernel_policy()) {
    ops::KernelPolicy p = previous_;
    edit(p);
    be_.set_kernel_policy(p);
  }
  ~PolicyScope() {
    try {
      be_.set_kernel_policy(previous_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "restoring the kernel policy: %s\n", e.what());
    }
  }
  PolicyScope(const PolicyScope&) = delete;
  PolicyScope& operator=(const PolicyScope&) = delete;

 private:
  ops::Backend& be_;
  ops::KernelPolicy previous_;
};

// ---- device-side fills and the spin kernel --------------------------------------------------------

// core's splitmix64 finaliser (constexpr, so device code calls it too).
__device__ uint64_t mix(uint64_t z) { return mtplab::splitmix64_mix(z); }

/// Uniform [lo, hi) BF16 from a counter-based hash: any size, no host traffic.
__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(mix(seed * mtplab::kSplitmix64Gamma + i) >> 40) * (1.0f / 16777216.0f);
    p[i] = static_cast<uint16_t>(__float_as_uint(lo + (hi - lo) * u) >> 16);
  }
}
__global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(mix(seed * mtplab::kSplitmix64Gamma + i) >> 40) * (1.0f / 16777216.0f);
    p[i] = lo + (hi - lo) * u;
  }
}
/// Random finite E4M3 codes.
__global__ void fill_fp8_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint8_t c = static_cast<uint8_t>(mix(seed * mtplab::kSplitmix64Gamma + i));
    if ((c & 0x7f) == 0x7f) c ^= 1;
    p[i] = c;
  }
}
/// Reads every 16-byte word once (the read-only ceiling); the sum is kept so nothing is elided.
__global__ void read_sum_kernel(const uint4* p, size_t n, unsigned int* sink) {
  unsigned int acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}
/// A streaming read of n 16-byte vectors with 4 loads in flight per thread: what the GEMVs' weight
/// reads could reach at the same size (the reference rows next to them).
__global__ void read_ref_kernel(const uint4* p, size_t n, unsigned int* sink) {
  constexpr int kU = 4;
  unsigned int acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride * kU) {
    uint4 v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      v[u] = i + u * stride < n ? __ldcs(p + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kU; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) *sink = acc;
}
__global__ void spin_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// ---- harness --------------------------------------------------------------------------------------

struct Options {
  std::string out = "bench-out";
  int reps = 200;
  int warmup = 10;
  std::string only;
  int device = 0;
  int graph_launches = 20;  // R: launches per captured graph in the graph mode; 0 turns the mode off
};

/// The samples of one mode (microseconds per launch of the op) and their summary.
struct Stats {
  std::vector<double> us;
  double median = 0, p10 = 0, p90 = 0, min = 0;

  void summarise() {
    if (us.empty()) return;  // a mode without samples keeps its zeros
    std::vector<double> sorted = us;
    std::sort(sorted.begin(), sorted.end());
    median = mtplab::quantile_sorted(sorted, 0.5);
    p10 = mtplab::quantile_sorted(sorted, 0.1);
    p90 = mtplab::quantile_sorted(sorted, 0.9);
    min = sorted.front();
  }
};

struct Result {
  std::string name, shape;
  double bytes = 0;
  Stats single;          // one launch between two events
  Stats graph;           // one replay of a graph of R launches between two events, / R (empty: no figure)
  std::string graph_na;  // why the graph mode has no figure for this case ("" when it has one or is off)
  bool has_graph() const { return !graph.us.empty(); }
};

double gbps_of(double bytes, double us) { return us > 0 ? bytes / (us * 1e-6) / 1e9 : 0; }

class Bench {
 public:
  Bench(const Options& opt, ops::Backend& be) : opt_(opt), be_(be) {
    stream_ = static_cast<cudaStream_t>(be.native_stream());
    cudaDeviceProp prop{};
    MTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, opt.device));
    l2_bytes_ = prop.l2CacheSize;
  }

  cudaStream_t stream() const { return stream_; }
  uint64_t next_seed() { return ++seed_; }

  void* alloc(size_t bytes) {
    void* p = be_.allocate(bytes);
    owned_.push_back(p);
    return p;
  }
  void release_all() {
    be_.synchronize();
    for (void* p : owned_) be_.release(p);
    owned_.clear();
  }
  bf16* rand_bf16(size_t n, float lo = -1.0f, float hi = 1.0f) {
    auto* p = static_cast<bf16*>(alloc(n * sizeof(bf16)));
    fill_bf16_kernel<<<1024, 256, 0, stream_>>>(reinterpret_cast<uint16_t*>(p), n, next_seed(), lo, hi);
    MTP_CUDA_LAUNCH_CHECK();
    return p;
  }
  float* rand_f32(size_t n, float lo = -1.0f, float hi = 1.0f) {
    auto* p = static_cast<float*>(alloc(n * sizeof(float)));
    fill_f32_kernel<<<1024, 256, 0, stream_>>>(p, n, next_seed(), lo, hi);
    MTP_CUDA_LAUNCH_CHECK();
    return p;
  }
  fp8e4m3* rand_fp8(size_t n) {
    auto* p = static_cast<fp8e4m3*>(alloc(n));
    fill_fp8_kernel<<<1024, 256, 0, stream_>>>(reinterpret_cast<uint8_t*>(p), n, next_seed());
    MTP_CUDA_LAUNCH_CHECK();
    return p;
  }
  template <typename T>
  T* upload(const std::vector<T>& host) {
    auto* p = static_cast<T*>(alloc(host.size() * sizeof(T)));
    be_.upload(p, host.data(), host.size() * sizeof(T));
    return p;
  }
  /// Copies of a `set_bytes` input set so that all of them together are >= 512 MB and >= 8x L2.
  int rotations(double set_bytes, int cap = 64) const {
    const double want = std::max(512.0 * (1 << 20), 8.0 * l2_bytes_);
    return std::max(2, std::min(cap, static_cast<int>(std::ceil(want / std::max(set_bytes, 1.0)))));
  }

  /// Whether --only (comma-separated substrings) names this case; every case without --only.
  bool selected(const std::string& name) const {
    return any_part([&](const std::string& part) { return name.find(part) != std::string::npos; });
  }
  /// Whether --only may name a case of the group whose case names all start with `prefix`: a part
  /// inside the prefix (every case of the group), or one that starts with it (e.g. "batch
  /// moe_experts_grouped B=128 ring" for the group "batch moe_experts_grouped"). Guards a group's
  /// inputs; measure() then runs only the selected cases.
  bool group_selected(const std::string& prefix) const {
    return any_part([&](const std::string& part) {
      return prefix.find(part) != std::string::npos || part.rfind(prefix, 0) == 0;
    });
  }

  /// Times `call(i)` (i = launch index, for rotation) in both modes, opt_.reps samples each.
  /// `period`: call(i) depends on i only through i % period (the number of input copies it rotates
  /// over; 1 when it has none). `no_graph`: why this case has no graph figure (null: it has one).
  void measure(const std::string& name, const std::string& shape, double bytes, int period,
               const std::function<void(int)>& call, const char* no_graph = nullptr) {
    if (!selected(name)) return;  // a case of a selected group that --only does not name
    ++cases_run_;
    measure_always(name, shape, bytes, period, call, no_graph);
  }
  /// Cases measure() ran (the ceiling, which always runs, not counted).
  int cases_run() const { return cases_run_; }
  /// measure() whatever --only says (the copy ceiling every percentage is taken against).
  void measure_always(const std::string& name, const std::string& shape, double bytes, int period,
                      const std::function<void(int)>& call, const char* no_graph = nullptr) {
    MTP_REQUIRE(period >= 1, "bench_kernels: ", name, ": rotation period ", period);
    Result r;
    r.name = name;
    r.shape = shape;
    r.bytes = bytes;
    // Single launches: call(0 .. warmup-1), then call(rep) between two events.
    for (int i = 0; i < opt_.warmup; ++i) call(i);
    MTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    timed_batches([&](int rep) { call(rep); }, 1, r.single);
    if (opt_.graph_launches > 0) {
      if (no_graph) {
        r.graph_na = no_graph;
      } else {
        measure_graph(period, call, r);
      }
    }
    results_.push_back(std::move(r));
    print_row(results_.back());
  }

  void set_ceiling(double gbps) { copy_gbps_ = gbps; }
  double ceiling() const { return copy_gbps_; }
  int graph_launches() const { return opt_.graph_launches; }
  const std::vector<Result>& results() const { return results_; }

  void print_header() const {
    if (opt_.graph_launches > 0) {
      std::printf(
          "single: one launch between two events; graph: a CUDA graph of %d consecutive launches "
          "replayed between two events, per launch = replay / %d\n",
          opt_.graph_launches, opt_.graph_launches);
    } else {
      std::printf("single: one launch between two events; graph mode off (--graph-launches 0)\n");
    }
    std::printf("%-34s %-26s %10s %9s %9s %9s %9s %9s %9s %11s %10s %12s %11s\n", "op", "shape", "MB",
                "single_us", "s_p10", "s_p90", "graph_us", "g_p10", "g_p90", "GB/s_single", "GB/s_graph",
                "%copy_single", "%copy_graph");
  }
  void print_row(const Result& r) const {
    const double gs = gbps_of(r.bytes, r.single.median);
    const double gg = r.has_graph() ? gbps_of(r.bytes, r.graph.median) : 0;
    const char* none = opt_.graph_launches > 0 ? "n/a" : "-";
    auto num = [&](bool have, const char* fmt, double v) {
      char buf[32];
      if (have) {
        std::snprintf(buf, sizeof buf, fmt, v);
      } else {
        std::snprintf(buf, sizeof buf, "%s", none);
      }
      return std::string(buf);
    };
    const bool g = r.has_graph();
    std::printf("%-34s %-26s %10.2f %9.2f %9.2f %9.2f %9s %9s %9s %11.0f %10s %11.1f%% %11s", r.name.c_str(),
                r.shape.c_str(), r.bytes / 1e6, r.single.median, r.single.p10, r.single.p90,
                num(g, "%.2f", r.graph.median).c_str(), num(g, "%.2f", r.graph.p10).c_str(),
                num(g, "%.2f", r.graph.p90).c_str(), gs, num(g, "%.0f", gg).c_str(),
                copy_gbps_ > 0 ? 100.0 * gs / copy_gbps_ : 0.0,
                num(g, "%.1f%%", copy_gbps_ > 0 ? 100.0 * gg / copy_gbps_ : 0.0).c_str());
    if (!r.graph_na.empty()) std::printf("  graph n/a: %s", r.graph_na.c_str());
    std::printf("\n");
    std::fflush(stdout);
  }

 private:
  /// opt_.reps samples of `one(rep)` between two events, in batches of 50 behind a spin kernel
  /// (5 ms: the host queues the whole batch meanwhile, so there is no launch gap inside a
  /// measurement); each sample is the elapsed time / `per`, in microseconds.
  void timed_batches(const std::function<void(int)>& one, int per, Stats& s) {
    constexpr int kBatch = 50;
    std::vector<cudaEvent_t> ev(2 * kBatch);
    for (auto& e : ev) MTP_CUDA_CHECK(cudaEventCreate(&e));
    for (int done = 0; done < opt_.reps;) {
      const int n = std::min(kBatch, opt_.reps - done);
      spin_kernel<<<1, 1, 0, stream_>>>(5'000'000);
      MTP_CUDA_LAUNCH_CHECK();
      for (int i = 0; i < n; ++i) {
        MTP_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream_));
        one(done + i);
        MTP_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream_));
      }
      MTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (int i = 0; i < n; ++i) {
        float ms = 0;
        MTP_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        s.us.push_back(ms * 1e3 / per);
      }
      done += n;
    }
    for (auto& e : ev) cudaEventDestroy(e);
    s.summarise();
  }

  /// The graph mode. Graph g records the launches call(g*R) .. call(g*R + R-1); G graphs with G*R
  /// a multiple of `period`, replayed 0, 1, .., G-1, 0, .., so the launches go through the input
  /// copies in the same order as the single launches do and no copy is reused sooner. A case whose
  /// capture fails (an op that synchronises with the host or allocates) gets graph_na, not an
  /// error; a failure while replaying is an error, as in the single mode.
  void measure_graph(int period, const std::function<void(int)>& call, Result& r) {
    const int R = opt_.graph_launches;
    const int G = period / std::gcd(period, R);
    std::vector<std::unique_ptr<ops::Graph>> graphs;
    MTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    try {
      for (int g = 0; g < G; ++g) {
        be_.begin_capture();
        try {
          for (int j = 0; j < R; ++j) call(g * R + j);
        } catch (...) {
          try {
            (void)be_.end_capture();  // closes the (invalidated) capture so the stream is usable again
          } catch (...) {
          }
          throw;
        }
        graphs.push_back(be_.end_capture());
      }
    } catch (const mtplab::Error& e) {
      r.graph_na = "not capturable: " + e.message();
    } catch (const std::exception& e) {
      r.graph_na = std::string("not capturable: ") + e.what();
    }
    if (!r.graph_na.empty()) {
      cudaGetLastError();  // the capture's error is not sticky: clear it, then check the stream
      MTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    int next = 0;
    auto replay = [&](int) { graphs[static_cast<size_t>(next++ % G)]->launch(); };
    for (int g = 0; g < G; ++g) replay(0);  // the first launch of an executable also uploads it
    for (int i = 0; i < opt_.warmup; ++i) replay(0);
    MTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    timed_batches(replay, R, r.graph);
    graphs.clear();
  }

  const Options& opt_;
  ops::Backend& be_;
  cudaStream_t stream_ = nullptr;
  double l2_bytes_ = 60e6;
  uint64_t seed_ = 0x5eed;
  std::vector<void*> owned_;
  std::vector<Result> results_;
  int cases_run_ = 0;
  /// Whether `match` holds for a non-empty part of --only (true without --only).
  template <typename Match>
  bool any_part(Match&& match) const {
    if (opt_.only.empty()) return true;
    for (size_t start = 0; start <= opt_.only.size();) {
      const size_t end = std::min(opt_.only.find(',', start), opt_.only.size());
      const std::string part = opt_.only.substr(start, end - start);
      if (!part.empty() && match(part)) return true;
      start = end + 1;
    }
    return false;
  }
  double copy_gbps_ = 0;
};

std::string dims(std::initializer_list<long long> d) {
  std::string s = "[";
  for (auto it = d.begin(); it != d.end(); ++it) s += (it == d.begin() ? "" : ", ") + std::to_string(*it);
  return s + "]";
}

struct RowsModeName {
  ops::RowsMode mode;
  const char* name;
};

// glm5.3-flash (docs/model.md).
constexpr int kH = 4096, kV = 154880, kHeads = 64, kHeadDim = 256, kQLora = 1536, kKvLora = 512;
constexpr int kIndexHeads = 32, kIndexDim = 128, kTopK = 2048, kPool = 4, kExperts = 288, kExpertTopK = 8,
              kInter = 2048;

void run_all(Bench& b, ops::Backend& be) {
  ops::OneRow one(be);  // the single-row cases: one row through the ragged entries
  cudaStream_t st = b.stream();
  // ---- ceilings ----
  {
    const size_t bytes = size_t{1} << 30;
    void* src = b.alloc(bytes);
    void* dst = b.alloc(bytes);
    MTP_CUDA_CHECK(cudaMemsetAsync(src, 0x5a, bytes, st));
    b.measure_always(
        "copy_d2d (ceiling)", "2 x 1 GiB", 2.0 * bytes, 1,
        [&](int) { MTP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st)); },
        "the ceiling is single large copies");
    const Result& r = b.results().back();
    b.set_ceiling(gbps_of(r.bytes, r.single.median));
    auto* sink = static_cast<unsigned int*>(b.alloc(4));
    if (b.group_selected("read_only")) {
      b.measure("read_only (reference)", "1 GiB", static_cast<double>(bytes), 1, [&](int) {
        read_sum_kernel<<<4 * 132 * 8, 256, 0, st>>>(static_cast<const uint4*>(src), bytes / 16, sink);
        MTP_CUDA_LAUNCH_CHECK();
      });
    }
    b.release_all();
  }
  // ---- what a pure read reaches at the GEMVs' sizes (the mid-size ceiling: ramp and tail) ----
  {
    struct Ref {
      const char* what;
      double mb;
    };
    const Ref refs[] = {{"eh_proj", 67.1},   {"q_b", 50.3}, {"kv_b", 33.6},
                        {"mla_out_v", 16.8}, {"q_a", 12.6}, {"kv_a", 4.2}};
    for (const Ref& ref : refs) {
      const std::string name = std::string("read_only at ") + ref.what + " size";
      if (!b.selected(name)) continue;
      const size_t vecs = static_cast<size_t>(ref.mb * 1e6) / 16;
      const int rot = b.rotations(16.0 * vecs);
      std::vector<const uint4*> src(rot);
      for (auto& s : src) {
        void* p = b.alloc(vecs * 16);
        MTP_CUDA_CHECK(cudaMemsetAsync(p, 0x5a, vecs * 16, st));
        s = static_cast<const uint4*>(p);
      }
      auto* sink = static_cast<unsigned int*>(b.alloc(4));
      const unsigned grid = static_cast<unsigned>(std::min<size_t>((vecs + 1023) / 1024, 132 * 8));
      b.measure(name, mtplab::str(ref.mb, " MB"), 16.0 * vecs, rot, [&](int i) {
        read_ref_kernel<<<grid, 256, 0, st>>>(src[i % rot], vecs, sink);
        MTP_CUDA_LAUNCH_CHECK();
      });
      b.release_all();
    }
  }

  // ---- GEMVs (linear, one row) ----
  struct Lin {
    const char* name;
    int n, k;
  };
  const Lin lins[] = {{"linear eh_proj", kH, 2 * kH},
                      {"linear q_a", kQLora, kH},
                      {"linear q_b", kHeads * kHeadDim, kQLora},
                      {"linear kv_a", kKvLora, kH},
                      {"linear kv_b", kHeads * 2 * kHeadDim, kKvLora},
                      {"linear o_proj", kH, kHeads * kHeadDim},
                      {"linear indexer.wq_b", kIndexHeads * kIndexDim, kQLora},
                      {"linear_f32 router", kExperts, kH}};
  for (const Lin& l : lins) {
    if (!b.selected(l.name)) continue;
    const double wbytes = 2.0 * l.n * l.k;
    const int rot = b.rotations(wbytes);
    std::vector<bf16*> W(rot);
    for (auto& w : W) w = b.rand_bf16(static_cast<size_t>(l.n) * l.k);
    bf16* x = b.rand_bf16(l.k);
    const bool f32 = std::string(l.name).find("f32") != std::string::npos;
    void* y = b.alloc(static_cast<size_t>(l.n) * 4);
    b.measure(l.name, dims({l.n, l.k}), wbytes + 2.0 * l.k + (f32 ? 4.0 : 2.0) * l.n, rot, [&](int i) {
      if (f32) {
        be.linear_f32(W[i % rot], x, static_cast<float*>(y), 1, l.n, l.k);
      } else {
        be.linear(W[i % rot], x, static_cast<bf16*>(y), 1, l.n, l.k);
      }
    });
    b.release_all();
  }

  // The batch_qidx arm: 4 rows through per-row GEMVs vs one cuBLASLt GEMM.
  for (RowsModeName m :
       {RowsModeName{ops::RowsMode::per_row, "per_row"}, RowsModeName{ops::RowsMode::batched, "batched"}}) {
    const std::string name = std::string("linear q_b rows=4 ") + m.name;
    if (!b.selected(name)) continue;
    const int n = kHeads * kHeadDim, k = kQLora, rows = 4;
    const double wbytes = 2.0 * n * k;
    const int rot = b.rotations(wbytes);
    std::vector<bf16*> W(rot);
    for (auto& w : W) w = b.rand_bf16(static_cast<size_t>(n) * k);
    bf16* x = b.rand_bf16(static_cast<size_t>(rows) * k);
    bf16* y = static_cast<bf16*>(b.alloc(static_cast<size_t>(rows) * n * 2));
    b.measure(name, dims({rows, n, k}), wbytes + 2.0 * rows * (k + n), rot,
              [&](int i) { be.linear(W[i % rot], x, y, rows, n, k, m.mode); });
    b.release_all();
  }

  // The fused ops of the draft step (--only fused): each next to the separate ops it replaces, so
  // the difference is the launches saved (the outputs are bit-identical, tests/ops/test_gpu_fused).
  {
    const int ns[] = {kQLora, kKvLora, kIndexDim, kIndexDim, kIndexHeads};
    const bool f32s[] = {false, false, false, true, true};
    const float w_scale = 1.0f / std::sqrt(static_cast<float>(kIndexHeads));
    double wbytes = 0, ybytes = 0;
    int n_total = 0;
    for (int j = 0; j < 5; ++j) {
      wbytes += 2.0 * ns[j] * kH;
      ybytes += (f32s[j] ? 4.0 : 2.0) * ns[j];
      n_total += ns[j];
    }
    const std::string shape = dims({n_total, kH}) + " in 5";
    const std::string sep = "fused u_proj: 5 linears + scale", grp = "fused u_proj: linear_group";
    if (b.selected(sep) || b.selected(grp)) {
      const int rot = b.rotations(wbytes);
      std::vector<std::array<bf16*, 5>> W(rot);
      for (auto& set : W)
        for (int j = 0; j < 5; ++j) set[j] = b.rand_bf16(static_cast<size_t>(ns[j]) * kH);
      bf16* x = b.rand_bf16(kH);
      std::array<void*, 5> y;
      for (int j = 0; j < 5; ++j) y[j] = b.alloc(static_cast<size_t>(ns[j]) * 4);
      if (b.selected(sep)) {
        b.measure(sep, shape, wbytes + 2.0 * kH + ybytes, rot, [&](int i) {
          const auto& w = W[i % rot];
          for (int j = 0; j < 5; ++j) {
            if (f32s[j]) {
              be.linear_f32(w[j], x, static_cast<float*>(y[j]), 1, ns[j], kH);
            } else {
              be.linear(w[j], x, static_cast<bf16*>(y[j]), 1, ns[j], kH);
            }
          }
          be.scale_f32(static_cast<float*>(y[4]), w_scale, kIndexHeads);
        });
      }
      if (b.selected(grp)) {
        b.measure(grp, shape, wbytes + 2.0 * kH + ybytes, rot, [&](int i) {
          const auto& w = W[i % rot];
          ops::LinearOut outs[5];
          for (int j = 0; j < 5; ++j) outs[j] = {w[j], y[j], ns[j], f32s[j], j == 4 ? w_scale : 1.0f};
          one.linear_group(outs, x, kH);
        });
      }
      b.release_all();
    }
    const std::string rsep = "fused residual_add + rmsnorm", rgrp = "fused residual_add_rmsnorm";
    if (b.selected(rsep) || b.selected(rgrp)) {
      bf16* x = b.rand_bf16(kH);
      float* delta = b.rand_f32(kH);
      bf16* w = b.rand_bf16(kH);
      bf16* y = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(kH)));
      bf16* nrm = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(kH)));
      const double bytes = 2.0 * kH + 4.0 * kH + 2.0 * kH + 2.0 * kH + 2.0 * kH;  // x, delta, w, y, normed
      if (b.selected(rsep)) {
        b.measure(rsep, dims({kH}), bytes, 1, [&](int) {
          be.residual_add(x, delta, y, kH);
          be.rmsnorm(y, w, nrm, 1, kH, 1e-5f);
        });
      }
      if (b.selected(rgrp)) {
        b.measure(rgrp, dims({kH}), bytes, 1,
                  [&](int) { one.residual_add_rmsnorm(x, delta, y, w, nrm, kH, 1e-5f); });
      }
      b.release_all();
    }
    // The cache writes of a row: at position 4095 of a 4096-row cache, which completes pool 1023
    // (the indexer store computes its key); BF16 latent cache.
    const std::string ksep = "fused rmsnorm + kv_write", kgrp = "fused kv_norm_write";
    const std::string isep = "fused layernorm + indexer_store", igrp = "fused indexer_norm_store";
    if (b.selected(ksep) || b.selected(kgrp) || b.selected(isep) || b.selected(igrp)) {
      const int rows = 4096, block_size = 64, num_blocks = rows / block_size;
      std::vector<int32_t> table(num_blocks);
      std::iota(table.begin(), table.end(), 0);
      int32_t* block_table = b.upload(table);
      int32_t* pos = b.upload(std::vector<int32_t>{rows - 1});
      const ops::KvCache cache{b.rand_bf16(static_cast<size_t>(rows) * kKvLora),
                               ops::KvDtype::bf16,
                               1.0f,
                               num_blocks,
                               block_size,
                               kKvLora};
      bf16* ckv_pre = b.rand_bf16(kKvLora, -3.0f, 3.0f);
      bf16* kv_norm = b.rand_bf16(kKvLora, 0.5f, 1.5f);
      bf16* c_kv = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(kKvLora)));
      const double kv_bytes = 6.0 * kKvLora;  // x, w, the cache row
      if (b.selected(ksep)) {
        b.measure(ksep, dims({kKvLora}), kv_bytes, 1, [&](int) {
          be.rmsnorm(ckv_pre, kv_norm, c_kv, 1, kKvLora, 1e-6f);
          be.kv_write(c_kv, block_table, pos, cache);
        });
      }
      if (b.selected(kgrp)) {
        b.measure(kgrp, dims({kKvLora}), kv_bytes, 1,
                  [&](int) { one.kv_norm_write(ckv_pre, kv_norm, 1e-6f, block_table, pos, cache); });
      }
      bf16* k_pre = b.rand_bf16(kIndexDim, -2.0f, 3.0f);
      bf16* ln_w = b.rand_bf16(kIndexDim, 0.5f, 1.5f);
      bf16* ln_b = b.rand_bf16(kIndexDim, -0.5f, 0.5f);
      float* gate = b.rand_f32(kIndexDim, -3.0f, 3.0f);
      float* ape = b.rand_f32(static_cast<size_t>(kPool) * kIndexDim);
      bf16* k_cache = b.rand_bf16(static_cast<size_t>(rows) * kIndexDim);
      float* gate_cache = b.rand_f32(static_cast<size_t>(rows) * kIndexDim, -3.0f, 3.0f);
      auto* valid = static_cast<uint8_t*>(b.alloc(rows));
      be.fill_bytes(valid, 1, rows);
      float* pool_keys = static_cast<float*>(b.alloc(4 * static_cast<size_t>(rows / kPool) * kIndexDim));
      bf16* k_normed = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(kIndexDim)));
      // x, w, b, gate; the k and gate rows; the pool's other rows, ape and the key.
      const double idx_bytes = (6.0 + 4.0 + 2.0 + 4.0 + 6.0 * (kPool - 1) + 4.0 * kPool + 4.0) * kIndexDim;
      if (b.selected(isep)) {
        b.measure(isep, dims({kIndexDim}) + " P 4", idx_bytes, 1, [&](int) {
          be.layernorm(k_pre, ln_w, ln_b, k_normed, 1, kIndexDim, 1e-6f);
          be.indexer_store(k_normed, gate, ape, pos, k_cache, gate_cache, valid, pool_keys, kIndexDim, kPool);
        });
      }
      if (b.selected(igrp)) {
        b.measure(igrp, dims({kIndexDim}) + " P 4", idx_bytes, 1, [&](int) {
          one.indexer_norm_store(k_pre, ln_w, ln_b, 1e-6f, gate, ape, pos, k_cache, gate_cache, valid,
                                 pool_keys, kIndexDim, kPool);
        });
      }
      b.release_all();
    }
  }

  if (b.group_selected("linear_fp8 eh_proj")) {
    const int n = kH, k = 2 * kH;
    const double wbytes = 1.0 * n * k + 4.0 * n;
    const int rot = b.rotations(wbytes);
    std::vector<fp8e4m3*> W(rot);
    for (auto& w : W) w = b.rand_fp8(static_cast<size_t>(n) * k);
    float* scale = b.rand_f32(n, 0.5f / 448, 1.5f / 448);
    bf16* x = b.rand_bf16(k);
    bf16* y = static_cast<bf16*>(b.alloc(static_cast<size_t>(n) * 2));
    b.measure("linear_fp8 eh_proj", dims({n, k}), wbytes + 2.0 * k + 2.0 * n, rot,
              [&](int i) { be.linear_fp8(W[i % rot], scale, x, y, 1, n, k); });
    b.release_all();
  }

  // ---- the head with its fused argmax ----
  for (int variant = 0; variant < 3; ++variant) {
    const char* names[] = {"head_argmax bf16", "head_argmax bf16 +logits", "head_argmax fp8"};
    if (!b.selected(names[variant])) continue;
    const bool fp8 = variant == 2;
    const bool with_logits = variant == 1;
    const double wbytes = fp8 ? (1.0 * kV * kH + 4.0 * kV) : 2.0 * kV * kH;
    const int rot = b.rotations(wbytes, 2);
    std::vector<bf16*> W(rot, nullptr);
    std::vector<fp8e4m3*> W8(rot, nullptr);
    for (int r = 0; r < rot; ++r) {
      if (fp8) {
        W8[r] = b.rand_fp8(static_cast<size_t>(kV) * kH);
      } else {
        W[r] = b.rand_bf16(static_cast<size_t>(kV) * kH);
      }
    }
    float* scale = fp8 ? b.rand_f32(kV, 0.5f / 448, 1.5f / 448) : nullptr;
    bf16* x = b.rand_bf16(kH);
    bf16* logits = with_logits ? static_cast<bf16*>(b.alloc(static_cast<size_t>(kV) * 2)) : nullptr;
    auto* out = static_cast<ops::ArgMax*>(b.alloc(sizeof(ops::ArgMax)));
    b.measure(names[variant], dims({kV, kH}), wbytes + 2.0 * kH + (with_logits ? 2.0 * kV : 0.0), rot,
              [&](int i) { be.head_argmax(W[i % rot], W8[i % rot], scale, x, kV, kH, 0, logits, out); });
    b.release_all();
  }

  if (b.group_selected("argmax")) {
    const int rot = b.rotations(2.0 * kV);
    std::vector<bf16*> L(rot);
    for (auto& l : L) l = b.rand_bf16(kV, -10.0f, 10.0f);
    auto* out = static_cast<ops::ArgMax*>(b.alloc(sizeof(ops::ArgMax)));
    b.measure("argmax logits", dims({kV}), 2.0 * kV, rot, [&](int i) { be.argmax(L[i % rot], kV, 0, out); });
    b.release_all();
  }

  // ---- MoE ----
  if (b.group_selected("moe_route")) {
    float* logits = b.rand_f32(kExperts, -4.0f, 4.0f);
    float* bias = b.rand_f32(kExperts, -0.1f, 0.1f);
    auto* idx = static_cast<int32_t*>(b.alloc(4 * kExpertTopK));
    float* w = static_cast<float*>(b.alloc(4 * kExpertTopK));
    b.measure("moe_route", dims({kExperts}) + " top 8", 8.0 * kExperts, 1,
              [&](int) { one.moe_route(logits, bias, kExperts, kExpertTopK, 1, 1, 2.5f, idx, w); });
    b.release_all();
  }
  if (b.group_selected("moe_experts")) {
    // All 288 experts resident; each call picks 8 distinct random ones (so L2 never holds them).
    const size_t per = static_cast<size_t>(kInter) * kH;
    bf16* gate = b.rand_bf16(per * kExperts, -1.0f, 1.0f);
    bf16* up = b.rand_bf16(per * kExperts, -1.0f, 1.0f);
    bf16* down = b.rand_bf16(per * kExperts, -0.05f, 0.05f);
    bf16* x = b.rand_bf16(kH);
    const int sets = 64;
    std::vector<int32_t> ids;
    uint64_t s = 12345;
    for (int set = 0; set < sets; ++set) {
      std::vector<int32_t> chosen;
      while (static_cast<int>(chosen.size()) < kExpertTopK) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int e = static_cast<int>((s >> 33) % kExperts);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      ids.insert(ids.end(), chosen.begin(), chosen.end());
    }
    int32_t* idx = b.upload(ids);
    float* w = b.rand_f32(kExpertTopK, 0.1f, 0.5f);
    float* out = static_cast<float*>(b.alloc(4 * kH));
    const ops::ExpertWeights ew{gate, up, down, 0, kExperts, kH, kInter};
    b.measure("moe_experts 8 of 288", dims({kExpertTopK, 3, kInter, kH}),
              3.0 * kExpertTopK * per * 2 + 2.0 * kH + 4.0 * kH, sets, [&](int i) {
                one.moe_experts(x, ew, idx + (i % sets) * kExpertTopK, w, kExpertTopK, 10.0f, out);
              });
    // The same routed experts plus the shared expert in one op, as the block runs them
    // (moe_experts_shared); four copies of the shared expert rotate so L2 cannot keep it.
    const int sh_copies = 4;
    std::vector<ops::ExpertWeights> shared;
    for (int c = 0; c < sh_copies; ++c)
      shared.push_back({b.rand_bf16(per, -1.0f, 1.0f), b.rand_bf16(per, -1.0f, 1.0f),
                        b.rand_bf16(per, -0.05f, 0.05f), 0, 1, kH, kInter});
    b.measure("moe_experts 8 + shared", dims({kExpertTopK + 1, 3, kInter, kH}),
              3.0 * (kExpertTopK + 1) * per * 2 + 2.0 * kH + 4.0 * kH, sets, [&](int i) {
                one.moe_experts_shared(x, ew, idx + (i % sets) * kExpertTopK, w, kExpertTopK,
                                       shared[static_cast<size_t>(i % sh_copies)], 10.0f, out);
              });
    b.release_all();
  }

  // ---- indexer ----
  // 1024 pools: the draft step at a context of 4096 rows; 16384: a long context.
  for (const int pools : {1024, 16384}) {
    if (b.group_selected("indexer_scores")) {
      const double kbytes = 4.0 * pools * kIndexDim;
      const int rot = b.rotations(kbytes);
      std::vector<float*> keys(rot);
      for (auto& k : keys) k = b.rand_f32(static_cast<size_t>(pools) * kIndexDim);
      float* q = b.rand_f32(static_cast<size_t>(kIndexHeads) * kIndexDim);
      float* w = b.rand_f32(kIndexHeads, -0.2f, 0.2f);
      int32_t* pos = b.upload(std::vector<int32_t>{pools * kPool - 1});
      float* scores = static_cast<float*>(b.alloc(sizeof(float) * pools));
      b.measure("indexer_scores", dims({pools, kIndexHeads, kIndexDim}), kbytes + 4.0 * pools, rot,
                [&](int i) {
                  be.indexer_scores(q, w, keys[i % rot], pos, scores, kIndexHeads, kIndexDim, kPool, pools);
                });
      b.release_all();
    }
    // The radix selection (v2; the row keeps its name). Top kTopK / kPool = 512 pools.
    if (b.group_selected("indexer_select")) {
      const int rot = 16;
      std::vector<float*> scores(rot);
      for (auto& s : scores) s = b.rand_f32(pools);
      int32_t* pos = b.upload(std::vector<int32_t>{pools * kPool - 1});
      auto* sel = static_cast<int32_t*>(b.alloc(4 * (kTopK + kPool - 1)));
      b.measure("indexer_select v2 top 512", dims({pools}), 4.0 * pools + 4.0 * (kTopK + kPool - 1), rot,
                [&](int i) { be.indexer_select(scores[i % rot], pos, sel, kTopK, kPool, pools); });
      b.release_all();
    }
  }

  // ---- MLA ----
  const size_t kvb_elems = static_cast<size_t>(kHeads) * 2 * kHeadDim * kKvLora;
  if (b.group_selected("mla_absorb_q") || b.group_selected("mla_out_v")) {
    const int rot = b.rotations(2.0 * kvb_elems);
    std::vector<bf16*> W(rot);
    for (auto& w : W) w = b.rand_bf16(kvb_elems, -0.05f, 0.05f);
    bf16* q = b.rand_bf16(static_cast<size_t>(kHeads) * kHeadDim);
    bf16* q_abs = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(kHeads) * kKvLora));
    bf16* o = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(kHeads) * kHeadDim));
    const double half = 2.0 * kvb_elems / 2;
    if (b.selected("mla_absorb_q"))
      b.measure("mla_absorb_q", dims({kHeads, kHeadDim, kKvLora}), half + 2.0 * kHeads * (kHeadDim + kKvLora),
                rot,
                [&](int i) { one.mla_absorb_q(q, W[i % rot], q_abs, kHeads, kHeadDim, kHeadDim, kKvLora); });
    if (b.selected("mla_out_v"))
      b.measure("mla_out_v", dims({kHeads, kHeadDim, kKvLora}), half + 2.0 * kHeads * (kHeadDim + kKvLora),
                rot,
                [&](int i) { one.mla_out_v(q_abs, W[i % rot], o, kHeads, kHeadDim, kHeadDim, kKvLora); });
    b.release_all();
  }
  // Both decode paths (the decode and, where it launches one, its combine), each row named by its
  // path, through the backend's policy (the rest of it as it is); the policy
  // is restored after each.
  using ops::MlaDecode;
  const std::pair<ops::KvDtype, MlaDecode> decode_cases[] = {{ops::KvDtype::bf16, MlaDecode::v2},
                                                             {ops::KvDtype::bf16, MlaDecode::v1},
                                                             {ops::KvDtype::fp8, MlaDecode::v2},
                                                             {ops::KvDtype::fp8, MlaDecode::v1}};
  for (const auto& [dtype, path] : decode_cases) {
    const std::string name =
        std::string("mla_decode ") + (dtype == ops::KvDtype::bf16 ? "bf16 " : "fp8 ") + ops::to_string(path);
    if (!b.selected(name)) continue;
    const MlaDecode decode = path;
    const PolicyScope use(be, [decode](ops::KernelPolicy& p) { p.mla_decode = decode; });
    // A 64k-row paged cache; the selection is 2051 distinct random rows (K + P - 1).
    const int block_size = 64, rows = 65536, num_blocks = rows / block_size;
    const size_t elem = dtype == ops::KvDtype::bf16 ? 2 : 1;
    const int width = kTopK + kPool - 1;
    const int rot = b.rotations(static_cast<double>(width) * kKvLora * elem, 32);
    std::vector<void*> caches(rot);
    for (auto& c : caches) {
      c = elem == 2 ? static_cast<void*>(b.rand_bf16(static_cast<size_t>(rows) * kKvLora))
                    : static_cast<void*>(b.rand_fp8(static_cast<size_t>(rows) * kKvLora));
    }
    std::vector<int32_t> table(num_blocks);
    for (int i = 0; i < num_blocks; ++i) table[i] = (i * 37) % num_blocks;  // 37 is coprime to 1024
    int32_t* block_table = b.upload(table);
    std::vector<int32_t> sel(width);
    for (int i = 0; i < width; ++i) sel[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 31) % rows);
    int32_t* selection = b.upload(sel);
    bf16* q_abs = b.rand_bf16(static_cast<size_t>(kHeads) * kKvLora, -2.0f, 2.0f);
    bf16* o_lat = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(kHeads) * kKvLora));
    const float scale = elem == 2 ? 1.0f : 1.0f / 448;
    b.measure(name, dims({width, kHeads, kKvLora}),
              static_cast<double>(width) * kKvLora * elem + 4.0 * kHeads * kKvLora, rot, [&](int i) {
                const ops::KvCache cache{caches[i % rot], dtype, scale, num_blocks, block_size, kKvLora};
                one.mla_decode(q_abs, selection, width, block_table, cache, o_lat, kHeads, 1.0f / 16.0f);
              });
    b.release_all();
  }

  // ---- small ops (launch-latency bound) ----
  if (b.group_selected("rmsnorm")) {
    bf16* x = b.rand_bf16(kH);
    bf16* w = b.rand_bf16(kH, 0.5f, 1.5f);
    bf16* y = static_cast<bf16*>(b.alloc(2 * kH));
    b.measure("rmsnorm", dims({kH}), 6.0 * kH, 1, [&](int) { be.rmsnorm(x, w, y, 1, kH, 1e-5f); });
    b.release_all();
  }
}

// ---- batched kernels (--only batch): the ops of a batched draft step at B rows -------------------------
//
// Bytes are the fewest each op must move at B: every weight row once (not B times), each row's
// inputs, outputs and cache rows once. "batch linear ... cublaslt" and "... mma" time the same
// batched linear through cuBLASLt (rows_linear = cublaslt) and through the small-M tensor-core
// GEMM (ops::cuda::rows_gemm), side by side, for docs/kernels.md's per-shape choice.
void run_batched(Bench& b, ops::Backend& be) {
  auto live_slots = [&](int B) {
    std::vector<int32_t> s(static_cast<size_t>(B));
    std::iota(s.begin(), s.end(), 0);
    return b.upload(s);
  };
  const int batches[] = {1, 4, 16, 64, 128};
  const ops::KernelPolicy base_policy = be.kernel_policy();
  auto with_policy = [&](auto&& edit) {
    ops::KernelPolicy p = base_policy;
    edit(p);
    be.set_kernel_policy(p);
  };
  // The head with its fused argmax (KernelPolicy::head_gemm): BF16 under the policy's choice; FP8
  // (row-scaled) on the MMA kernel at every B ("fp8 B=4") and on the multi-row GEMV ("fp8 B=4
  // gemv", 1 .. ops::cuda::kMaxRowsGemvHead rows; at 8 rows gemv runs the MMA kernel, which shows
  // the fallback's cost), on the warpgroup-MMA kernel ("wgmma": x packed, then the GEMM) and under
  // the policy's automatic choice ("auto"); "cublaslt": the BF16 head as cuBLASLt GEMM + per-row
  // argmax, beside it.
  struct HeadCase {
    bool fp8;
    bool forced;  // head_gemm set to `gemm` (else the policy's own)
    ops::HeadGemm gemm;
    const char* suffix;
    std::vector<int> batches;
  };
  const std::vector<int> all_batches(std::begin(batches), std::end(batches));
  const HeadCase head_cases[] = {
      {false, false, ops::HeadGemm::automatic, "", all_batches},
      {true, true, ops::HeadGemm::mma, "", all_batches},
      {true, true, ops::HeadGemm::mma, "", {3, 8}},
      {true, true, ops::HeadGemm::gemv, " gemv", {1, 2, 3, 4, 8}},
      {true, true, ops::HeadGemm::wgmma, " wgmma", {4, 8, 16, 32, 64, 128}},
      {true, false, ops::HeadGemm::automatic, " auto", {1, 2, 4, 8, 16, 32, 64, 128}},
      {false, true, ops::HeadGemm::cublaslt, " cublaslt", all_batches},
      {true, true, ops::HeadGemm::cublaslt, " cublaslt", {2, 4, 8, 16, 32, 64, 128}},
  };
  for (const HeadCase& hc : head_cases) {
    const bool fp8 = hc.fp8;
    for (int B : hc.batches) {
      const std::string name = mtplab::str("batch head_argmax ", fp8 ? "fp8" : "bf16", " B=", B, hc.suffix);
      if (!b.selected(name)) continue;
      with_policy([&](ops::KernelPolicy& p) {
        if (hc.forced) p.head_gemm = hc.gemm;
      });
      const double wbytes = fp8 ? (1.0 * kV * kH + 4.0 * kV) : 2.0 * kV * kH;
      const int rot = b.rotations(wbytes, 2);
      std::vector<bf16*> W(rot, nullptr);
      std::vector<fp8e4m3*> W8(rot, nullptr);
      for (int r = 0; r < rot; ++r) {
        if (fp8) {
          W8[r] = b.rand_fp8(static_cast<size_t>(kV) * kH);
        } else {
          W[r] = b.rand_bf16(static_cast<size_t>(kV) * kH);
        }
      }
      float* scale = fp8 ? b.rand_f32(kV, 0.5f / 448, 1.5f / 448) : nullptr;
      bf16* x = b.rand_bf16(static_cast<size_t>(B) * kH);
      int32_t* slots = live_slots(B);
      auto* out = static_cast<ops::ArgMax*>(b.alloc(sizeof(ops::ArgMax) * B));
      auto* tok = static_cast<int32_t*>(b.alloc(sizeof(int32_t) * B));
      b.measure(name, dims({B, kV, kH}), wbytes + 2.0 * B * kH + 12.0 * B, rot, [&](int i) {
        be.head_argmax_batch(W[i % rot], W8[i % rot], scale, x, ops::RowBatch{slots, nullptr, B, 1}, kV, kH,
                             0, nullptr, 0, out, ops::HeadExtras{nullptr, tok});
      });
      be.set_kernel_policy(base_policy);
      b.release_all();
    }
  }
  // The batched linears of the step: cuBLASLt against the small-M tensor-core GEMM.
  struct Lin {
    const char* name;
    int n, k;
    bool f32;
  };
  const Lin lins[] = {{"eh_proj", kH, 2 * kH, false},
                      {"q_b", kHeads * kHeadDim, kQLora, false},
                      {"kv_a", kKvLora, kH, false},
                      {"o_proj", kH, kHeads * kHeadDim, true},
                      {"router", kExperts, kH, true}};
  int dev = 0;
  MTP_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  MTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  ops::cuda::LaunchCtx ctx;
  ctx.stream = b.stream();
  ctx.num_sms = prop.multiProcessorCount;
  ctx.policy = be.kernel_policy();
  ctx.pdl_capable = false;  // no programmatic launch: as cuBLASLt's kernels, in both modes
  // One batched linear case: fresh weights (rotated past the L2), x and y, measured through
  // `launch(W, x, y)`, then the base policy back and the buffers released.
  auto bench_linear = [&](const std::string& name, const Lin& l, int B, auto&& launch) {
    const double wbytes = 2.0 * l.n * l.k;
    const int rot = b.rotations(wbytes);
    std::vector<bf16*> W(rot);
    for (auto& w : W) w = b.rand_bf16(static_cast<size_t>(l.n) * l.k);
    bf16* x = b.rand_bf16(static_cast<size_t>(B) * l.k);
    void* y = b.alloc(static_cast<size_t>(B) * l.n * 4);
    b.measure(name, dims({B, l.n, l.k}), wbytes + 2.0 * B * l.k + (l.f32 ? 4.0 : 2.0) * B * l.n, rot,
              [&](int i) { launch(W[i % rot], x, y); });
    be.set_kernel_policy(base_policy);
    b.release_all();
  };
  // The backend's batched linear (the policy set by the caller picks its kernel).
  auto backend_linear = [&](const Lin& l, int B) {
    return [&be, &l, B](const bf16* W, const bf16* x, void* y) {
      if (l.f32) {
        be.linear_f32(W, x, static_cast<float*>(y), B, l.n, l.k, ops::RowsMode::batched);
      } else {
        be.linear(W, x, static_cast<bf16*>(y), B, l.n, l.k, ops::RowsMode::batched);
      }
    };
  };
  for (const Lin& l : lins) {
    for (int B : {2, 8, 32, 128}) {
      for (bool mma : {false, true}) {
        // The skinny GEMM has BF16 outputs only (mla_out_v_batch's kernel; no rule gives it a linear).
        if (mma && l.f32) continue;
        const std::string name = mtplab::str("batch linear ", l.name, " B=", B, mma ? " mma" : " cublaslt");
        if (!b.selected(name)) continue;
        with_policy([](ops::KernelPolicy& p) { p.rows_linear = ops::RowsLinear::cublaslt; });
        if (mma) {
          bench_linear(name, l, B, [&](const bf16* W, const bf16* x, void* y) {
            ops::cuda::rows_gemm(ctx, W, x, l.k, static_cast<bf16*>(y), l.n, B, l.n, l.k,
                                 ops::cuda::GemvRowMap{l.n, 0, 0, 0});
            MTP_CUDA_CHECK(cudaGetLastError());
          });
        } else {
          bench_linear(name, l, B, backend_linear(l, B));
        }
      }
    }
  }
  // The batched linears at small B through the backend: the multi-row GEMV (KernelPolicy::rows_linear
  // = gemv) and cuBLASLt (= cublaslt) side by side, for the row limit of rows_linear = auto.
  const Lin row_lins[] = {{"eh_proj", kH, 2 * kH, false},
                          {"q_a", kQLora, kH, false},
                          {"q_b", kHeads * kHeadDim, kQLora, false},
                          {"kv_a", kKvLora, kH, false},
                          {"o_proj", kH, kHeads * kHeadDim, true},
                          {"indexer.wq_b", kIndexHeads * kIndexDim, kQLora, true},
                          {"indexer.wk", kIndexDim, kH, false},
                          {"indexer.gate", kIndexHeads, kH, true},
                          {"router", kExperts, kH, true}};
  for (const Lin& l : row_lins) {
    for (int B : {2, 4, 8, 16}) {
      for (bool gemv : {true, false}) {
        const std::string name =
            mtplab::str("batch rows_linear ", l.name, " B=", B, gemv ? " gemv" : " cublaslt");
        if (!b.selected(name)) continue;
        with_policy([&](ops::KernelPolicy& p) {
          p.rows_linear = gemv ? ops::RowsLinear::gemv : ops::RowsLinear::cublaslt;
        });
        bench_linear(name, l, B, backend_linear(l, B));
      }
    }
  }
  // The grouped experts, every expert resident (the union grows with B: bytes = the union's weights).
  if (b.group_selected("batch moe_experts_grouped")) {
    const size_t per = static_cast<size_t>(kInter) * kH;
    bf16* gate = b.rand_bf16(per * kExperts);
    bf16* up = b.rand_bf16(per * kExperts);
    bf16* down = b.rand_bf16(per * kExperts, -0.1f, 0.1f);
    bf16* sg = b.rand_bf16(per);
    bf16* su = b.rand_bf16(per);
    bf16* sd = b.rand_bf16(per, -0.1f, 0.1f);
    const ops::ExpertWeights routed{gate, up, down, 0, kExperts, kH, kInter};
    const ops::ExpertWeights shared{sg, su, sd, 0, 1, kH, kInter};
    // Under the policy's automatic pipeline, then each pipeline forced (KernelPolicy::moe_pipeline,
    // " v1", " slots", " ringpf"; the comparison pipelines are timed by dev/cuda/moe.cu).
    const ops::MoePipeline pipes[] = {ops::MoePipeline::automatic, ops::MoePipeline::v1,
                                      ops::MoePipeline::slots, ops::MoePipeline::ringpf};
    for (const ops::MoePipeline pipe : pipes)
      for (int B : {1, 2, 3, 4, 16, 64, 128}) {
        const bool forced = pipe != ops::MoePipeline::automatic;
        const std::string name = mtplab::str("batch moe_experts_grouped B=", B, forced ? " " : "",
                                             forced ? ops::to_string(pipe) : "");
        if (!b.selected(name)) continue;
        with_policy([&](ops::KernelPolicy& p) {
          if (forced) p.moe_pipeline = pipe;
        });
        std::vector<int32_t> idx_h(static_cast<size_t>(B) * kExpertTopK);
        std::vector<uint8_t> used(kExperts, 0);
        uint64_t r = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(B + 1);
        for (int row = 0; row < B; ++row) {
          for (int i = 0; i < kExpertTopK; ++i) {  // distinct experts per row, uniform over the 288
            int e;
            bool again;
            do {
              r = mtplab::splitmix64_mix(r + 1);
              e = static_cast<int>(r % kExperts);
              again = false;
              for (int j = 0; j < i; ++j) again |= idx_h[static_cast<size_t>(row) * kExpertTopK + j] == e;
            } while (again);
            idx_h[static_cast<size_t>(row) * kExpertTopK + i] = e;
            used[static_cast<size_t>(e)] = 1;
          }
        }
        const int distinct = static_cast<int>(std::count(used.begin(), used.end(), 1));
        int32_t* idx = b.upload(idx_h);
        float* wts = b.rand_f32(static_cast<size_t>(B) * kExpertTopK, 0.1f, 1.0f);
        bf16* x = b.rand_bf16(static_cast<size_t>(B) * kH);
        int32_t* slots = live_slots(B);
        float* out = static_cast<float*>(b.alloc(sizeof(float) * B * kH));
        const double bytes = 2.0 * 3.0 * per * (distinct + 1) + 2.0 * B * kH + 4.0 * B * kH;
        b.measure(name, mtplab::str(dims({B, kExpertTopK, 3, kInter, kH}), " ", distinct, " experts"), bytes,
                  1, [&](int) {
                    be.moe_experts_grouped(x, routed, idx, wts, ops::RowBatch{slots, nullptr, B, 1},
                                           kExpertTopK, &shared, 10.0f, out);
                  });
        be.set_kernel_policy(base_policy);
      }
    b.release_all();
  }
  // The sparse decode: each row at position 4095 of its own slot (2051 selected rows: K pool rows
  // plus the tail), slots' blocks interleaved in one pool. Both kernels (KernelPolicy::mla_decode,
  // named in the row) at automatic splits at every B; " splits=S": the split count forced
  // (KernelPolicy::mla_batch_splits) instead of chosen: v1 at 2 and 4 (its automatic count is 5, 2
  // and 1 at B = 16, 64, 128), v2 at 16 (two clusters of 8 per (row, head tile), where the
  // automatic rule gives one).
  // "shared2", "shared32": the shared kernels (KernelPolicy::mla_batch) at automatic splits from
  // B = 2, and forced at a count; the v1 / v2 rows run mla_batch = tiles. (shared, 4 tiles on
  // 16-row chunks: dev/cuda/mla.cu.)
  using ops::MlaDecode;
  struct DecodeCase {
    MlaDecode path;
    int B, splits;
    int shared = 0;  // 0: tiles; 2: shared2; 32: shared32
  };
  const DecodeCase decode_cases[] = {
      {MlaDecode::v2, 1, 0},       {MlaDecode::v2, 16, 0},     {MlaDecode::v2, 16, 16},
      {MlaDecode::v2, 64, 0},      {MlaDecode::v2, 64, 16},    {MlaDecode::v2, 128, 0},
      {MlaDecode::v1, 1, 0},       {MlaDecode::v1, 16, 0},     {MlaDecode::v1, 16, 2},
      {MlaDecode::v1, 16, 4},      {MlaDecode::v1, 64, 0},     {MlaDecode::v1, 64, 2},
      {MlaDecode::v1, 64, 4},      {MlaDecode::v1, 128, 0},    {MlaDecode::v1, 128, 2},
      {MlaDecode::v1, 128, 4},     {MlaDecode::v2, 2, 0, 2},   {MlaDecode::v2, 2, 64, 2},
      {MlaDecode::v2, 4, 0, 2},    {MlaDecode::v2, 8, 0, 2},   {MlaDecode::v2, 16, 0, 2},
      {MlaDecode::v2, 16, 16, 32}, {MlaDecode::v2, 32, 0, 2},  {MlaDecode::v2, 64, 0, 2},
      {MlaDecode::v2, 128, 0, 2},  {MlaDecode::v2, 8, 0, 32},  {MlaDecode::v2, 16, 0, 32},
      {MlaDecode::v2, 32, 0, 32},  {MlaDecode::v2, 64, 0, 32}, {MlaDecode::v2, 128, 0, 32}};
  for (ops::KvDtype dtype : {ops::KvDtype::bf16, ops::KvDtype::fp8}) {
    for (const DecodeCase dc : decode_cases) {
      const int B = dc.B;
      const std::string name =
          mtplab::str("batch mla_decode ", dtype == ops::KvDtype::bf16 ? "bf16 " : "fp8 ",
                      dc.shared == 2    ? "shared2"
                      : dc.shared == 32 ? "shared32"
                                        : ops::to_string(dc.path),
                      " B=", B, dc.splits ? mtplab::str(" splits=", dc.splits) : std::string());
      if (!b.selected(name)) continue;
      with_policy([&](ops::KernelPolicy& p) {
        p.mla_decode = dc.path;
        p.mla_batch = dc.shared == 2    ? ops::MlaBatch::shared2
                      : dc.shared == 32 ? ops::MlaBatch::shared32
                                        : ops::MlaBatch::tiles;
        p.mla_batch_splits = dc.splits;
      });
      const int block_size = 64, rows = 4096, max_blocks = rows / block_size, width = kTopK + kPool - 1;
      const size_t elem = dtype == ops::KvDtype::bf16 ? 2 : 1;
      const size_t values = static_cast<size_t>(B) * rows * kKvLora;
      void* cache =
          elem == 2 ? static_cast<void*>(b.rand_bf16(values)) : static_cast<void*>(b.rand_fp8(values));
      std::vector<int32_t> tables(static_cast<size_t>(B) * max_blocks), sel(static_cast<size_t>(B) * width);
      for (int s = 0; s < B; ++s)
        for (int j = 0; j < max_blocks; ++j) tables[static_cast<size_t>(s) * max_blocks + j] = j * B + s;
      for (int s = 0; s < B; ++s)
        for (int i = 0; i < width; ++i) sel[static_cast<size_t>(s) * width + i] = (i * 2 + s) % rows;
      int32_t* table = b.upload(tables);
      int32_t* selection = b.upload(sel);
      int32_t* slots = live_slots(B);
      bf16* q_abs = b.rand_bf16(static_cast<size_t>(B) * kHeads * kKvLora, -2.0f, 2.0f);
      bf16* o_lat = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(B) * kHeads * kKvLora));
      const ops::KvSlots kv{
          ops::KvCache{cache, dtype, elem == 2 ? 1.0f : 1.0f / 448, B * max_blocks, block_size, kKvLora},
          table, B, max_blocks};
      b.measure(name, dims({B, width, kHeads, kKvLora}),
                static_cast<double>(B) * (width * kKvLora * elem + 4.0 * kHeads * kKvLora), 1, [&](int) {
                  be.mla_decode_batch(q_abs, selection, width, ops::RowBatch{slots, nullptr, B, 1}, kv, o_lat,
                                      kHeads, 1.0f / 16.0f);
                });
      be.set_kernel_policy(base_policy);
      b.release_all();
    }
  }
  // The batched pool scores at a context of 4096 rows (1024 candidate pools per row) in slots of
  // 65536 rows (16384 pools: the rest of each row is written -inf, as in the draft step), under both
  // kernels. Bytes: each row's candidate keys and its query, and its scores row.
  for (int B : {1, 16, 32, 64, 128}) {
    const std::string name = mtplab::str("batch indexer_scores B=", B);
    if (!b.group_selected(name)) continue;
    const int max_rows = 65536, max_pools = max_rows / kPool, ctx_rows = 4096;
    ops::IndexerSlots idx;
    idx.slots = B;
    idx.max_rows = max_rows;
    idx.D = kIndexDim;
    idx.P = kPool;
    idx.pool_keys = b.rand_f32(static_cast<size_t>(B) * max_pools * kIndexDim);
    // The row caches are not read by the scores (stand-ins: the op checks the slots are whole).
    idx.k_cache = static_cast<bf16*>(b.alloc(16));
    idx.gate_cache = static_cast<float*>(b.alloc(16));
    idx.valid = static_cast<uint8_t*>(b.alloc(16));
    float* q = b.rand_f32(static_cast<size_t>(B) * kIndexHeads * kIndexDim);
    float* w = b.rand_f32(static_cast<size_t>(B) * kIndexHeads, -0.2f, 0.2f);
    int32_t* pos = b.upload(std::vector<int32_t>(static_cast<size_t>(B), ctx_rows - 1));
    int32_t* slots = live_slots(B);
    float* scores = static_cast<float*>(b.alloc(sizeof(float) * static_cast<size_t>(B) * max_pools));
    const double bytes = static_cast<double>(B) * (4.0 * (ctx_rows / kPool) * kIndexDim +
                                                   4.0 * kIndexHeads * (kIndexDim + 1) + 4.0 * max_pools);
    // Both kernels (same bits), named in the row.
    for (const auto kernel : {ops::IndexerScores::pools4, ops::IndexerScores::tiled}) {
      const PolicyScope use(be, [kernel](ops::KernelPolicy& p) { p.indexer_scores = kernel; });
      b.measure(name + " " + ops::to_string(kernel), dims({B, ctx_rows / kPool, kIndexHeads, kIndexDim}),
                bytes, 1, [&](int) {
                  be.indexer_scores_batch(q, w, ops::RowBatch{slots, pos, B, 1}, idx, scores, kIndexHeads);
                });
    }
    b.release_all();
  }
  // Absorb and out_v over W_kvb (once for all rows).
  for (int B : {1, 16, 128}) {
    const std::string absorb = mtplab::str("batch mla_absorb_q B=", B),
                      outv = mtplab::str("batch mla_out_v B=", B);
    if (!b.selected(absorb) && !b.selected(outv)) continue;
    const size_t kvb = static_cast<size_t>(kHeads) * 2 * kHeadDim * kKvLora;
    const int rot = b.rotations(2.0 * kvb);
    std::vector<bf16*> W(rot);
    for (auto& w : W) w = b.rand_bf16(kvb, -0.05f, 0.05f);
    bf16* q = b.rand_bf16(static_cast<size_t>(B) * kHeads * kHeadDim);
    bf16* q_abs = b.rand_bf16(static_cast<size_t>(B) * kHeads * kKvLora);
    bf16* o = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(B) * kHeads * kHeadDim));
    bf16* qa_out = static_cast<bf16*>(b.alloc(2 * static_cast<size_t>(B) * kHeads * kKvLora));
    const double half = 2.0 * kvb / 2, io = 2.0 * B * kHeads * (kHeadDim + kKvLora);
    if (b.selected(absorb))
      b.measure(absorb, dims({B, kHeads, kHeadDim, kKvLora}), half + io, rot, [&](int i) {
        be.mla_absorb_q_batch(q, W[i % rot], qa_out, B, kHeads, kHeadDim, kHeadDim, kKvLora);
      });
    if (b.selected(outv))
      b.measure(outv, dims({B, kHeads, kHeadDim, kKvLora}), half + io, rot, [&](int i) {
        be.mla_out_v_batch(q_abs, W[i % rot], o, B, kHeads, kHeadDim, kHeadDim, kKvLora);
      });
    b.release_all();
  }
}

/// A CSV field in double quotes (a quote inside doubled).
std::string quoted(const std::string& v) {
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + '"';
}

void write_csv(const Bench& b, const std::string& dir, const std::string& device,
               const ops::KernelPolicy& policy) {
  std::filesystem::create_directories(dir);
  std::ofstream f(dir + "/bench_kernels.csv");
  MTP_REQUIRE(f, "cannot write ", dir, "/bench_kernels.csv");
  f << "# mtplab_bench_kernels git " << mtplab::git_sha() << (mtplab::git_dirty() ? "-dirty" : "")
    << " device " << device << " copy_GBps " << b.ceiling() << " graph_launches " << b.graph_launches()
    << " gemv_variant " << ops::to_string(policy.gemv_variant) << " kernel_policy " << ops::to_string(policy)
    << "\n";
  // The single-launch columns first, as before; the graph columns (per launch) are empty where the
  // case has no graph figure, and graph_note says why.
  f << "op,shape,bytes,reps,median_us,p10_us,p90_us,min_us,GBps,frac_of_copy,"
       "graph_launches,graph_reps,graph_median_us,graph_p10_us,graph_p90_us,graph_min_us,graph_GBps,"
       "graph_frac_of_copy,graph_note\n";
  for (const Result& r : b.results()) {
    const double gbps = gbps_of(r.bytes, r.single.median);
    f << quoted(r.name) << ',' << quoted(r.shape) << ',' << r.bytes << ',' << r.single.us.size() << ','
      << r.single.median << ',' << r.single.p10 << ',' << r.single.p90 << ',' << r.single.min << ',' << gbps
      << ',' << (b.ceiling() > 0 ? gbps / b.ceiling() : 0) << ',' << b.graph_launches() << ',';
    if (r.has_graph()) {
      const double g = gbps_of(r.bytes, r.graph.median);
      f << r.graph.us.size() << ',' << r.graph.median << ',' << r.graph.p10 << ',' << r.graph.p90 << ','
        << r.graph.min << ',' << g << ',' << (b.ceiling() > 0 ? g / b.ceiling() : 0) << ',';
    } else {
      f << "0,,,,,,,";
    }
    f << quoted(b.graph_launches() > 0 ? r.graph_na : "off") << "\n";
  }
  MTP_REQUIRE(f, "cannot write ", dir, "/bench_kernels.csv");
  // Every sample; mode graph: one replay of graph_launches launches / graph_launches.
  std::ofstream s(dir + "/bench_kernels_samples.csv");
  MTP_REQUIRE(s, "cannot write ", dir, "/bench_kernels_samples.csv");
  s << "op,rep,us,mode\n";
  for (const Result& r : b.results()) {
    for (size_t i = 0; i < r.single.us.size(); ++i)
      s << quoted(r.name) << ',' << i << ',' << r.single.us[i] << ",single\n";
    for (size_t i = 0; i < r.graph.us.size(); ++i)
      s << quoted(r.name) << ',' << i << ',' << r.graph.us[i] << ",graph\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  mtplab::cli::Parser p(
      "mtplab_bench_kernels",
      "mtplab_bench_kernels [--out DIR] [--reps N] [--warmup N] [--only SUBSTRING[,SUBSTRING..]] "
      "[--device D] [--graph-launches R]");
  p.about("The CUDA backend's memory-bound ops at the glm5.3-flash shapes, against the copy bandwidth.\n")
      .text("out", "DIR", "where bench_kernels.csv and bench_kernels_samples.csv go (default bench-out)")
      .integer("reps", "N", "samples per op and mode (default 200)", 1, 1000000)
      .integer("warmup", "N", "untimed calls first (default 10)", 0, 1000000)
      .text("only", "SUBSTRING[,..]", "run only the cases whose name contains one of them")
      .integer("device", "D", "CUDA device (default 0)", 0, 1023)
      .integer("graph-launches", "R", "launches per captured graph; 0 turns the graph mode off (default 20)",
               0, 1000);
  p.run_main(argc, argv, [&](const mtplab::cli::Args& a) {
    opt.out = a.text("out", opt.out);
    opt.reps = static_cast<int>(a.integer("reps", opt.reps));
    opt.warmup = static_cast<int>(a.integer("warmup", opt.warmup));
    opt.only = a.text("only", opt.only);
    opt.device = static_cast<int>(a.integer("device", opt.device));
    opt.graph_launches = static_cast<int>(a.integer("graph-launches", opt.graph_launches));
  });
  return mtplab::bench::guarded_main([&] {
    if (!ops::cuda_backend_available()) {
      std::printf("SKIPPED: no CUDA device is visible\n");
      return 77;
    }
    auto be = ops::make_cuda_backend(opt.device);
    // The override path for tuning runs: the environment's MTPLAB_* choices, printed.
    std::vector<std::string> overridden;
    be->set_kernel_policy(ops::env_overrides(ops::KernelPolicy{}, &overridden));
    const ops::KernelPolicy policy = be->kernel_policy();
    std::printf("mtplab_bench_kernels on %s (git %s%s), %d reps per op, GEMV variant %s\n",
                be->device_name().c_str(), mtplab::git_sha(), mtplab::git_dirty() ? "-dirty" : "", opt.reps,
                ops::to_string(policy.gemv_variant));
    std::printf("kernel policy %s%s%s\n", ops::to_string(policy).c_str(),
                overridden.empty() ? "" : "; from the environment: ", mtplab::join(overridden, ", ").c_str());
    Bench bench(opt, *be);
    bench.print_header();
    run_all(bench, *be);
    run_batched(bench, *be);
    MTP_REQUIRE(
        opt.only.empty() || bench.cases_run() > 0, "mtplab_bench_kernels: --only \"", opt.only,
        "\" names no case (a case runs when its name, as a run without --only prints it, contains one "
        "of the comma-separated parts)");
    write_csv(bench, opt.out, be->device_name(), policy);
    std::printf("wrote %s/bench_kernels.csv\n", opt.out.c_str());
    return 0;
  });
}
