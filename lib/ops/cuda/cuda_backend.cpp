// The CUDA backend: every op of ops/ops.hpp enqueued on one non-blocking stream that the
// backend creates, plus make_cuda_backend / cuda_backend_available (the non-CUDA fallbacks live
// in lib/ops/backend.cpp under #if !defined(MTPLAB_HAVE_CUDA)).
//
// Invariants:
// - One backend drives one device; the constructor makes it current, and the process is
//   expected to use one device (one rank per GPU).
// - Nothing here synchronises except download / upload / synchronize / elapsed_ms and the
//   growth of a scratch buffer, which are refused while the stream is being captured
//   (begin_capture .. end_capture): run an op once before capturing it so its scratch is sized.
// - The kernel of every op with more than one is the rule's of dispatch.cu (with the policy's
//   forced choices); the backend asks it and runs the answer.
// - RowsMode::batched with rows > 1 goes through the multi-row GEMV (cuda::rows_gemv) where the
//   policy's rows_linear picks it (dispatch.cu's rows_linear_on_gemv), else through cuBLASLt (BF16
//   in, fp32 accumulate, BF16 or fp32 out; one handle and one workspace per backend, one cached
//   plan per shape). Everything else is a GEMV launch per row.
// - The batched-rows ops (B sequences per op) run the batched launchers of the family headers
//   (norm.hpp, dense.hpp, ...), one launch per op for all rows.
// - The kernel choices are the backend's KernelPolicy, kept in ctx_ (the launchers read them
//   there): never changed while a capture is open, and a graph launches only under the policy it
//   was recorded with.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <map>
#include <tuple>

#include "core/log.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/elementwise.hpp"
#include "ops/cuda/indexer.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/mla.hpp"
#include "ops/cuda/moe.hpp"
#include "ops/cuda/norm.hpp"
#include "ops/cuda/sample_stats.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops {
namespace cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaStream_t stream) : stream_(stream) { MTP_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record() override {
    MTP_CUDA_CHECK(cudaEventRecord(event_, stream_));
    recorded_ = true;
  }
  cudaEvent_t event() const { return event_; }
  bool recorded() const { return recorded_; }

 private:
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

/// A CUDA graph executable; launched on the backend's stream, only while the backend's policy
/// (`current`, the backend's own, which outlives its graphs) is the one it was recorded under.
class CudaGraph final : public Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream, const KernelPolicy& current)
      : exec_(exec), stream_(stream), current_(current), recorded_(current) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void launch() override {
    MTP_REQUIRE(current_ == recorded_, "ops::cuda: a graph recorded under the kernel policy ",
                to_string(recorded_), " launched under ", to_string(current_),
                "; record it again after changing the policy");
    MTP_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
  }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  const KernelPolicy& current_;
  KernelPolicy recorded_;
};

/// Device scratch that only grows, and never while the stream is being captured.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (ptr_) cudaFree(ptr_);
  }
  void* ensure(size_t bytes, cudaStream_t stream, const char* what) {
    if (bytes <= bytes_) return ptr_;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    MTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    MTP_REQUIRE(status == cudaStreamCaptureStatusNone, "ops::cuda: the ", what, " scratch must grow to ",
                bytes,
                " bytes while the stream is being captured; run the op once before capturing the graph");
    MTP_CUDA_CHECK(cudaStreamSynchronize(stream));  // in-flight kernels may still use the old buffer
    if (ptr_) MTP_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
    MTP_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Largest power of two (up to 256) dividing the address: cuBLASLt's alignment preference.
uint32_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

void destroy_plan(GemmPlan& plan) {
  if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.op) cublasLtMatmulDescDestroy(plan.op);
  plan = GemmPlan{};
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    int count = 0;
    MTP_CUDA_CHECK(cudaGetDeviceCount(&count));
    MTP_REQUIRE(device >= 0 && device < count, "ops::cuda: device ", device, " requested but ", count,
                " CUDA device(s) are visible");
    MTP_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    MTP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name_ = prop.name;
    ctx_.num_sms = prop.multiProcessorCount;
    ctx_.record = &kernels_chosen_;  // the launchers note their choices (Backend::kernels_chosen)
    // Programmatic dependent launch needs sm_90; the policy's pdl = off turns it off (docs/kernels.md).
    ctx_.pdl_capable = prop.major >= 9;
    MTP_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    MTP_CUBLAS_CHECK(cublasLtCreate(&lt_));
    MTP_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    argmax_.capacity = gemv_max_grid(ctx_.num_sms);
    MTP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&argmax_.partials),
                              sizeof(unsigned long long) * static_cast<size_t>(argmax_.capacity)));
    MTP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&argmax_.counter), sizeof(unsigned int)));
    MTP_CUDA_CHECK(cudaMemset(argmax_.counter, 0, sizeof(unsigned int)));
    log_debug("ops::cuda: device ", device, " (", name_, ", ", ctx_.num_sms, " SMs), programmatic launch ",
              ctx_.pdl_capable ? "supported" : "not supported");
  }

  ~CudaBackend() override {
    // Destructors must not throw: errors here are reported by the next CUDA call, if any.
    cudaStreamSynchronize(ctx_.stream);
    for (auto& [key, plan] : plans_) destroy_plan(plan);
    for (auto& [key, plan] : fp8_plans_) destroy_plan(plan);
    cublasLtDestroy(lt_);
    cudaFree(workspace_);
    cudaFree(argmax_.partials);
    cudaFree(argmax_.counter);
    cudaFree(head_batch_.best);
    cudaFree(head_batch_.counter);
    cudaFree(head_batch_.packed_x);
    cudaStreamDestroy(ctx_.stream);
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  BackendKind kind() const override { return BackendKind::cuda; }
  std::string device_name() const override { return name_; }

  // ---- memory ---------------------------------------------------------------------------------
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      size_t free_bytes = 0, total = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_bytes, &total);
      MTP_FAIL("ops::cuda: cannot allocate ", bytes, " bytes on device ", device_, " (", free_bytes, " of ",
               total, " bytes free): ", cudaGetErrorString(err));
    }
    return p;
  }
  void release(void* ptr) noexcept override {
    if (ptr) cudaFree(ptr);
  }
  void upload(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    require_not_capturing("upload");
    MTP_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ctx_.stream));
    MTP_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));  // the host buffer may be reused on return
  }
  void download(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    require_not_capturing("download");
    MTP_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream));
    MTP_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    MTP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_.stream));
  }
  void fill_bytes(void* dst, uint8_t value, size_t bytes) override {
    if (bytes == 0) return;
    MTP_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, ctx_.stream));
  }
  void synchronize() override {
    require_not_capturing("synchronize");
    MTP_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void* native_stream() override { return ctx_.stream; }

  // ---- kernel choices -------------------------------------------------------------------------
  void set_kernel_policy(const KernelPolicy& policy) override {
    MTP_REQUIRE(!capturing_,
                "ops::cuda::set_kernel_policy while a graph is being captured: set the policy "
                "before begin_capture (the recorded kernels would follow the old one)");
    validate(policy);
    ctx_.policy = policy;
    log_debug("ops::cuda: kernel policy ", to_string(policy));
  }
  const KernelPolicy& kernel_policy() const override { return ctx_.policy; }

  // ---- timing ---------------------------------------------------------------------------------
  std::unique_ptr<Event> make_event() override { return std::make_unique<CudaEvent>(ctx_.stream); }
  double elapsed_ms(const Event& start, const Event& end) override {
    const auto* s = dynamic_cast<const CudaEvent*>(&start);
    const auto* e = dynamic_cast<const CudaEvent*>(&end);
    MTP_REQUIRE(s && e, "ops::cuda::elapsed_ms: an event was not made by the cuda backend");
    MTP_REQUIRE(s->recorded() && e->recorded(), "ops::cuda::elapsed_ms: event ",
                s->recorded() ? "end" : "start", " was never recorded");
    MTP_CUDA_CHECK(cudaEventSynchronize(e->event()));
    float ms = 0.0f;
    MTP_CUDA_CHECK(cudaEventElapsedTime(&ms, s->event(), e->event()));
    return ms;
  }

  // ---- graphs ---------------------------------------------------------------------------------
  bool supports_graphs() const override { return true; }
  void begin_capture() override {
    MTP_REQUIRE(!capturing_, "ops::cuda: begin_capture while a capture is already open");
    // Thread-local mode: only this thread's unsafe calls (a cudaMalloc, a synchronize) break the
    // capture; NCCL's own threads are left alone.
    MTP_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    ctx_.capturing = true;
  }
  std::unique_ptr<Graph> end_capture() override {
    MTP_REQUIRE(capturing_, "ops::cuda: end_capture without begin_capture");
    capturing_ = false;
    ctx_.capturing = false;
    cudaGraph_t graph = nullptr;
    MTP_CUDA_CHECK(cudaStreamEndCapture(ctx_.stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    MTP_CUDA_CHECK(err);
    return std::make_unique<CudaGraph>(exec, ctx_.stream, ctx_.policy);
  }

  // ---- scalars, norms, elementwise ------------------------------------------------------------
  uint64_t kernels_enqueued() const override { return g_kernels_enqueued.load(std::memory_order_relaxed); }
  void add_i32(const int32_t* src, int32_t add, int32_t* dst) override { cuda::add_i32(ctx_, src, add, dst); }
  void rmsnorm(const bf16* x, const bf16* w, bf16* y, int rows, int n, float eps) override {
    cuda::rmsnorm(ctx_, x, w, y, rows, n, eps);
  }
  void layernorm(const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int n, float eps) override {
    cuda::layernorm(ctx_, x, w, b, y, rows, n, eps);
  }
  void residual_add(const bf16* x, const float* delta, bf16* y, int n) override {
    require_n("residual_add", n);
    cuda::residual_add(ctx_, x, delta, y, n);
  }
  void add(const bf16* a, const bf16* b, bf16* y, int n) override {
    require_n("add", n);
    cuda::add(ctx_, a, b, y, n);
  }
  void to_bf16(const float* x, bf16* y, int n) override {
    require_n("to_bf16", n);
    cuda::to_bf16(ctx_, x, y, n);
  }
  void accumulate_f32(const float* x, float* y, int n) override {
    require_n("accumulate_f32", n);
    cuda::accumulate_f32(ctx_, x, y, n);
  }
  void scale_f32(float* x, float s, int n) override {
    require_n("scale_f32", n);
    cuda::scale_f32(ctx_, x, s, n);
  }

  // ---- linear layers --------------------------------------------------------------------------
  void linear(const bf16* W, const bf16* X, bf16* Y, int rows, int n_out, int k, RowsMode mode) override {
    linear_any(W, X, Y, false, rows, n_out, k, mode, "linear");
  }
  void linear_f32(const bf16* W, const bf16* X, float* Y, int rows, int n_out, int k,
                  RowsMode mode) override {
    linear_any(W, X, Y, true, rows, n_out, k, mode, "linear_f32");
  }
  void linear_rows_group(std::span<const LinearOut> outs, const bf16* X, int rows, int k) override {
    MTP_REQUIRE(!outs.empty() && static_cast<int>(outs.size()) <= kMaxLinearGroup,
                "ops::cuda::linear_rows_group: ", outs.size(), " outputs (1 .. ", kMaxLinearGroup,
                " allowed)");
    MTP_REQUIRE(rows >= 1 && k >= 1, "ops::cuda::linear_rows_group: rows ", rows, ", k ", k);
    for (size_t i = 0; i < outs.size(); ++i) {
      const LinearOut& o = outs[i];
      MTP_REQUIRE(o.W && o.y && o.n_out >= 1, "ops::cuda::linear_rows_group: output ", i, " has W ", o.W,
                  ", y ", o.y, ", n_out ", o.n_out);
      MTP_REQUIRE(o.f32_out || o.f32_scale == 1.0f, "ops::cuda::linear_rows_group: output ", i,
                  " is BF16 but has f32_scale ", o.f32_scale, " (only fp32 outputs are scaled)");
    }
    // One row: the batched linear is the single-row GEMV, whose bits linear_group keeps.
    if (rows == 1) return cuda::gemv_group(ctx_, outs, X, k);
    // The outputs the multi-row GEMV takes share one launch (each output's bits are its own
    // launch's: dense.hpp); the rest run as their own batched linear, in order.
    LinearOut grouped[kMaxLinearGroup];
    int n_grouped = 0, n_sum = 0;
    for (const LinearOut& o : outs) {
      if (rows_gemv_wanted(rows, o.n_out, k, o.W, X)) {
        grouped[n_grouped++] = o;
        n_sum += o.n_out;
        continue;
      }
      linear_any(o.W, X, o.y, o.f32_out, rows, o.n_out, k, RowsMode::batched,
                 o.f32_out ? "linear_f32" : "linear");
      if (o.f32_out && o.f32_scale != 1.0f) scale_f32(static_cast<float*>(o.y), o.f32_scale, rows * o.n_out);
    }
    if (n_grouped > 0) {
      cuda::record_kernel(ctx_, "linear_rows_group", "rows_gemv");
      cuda::rows_gemv_group(ctx_, std::span<const LinearOut>(grouped, static_cast<size_t>(n_grouped)), X,
                            rows, k, rows_gemv_scratch(n_sum, k));
    }
  }
  void linear_fp8(const fp8e4m3* W, const float* row_scale, const bf16* X, bf16* Y, int rows, int n_out,
                  int k) override {
    MTP_REQUIRE(rows >= 1, "ops::cuda::linear_fp8: rows = ", rows);
    MTP_REQUIRE(row_scale, "ops::cuda::linear_fp8: row_scale is null");
    for (int r = 0; r < rows; ++r) {
      cuda::gemv_fp8(ctx_, W, row_scale, X + static_cast<size_t>(r) * k, Y + static_cast<size_t>(r) * n_out,
                     n_out, k);
    }
  }

  void head_argmax(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x, int n, int k,
                   int64_t index_base, bf16* logits, ArgMax* out, HeadExtras extras = {}) override {
    require_index_range("head_argmax", index_base, n);
    MTP_REQUIRE(out, "ops::cuda::head_argmax: out is null");
    if (W_fp8) {
      MTP_REQUIRE(row_scale, "ops::cuda::head_argmax: row_scale (FP8 head) is null");
    } else {
      MTP_REQUIRE(W, "ops::cuda::head_argmax: W is null");
    }
    cuda::head_argmax(ctx_, W, W_fp8, row_scale, x, n, k, index_base, logits, out, extras, argmax_);
  }
  void argmax(const bf16* x, int n, int64_t index_base, ArgMax* out) override {
    require_index_range("argmax", index_base, n);
    cuda::argmax(ctx_, x, n, index_base, out, argmax_);
  }
  void argmax_pack_key(const ArgMax* in, uint64_t* key) override { cuda::argmax_pack_key(ctx_, in, key); }
  void argmax_unpack_key(const uint64_t* key, int32_t* token) override {
    cuda::argmax_unpack_key(ctx_, key, token);
  }
  void argmax_pick(const ArgMax* pairs, int n, int32_t* token) override {
    cuda::argmax_pick(ctx_, pairs, n, token);
  }

  // ---- indexer --------------------------------------------------------------------------------
  void indexer_store(const bf16* k_normed, const float* gate, const float* ape, const int32_t* pos,
                     bf16* k_cache, float* gate_cache, uint8_t* valid, float* pool_keys, int D,
                     int P) override {
    cuda::indexer_store(ctx_, k_normed, gate, ape, pos, k_cache, gate_cache, valid, pool_keys, D, P);
  }
  void indexer_scores(const float* q, const float* w, const float* pool_keys, const int32_t* pos,
                      float* scores, int n_heads, int D, int P, int max_pools) override {
    cuda::indexer_scores(ctx_, q, w, pool_keys, pos, scores, n_heads, D, P, max_pools);
  }
  void indexer_select(const float* scores, const int32_t* pos, int32_t* selection, int K, int P,
                      int max_pools) override {
    cuda::indexer_select(ctx_, scores, pos, selection, K, P, max_pools);
  }

  // ---- MLA ------------------------------------------------------------------------------------
  void kv_write(const bf16* c_kv, const int32_t* block_table, const int32_t* pos, KvCache cache) override {
    require_cache("kv_write", cache);
    cuda::kv_write(ctx_, c_kv, block_table, pos, cache);
  }

  // ---- batched rows (ops.hpp, "batched rows"; the launchers: the family headers' batched rows) --
  // One launch per op for all rows (docs/kernels.md, "Backend rules"); the skinny GEMMs take up
  // to cuda::kMaxBatchRows rows per launch (more: cuBLASLt), the grouped experts up to
  // cuda::kMaxMoeLaunchRows, the cuBLASLt head cuda::head_lt_launch_rows; larger batches
  // run in groups of that many. The host checks sizes and pointers; slots, positions, tokens and
  // selections are read on the device only (a padded row, slot < 0, is skipped there), so the
  // distinct-slot and in-range rules the CPU reference enforces are the caller's here.
  void embed_rmsnorm_batch(const bf16* table, const int32_t* tokens, const RowBatch& rb, const bf16* w,
                           bf16* y, int ld_y, int n, float eps) override {
    const char* op = "embed_rmsnorm_batch";
    const int32_t* slot = rb.slot;
    const int rows = rb.rows;
    require_rows(op, slot, rows);
    MTP_REQUIRE(n >= 1 && ld_y >= n, "ops::cuda::", op, ": n ", n, ", ld_y ", ld_y);
    require_ptrs(op, {table, tokens, w, y});
    cuda::embed_rmsnorm_batch(ctx_, table, tokens, slot, w, y, ld_y, rows, n, eps);
  }
  void rmsnorm_strided(const bf16* x, int ld_x, const bf16* w, bf16* y, int ld_y, int rows, int n,
                       float eps) override {
    MTP_REQUIRE(rows >= 1 && n >= 1 && ld_x >= n && ld_y >= n, "ops::cuda::rmsnorm_strided: rows ", rows,
                ", n ", n, ", ld_x ", ld_x, ", ld_y ", ld_y);
    require_ptrs("rmsnorm_strided", {x, w, y});
    cuda::rmsnorm_strided(ctx_, x, ld_x, w, y, ld_y, rows, n, eps);
  }
  void residual_add_rmsnorm_rows(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed,
                                 int rows, int n, float eps) override {
    MTP_REQUIRE(rows >= 1 && n >= 1, "ops::cuda::residual_add_rmsnorm_rows: rows ", rows, ", n ", n);
    require_ptrs("residual_add_rmsnorm_rows", {x, delta, y, w, normed});
    const size_t all = static_cast<size_t>(rows) * n;
    MTP_REQUIRE(normed + all <= y || y + all <= normed,
                "ops::cuda::residual_add_rmsnorm_rows: normed overlaps y");
    cuda::residual_add_rmsnorm_rows(ctx_, x, delta, y, w, normed, rows, n, eps);
  }
  void head_argmax_batch(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x,
                         const RowBatch& rb, int n, int k, int64_t index_base, bf16* logits, int ld_logits,
                         ArgMax* out, HeadExtras extras = {}) override {
    const char* op = "head_argmax_batch";
    const int32_t* slot = rb.slot;
    const int rows = rb.rows;
    require_rows(op, slot, rows);
    require_index_range(op, index_base, n);
    require_ptrs(op, {x, out});
    if (W_fp8) {
      MTP_REQUIRE(row_scale, "ops::cuda::head_argmax_batch: row_scale (FP8 head) is null");
    } else {
      MTP_REQUIRE(W, "ops::cuda::head_argmax_batch: W is null");
    }
    if (logits)
      MTP_REQUIRE(ld_logits >= n, "ops::cuda::head_argmax_batch: ld_logits ", ld_logits, " < n ", n);
    const bool fp8 = W_fp8 != nullptr;
    if (cuda::head_on_cublaslt(ctx_.policy, fp8, rows, [&] { return fp8_plans_exist(rows, n, k); })) {
      cuda::record_kernel(ctx_, op, "cublaslt");
      head_argmax_lt(W, W_fp8, row_scale, x, slot, rows, n, k, index_base, logits, ld_logits, out, extras);
      return;
    }
    const cuda::HeadBatchScratch s = head_batch_scratch(W_fp8 ? k : 0);
    for (int b0 = 0; b0 < rows; b0 += cuda::kMaxBatchRows) {
      const int r = std::min(cuda::kMaxBatchRows, rows - b0);
      const HeadExtras e{extras.key ? extras.key + b0 : nullptr, extras.token ? extras.token + b0 : nullptr};
      cuda::head_argmax_batch(ctx_, W, W_fp8, row_scale, x + static_cast<size_t>(b0) * k, slot + b0, r, n, k,
                              index_base, logits ? logits + static_cast<size_t>(b0) * ld_logits : nullptr,
                              ld_logits, out + b0, e, s);
    }
  }
  void argmax_batch(const bf16* x, int ld_x, int rows, int n, int64_t index_base, ArgMax* out) override {
    MTP_REQUIRE(rows >= 1 && ld_x >= n, "ops::cuda::argmax_batch: rows ", rows, ", n ", n, ", ld_x ", ld_x);
    require_index_range("argmax_batch", index_base, n);
    require_ptrs("argmax_batch", {x, out});
    cuda::argmax_batch(ctx_, x, ld_x, rows, n, index_base, out, argmax_);
  }
  void argmax_unpack_key_batch(const uint64_t* key, int32_t* token, int rows) override {
    MTP_REQUIRE(rows >= 1, "ops::cuda::argmax_unpack_key_batch: rows = ", rows);
    require_ptrs("argmax_unpack_key_batch", {key, token});
    cuda::argmax_unpack_key_batch(ctx_, key, token, rows);
  }
  void argmax_pick_batch(const ArgMax* pairs, int n, int rows, int32_t* token) override {
    MTP_REQUIRE(rows >= 1 && n >= 1, "ops::cuda::argmax_pick_batch: rows ", rows, ", n ", n);
    require_ptrs("argmax_pick_batch", {pairs, token});
    cuda::argmax_pick_batch(ctx_, pairs, n, rows, token);
  }
  // The rows of one slot write distinct cache rows: independent blocks, whatever max_seq_rows.
  void kv_norm_write_batch(const bf16* ckv_pre, const bf16* w, float eps, const RowBatch& rb,
                           KvSlots kv) override {
    const char* op = "kv_norm_write_batch";
    const auto [slot, pos, rows, max_seq_rows] = rb;
    require_rows(op, rb);
    require_kv_slots(op, kv);
    require_ptrs(op, {ckv_pre, w, pos});
    cuda::kv_norm_write_batch(ctx_, ckv_pre, w, eps, slot, pos, rows, kv);
  }
  void indexer_norm_store_batch(const bf16* k_pre, const bf16* w, const bf16* b, float eps, const float* gate,
                                const float* ape, const RowBatch& rb, IndexerSlots idx) override {
    const char* op = "indexer_norm_store_batch";
    const auto [slot, pos, rows, max_seq_rows] = rb;
    MTP_REQUIRE(rb.max_seq_rows >= 1, "ops::cuda::", op, ": max_seq_rows ", rb.max_seq_rows);
    require_rows(op, rb);
    require_indexer_slots(op, idx);
    require_ptrs(op, {k_pre, w, b, gate, ape, pos});
    MTP_REQUIRE(reinterpret_cast<uintptr_t>(idx.k_cache) % 16 == 0,
                "ops::cuda::indexer_norm_store_batch: k_cache must be 16-byte aligned");
    // Rows of one slot in one launch: a pool's key waits for all its rows (two launches).
    cuda::indexer_norm_store_batch(ctx_, k_pre, w, b, eps, gate, ape, slot, pos, rows, idx,
                                   /*keys_after_rows=*/rb.max_seq_rows > 1);
  }
  void indexer_scores_batch(const float* q, const float* w, const RowBatch& rb, IndexerSlots idx,
                            float* scores, int n_heads) override {
    const char* op = "indexer_scores_batch";
    const auto [slot, pos, rows, max_seq_rows] = rb;
    require_rows(op, rb);
    require_indexer_slots(op, idx);
    require_ptrs(op, {q, w, pos, scores});
    MTP_REQUIRE(n_heads >= 1 && idx.D >= 4 && idx.D % 4 == 0, "ops::cuda::indexer_scores_batch: n_heads ",
                n_heads, ", D ", idx.D, " (a multiple of 4)");
    MTP_REQUIRE(
        reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(idx.pool_keys) % 16 == 0,
        "ops::cuda::indexer_scores_batch: q and pool_keys must be 16-byte aligned");
    MTP_REQUIRE(rows <= 65535, "ops::cuda::indexer_scores_batch: ", rows, " rows (at most 65535)");
    cuda::indexer_scores_batch(ctx_, q, w, slot, pos, rows, idx, scores, n_heads);
  }
  void indexer_select_batch(const float* scores, const RowBatch& rb, int32_t* selection, int K, int P,
                            int max_pools) override {
    const char* op = "indexer_select_batch";
    const auto [slot, pos, rows, max_seq_rows] = rb;
    require_rows(op, rb);
    MTP_REQUIRE(K >= 1 && P >= 1 && max_pools >= 1, "ops::cuda::indexer_select_batch: K ", K, ", P ", P,
                ", max_pools ", max_pools);
    require_ptrs(op, {scores, pos, selection});
    cuda::indexer_select_batch(ctx_, scores, slot, pos, rows, selection, K, P, max_pools);
  }
  void indexer_share_select(const int32_t* anchor, const int32_t* anchor_pos, const int32_t* pos, int rows,
                            int32_t* selection, int width, int K, int P) override {
    const char* op = "indexer_share_select";
    MTP_REQUIRE(rows >= 1 && rows <= 65535 && K >= 1 && P >= 1 && width >= K + P - 1, "ops::cuda::", op,
                ": rows ", rows, ", K ", K, ", P ", P, ", width ", width, " (width >= K + P - 1)");
    require_ptrs(op, {anchor, anchor_pos, pos, selection});
    cuda::indexer_share_select(ctx_, anchor, anchor_pos, pos, rows, selection, width, K, P);
  }
  void mla_absorb_q_batch(const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows, int n_heads, int dqk,
                          int dv, int kv_lora) override {
    MTP_REQUIRE(rows >= 1 && rows <= 65535 * 32, "ops::cuda::mla_absorb_q_batch: rows = ", rows);
    require_ptrs("mla_absorb_q_batch", {q, W_kvb, q_abs});
    cuda::mla_absorb_q_batch(ctx_, q, W_kvb, q_abs, rows, n_heads, dqk, dv, kv_lora);
  }
  void mla_decode_batch(const bf16* q_abs, const int32_t* selection, int width, const RowBatch& rb,
                        KvSlots kv, bf16* o_lat, int n_heads, float softmax_scale) override {
    const char* op = "mla_decode_batch";
    const int32_t* slot = rb.slot;
    const int rows = rb.rows;
    require_rows(op, slot, rows);
    require_kv_slots(op, kv);
    require_ptrs(op, {q_abs, o_lat});
    MTP_REQUIRE(n_heads >= 1 && width >= 0 && rows <= 65535, "ops::cuda::mla_decode_batch: n_heads ", n_heads,
                ", width ", width, ", rows ", rows, " (at most 65535)");
    MTP_REQUIRE(width == 0 || selection, "ops::cuda::mla_decode_batch: selection is null");
    const bool fp8 = kv.cache.dtype == KvDtype::fp8;
    const int splits = cuda::mla_batch_splits(ctx_, width, n_heads, rows, fp8);
    const size_t floats =
        cuda::mla_decode_batch_scratch_floats(ctx_, splits, n_heads, kv.cache.kv_lora, rows, fp8);
    float* scratch =
        floats ? static_cast<float*>(mla_batch_scratch_.ensure(sizeof(float) * floats, ctx_.stream, op))
               : nullptr;
    cuda::mla_decode_batch(ctx_, q_abs, selection, width, slot, rows, kv, o_lat, n_heads, softmax_scale,
                           splits, scratch);
  }
  void mla_out_v_batch(const bf16* o_lat, const bf16* W_kvb, bf16* o, int rows, int n_heads, int dqk, int dv,
                       int kv_lora) override {
    MTP_REQUIRE(rows >= 1 && n_heads >= 1 && dqk >= 0 && dv >= 1 && kv_lora >= 1,
                "ops::cuda::mla_out_v_batch: rows ", rows, ", n_heads ", n_heads, ", dqk ", dqk, ", dv ", dv,
                ", kv_lora ", kv_lora);
    require_ptrs("mla_out_v_batch", {o_lat, W_kvb, o});
    const size_t in_row = static_cast<size_t>(n_heads) * kv_lora, out_row = static_cast<size_t>(n_heads) * dv;
    for (int b0 = 0; b0 < rows; b0 += cuda::kMaxBatchRows)
      cuda::mla_out_v_batch(ctx_, o_lat + b0 * in_row, W_kvb, o + b0 * out_row,
                            std::min(cuda::kMaxBatchRows, rows - b0), n_heads, dqk, dv, kv_lora);
  }
  void moe_route_batch(const float* logits, const float* bias, const RowBatch& rb, int num_experts, int top_k,
                       int n_group, int topk_group, float scaling, int32_t* idx, float* weights) override {
    const char* op = "moe_route_batch";
    const int32_t* slot = rb.slot;
    const int rows = rb.rows;
    require_rows(op, slot, rows);
    require_ptrs(op, {logits, idx, weights});
    MTP_REQUIRE(num_experts >= 1 && top_k >= 1 && top_k <= num_experts && n_group >= 1,
                "ops::cuda::moe_route_batch: num_experts ", num_experts, ", top_k ", top_k, ", n_group ",
                n_group);
    if (n_group > 1) {
      MTP_REQUIRE(num_experts % n_group == 0 && num_experts / n_group >= 2 && topk_group >= 1 &&
                      topk_group <= n_group && top_k <= topk_group * (num_experts / n_group),
                  "ops::cuda::moe_route_batch: bad group limit (num_experts ", num_experts, ", n_group ",
                  n_group, ", topk_group ", topk_group, ", top_k ", top_k, ")");
    }
    cuda::moe_route_batch(ctx_, logits, bias, slot, rows, num_experts, top_k, n_group, topk_group, scaling,
                          idx, weights);
  }
  void moe_experts_grouped(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                           const float* weights, const RowBatch& rb, int top_k, const ExpertWeights* shared,
                           float limit, float* out) override {
    const char* op = "moe_experts_grouped";
    const int32_t* slot = rb.slot;
    const int rows = rb.rows;
    require_rows(op, slot, rows);
    require_ptrs(op, {x, out});
    MTP_REQUIRE(top_k >= 0 && routed.hidden >= 1 && routed.inter >= 1 && routed.num_local >= 0,
                "ops::cuda::moe_experts_grouped: top_k ", top_k, ", hidden ", routed.hidden, ", inter ",
                routed.inter, ", num_local ", routed.num_local);
    MTP_REQUIRE(top_k == 0 || (idx && weights), "ops::cuda::moe_experts_grouped: idx or weights is null");
    MTP_REQUIRE(routed.num_local == 0 || (routed.gate && routed.up && routed.down), "ops::cuda::", op, ": ",
                routed.num_local, " local experts but null weights");
    if (shared) {
      MTP_REQUIRE(
          shared->hidden == routed.hidden && shared->inter >= 1 && shared->gate && shared->up && shared->down,
          "ops::cuda::moe_experts_grouped: the shared expert (hidden ", shared->hidden, ", inter ",
          shared->inter, ") must match hidden ", routed.hidden, " and have weights");
    }
    // One launch for up to kMaxMoeLaunchRows rows (each active expert read once), more in
    // launches of that many.
    const int most = cuda::kMaxMoeLaunchRows;
    const int chunk = std::min(rows, most);
    bf16* act = static_cast<bf16*>(moe_batch_act_.ensure(
        sizeof(bf16) * std::max<size_t>(1, cuda::moe_grouped_act_elems(chunk, top_k, routed.inter,
                                                                       shared ? shared->inter : 0)),
        ctx_.stream, op));
    const size_t wide_bytes = cuda::moe_grouped_wide_bytes(chunk, top_k, routed.num_local, routed.hidden);
    void* wide = wide_bytes ? moe_wide_.ensure(wide_bytes, ctx_.stream, op) : nullptr;
    const size_t H = static_cast<size_t>(routed.hidden);
    for (int b0 = 0; b0 < rows; b0 += most) {
      const int r = std::min(most, rows - b0);
      cuda::moe_experts_grouped(ctx_, x + b0 * H, routed, top_k ? idx + static_cast<size_t>(b0) * top_k : idx,
                                top_k ? weights + static_cast<size_t>(b0) * top_k : weights, slot + b0, r,
                                top_k, shared, limit, act, out + b0 * H, wide);
    }
  }

  // The parameters live in device memory and are not read here: drafter::sample_params checks
  // them where they are written (the CPU reference checks them at every call).
  void logit_stats_batch(const LogitRows& v, const int32_t* requested, const SampleParams* params,
                         LogitStats* out) override {
    const char* op = "logit_stats_batch";
    require_ptrs(op, {v.data, params, out});
    MTP_REQUIRE(v.rows >= 1 && v.rows <= 65535 && v.segments >= 1, "ops::cuda::", op, ": rows ", v.rows,
                " (1 .. 65535), segments ", v.segments);
    if (v.segments == 1) {
      MTP_REQUIRE(v.n >= 1 && v.ld >= v.n, "ops::cuda::", op, ": n ", v.n, ", ld ", v.ld);
    } else {
      MTP_REQUIRE(v.vocab >= v.segments && v.ld >= vocab_segment(v.vocab, v.segments, 0).count &&
                      v.seg_stride >= static_cast<int64_t>(v.rows) * v.ld,
                  "ops::cuda::", op, ": vocab ", v.vocab, " in ", v.segments, " segments, ld ", v.ld,
                  ", seg_stride ", v.seg_stride);
    }
    // A fixed size, allocated and zeroed on the first call (outside any capture: the first stats
    // pass runs op by op), left zero by the kernels.
    const size_t bytes = cuda::stats_scratch_bytes();
    if (!stats_zeroed_) {
      void* scratch = stats_scratch_.ensure(bytes, ctx_.stream, op);
      MTP_CUDA_CHECK(cudaMemsetAsync(scratch, 0, bytes, ctx_.stream));
      stats_zeroed_ = true;
    }
    cuda::logit_stats_batch(ctx_, v, requested, params, out, stats_scratch_.ensure(bytes, ctx_.stream, op));
  }
  void logit_stats_combine(const LogitStats* parts, int n, int rows, const SampleParams* params,
                           TokenStats* out) override {
    const char* op = "logit_stats_combine";
    require_ptrs(op, {parts, params, out});
    MTP_REQUIRE(n >= 1 && rows >= 1, "ops::cuda::", op, ": n ", n, ", rows ", rows);
    cuda::logit_stats_combine(ctx_, parts, n, rows, params, out);
  }

 private:
  static void require_rows(const char* op, const int32_t* slot, int rows) {
    MTP_REQUIRE(rows >= 1, "ops::cuda::", op, ": rows = ", rows);
    MTP_REQUIRE(slot, "ops::cuda::", op, ": slot is null");
  }
  static void require_rows(const char* op, const RowBatch& rb) { require_rows(op, rb.slot, rb.rows); }
  static void require_ptrs(const char* op, std::initializer_list<const void*> ptrs) {
    int i = 0;
    for (const void* p : ptrs) {
      MTP_REQUIRE(p, "ops::cuda::", op, ": pointer argument ", i, " is null");
      ++i;
    }
  }
  static void require_kv_slots(const char* op, const KvSlots& kv) {
    require_cache(op, kv.cache);
    MTP_REQUIRE(kv.block_tables && kv.slots >= 1 && kv.max_blocks >= 1, "ops::cuda::", op,
                ": KvSlots has no block tables, ", kv.slots, " slots, ", kv.max_blocks, " blocks per slot");
  }
  static void require_indexer_slots(const char* op, const IndexerSlots& idx) {
    MTP_REQUIRE(idx.k_cache && idx.gate_cache && idx.valid && idx.pool_keys, "ops::cuda::", op,
                ": IndexerSlots has a null array");
    MTP_REQUIRE(
        idx.slots >= 1 && idx.D >= 1 && idx.P >= 1 && idx.max_rows >= idx.P && idx.max_rows % idx.P == 0,
        "ops::cuda::", op, ": IndexerSlots of ", idx.slots, " slots, D ", idx.D, ", P ", idx.P, ", max_rows ",
        idx.max_rows, " (a whole number of pools)");
  }
  /// Whether cuBLASLt has an FP8 algorithm for every launch of a head of `rows` rows
  /// (cuda::head_lt_launch_rows at a time, then the rest): the condition of the FP8 head on
  /// cuBLASLt (dispatch.cu's head_on_cublaslt), else the fused kernels (cuda::head_argmax_batch).
  bool fp8_plans_exist(int rows, int n, int k) {
    const int chunk = cuda::head_lt_launch_rows(rows);
    const int rest = rows % chunk;
    return (rows < chunk || fp8_plan_for(chunk, n, k) != nullptr) &&
           (rest == 0 || fp8_plan_for(rest, n, k) != nullptr);
  }
  /// head_argmax_batch through cuBLASLt: logits [r][n] into scratch, the per-row argmax over them,
  /// then head_finish_rows writes the live rows' results (and their logits when wanted). FP8 rows
  /// (W_fp8): x split into two E4M3 parts a row (cuda::head_split_e4m3), cuBLASLt's FP8 GEMM of W
  /// and the parts into fp32 [2r][n], then one pass over it that scales the parts' sums into the
  /// BF16 logits (stored only when wanted) and takes their argmax (cuda::head_combine_argmax_e4m3),
  /// and the finish.
  void head_argmax_lt(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x,
                      const int32_t* slot, int rows, int n, int k, int64_t index_base, bf16* logits,
                      int ld_logits, ArgMax* out, HeadExtras extras) {
    const char* op = "head_argmax_batch (cublaslt)";
    // Sized for a full launch of head_lt_launch_rows rows whatever this call's rows, so that a graph
    // captured at a larger batch bucket than the eager call before it needs no growth (Scratch
    // refuses to grow while capturing) up to kMaxBatchRows rows.
    const int chunk = cuda::head_lt_launch_rows(rows);
    const size_t logit_bytes = W_fp8 ? 0 : (sizeof(bf16) * static_cast<size_t>(chunk) * n + 255) / 256 * 256;
    const size_t pair_bytes = (sizeof(ArgMax) * chunk + 255) / 256 * 256;
    const size_t d_bytes = W_fp8 ? sizeof(float) * 2 * static_cast<size_t>(chunk) * n : 0;
    const size_t part_bytes = W_fp8 ? (2 * static_cast<size_t>(chunk) * k + 255) / 256 * 256 : 0;
    const size_t shift_bytes = W_fp8 ? sizeof(int) * chunk : 0;
    auto* base = static_cast<uint8_t*>(head_lt_scratch_.ensure(
        logit_bytes + pair_bytes + d_bytes + part_bytes + shift_bytes, ctx_.stream, op));
    auto* buf = reinterpret_cast<bf16*>(base);
    auto* pairs = reinterpret_cast<ArgMax*>(base + logit_bytes);
    auto* D = reinterpret_cast<float*>(base + logit_bytes + pair_bytes);
    auto* parts = base + logit_bytes + pair_bytes + d_bytes;
    auto* shifts = reinterpret_cast<int*>(parts + part_bytes);
    for (int b0 = 0; b0 < rows; b0 += chunk) {
      const int r = std::min(chunk, rows - b0);
      const int32_t* sl = slot ? slot + b0 : nullptr;
      bf16* dst = logits ? logits + static_cast<size_t>(b0) * ld_logits : nullptr;
      const HeadExtras e{extras.key ? extras.key + b0 : nullptr, extras.token ? extras.token + b0 : nullptr};
      if (W_fp8) {
        // The logits go straight to dst (the combine is the argmax's pass): finish copies nothing.
        cuda::head_split_e4m3(ctx_, x + static_cast<size_t>(b0) * k, sl, r, k, parts, shifts);
        gemm_fp8(W_fp8, parts, D, r, n, k);
        cuda::head_combine_argmax_e4m3(ctx_, D, r, n, row_scale, shifts, sl, index_base, dst, ld_logits,
                                       pairs, argmax_);
        cuda::head_finish_rows(ctx_, pairs, sl, r, nullptr, n, nullptr, ld_logits, out + b0, e);
      } else {
        gemm(W, x + static_cast<size_t>(b0) * k, buf, false, r, n, k);
        cuda::argmax_batch(ctx_, buf, n, r, n, index_base, pairs, argmax_);
        cuda::head_finish_rows(ctx_, pairs, sl, r, buf, n, dst, ld_logits, out + b0, e);
      }
    }
  }
  /// The head's per-row keys and counter: zero when allocated, reset by every launch's last block.
  cuda::HeadBatchScratch head_batch_scratch(int k) {
    const size_t packed = cuda::head_packed_x_elems(k);
    if (head_batch_.packed_elems < packed) {
      require_not_capturing("head_argmax_batch (first call at this k: allocates its scratch)");
      cudaFree(head_batch_.packed_x);
      head_batch_.packed_x = nullptr;
      head_batch_.packed_elems = 0;
      MTP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&head_batch_.packed_x), sizeof(bf16) * packed));
      head_batch_.packed_elems = packed;
    }
    if (!head_batch_.best) {
      require_not_capturing("head_argmax_batch (first call: allocates its scratch)");
      MTP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&head_batch_.best),
                                sizeof(unsigned long long) * cuda::kMaxBatchRows));
      MTP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&head_batch_.counter), sizeof(unsigned int)));
      MTP_CUDA_CHECK(cudaMemsetAsync(head_batch_.best, 0, sizeof(unsigned long long) * cuda::kMaxBatchRows,
                                     ctx_.stream));
      MTP_CUDA_CHECK(cudaMemsetAsync(head_batch_.counter, 0, sizeof(unsigned int), ctx_.stream));
    }
    return head_batch_;
  }
  void require_not_capturing(const char* op) const {
    MTP_REQUIRE(!capturing_, "ops::cuda::", op,
                " while a graph is being captured: it would synchronise the stream; do it before "
                "begin_capture or after end_capture");
  }
  static void require_n(const char* op, int n) { MTP_REQUIRE(n >= 1, "ops::cuda::", op, ": n = ", n); }
  static void require_index_range(const char* op, int64_t index_base, int n) {
    MTP_REQUIRE(n >= 1, "ops::cuda::", op, ": n = ", n);
    MTP_REQUIRE(index_base >= 0 && index_base + n - 1 <= std::numeric_limits<int32_t>::max(),
                "ops::cuda::", op, ": index_base ", index_base, " + ", n - 1,
                " does not fit a non-negative int32 token id");
  }
  static void require_cache(const char* op, const KvCache& cache) {
    MTP_REQUIRE(cache.data && cache.num_blocks >= 1 && cache.block_size >= 1 && cache.kv_lora >= 1,
                "ops::cuda::", op, ": cache is empty or has a non-positive size");
    if (cache.dtype == KvDtype::fp8) {
      MTP_REQUIRE(std::isfinite(cache.scale) && cache.scale > 0.0f, "ops::cuda::", op, ": FP8 cache scale ",
                  cache.scale, " must be finite and positive");
    }
  }

  void linear_any(const bf16* W, const bf16* X, void* Y, bool f32_out, int rows, int n_out, int k,
                  RowsMode mode, const char* op) {
    MTP_REQUIRE(rows >= 1 && n_out >= 1 && k >= 1, "ops::cuda::", op, ": rows ", rows, ", n_out ", n_out,
                ", k ", k);
    if (rows > 1 && mode == RowsMode::batched) {
      // The multi-row GEMV (KernelPolicy::rows_linear), else cuBLASLt.
      const bool gemv = rows_gemv_wanted(rows, n_out, k, W, X);
      cuda::record_kernel(ctx_, op, gemv ? "rows_gemv" : "cublaslt");
      if (gemv) {
        cuda::rows_gemv(ctx_, W, X, Y, f32_out, rows, n_out, k, rows_gemv_scratch(n_out, k));
      } else {
        gemm(W, X, Y, f32_out, rows, n_out, k);
      }
      return;
    }
    const size_t out_elem = f32_out ? sizeof(float) : sizeof(bf16);
    for (int r = 0; r < rows; ++r) {
      cuda::gemv_bf16(ctx_, W, X + static_cast<size_t>(r) * k,
                      static_cast<uint8_t*>(Y) + static_cast<size_t>(r) * n_out * out_elem, f32_out, n_out, k,
                      GemvRowMap{n_out, 0, 0, 0});
    }
  }

  /// Whether a batched linear of `rows` rows (>= 2) runs the multi-row GEMV (dispatch.cu).
  bool rows_gemv_wanted(int rows, int n, int k, const void* W, const void* X) const {
    return cuda::rows_linear_on_gemv(ctx_.policy, rows, n, k,
                                     pointer_alignment(W) >= 16 && pointer_alignment(X) >= 16);
  }
  /// rows_gemv's workspace and counters for [n x k], sized for cuda::kMaxRowsGemv rows whatever
  /// this call's (a graph captured at a larger batch than the eager call before it needs no growth;
  /// Scratch refuses to grow while capturing). Counters are zeroed when allocated; every launch
  /// leaves them zero.
  cuda::RowsGemvScratch rows_gemv_scratch(int n, int k) {
    cuda::RowsGemvScratch s;
    const size_t floats = cuda::rows_gemv_ws_floats(n, k);
    const int counters = cuda::rows_gemv_counters(n, k);
    if (floats == 0) return s;
    s.ws =
        static_cast<float*>(rows_gemv_ws_.ensure(sizeof(float) * floats, ctx_.stream, "rows_gemv workspace"));
    s.ws_floats = floats;
    if (counters > rows_gemv_counter_count_) {
      void* c = rows_gemv_counter_.ensure(sizeof(unsigned int) * counters, ctx_.stream, "rows_gemv counter");
      MTP_CUDA_CHECK(cudaMemsetAsync(c, 0, sizeof(unsigned int) * counters, ctx_.stream));
      rows_gemv_counter_count_ = counters;
    }
    s.counter = static_cast<unsigned int*>(rows_gemv_counter_.ensure(
        sizeof(unsigned int) * rows_gemv_counter_count_, ctx_.stream, "rows_gemv counter"));
    s.counters = rows_gemv_counter_count_;
    return s;
  }

  /// Y[rows, n] = X[rows, k] W[n, k]^T. Column-major view: D(n x rows) = op_T(A: k x n) * B(k x rows).
  void gemm(const bf16* W, const bf16* X, void* Y, bool f32_out, int rows, int n, int k) {
    const uint32_t align = std::min({pointer_alignment(W), pointer_alignment(X), pointer_alignment(Y)});
    const auto key = std::make_tuple(rows, n, k, f32_out, align);
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, make_plan(rows, n, k, f32_out, align)).first;
    const GemmPlan& plan = it->second;
    const float alpha = 1.0f, beta = 0.0f;
    MTP_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &alpha, W, plan.a, X, plan.b, &beta, Y, plan.c, Y, plan.c,
                                    &plan.algo, workspace_, kWorkspaceBytes, ctx_.stream));
  }

  /// D[2 rows, n] (fp32) = parts[2 rows, k] (E4M3) W[n, k]^T (E4M3): cuBLASLt's FP8 GEMM in its
  /// accurate accumulation (no fast accumulation), unit scales (the row scales are the combine's).
  void gemm_fp8(const fp8e4m3* W, const uint8_t* parts, float* D, int rows, int n, int k) {
    const GemmPlan* plan = fp8_plan_for(rows, n, k);
    MTP_REQUIRE(plan != nullptr,
                "ops::cuda::head_argmax_batch (cublaslt): cuBLASLt has no FP8 algorithm for [", 2 * rows,
                " x ", k, "] x [", n, " x ", k, "]^T");
    const float alpha = 1.0f, beta = 0.0f;
    MTP_CUBLAS_CHECK(cublasLtMatmul(lt_, plan->op, &alpha, W, plan->a, parts, plan->b, &beta, D, plan->c, D,
                                    plan->c, &plan->algo, workspace_, kWorkspaceBytes, ctx_.stream));
  }
  /// The FP8 plan for `rows` batch rows (2 rows of parts), or nullptr where cuBLASLt has none; the
  /// scratch pointers are 256-byte aligned (head_argmax_lt), so the plan depends on the shape only.
  const GemmPlan* fp8_plan_for(int rows, int n, int k) {
    const auto key = std::make_tuple(rows, n, k);
    auto it = fp8_plans_.find(key);
    if (it == fp8_plans_.end()) it = fp8_plans_.emplace(key, make_fp8_plan(rows, n, k)).first;
    return it->second.op ? &it->second : nullptr;
  }
  /// The fp32-compute operation both plans use: D = op_T(A) * B.
  static void create_tn_op(GemmPlan& plan) {
    MTP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    MTP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    MTP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  }
  GemmPlan make_fp8_plan(int rows, int n, int k) {
    GemmPlan plan;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    try {
      create_tn_op(plan);
      const int8_t fast_accum = 0;
      MTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                      sizeof(fast_accum)));
      MTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, k, n, k));
      MTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, k, 2 * rows, k));
      MTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, n, 2 * rows, n));
      MTP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = kWorkspaceBytes;
      MTP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &ws, sizeof(ws)));
      // An unsupported combination is a status, not an error: the caller falls back (or names it).
      st = cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &result,
                                          &found);
    } catch (...) {
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      destroy_plan(plan);
      throw;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found < 1) {
      log_debug("ops::cuda: cuBLASLt has no FP8 algorithm for [", 2 * rows, " x ", k, "] x [", n, " x ", k,
                "]^T (status ", static_cast<int>(st), ")");
      destroy_plan(plan);  // op == nullptr: no algorithm
      return plan;
    }
    plan.algo = result.algo;
    return plan;
  }

  GemmPlan make_plan(int rows, int n, int k, bool f32_out, uint32_t align) {
    GemmPlan plan;
    create_tn_op(plan);
    MTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, k, n, k));
    MTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, k, rows, k));
    MTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, f32_out ? CUDA_R_32F : CUDA_R_16BF, n, rows, n));
    cublasLtMatmulPreference_t pref = nullptr;
    MTP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspaceBytes;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    try {
      MTP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &ws, sizeof(ws)));
      for (auto attr :
           {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        MTP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
      }
      MTP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1,
                                                      &result, &found));
    } catch (...) {
      cublasLtMatmulPreferenceDestroy(pref);
      throw;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    MTP_REQUIRE(found >= 1, "ops::cuda: cuBLASLt has no algorithm for [", rows, " x ", k, "] x [", n, " x ",
                k, "]^T with ", f32_out ? "fp32" : "BF16", " output and ", align, "-byte alignment");
    plan.algo = result.algo;
    return plan;
  }

  int device_;
  bool capturing_ = false;
  std::string name_;
  LaunchCtx ctx_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  ArgmaxScratch argmax_;
  Scratch moe_act_;
  Scratch mla_scratch_;
  Scratch mla_batch_scratch_;
  Scratch moe_batch_act_;
  Scratch moe_wide_;
  Scratch stats_scratch_;      // logit_stats_batch's histograms (zero between launches)
  Scratch head_lt_scratch_;    // the cuBLASLt head's logits and per-row pairs
  Scratch rows_gemv_ws_;       // rows_gemv's tile sums
  Scratch rows_gemv_counter_;  // rows_gemv's per-group counters (zero between launches)
  int rows_gemv_counter_count_ = 0;
  bool stats_zeroed_ = false;
  cuda::HeadBatchScratch head_batch_;
  std::map<std::tuple<int, int, int, bool, uint32_t>, GemmPlan> plans_;
  std::map<std::tuple<int, int, int>, GemmPlan> fp8_plans_;  // op == nullptr: no algorithm
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<cuda::CudaBackend>(device); }

bool cuda_backend_available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return false;
  }
  return count > 0;
}

}  // namespace mtplab::ops
