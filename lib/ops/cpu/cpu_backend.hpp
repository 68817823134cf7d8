// The CPU reference backend (internal to lib/ops): the definition every GPU kernel is tested
// against. Every op runs at once on the calling thread, single-threaded, in plain loops.
//
// Invariants:
// - Each op computes exactly the function documented in ops/ops.hpp and docs/numerics.md, with
//   fp32 accumulation and BF16 rounding (round-to-nearest-even) at exactly the stated points.
//   Summation order is not part of the contract; the CPU sums in 8 interleaved fp32 lanes.
// - Backend memory is host memory from aligned operator new (64-byte alignment), so a pointer
//   from allocate() can be read directly; positions and tokens are read from it at call time.
// - Bad arguments (sizes, positions past the cache, unknown blocks) throw mtplab::Error naming
//   the op and the value; a GPU kernel cannot check what the CPU checks here.
// - One instance is not thread-safe (scratch buffers are members).
// - The kernel record notes "cpu" for each op whose CUDA kernel a dispatch rule picks (linear,
//   linear_f32, linear_fp8, linear_rows_group, head_argmax, head_argmax_batch, the indexer's
//   scores and selection, the MLA batch ops, moe_experts_grouped), so a point's record is never
//   empty and says which backend computed each op.
#pragma once
#include <vector>

#include "ops/ops.hpp"

namespace mtplab::ops::cpu {

class CpuBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::cpu; }
  std::string device_name() const override { return "cpu"; }

  void* allocate(size_t bytes) override;
  void release(void* ptr) noexcept override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill_bytes(void* dst, uint8_t value, size_t bytes) override;
  void synchronize() override {}

  /// Stored (validated) and reported; the reference computes the same function under any policy.
  void set_kernel_policy(const KernelPolicy& policy) override;
  const KernelPolicy& kernel_policy() const override { return policy_; }

  std::unique_ptr<Event> make_event() override;
  double elapsed_ms(const Event& start, const Event& end) override;

  void add_i32(const int32_t* src, int32_t add, int32_t* dst) override;

  void rmsnorm(const bf16* x, const bf16* w, bf16* y, int rows, int n, float eps) override;
  void embed_rmsnorm(const bf16* table, const int32_t* token, const bf16* w, bf16* y, int n, float eps);
  void layernorm(const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int n, float eps) override;

  void linear(const bf16* W, const bf16* X, bf16* Y, int rows, int n_out, int k, RowsMode mode) override;
  void linear_f32(const bf16* W, const bf16* X, float* Y, int rows, int n_out, int k, RowsMode mode) override;
  void linear_group(std::span<const LinearOut> outs, const bf16* x, int k);
  void linear_rows_group(std::span<const LinearOut> outs, const bf16* X, int rows, int k) override;
  void linear_fp8(const fp8e4m3* W, const float* row_scale, const bf16* X, bf16* Y, int rows, int n_out,
                  int k) override;

  void head_argmax(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x, int n, int k,
                   int64_t index_base, bf16* logits, ArgMax* out, HeadExtras extras = {}) override;
  void argmax(const bf16* x, int n, int64_t index_base, ArgMax* out) override;

  void argmax_pack_key(const ArgMax* in, uint64_t* key) override;
  void argmax_unpack_key(const uint64_t* key, int32_t* token) override;
  void argmax_pick(const ArgMax* pairs, int n, int32_t* token) override;

  void residual_add(const bf16* x, const float* delta, bf16* y, int n) override;
  void residual_add_rmsnorm(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed, int n,
                            float eps);
  void add(const bf16* a, const bf16* b, bf16* y, int n) override;
  void to_bf16(const float* x, bf16* y, int n) override;
  void accumulate_f32(const float* x, float* y, int n) override;
  void scale_f32(float* x, float s, int n) override;

  void indexer_store(const bf16* k_normed, const float* gate, const float* ape, const int32_t* pos,
                     bf16* k_cache, float* gate_cache, uint8_t* valid, float* pool_keys, int D,
                     int P) override;
  void indexer_norm_store(const bf16* k_pre, const bf16* w, const bf16* b, float eps, const float* gate,
                          const float* ape, const int32_t* pos, bf16* k_cache, float* gate_cache,
                          uint8_t* valid, float* pool_keys, int D, int P);
  void indexer_scores(const float* q, const float* w, const float* pool_keys, const int32_t* pos,
                      float* scores, int n_heads, int D, int P, int max_pools) override;
  void indexer_select(const float* scores, const int32_t* pos, int32_t* selection, int K, int P,
                      int max_pools) override;

  void kv_write(const bf16* c_kv, const int32_t* block_table, const int32_t* pos, KvCache cache) override;
  void kv_norm_write(const bf16* ckv_pre, const bf16* w, float eps, const int32_t* block_table,
                     const int32_t* pos, KvCache cache);
  void mla_absorb_q(const bf16* q, const bf16* W_kvb, bf16* q_abs, int n_heads, int dqk, int dv, int kv_lora);
  void mla_decode(const bf16* q_abs, const int32_t* selection, int width, const int32_t* block_table,
                  KvCache cache, bf16* o_lat, int n_heads, float softmax_scale);
  void mla_out_v(const bf16* o_lat, const bf16* W_kvb, bf16* o, int n_heads, int dqk, int dv, int kv_lora);

  void moe_route(const float* logits, const float* bias, int num_experts, int top_k, int n_group,
                 int topk_group, float scaling, int32_t* idx, float* weights);
  void moe_experts(const bf16* x, const ExpertWeights& w, const int32_t* idx, const float* weights, int top_k,
                   float limit, float* out);
  void moe_experts_shared(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                          const float* weights, int top_k, const ExpertWeights& shared, float limit,
                          float* out);

  // ---- batched rows: each row through the single-row code above (bit-identical by construction),
  // except the head and the grouped experts, which read each weight row once for all rows.
  void embed_rmsnorm_batch(const bf16* table, const int32_t* tokens, const RowBatch& rb, const bf16* w,
                           bf16* y, int ld_y, int n, float eps) override;
  void rmsnorm_strided(const bf16* x, int ld_x, const bf16* w, bf16* y, int ld_y, int rows, int n,
                       float eps) override;
  void residual_add_rmsnorm_rows(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed,
                                 int rows, int n, float eps) override;
  void head_argmax_batch(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x,
                         const RowBatch& rb, int n, int k, int64_t index_base, bf16* logits, int ld_logits,
                         ArgMax* out, HeadExtras extras = {}) override;
  void argmax_batch(const bf16* x, int ld_x, int rows, int n, int64_t index_base, ArgMax* out) override;
  void argmax_unpack_key_batch(const uint64_t* key, int32_t* token, int rows) override;
  void argmax_pick_batch(const ArgMax* pairs, int n, int rows, int32_t* token) override;
  void kv_norm_write_batch(const bf16* ckv_pre, const bf16* w, float eps, const RowBatch& rb,
                           KvSlots kv) override;
  void indexer_norm_store_batch(const bf16* k_pre, const bf16* w, const bf16* b, float eps, const float* gate,
                                const float* ape, const RowBatch& rb, IndexerSlots idx) override;
  void indexer_scores_batch(const float* q, const float* w, const RowBatch& rb, IndexerSlots idx,
                            float* scores, int n_heads) override;
  void indexer_select_batch(const float* scores, const RowBatch& rb, int32_t* selection, int K, int P,
                            int max_pools) override;
  void indexer_share_select(const int32_t* anchor, const int32_t* anchor_pos, const int32_t* pos, int rows,
                            int32_t* selection, int width, int K, int P) override;
  void mla_absorb_q_batch(const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows, int n_heads, int dqk,
                          int dv, int kv_lora) override;
  void mla_decode_batch(const bf16* q_abs, const int32_t* selection, int width, const RowBatch& rb,
                        KvSlots kv, bf16* o_lat, int n_heads, float softmax_scale) override;
  void mla_out_v_batch(const bf16* o_lat, const bf16* W_kvb, bf16* o, int rows, int n_heads, int dqk, int dv,
                       int kv_lora) override;
  void moe_route_batch(const float* logits, const float* bias, const RowBatch& rb, int num_experts, int top_k,
                       int n_group, int topk_group, float scaling, int32_t* idx, float* weights) override;
  void moe_experts_grouped(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                           const float* weights, const RowBatch& rb, int top_k, const ExpertWeights* shared,
                           float limit, float* out) override;

  // ---- sampling statistics (cpu/sample_stats.cpp) ---------------------------------------------
  void logit_stats_batch(const LogitRows& view, const int32_t* requested, const SampleParams* params,
                         LogitStats* out) override;
  void logit_stats_combine(const LogitStats* parts, int n, int rows, const SampleParams* params,
                           TokenStats* out) override;

 private:
  /// Notes in the kernel record (Backend::kernels_chosen) that `op` ran the reference, "cpu": the
  /// ops whose CUDA kernel a dispatch rule picks, under their Backend names.
  void ran(const char* op) { kernels_chosen_.note(op, "cpu"); }
  /// A row op noted as run (ran): row r of the [rows, in_row] input through `one` into row r of the
  /// [rows, out_row] output (mla.cpp).
  template <typename F>
  void ran_per_row(const char* op, int rows, const bf16* in, size_t in_row, bf16* out, size_t out_row,
                   F&& one);
  /// Y[r] = sum_j W[., j] X[r, j] in fp32 (no rounding), rows at a time; shared by the linears.
  void linear_fp32_rows(const bf16* W, const bf16* X, float* Y, int rows, int n_out, int k, const char* op);
  /// linear_group and linear_rows_group: the outputs checked (op and x_name in the messages), then
  /// each computed by the separate linear / linear_f32 (+ scale_f32) of `rows` rows under `mode`.
  void linear_outs(const char* op, const char* x_name, std::span<const LinearOut> outs, const bf16* X,
                   int rows, int k, RowsMode mode);
  /// Resolves logical row `row` of a paged cache to its slot (block table lookup, checked).
  int64_t cache_slot(const int32_t* block_table, const KvCache& cache, int64_t row, const char* op) const;

  // Scratch reused across calls (single-threaded backend).
  std::vector<float> xf_;
  std::vector<float> tmp_;
  std::vector<float> tmp2_;
  std::vector<bf16> row_;  ///< the normed row of the fused cache writes (kv_norm_write, indexer_norm_store)
  KernelPolicy policy_;
};

}  // namespace mtplab::ops::cpu
