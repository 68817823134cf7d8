// Host launchers of the pooled indexer kernels (indexer.cu; the CPU reference: cpu/indexer.cpp). What every
// launcher shares (LaunchCtx, the invariants): kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

// ---- one row ------------------------------------------------------------------------------------------
void indexer_store(const LaunchCtx& ctx, const bf16* k_normed, const float* gate, const float* ape,
                   const int32_t* pos, bf16* k_cache, float* gate_cache, uint8_t* valid, float* pool_keys,
                   int D, int P);
/// indexer_scores_batch at one row, pool_keys as its slot 0 (the same kernel and bits as a batch of
/// one). q and pool_keys 16-byte aligned.
void indexer_scores(const LaunchCtx& ctx, const float* q, const float* w, const float* pool_keys,
                    const int32_t* pos, float* scores, int n_heads, int D, int P, int max_pools);
/// layernorm of one row of D into k_cache row pos[0], then the rest of indexer_store; one block.
/// The norm's path is layernorm's for the same x, w, b and an aligned output (the same bits as
/// layernorm + indexer_store). k_cache 16-byte aligned.
void indexer_norm_store(const LaunchCtx& ctx, const bf16* x, const bf16* w, const bf16* b, float eps,
                        const float* gate, const float* ape, const int32_t* pos, bf16* k_cache,
                        float* gate_cache, uint8_t* valid, float* pool_keys, int D, int P);
/// The radix selection of one row (11/11/10-bit digits, stopping at the first digit whose bin is
/// taken whole; docs/kernels.md).
void indexer_select(const LaunchCtx& ctx, const float* scores, const int32_t* pos, int32_t* selection, int K,
                    int P, int max_pools);

// ---- batched rows -------------------------------------------------------------------------------------
/// The rows' layer norms, gate rows, valid flags and completed pools' keys. keys_after_rows: rows of
/// one slot share the launch, so a pool's key may need rows other blocks write: the rows are stored
/// by one launch and the keys by a second (the same bits as one launch per row in batch order).
void indexer_norm_store_batch(const LaunchCtx& ctx, const bf16* k_pre, const bf16* w, const bf16* b,
                              float eps, const float* gate, const float* ape, const int32_t* slot,
                              const int32_t* pos, int rows, const IndexerSlots& idx,
                              bool keys_after_rows = false);
/// The batched pool scores, by ctx.policy.indexer_scores (dispatch.cu's indexer_scores_tiled), the
/// same bits either way: pools4, a warp per 4 pools of a row, lane h one head; tiled, a warp per 16
/// pools of a row, each lane 4 heads x 4 pools on register tiles (32 heads only). slot == nullptr:
/// one row reading slot 0.
void indexer_scores_batch(const LaunchCtx& ctx, const float* q, const float* w, const int32_t* slot,
                          const int32_t* pos, int rows, const IndexerSlots& idx, float* scores, int n_heads);
void indexer_select_batch(const LaunchCtx& ctx, const float* scores, const int32_t* slot, const int32_t* pos,
                          int rows, int32_t* selection, int K, int P, int max_pools);
/// The index_share selection of each row (ops.hpp): block b copies anchor row b's pools, then the
/// rows from the anchor's tail to pos[b], then -1 up to width.
void indexer_share_select(const LaunchCtx& ctx, const int32_t* anchor, const int32_t* anchor_pos,
                          const int32_t* pos, int rows, int32_t* selection, int width, int K, int P);

}  // namespace mtplab::ops::cuda
