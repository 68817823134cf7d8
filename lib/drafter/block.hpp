// One DSA-attention + routed-MoE layer with a plain residual, as the MTP layer (and mtplab's
// target, drafter/target.hpp) uses it, written against ops::Backend and dist::Communicator only.
// The MLP is the routed experts plus the shared expert, or (BlockDims::dense_mlp, the target's
// first first_k_dense_replace layers) one dense MLP of the same clamped SwiGLU: the shared-expert
// path of moe_experts_grouped with no routed expert.
//
// Invariants:
// - Rows are ragged (ops::RowBatch): per row its slot (whose caches) and its position, which is
//   also the cache row it writes; a sequence's rows are consecutive and ascending. The caller
//   guarantees each sequence's first row is at the rows already written to its slot.
// - Sharding: this rank holds n_heads_local attention heads (q_b / kv_b rows, o_proj columns)
//   and its routed experts plus a slice of the shared expert's intermediate dimension (a dense
//   MLP: a slice of its intermediate dimension); the attention and MLP partials are fp32 and
//   all-reduced, then added to the residual in BF16.
// - The indexer (and so the selection) is replicated: every rank computes the same rows.
// - index_share (enable_index_share): a forward given `share_anchor_pos` computes no indexer
//   query, scores or selection; its rows attend to the pools the last scoring forward (the step's
//   first draft, at the anchor position) selected plus the rows from that draft's tail to their
//   own position (ops::Backend::indexer_share_select). Their key rows are written as always.
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
  int index_topk = 0;   ///< K
  int index_kpool = 0;  ///< P
  int num_experts = 0;  ///< all routed experts (routing is replicated)
  int top_k = 0;
  int n_group = 1;
  int topk_group = 1;
  int moe_inter = 0;
  int shared_inter_local = 0;  ///< this rank's slice of the shared expert's intermediate dim
  /// A dense MLP instead of the router, routed and shared experts (a target layer below
  /// first_k_dense_replace): gate / up / down of this rank's dense_inter_local columns.
  bool dense_mlp = false;
  int dense_inter_local = 0;
  float routed_scaling = 1.0f;
  float swiglu_limit = 0.0f;
  float rms_eps = 1e-5f;
  float index_ln_eps = 1e-6f;
  float softmax_scale = 0.0f;  ///< 1/sqrt(qk_nope + qk_rope), from ModelConfig::softmax_scale()
  int max_rows = 0;            ///< context capacity, whole pools
  int block_size = 64;         ///< rows per KV block
  ops::KvDtype kv_dtype = ops::KvDtype::bf16;
  float kv_scale = 1.0f;
  /// Width of a selection: K + P - 1.
  int selection_width() const { return index_topk + index_kpool - 1; }
  int max_pools() const { return max_rows / index_kpool; }
};

/// The block's weights in backend memory (this rank's shard). Shapes as in docs/model.md.
struct BlockWeights {
  ops::Array<bf16> input_norm, post_norm;  // [H]
  ops::Array<bf16> q_a, q_a_norm, q_b;     // [q_lora, H], [q_lora], [nh_local*qk_nope, q_lora]
  ops::Array<bf16> kv_a, kv_a_norm, kv_b;  // [kv_lora, H], [kv_lora], [nh_local*(qk_nope+v), kv_lora]
  ops::Array<bf16> o_proj;                 // [H, nh_local*v]
  ops::Array<bf16> idx_wq_b, idx_wk, idx_k_norm_w, idx_k_norm_b,
      idx_weights_proj;                         // [nI*D, q_lora], [D, H], [D], [D], [nI, H]
  ops::Array<bf16> idx_gate;                    // [D, H]
  ops::Array<float> idx_ape;                    // [P, D]
  ops::Array<bf16> router;                      // [E, H]
  ops::Array<float> router_bias;                // [E]
  ops::Array<bf16> exp_gate, exp_up, exp_down;  // stacked local experts
  int first_expert = 0, num_local_experts = 0;
  ops::Array<bf16> sh_gate, sh_up, sh_down;     // shared expert slice [Is, H], [Is, H], [H, Is]
  ops::Array<bf16> mlp_gate, mlp_up, mlp_down;  // dense MLP slice [Id, H], [Id, H], [H, Id] (dense_mlp)
};

/// The caches of a pool of sequence slots: one allocation per cache kind, addressed by slot, so one
/// op reaches every row's caches through (slot, position) in backend memory (ops::RowBatch). A
/// single sequence is a pool of one slot. Slot s has its own block table (max_blocks entries) into
/// one shared block pool; its blocks are spread over the pool (logical block j of slot s is physical
/// block j * slots + s), and every access goes through the table, as with blocks a paged allocator
/// hands out. The indexer arrays are slot-major.
class SlotCaches {
 public:
  SlotCaches(ops::Backend& be, const BlockDims& dims, int slots);
  int slots() const { return slots_; }
  int max_blocks() const { return max_blocks_; }
  /// The whole pool, as the ops address it.
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

/// Buffers of Block::forward for up to `rows` rows.
struct BlockScratch {
  /// share_width > 0 (index_share): also the chained drafts' selections [rows, share_width];
  /// shadow: the selection check's per-row queries and selections.
  BlockScratch(ops::Backend& be, const BlockDims& dims, int rows, int share_width, bool shadow);
  int rows = 0;
  ops::Array<bf16> u, cq_pre, cq, q, ckv_pre, k_pre, q_abs, o_lat, o, v;
  ops::Array<float> gate, w_idx, q_idx, scores, attn_partial, router_logits, moe_partial, expert_w;
  ops::Array<int32_t> selection, expert_idx;
  ops::Array<int32_t> share_selection;
  ops::Array<float> shadow_q_idx;        // [rows, n_I * D] per-row GEMV (selection check only)
  ops::Array<int32_t> shadow_selection;  // [rows, K + P - 1] (selection check only)
};

/// One DSA + MoE block over ragged rows (ops::RowBatch): one draft row, a decode batch, the context
/// rows of one sequence, or several sequences of several rows each, on the same code path.
class Block {
 public:
  Block(ops::Backend& be, dist::Communicator* comm, BlockDims dims, BlockWeights weights);
  const BlockDims& dims() const { return dims_; }
  BlockWeights& weights() { return w_; }

  /// An RMSNorm of the block's output, fused into its last residual add (residual_add_rmsnorm:
  /// the same bits as the add then the norm): normed = rmsnorm(x_out; w, eps), [rows, H].
  struct OutNorm {
    const bf16* w = nullptr;
    bf16* normed = nullptr;
    float eps = 0.0f;
  };
  /// What a forward computes, and the kernel paths the arms choose for the same function.
  struct Options {
    const OutNorm* out_norm = nullptr;
    /// index_share ([rows] backend memory; needs enable_index_share): the rows are the chained
    /// drafts of the step whose first draft was the last scoring forward, row b's at
    /// share_anchor_pos[b]: no indexer query, scores or selection; each row attends to that draft's
    /// pools plus its rows from the draft's tail to its own position (the caller keeps
    /// pos - anchor < max_drafts).
    const int32_t* share_anchor_pos = nullptr;
    /// The cache-only context rows (context_rows: cache_only): the input norm, the projections of u
    /// that the caches need and the cache writes; no query, attention, MoE or output (x_out unused).
    bool cache_only = false;
    /// How the projections of u (and the q_a norm and q_b) run over the rows: batched, every weight
    /// read once for all rows; per_row, one GEMV group per row (context_gemm off). On the CPU the
    /// same bits either way.
    ops::RowsMode proj_mode = ops::RowsMode::batched;
    /// How the indexer queries q^I = W_qbI c_q run (batch_qidx); the same bits on the CPU.
    ops::RowsMode qidx_mode = ops::RowsMode::batched;
    /// A recorded routing ([rows, top_k] global expert ids, backend memory) that replaces the
    /// router's choice: the router still runs (its cost stays), then its ids are overwritten by
    /// these (its gating weights kept). For benchmarks that route as a trained model does
    /// (mtplab_bench_verify --routing); the rows' outputs are then not the model's.
    const int32_t* routed_experts = nullptr;
  };

  /// Allocates the buffers of forward for up to `rows` rows (with the selection check's shadow
  /// buffers when `shadow`); a no-op when they exist. Returns true when it (re)allocated them
  /// (their addresses changed: graphs recorded over them must be recorded again).
  bool reserve(int rows, bool shadow = false);
  int reserved_rows() const { return scratch_ ? scratch_->rows : 0; }
  /// Uses `other`'s forward buffers from now on (until this block's next reserve that grows them):
  /// blocks that run one after another, as the layers of the target, need one set between them.
  /// The sizes must agree (the same BlockDims but the MLP choice); neither may share its indexer
  /// selection (index_share keeps the first draft's selection in the buffers). selection() and
  /// experts() then read what the last of the sharing blocks to run wrote.
  void share_buffers(const Block& other);

  /// The block on the rows of `rb` (x [rows, H], row b of slot slot[b] at position pos[b], both
  /// backend memory; a padded row, slot -1, writes no cache): x_out = x + Attn(norm(x)),
  /// x_out += MoE(norm(x_out)). The dense projections run once for all rows, each row's cache rows
  /// are written at (slot, pos) before any row reads the caches, the indexer scores, selection and
  /// sparse MLA read each row's own caches up to its position, the router runs per row and the
  /// routed experts grouped over the rows (each expert read once for the rows routed to it), with
  /// two all-reduces of [rows, H]. Row b's output equals the block on that row alone after its
  /// sequence's earlier rows, bit for bit on the CPU. x and x_out may alias. The caller checks
  /// positions against the capacity and keeps the row counts.
  ///
  /// Why all rows' caches may be written before any row's selection and attention: row r at
  /// position p reads the caches only through p. indexer_scores reads the keys of pools j with
  /// jP + P - 1 <= p (a pool key is written when its last row is stored, so rows past p never touch
  /// these keys); indexer_select ranks those pools and adds the tail rows up to p; mla_decode reads
  /// the latent rows of that selection only, all <= p. The rows after p that the batch wrote are
  /// never read by row r.
  void forward(const ops::RowBatch& rb, const bf16* x, SlotCaches& caches, bf16* x_out,
               const Options& options);
  /// forward with the default Options: the full block, no output norm, every projection batched.
  void forward(const ops::RowBatch& rb, const bf16* x, SlotCaches& caches, bf16* x_out);
  /// The batch_qidx check, after a forward on the same rows: each row's per-row (GEMV) indexer
  /// query from its kept c_q, and the selection it gives, into shadow_selection(). Writes no cache
  /// and no row output. Needs reserve(.., shadow = true).
  void shadow_select(const ops::RowBatch& rb, SlotCaches& caches);

  /// The selections of the rows of the last scoring forward ([rows, K + P - 1]).
  const int32_t* selection() const { return scratch_ ? scratch_->selection.data() : nullptr; }
  /// The selections of the rows of the last sharing forward ([rows, share_width()]).
  const int32_t* share_selection() const { return scratch_ ? scratch_->share_selection.data() : nullptr; }
  /// The selections shadow_select made ([rows, K + P - 1]).
  const int32_t* shadow_selection() const { return scratch_ ? scratch_->shadow_selection.data() : nullptr; }
  /// The routed experts (global ids, [rows, top_k]) of the rows of the last full forward (not
  /// written by a dense-MLP block).
  const int32_t* experts() const { return scratch_ ? scratch_->expert_idx.data() : nullptr; }

  /// The index_share arm: the buffers of chained drafts' selections for steps of up to
  /// `max_drafts` drafts (share_width() entries per row), now and for every reserve after.
  void enable_index_share(int max_drafts);
  /// A chained draft's selection width: K + P - 1 + max_drafts - 1 (0 before enable_index_share).
  int share_width() const { return share_extra_ < 0 ? 0 : dims_.selection_width() + share_extra_; }

 private:
  /// Input norm of the rows into u, then the projections of u: kv_a, indexer wk and gate, and
  /// unless cache_only also q_a, weights_proj (scaled by 1/sqrt(n_I)), the q_a norm and q_b.
  void project(const ops::RowBatch& rb, const bf16* x, const Options& o);
  void all_reduce(float* partial, int n);
  /// The MLP of the normed rows scratch v into scratch moe_partial (fp32, this rank's partial).
  void moe(const ops::RowBatch& rb, const int32_t* routed_experts);
  void dense_mlp(const ops::RowBatch& rb);

  ops::Backend& be_;
  dist::Communicator* comm_;
  BlockDims dims_;
  BlockWeights w_;
  std::shared_ptr<BlockScratch> scratch_;
  int share_extra_ = -1;       ///< index_share: max_drafts - 1; -1 off
  bool anchor_ready_ = false;  ///< a scoring forward has written scratch_->selection
};

}  // namespace mtplab::drafter
