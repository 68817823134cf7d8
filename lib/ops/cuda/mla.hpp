// Host launchers of the MLA kernels (mla.cu; the CPU reference: cpu/mla.cpp). What every launcher
// shares (LaunchCtx, the invariants): kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

// ---- one row ------------------------------------------------------------------------------------------
void mla_absorb_q(const LaunchCtx& ctx, const bf16* q, const bf16* W_kvb, bf16* q_abs, int n_heads, int dqk,
                  int dv, int kv_lora);
void kv_write(const LaunchCtx& ctx, const bf16* c_kv, const int32_t* block_table, const int32_t* pos,
              const KvCache& cache);
/// rmsnorm of one row of cache.kv_lora, stored as kv_write stores it; one block. The norm's path
/// (register-resident or scalar) is the one rmsnorm takes for the same x, w and an aligned output,
/// so the cache bytes are rmsnorm + kv_write's. cache.data 16-byte aligned.
void kv_norm_write(const LaunchCtx& ctx, const bf16* x, const bf16* w, float eps, const int32_t* block_table,
                   const int32_t* pos, const KvCache& cache);

// ---- batched rows -------------------------------------------------------------------------------------
void kv_norm_write_batch(const LaunchCtx& ctx, const bf16* ckv_pre, const bf16* w, float eps,
                         const int32_t* slot, const int32_t* pos, int rows, const KvSlots& kv);
void mla_absorb_q_batch(const LaunchCtx& ctx, const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows,
                        int n_heads, int dqk, int dv, int kv_lora);
/// The batched decode (one row included: the single-sequence decode is a batch of one), by the
/// policy's mla_batch and mla_decode (docs/kernels.md): tiles, one block per (row, head tile,
/// split), the v2 kernel (splits a multiple of 8, at most 32 chunks each, merged per cluster of 8
/// over distributed shared memory; a large batch: one cluster per (row, head tile), no scratch, no
/// combine) or the v1 kernel (a combine over every split); shared2 / shared32, one block per (row,
/// split, 32 / 64 heads) whose head tiles share each staged chunk (v1's scores, one softmax per
/// tile; shared32 on chunks of 32 rows). ctx.policy.mla_batch_splits, when not 0, forces the split
/// count (v2: rounded up to a multiple of 8; the shared kernels: capped at the chunks).
/// The kernel and the split count: dispatch.cu (mla_batch_kernel, mla_batch_splits); the fp32
/// scratch mla_decode_batch needs for them (0: none), under the policy it runs with:
size_t mla_decode_batch_scratch_floats(const LaunchCtx& ctx, int splits, int n_heads, int kv_lora, int rows,
                                       bool fp8_cache);
/// slot == nullptr: every row reads slot 0 (the single-sequence decode's path: one row, kv holding
/// that sequence's KvCache and block table).
void mla_decode_batch(const LaunchCtx& ctx, const bf16* q_abs, const int32_t* selection, int width,
                      const int32_t* slot, int rows, const KvSlots& kv, bf16* o_lat, int n_heads,
                      float softmax_scale, int splits, float* scratch);
/// o_lat[b, h] from `partials` fp32 partials [rows][n_heads][partials][2 + kv_lora] (m, l, acc), merged
/// in partial order; rows with slot[b] < 0 are skipped (slot may be nullptr: none).
void mla_combine_rows(const LaunchCtx& ctx, const float* scratch, const int32_t* slot, int rows, int partials,
                      int n_heads, int kv_lora, bf16* o_lat);
void mla_out_v_batch(const LaunchCtx& ctx, const bf16* o_lat, const bf16* W_kvb, bf16* o, int rows,
                     int n_heads, int dqk, int dv, int kv_lora);

}  // namespace mtplab::ops::cuda
