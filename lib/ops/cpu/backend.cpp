// CPU reference backend: memory, timing, device-side scalars and the elementwise ops.
//
// Invariants: memory is 64-byte aligned host memory (operator new with align_val_t), so any
// element type can live in it and the vector loops see aligned rows; allocate(0) returns null and
// release(null) is a no-op. Upload, download and copy are memcpy (the CPU has no stream, so
// "in stream order" is program order).
#include <chrono>
#include <cstring>
#include <new>

#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_math.hpp"

namespace mtplab::ops {

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<cpu::CpuBackend>(); }

namespace cpu {
namespace {

constexpr std::align_val_t kAlignment{64};

class CpuEvent final : public Event {
 public:
  void record() override {
    at_ = std::chrono::steady_clock::now();
    recorded_ = true;
  }
  bool recorded() const { return recorded_; }
  std::chrono::steady_clock::time_point at() const { return at_; }

 private:
  std::chrono::steady_clock::time_point at_{};
  bool recorded_ = false;
};

}  // namespace

// ---- memory -------------------------------------------------------------------------------------

void* CpuBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  try {
    return ::operator new(bytes, kAlignment);
  } catch (const std::bad_alloc&) {
    MTP_FAIL("ops::cpu: cannot allocate ", bytes, " bytes of host memory");
  }
}

void CpuBackend::release(void* ptr) noexcept {
  if (ptr) ::operator delete(ptr, kAlignment);
}

void CpuBackend::upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  require_ptr("upload", "dst", dst);
  require_ptr("upload", "host_src", host_src);
  std::memcpy(dst, host_src, bytes);
}

void CpuBackend::download(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require_ptr("download", "host_dst", host_dst);
  require_ptr("download", "src", src);
  std::memcpy(host_dst, src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require_ptr("copy", "dst", dst);
  require_ptr("copy", "src", src);
  std::memmove(dst, src, bytes);
}

void CpuBackend::fill_bytes(void* dst, uint8_t value, size_t bytes) {
  if (bytes == 0) return;
  require_ptr("fill_bytes", "dst", dst);
  std::memset(dst, value, bytes);
}

void CpuBackend::set_kernel_policy(const KernelPolicy& policy) {
  validate(policy);
  policy_ = policy;
}

// ---- timing -------------------------------------------------------------------------------------

std::unique_ptr<Event> CpuBackend::make_event() { return std::make_unique<CpuEvent>(); }

double CpuBackend::elapsed_ms(const Event& start, const Event& end) {
  const auto* s = dynamic_cast<const CpuEvent*>(&start);
  const auto* e = dynamic_cast<const CpuEvent*>(&end);
  MTP_REQUIRE(s && e, "ops::cpu::elapsed_ms: an event was not made by the cpu backend");
  MTP_REQUIRE(s->recorded() && e->recorded(), "ops::cpu::elapsed_ms: event ", s->recorded() ? "end" : "start",
              " was never recorded");
  return std::chrono::duration<double, std::milli>(e->at() - s->at()).count();
}

// ---- scalars and elementwise --------------------------------------------------------------------

void CpuBackend::add_i32(const int32_t* src, int32_t add, int32_t* dst) {
  require_ptr("add_i32", "src", src);
  require_ptr("add_i32", "dst", dst);
  dst[0] = static_cast<int32_t>(static_cast<int64_t>(src[0]) + add);
}

void CpuBackend::residual_add(const bf16* x, const float* delta, bf16* y, int n) {
  require_size("residual_add", "n", n);
  for (int i = 0; i < n; ++i) y[i] = mtplab::to_bf16(to_float(x[i]) + delta[i]);
}

void CpuBackend::add(const bf16* a, const bf16* b, bf16* y, int n) {
  require_size("add", "n", n);
  for (int i = 0; i < n; ++i) y[i] = mtplab::to_bf16(to_float(a[i]) + to_float(b[i]));
}

void CpuBackend::to_bf16(const float* x, bf16* y, int n) {
  require_size("to_bf16", "n", n);
  for (int i = 0; i < n; ++i) y[i] = mtplab::to_bf16(x[i]);
}

void CpuBackend::accumulate_f32(const float* x, float* y, int n) {
  require_size("accumulate_f32", "n", n);
  for (int i = 0; i < n; ++i) y[i] += x[i];
}

void CpuBackend::scale_f32(float* x, float s, int n) {
  require_size("scale_f32", "n", n);
  for (int i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace cpu
}  // namespace mtplab::ops
