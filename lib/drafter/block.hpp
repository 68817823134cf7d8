// One DSA-attention + routed-MoE layer with a plain residual, as the MTP layer (and mtplab's
// synthetic target) uses it, written against ops::Backend and dist::Communicator only.
//
// Invariants:
// - Rows are dense: a row's KV slot, indexer row and position are all `pos`; the caller passes
//   `pos` in backend memory and guarantees pos == rows already written (LayerCache::rows).
// - Sharding: this rank holds n_heads_local attention heads (q_b / kv_b rows, o_proj columns)
//   and its routed experts plus a slice of the shared expert's intermediate dimension; the
//   attention and MoE partials are fp32 and all-reduced, then added to the residual in BF16.
// - The indexer (and so the selection) is replicated: every rank computes the same rows.
// - index_share (enable_index_share): a forward given `share_anchor_pos` computes no indexer
//   query, scores or selection; it attends to the pools the last scoring forward (the propose's
//   first draft, at the anchor position) selected plus the rows from that draft's tail to its own
//   position (ops::Backend::indexer_share_select). Its key rows are written as always.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/communicator.hpp"
#include "ops/ops.hpp"

namespace mtplab::drafter {

/// The sizes the block needs (a projection of model::ModelConfig plus this rank's shard).
struct BlockDims {
  int hidden = 0;
  int n_heads_local = 0;  ///< heads this rank computes
  int qk_nope = 0;        ///< per-head query/key dim (qk_rope is 0)
  int v_head = 0;
  int q_lora = 0;
  int kv_lora = 0;
  int index_heads = 0;
  int index_dim = 0;
  int index_topk = 0;  ///< K
  int index_kpool = 0; ///< P
  int num_experts = 0; ///< all routed experts (routing is replicated)
  int top_k = 0;
  int n_group = 1;
  int topk_group = 1;
  int moe_inter = 0;
  int shared_inter_local = 0;  ///< this rank's slice of the shared expert's intermediate dim
  float routed_scaling = 1.0f;
  float swiglu_limit = 0.0f;
  float rms_eps = 1e-5f;
  float index_ln_eps = 1e-6f;
  float softmax_scale = 0.0f;  ///< 1/sqrt(qk_nope + qk_rope), from ModelConfig::softmax_scale()
  int max_rows = 0;    ///< context capacity, whole pools
  int block_size = 64; ///< rows per KV block
  ops::KvDtype kv_dtype = ops::KvDtype::bf16;
  float kv_scale = 1.0f;
  /// Width of a selection: K + P - 1.
  int selection_width() const { return index_topk + index_kpool - 1; }
  int max_pools() const { return max_rows / index_kpool; }
};

/// The block's weights in backend memory (this rank's shard). Shapes as in docs/model.md.
struct BlockWeights {
  ops::Array<bf16> input_norm, post_norm;              // [H]
  ops::Array<bf16> q_a, q_a_norm, q_b;                 // [q_lora, H], [q_lora], [nh_local*qk_nope, q_lora]
  ops::Array<bf16> kv_a, kv_a_norm, kv_b;              // [kv_lora, H], [kv_lora], [nh_local*(qk_nope+v), kv_lora]
  ops::Array<bf16> o_proj;                             // [H, nh_local*v]
  ops::Array<bf16> idx_wq_b, idx_wk, idx_k_norm_w, idx_k_norm_b, idx_weights_proj;  // [nI*D, q_lora], [D, H], [D], [D], [nI, H]
  ops::Array<bf16> idx_gate;                           // [D, H]
  ops::Array<float> idx_ape;                           // [P, D]
  ops::Array<bf16> router;                             // [E, H]
  ops::Array<float> router_bias;                       // [E]
  ops::Array<bf16> exp_gate, exp_up, exp_down;         // stacked local experts
  int first_expert = 0, num_local_experts = 0;
  ops::Array<bf16> sh_gate, sh_up, sh_down;            // shared expert slice [Is, H], [Is, H], [H, Is]
};

/// Where one sequence's caches of a block live, as the single-sequence ops address them: its own
/// LayerCache, or its slot of a SlotCaches pool. The block's row functions work on either.
struct CacheView {
  const int32_t* block_table = nullptr;  ///< this sequence's logical -> physical blocks
  ops::KvCache kv;                       ///< the block pool the table points into
  bf16* k_cache = nullptr;               ///< [max_rows, D]
  float* gate_cache = nullptr;           ///< [max_rows, D]
  uint8_t* valid = nullptr;              ///< [max_rows]
  float* pool_keys = nullptr;            ///< [max_pools, D]
};

/// Per-sequence caches of one block: the paged latent KV cache and the indexer rows.
class LayerCache {
 public:
  LayerCache(ops::Backend& be, const BlockDims& dims);
  /// Rows written so far (host-side mirror of the device state).
  int rows() const { return rows_; }
  void set_rows(int rows) { rows_ = rows; }
  ops::KvCache kv() { return kv_; }
  CacheView view();
  ops::Array<int32_t> block_table;
  ops::Array<bf16> k_cache;     // [max_rows, D]
  ops::Array<float> gate_cache; // [max_rows, D]
  ops::Array<uint8_t> valid;    // [max_rows]
  ops::Array<float> pool_keys;  // [max_pools, D]

 private:
  ops::Array<uint8_t> kv_data_;
  ops::KvCache kv_;
  int rows_ = 0;
};

/// The caches of a pool of sequence slots (batched drafting): one allocation per cache kind,
/// addressed by slot, so one op reaches every row's caches through (slot, position) in backend
/// memory (docs/drafter.md, "Batched drafting"). Slot s has its own block table (max_blocks
/// entries) into one shared block pool; its blocks are spread over the pool (logical block j of
/// slot s is physical block j * slots + s), and every access goes through the table, as with
/// blocks a paged allocator hands out. The indexer arrays are slot-major.
class SlotCaches {
 public:
  SlotCaches(ops::Backend& be, const BlockDims& dims, int slots);
  int slots() const { return slots_; }
  int max_blocks() const { return max_blocks_; }
  /// Slot s's caches, as the single-sequence ops (context rows) address them.
  CacheView view(int slot);
  /// The whole pool, as the batched ops address it.
  ops::KvSlots kv_slots();
  ops::IndexerSlots indexer_slots();
  /// Clears slot s's valid flags (a new sequence takes the slot).
  void clear(ops::Backend& be, int slot);
  /// Copies slot `from`'s first `rows` rows (latent KV rows through both block tables, indexer
  /// rows, valid flags, the complete pools' keys) into slot `to`, in stream order; `to`'s rows past
  /// them are marked invalid.
  void copy_slot(ops::Backend& be, int from, int to, int rows);
  ops::Array<int32_t> block_tables;  // [slots, max_blocks]
  ops::Array<bf16> k_cache;          // [slots, max_rows, D]
  ops::Array<float> gate_cache;      // [slots, max_rows, D]
  ops::Array<uint8_t> valid;         // [slots, max_rows]
  ops::Array<float> pool_keys;       // [slots, max_pools, D]

 private:
  BlockDims dims_;
  int slots_ = 0;
  int max_blocks_ = 0;
  ops::Array<uint8_t> kv_data_;  // [slots * max_blocks, block_size, kv_lora]
  ops::KvCache kv_;
};

/// Scratch buffers of one block forward (one row at a time).
struct BlockScratch {
  BlockScratch(ops::Backend& be, const BlockDims& dims);
  ops::Array<bf16> u, cq_pre, cq, q, ckv_pre, k_pre, q_abs, o_lat, o, v;
  ops::Array<float> gate, q_idx, w_idx, scores, attn_partial, router_logits, moe_partial;
  ops::Array<int32_t> selection, expert_idx;
  ops::Array<float> expert_w;
  ops::Array<int32_t> share_selection;  ///< [Block::share_width()] (index_share only)
};

/// Chunk buffers of Block::forward_rows: what phase A keeps per row for phases B and C, and the
/// selection each row used; the shadow buffers only when the selection check is on.
struct RowsScratch {
  RowsScratch(ops::Backend& be, const BlockDims& dims, int max_rows, bool shadow, bool gemm);
  int max_rows = 0;
  bool gemm = false;
  // The batched projections' outputs (context_gemm only).
  ops::Array<bf16> u;        // [max_rows, H] input-normed rows
  ops::Array<bf16> cq_pre;   // [max_rows, q_lora]
  ops::Array<bf16> ckv_pre;  // [max_rows, kv_lora]
  ops::Array<bf16> k_pre;    // [max_rows, D]
  ops::Array<float> gate;    // [max_rows, D]
  ops::Array<bf16> cq;                   // [max_rows, q_lora]
  ops::Array<bf16> q;                    // [max_rows, nh_local * qk_nope]
  ops::Array<float> w_idx;               // [max_rows, n_I] indexer head weights (1/sqrt(n_I) applied)
  ops::Array<float> q_idx;               // [max_rows, n_I * D]
  ops::Array<int32_t> selection;         // [max_rows, K + P - 1]
  ops::Array<float> shadow_q_idx;        // [max_rows, n_I * D] per-row GEMV (check only)
  ops::Array<int32_t> shadow_selection;  // [max_rows, K + P - 1] (check only)
};

/// Buffers of Block::forward_batch for up to `rows` rows (one per sequence of the batch).
struct BatchScratch {
  /// share_width > 0 (index_share): also the chained drafts' selections [rows, share_width].
  BatchScratch(ops::Backend& be, const BlockDims& dims, int rows, int share_width = 0);
  int rows = 0;
  ops::Array<bf16> u, cq_pre, cq, q, ckv_pre, k_pre, q_abs, o_lat, o, v;
  ops::Array<float> gate, w_idx, q_idx, scores, attn_partial, router_logits, moe_partial, expert_w;
  ops::Array<int32_t> selection, expert_idx;
  ops::Array<int32_t> share_selection;
};

class Block {
 public:
  Block(ops::Backend& be, dist::Communicator* comm, BlockDims dims, BlockWeights weights);
  const BlockDims& dims() const { return dims_; }
  BlockWeights& weights() { return w_; }

  /// The cache-only context row: input norm, latent write, indexer row (no query, selection,
  /// attention, MoE). Advances cache.rows() by one.
  void write_context_row(const bf16* x, const int32_t* pos, LayerCache& cache);
  /// An RMSNorm of the block's output, fused into its last residual add (residual_add_rmsnorm:
  /// the same bits as the add then the norm): normed = rmsnorm(x_out; w, eps).
  struct OutNorm {
    const bf16* w = nullptr;
    bf16* normed = nullptr;
    float eps = 0.0f;
  };
  /// The full block on one row at `pos`: x_out = x + Attn(norm(x)); x_out += MoE(norm(x_out)),
  /// and with `out_norm` also its norm of x_out. x and x_out may alias. Advances cache.rows().
  /// `share_anchor_pos` (index_share; needs enable_index_share): the row is a chained draft of the
  /// propose whose first draft was the last forward without it, at *share_anchor_pos (backend
  /// memory), on the same cache: no indexer query, scores or selection; the attention reads that
  /// draft's pools plus rows anchor's tail .. pos (the caller keeps pos - anchor < max_drafts).
  void forward(const bf16* x, const int32_t* pos, LayerCache& cache, bf16* x_out,
               const OutNorm* out_norm = nullptr, const int32_t* share_anchor_pos = nullptr);
  /// The selection the last scoring forward used (K + P - 1 rows, -1 padded), for tests.
  const int32_t* last_selection() const { return scratch_.selection.data(); }
  /// The routed experts (global ids, [top_k]) of the last single-row forward().
  const int32_t* last_experts() const { return scratch_.expert_idx.data(); }

  /// The index_share arm: the buffers of chained drafts' selections for proposes of up to
  /// `max_drafts` drafts (share_width() entries per row), now and for every reserve_batch after.
  void enable_index_share(int max_drafts);
  /// A chained draft's selection width: K + P - 1 + max_drafts - 1 (0 before enable_index_share).
  int share_width() const { return share_extra_ < 0 ? 0 : dims_.selection_width() + share_extra_; }
  /// The selection the last sharing forward used (share_width() rows, -1 padded), for tests.
  const int32_t* last_share_selection() const { return scratch_.share_selection.data(); }

  /// Allocates the chunk buffers of forward_rows for up to `max_rows` rows per call (with the
  /// shadow buffers of shadow_select_rows when `shadow`). At glm5.3-flash and 256 rows on one
  /// rank: q 8 MiB, q_idx 4 MiB, selection 2 MiB, cq 0.75 MiB; the shadow adds 6 MiB.
  /// `gemm`: also the buffers of the batched projections (context_gemm), ~2.5 MiB more.
  void reserve_rows(int max_rows, bool shadow, bool gemm = false);
  /// write_context_row on n rows at once (rows x [n, H], pos[r] == cache.rows() + r): the input
  /// norm and the projections of u (kv_a, indexer wk, gate) as one batched linear each
  /// (`RowsMode::batched`: one GEMM on CUDA), then each row's cache writes. Needs
  /// reserve_rows(.., gemm = true). Advances cache.rows() by n.
  void write_context_rows(int n, const bf16* x, const int32_t* pos, LayerCache& cache);
  /// The full block on n context rows at once: rows x [n, H] at positions pos[0..n) (backend
  /// memory), pos[r] == cache.rows() + r; x_out [n, H] may alias x. Phase A (per row): input
  /// norm, the projections, q_a norm, q_b, the cache writes; phase B: q_idx for all n rows, one
  /// `qidx_mode` linear (batched: one GEMM on CUDA) or, per_row, n GEMVs; phase C (per row):
  /// scores, selection, absorbed MLA, o_proj, all-reduce, MoE, residual. With per_row it is
  /// bit-identical to n calls of forward (tested). Advances cache.rows() by n.
  /// `proj_mode` batched (context_gemm): phase A's projections of u, the q_a norm and q_b are
  /// one batched linear each over the n rows, then each row's cache writes (needs
  /// reserve_rows(.., gemm = true)); per_row: project_row per row.
  void forward_rows(int n, const bf16* x, const int32_t* pos, LayerCache& cache, bf16* x_out,
                    ops::RowsMode qidx_mode, ops::RowsMode proj_mode = ops::RowsMode::per_row);
  /// After forward_rows on the same rows: the per-row (GEMV) q_idx of each row from its kept c_q,
  /// and the selection it gives, into shadow_selection. Writes no cache and no row output.
  void shadow_select_rows(int n, const int32_t* pos, LayerCache& cache);
  /// The selections of the rows of the last forward_rows / shadow_select_rows ([n, K + P - 1]).
  const int32_t* rows_selection() const;
  const int32_t* rows_shadow_selection() const;

  // ---- the same on any CacheView (a slot of a SlotCaches pool): `rows` is the rows the view's
  // sequence holds (the caller keeps the count; the LayerCache versions above advance theirs).
  void write_context_row(const bf16* x, const int32_t* pos, const CacheView& cache, int rows);
  void write_context_rows(int n, const bf16* x, const int32_t* pos, const CacheView& cache, int rows);
  void forward_rows(int n, const bf16* x, const int32_t* pos, const CacheView& cache, int rows, bf16* x_out,
                    ops::RowsMode qidx_mode, ops::RowsMode proj_mode);
  void shadow_select_rows(int n, const int32_t* pos, const CacheView& cache);

  // ---- batched: one row per sequence of a decode batch ---------------------------------------
  /// Allocates the buffers of forward_batch for up to `rows` rows (a no-op when they exist).
  /// Returns true when it (re)allocated them (their addresses changed).
  bool reserve_batch(int rows);
  /// The full block on n rows x [n, H], row b of sequence slot slot[b] at position pos[b] (both
  /// backend memory, [n]; slot -1: a padded row, which writes no cache), each with its own caches
  /// in `caches`: the dense projections as one batched linear over the n rows (every weight read
  /// once), the cache writes, indexer scores / selection and sparse MLA over each row's own
  /// caches (one op each), the router per row and the routed experts grouped over the rows
  /// (moe_experts_grouped), two all-reduces of [n, H]. Row b's output equals forward() of that
  /// row on its sequence's caches, bit for bit on the CPU. x and x_out may alias; with out_norm,
  /// out_norm->normed is [n, H]. The caller checks positions and advances its row counts.
  /// `share_anchor_pos` (index_share, [n] backend memory): as forward's, per row: the rows are the
  /// chained drafts of the batched step whose first draft was the last forward_batch without it.
  void forward_batch(int n, const bf16* x, const int32_t* slot, const int32_t* pos, SlotCaches& caches,
                     bf16* x_out, const OutNorm* out_norm = nullptr,
                     const int32_t* share_anchor_pos = nullptr);
  /// The selections of the rows of the last scoring forward_batch ([n, K + P - 1]).
  const int32_t* batch_selection() const { return batch_ ? batch_->selection.data() : nullptr; }
  /// The selections of the rows of the last sharing forward_batch ([n, share_width()]).
  const int32_t* batch_share_selection() const { return batch_ ? batch_->share_selection.data() : nullptr; }
  /// The routed experts (global ids, [n, top_k]) of the rows of the last forward_batch.
  const int32_t* batch_experts() const { return batch_ ? batch_->expert_idx.data() : nullptr; }

 private:
  /// Phase A of one row: input norm, every projection of u (w_idx to `w_idx`; none when w_idx is
  /// null: a sharing draft has no indexer query), c_q to `cq`, q to `q`, then the latent and
  /// indexer cache rows at pos.
  void project_row(const bf16* x, const int32_t* pos, const CacheView& cache, bf16* cq, bf16* q,
                   float* w_idx);
  /// Phase C of one row: scores and selection (into `selection`) from q_idx and w_idx, or with
  /// share_anchor_pos the shared selection (into scratch_.share_selection; q_idx, w_idx and
  /// `selection` unused), absorbed sparse MLA, o_proj, all-reduce, then the MoE with both residuals.
  void finish_row(const bf16* x, const int32_t* pos, const CacheView& cache, bf16* x_out, const bf16* q,
                  const float* w_idx, const float* q_idx, int32_t* selection,
                  const OutNorm* out_norm = nullptr, const int32_t* share_anchor_pos = nullptr);
  /// Norms and stores the cache row from the projections of u already in scratch (ckv_pre, k_pre,
  /// gate: one linear_group, made by the caller with whatever else it projects from u).
  void write_caches(const int32_t* pos, const CacheView& cache);
  /// The same from projections kept elsewhere (one row of the batched buffers).
  void write_caches_from(const bf16* ckv_pre, const bf16* k_pre, const float* gate, const int32_t* pos,
                         const CacheView& cache);
  /// Input norm of n rows into rows_->u, then the batched projections `outs` of those rows.
  void project_rows_batched(int n, const bf16* x, bool full);
  void all_reduce(float* partial, int n);

  ops::Backend& be_;
  dist::Communicator* comm_;
  BlockDims dims_;
  BlockWeights w_;
  BlockScratch scratch_;
  std::unique_ptr<RowsScratch> rows_;
  std::unique_ptr<BatchScratch> batch_;
  int share_extra_ = -1;             ///< index_share: max_drafts - 1; -1 off
  bool anchor_ready_ = false;        ///< a scoring forward() has written scratch_.selection
  bool batch_anchor_ready_ = false;  ///< a scoring forward_batch() has written batch_->selection
};

}  // namespace mtplab::drafter
