// What the kernel playgrounds of dev/cuda share. A playground runs kernels that no rule of the
// library picks (kept for comparison: docs/kernels.md, "Playgrounds") on fresh random inputs,
// checks each against the CPU reference (lib/ops/cpu) at a stated tolerance, and times it against
// what the library runs for the same shape.
//
//   <playground> [--reps N] [--seed S] [--device D]
//
// - Without a CUDA device it prints that it skips and exits 0 (the build machines have none).
// - A check outside its tolerance prints the case, the seed and the first elements that differ,
//   and the playground exits 1 after the remaining cases; 0 when every check held.
// - Times: the median of N (default 50) runs, each between two CUDA events on the launch stream,
//   after 3 warm-up runs; the inputs stay the same (an L2-warm figure, for comparing kernels with
//   each other, not the bandwidth figures of mtplab_bench_kernels).
// - Inputs are fresh every run (the seed is printed first); --seed S replays one.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cli.hpp"
#include "core/numeric.hpp"
#include "core/str.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/kernel_policy.hpp"
#include "ops/ops.hpp"

namespace mtplab::dev {

struct Options {
  int reps = 50;
  int device = 0;
  uint64_t seed = 0;
};

/// splitmix64: the inputs of a playground run.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
  std::vector<float> floats(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  std::vector<bf16> bf16s(size_t n, float lo, float hi) {
    std::vector<bf16> v(n);
    for (auto& x : v) x = to_bf16(uniform(lo, hi));
    return v;
  }
  /// Finite E4M3 codes of both signs (0x7f / 0xff are NaN and avoided).
  std::vector<fp8e4m3> fp8s(size_t n) {
    std::vector<fp8e4m3> v(n);
    for (auto& x : v) {
      uint8_t code = static_cast<uint8_t>(next() & 0xff);
      if ((code & 0x7f) == 0x7f) code ^= 0x01;
      x = fp8e4m3{code};
    }
    return v;
  }

 private:
  uint64_t s_;
};

/// --reps, --seed, --device; --help prints the usage. A fresh seed unless --seed.
inline Options parse_options(int argc, char** argv, const char* name, const char* what) {
  Options o;
  std::random_device rd;
  o.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--reps" && has_value) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--seed" && has_value) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--device" && has_value) {
      o.device = std::atoi(argv[++i]);
    } else {
      std::printf("%s: %s\nusage: %s [--reps N] [--seed S] [--device D]\n", name, what, name);
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

/// Whether a CUDA device is there to run on; else prints that `name` skips.
inline bool have_device(const char* name) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    std::printf("%s: no CUDA device, skipped\n", name);
    return false;
  }
  return true;
}

/// The launch context of a playground's own launches: its own stream, the device's size, the
/// default kernel policy (programmatic launch off: each timed launch stands alone).
inline ops::cuda::LaunchCtx make_ctx(int device) {
  MTP_CUDA_CHECK(cudaSetDevice(device));
  ops::cuda::LaunchCtx ctx;
  cudaDeviceProp prop{};
  MTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  ctx.num_sms = prop.multiProcessorCount;
  ctx.pdl_capable = false;
  ctx.policy.pdl = false;
  MTP_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  return ctx;
}

/// Median milliseconds of `reps` calls of f on `stream` (each between two events), after 3
/// warm-up calls.
template <typename F>
double median_ms(cudaStream_t stream, int reps, F&& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a = nullptr, b = nullptr;
  MTP_CUDA_CHECK(cudaEventCreate(&a));
  MTP_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    MTP_CUDA_CHECK(cudaEventRecord(a, stream));
    f();
    MTP_CUDA_CHECK(cudaEventRecord(b, stream));
    MTP_CUDA_CHECK(cudaEventSynchronize(b));
    MTP_CUDA_CHECK(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], a, b));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[static_cast<size_t>(reps / 2)];
}

/// The checks of one run: each prints a line; failed() once any check failed.
class Report {
 public:
  explicit Report(uint64_t seed) : seed_(seed) {}
  /// BF16 outputs against the reference: |got - want| <= ulps BF16 ulps of want + floor_rel x the
  /// largest |want|, and at least min_identical of them bit-identical (from 256 elements).
  bool bf16_close(const std::string& what, const std::vector<bf16>& got, const std::vector<bf16>& want,
                  double ulps = 2.0, double floor_rel = 1.0 / 4096, double min_identical = 0.9) {
    double top = 0;
    for (const bf16& w : want) top = std::max(top, static_cast<double>(std::fabs(to_float(w))));
    size_t bad = 0, identical = 0;
    std::string first;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      const double g = to_float(got[i]), c = to_float(want[i]);
      identical += got[i].bits == want[i].bits;
      int e = 0;
      std::frexp(std::fabs(c), &e);
      const double ulp = c == 0.0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, e - 8);
      if (!(std::fabs(g - c) <= ulps * ulp + floor_rel * top)) {
        if (bad < 5) first += str("\n    [", i, "] got ", g, " want ", c);
        ++bad;
      }
    }
    const double frac =
        want.empty() ? 1.0 : static_cast<double>(identical) / static_cast<double>(want.size());
    const bool ok = got.size() == want.size() && bad == 0 && (want.size() < 256 || frac >= min_identical);
    return record(ok, str(what, ": ", bad, " of ", want.size(), " outside ", ulps, " ulps + ", floor_rel,
                          " x max, ", frac, " bit-identical (at least ", min_identical, ")", first));
  }
  /// fp32 outputs: |got - want| <= rel |want| + floor_rel x the largest |want| (equal infinities pass).
  bool f32_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                 double rel, double floor_rel) {
    double top = 0;
    for (float w : want)
      if (std::isfinite(w)) top = std::max(top, static_cast<double>(std::fabs(w)));
    size_t bad = 0;
    std::string first;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      const double g = got[i], c = want[i];
      if (std::isinf(c) && g == c) continue;
      if (!(std::fabs(g - c) <= rel * std::fabs(c) + floor_rel * top)) {
        if (bad < 5) first += str("\n    [", i, "] got ", g, " want ", c);
        ++bad;
      }
    }
    return record(
        got.size() == want.size() && bad == 0,
        str(what, ": ", bad, " of ", want.size(), " outside rel ", rel, " + ", floor_rel, " x max", first));
  }
  /// Byte-equal vectors.
  template <typename T>
  bool equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    size_t bad = 0, first = got.size();
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
        if (first == got.size()) first = i;
        ++bad;
      }
    }
    return record(got.size() == want.size() && bad == 0,
                  str(what, ": ", bad, " of ", want.size(), " differ", bad ? str(", first at ", first) : ""));
  }
  bool check(const std::string& what, bool ok) { return record(ok, what); }
  /// A timing line: the playground's kernel against the library's choice for the shape.
  static void timing(const std::string& what, double ms, const std::string& against, double against_ms) {
    std::printf("  time %-48s %9.2f us   %s %9.2f us (%.2fx)\n", what.c_str(), 1e3 * ms, against.c_str(),
                1e3 * against_ms, against_ms > 0 ? ms / against_ms : 0.0);
  }
  bool failed() const { return failures_ > 0; }
  /// The exit status: 1 when a check failed (the seed is printed again), else 0.
  int finish(const char* name) const {
    if (failures_ > 0) {
      std::printf("%s: %d check(s) failed (seed %llu)\n", name, failures_,
                  static_cast<unsigned long long>(seed_));
      return 1;
    }
    std::printf("%s: every check held\n", name);
    return 0;
  }

 private:
  bool record(bool ok, const std::string& line) {
    std::printf("  %s %s\n", ok ? "ok  " : "FAIL", line.c_str());
    if (!ok) ++failures_;
    return ok;
  }
  uint64_t seed_;
  int failures_ = 0;
};

/// A device buffer of n T's, freed at the end of its scope.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    MTP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes()));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return std::max<size_t>(1, n_ * sizeof(T)); }
  void upload(const std::vector<T>& host) {
    MTP_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  /// Fills every byte (0xFF: NaN poison for floats, so an element a kernel forgot to write fails).
  void poison(uint8_t byte = 0xFF) { MTP_CUDA_CHECK(cudaMemset(p_, byte, bytes())); }
  std::vector<T> download() const {
    MTP_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n_);
    MTP_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace mtplab::dev
