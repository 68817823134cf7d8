// The DSA + MoE block's forward, op by op (docs/model.md, "DSA attention", "The pooled indexer", "MoE").
#include "drafter/block.hpp"

#include <cmath>
#include <numeric>

#include "core/error.hpp"

namespace mtplab::drafter {

SlotCaches::SlotCaches(ops::Backend& be, const BlockDims& d, int slots) : dims_(d), slots_(slots) {
  MTP_REQUIRE(slots >= 1, "slot caches: ", slots, " slots");
  MTP_REQUIRE(d.max_rows > 0 && d.max_rows % d.index_kpool == 0, "slot caches: capacity ", d.max_rows,
              " is not a positive whole number of pools of ", d.index_kpool);
  max_blocks_ = (d.max_rows + d.block_size - 1) / d.block_size;
  const size_t S = static_cast<size_t>(slots);
  const size_t blocks = S * max_blocks_;
  // Slot s's logical block j is physical block j * slots + s: the slots' blocks interleave in
  // the pool, so nothing can work by assuming a slot's rows are contiguous.
  std::vector<int32_t> tables(blocks);
  for (size_t s = 0; s < S; ++s)
    for (int j = 0; j < max_blocks_; ++j) tables[s * max_blocks_ + j] = static_cast<int32_t>(j * S + s);
  block_tables = ops::Array<int32_t>(be, blocks);
  be.upload(block_tables.data(), tables.data(), tables.size() * sizeof(int32_t));
  const size_t elem = d.kv_dtype == ops::KvDtype::bf16 ? 2 : 1;
  kv_data_ = ops::Array<uint8_t>(be, blocks * d.block_size * d.kv_lora * elem);
  kv_ = ops::KvCache{kv_data_.data(),          d.kv_dtype,   d.kv_scale,
                     static_cast<int>(blocks), d.block_size, d.kv_lora};
  const size_t rows = S * d.max_rows;
  k_cache = ops::Array<bf16>(be, rows * d.index_dim);
  gate_cache = ops::Array<float>(be, rows * d.index_dim);
  valid = ops::Array<uint8_t>(be, rows);
  pool_keys = ops::Array<float>(be, S * d.max_pools() * d.index_dim);
  be.fill_bytes(valid.data(), 0, valid.bytes());
}

ops::KvSlots SlotCaches::kv_slots() { return ops::KvSlots{kv_, block_tables.data(), slots_, max_blocks_}; }

ops::IndexerSlots SlotCaches::indexer_slots() {
  return ops::IndexerSlots{k_cache.data(), gate_cache.data(), valid.data(),    pool_keys.data(),
                           slots_,         dims_.max_rows,    dims_.index_dim, dims_.index_kpool};
}

void SlotCaches::clear(ops::Backend& be, int slot) {
  MTP_REQUIRE(slot >= 0 && slot < slots_, "slot caches: slot ", slot, " of ", slots_);
  be.fill_bytes(valid.data() + static_cast<size_t>(slot) * dims_.max_rows, 0,
                static_cast<size_t>(dims_.max_rows));
}

void SlotCaches::copy_slot(ops::Backend& be, int from, int to, int rows) {
  MTP_REQUIRE(rows >= 0 && rows <= dims_.max_rows, "slot caches: copy of ", rows, " rows, capacity ",
              dims_.max_rows);
  MTP_REQUIRE(from != to, "slot caches: copy of slot ", from, " onto itself");
  MTP_REQUIRE(from >= 0 && from < slots_ && to >= 0 && to < slots_, "slot caches: copy of slot ", from,
              " to ", to, " of ", slots_);
  const size_t elem = dims_.kv_dtype == ops::KvDtype::bf16 ? 2 : 1;
  const size_t block_bytes = static_cast<size_t>(dims_.block_size) * dims_.kv_lora * elem;
  auto* kv = static_cast<uint8_t*>(kv_.data);
  const size_t S = static_cast<size_t>(slots_);
  for (int j = 0; j * dims_.block_size < rows; ++j)  // logical block j of a slot: physical j * slots + slot
    be.copy(kv + (static_cast<size_t>(j) * S + static_cast<size_t>(to)) * block_bytes,
            kv + (static_cast<size_t>(j) * S + static_cast<size_t>(from)) * block_bytes, block_bytes);
  const size_t D = static_cast<size_t>(dims_.index_dim);
  const size_t n = static_cast<size_t>(rows);
  const size_t R = static_cast<size_t>(dims_.max_rows), pools = static_cast<size_t>(dims_.max_pools());
  const size_t f = static_cast<size_t>(from), t = static_cast<size_t>(to);
  be.copy(k_cache.data() + t * R * D, k_cache.data() + f * R * D, n * D * sizeof(bf16));
  be.copy(gate_cache.data() + t * R * D, gate_cache.data() + f * R * D, n * D * sizeof(float));
  be.fill_bytes(valid.data() + t * R, 0, R);
  be.copy(valid.data() + t * R, valid.data() + f * R, n);
  be.copy(pool_keys.data() + t * pools * D, pool_keys.data() + f * pools * D,
          (n / static_cast<size_t>(dims_.index_kpool)) * D * sizeof(float));
}

BlockScratch::BlockScratch(ops::Backend& be, const BlockDims& d, int n, int share_width, bool shadow)
    : rows(n),
      u(be, static_cast<size_t>(n) * d.hidden),
      cq_pre(be, static_cast<size_t>(n) * d.q_lora),
      cq(be, static_cast<size_t>(n) * d.q_lora),
      q(be, static_cast<size_t>(n) * d.n_heads_local * d.qk_nope),
      ckv_pre(be, static_cast<size_t>(n) * d.kv_lora),
      k_pre(be, static_cast<size_t>(n) * d.index_dim),
      q_abs(be, static_cast<size_t>(n) * d.n_heads_local * d.kv_lora),
      o_lat(be, static_cast<size_t>(n) * d.n_heads_local * d.kv_lora),
      o(be, static_cast<size_t>(n) * d.n_heads_local * d.v_head),
      v(be, static_cast<size_t>(n) * d.hidden),
      gate(be, static_cast<size_t>(n) * d.index_dim),
      w_idx(be, static_cast<size_t>(n) * d.index_heads),
      q_idx(be, static_cast<size_t>(n) * d.index_heads * d.index_dim),
      scores(be, static_cast<size_t>(n) * d.max_pools()),
      attn_partial(be, static_cast<size_t>(n) * d.hidden),
      router_logits(be, static_cast<size_t>(n) * d.num_experts),
      moe_partial(be, static_cast<size_t>(n) * d.hidden),
      expert_w(be, static_cast<size_t>(n) * d.top_k),
      selection(be, static_cast<size_t>(n) * d.selection_width()),
      expert_idx(be, static_cast<size_t>(n) * d.top_k) {
  // Padded rows of the row ops compute on whatever their rows hold: start from zeros, not from
  // uninitialised memory.
  for (ops::Array<bf16>* a : {&u, &cq_pre, &cq, &q, &ckv_pre, &k_pre, &q_abs, &o_lat, &o, &v})
    be.fill_bytes(a->data(), 0, a->bytes());
  for (ops::Array<float>* a :
       {&gate, &w_idx, &q_idx, &scores, &attn_partial, &router_logits, &moe_partial, &expert_w})
    be.fill_bytes(a->data(), 0, a->bytes());
  be.fill_bytes(selection.data(), 0xFF, selection.bytes());
  be.fill_bytes(expert_idx.data(), 0, expert_idx.bytes());
  if (share_width > 0) {
    share_selection = ops::Array<int32_t>(be, static_cast<size_t>(n) * share_width);
    be.fill_bytes(share_selection.data(), 0xFF, share_selection.bytes());
  }
  if (shadow) {
    shadow_q_idx = ops::Array<float>(be, static_cast<size_t>(n) * d.index_heads * d.index_dim);
    shadow_selection = ops::Array<int32_t>(be, static_cast<size_t>(n) * d.selection_width());
    be.fill_bytes(shadow_q_idx.data(), 0, shadow_q_idx.bytes());
    be.fill_bytes(shadow_selection.data(), 0xFF, shadow_selection.bytes());
  }
}

Block::Block(ops::Backend& be, dist::Communicator* comm, BlockDims dims, BlockWeights weights)
    : be_(be), comm_(comm), dims_(dims), w_(std::move(weights)) {
  MTP_REQUIRE(dims_.softmax_scale > 0, "block: softmax_scale is not set");
  MTP_REQUIRE(dims_.index_topk % dims_.index_kpool == 0, "block: index_topk ", dims_.index_topk,
              " is not divisible by index_kpool ", dims_.index_kpool);
  if (dims_.dense_mlp) {
    const size_t mlp = static_cast<size_t>(dims_.dense_inter_local) * dims_.hidden;
    MTP_REQUIRE(dims_.dense_inter_local >= 0 && w_.mlp_gate.size() == mlp && w_.mlp_up.size() == mlp &&
                    w_.mlp_down.size() == mlp,
                "block: a dense-MLP block of ", dims_.dense_inter_local,
                " columns needs gate, up and down of ", mlp, " values each (got ", w_.mlp_gate.size(), ", ",
                w_.mlp_up.size(), ", ", w_.mlp_down.size(), ")");
  }
}

void Block::all_reduce(float* partial, int n) {
  if (comm_ && comm_->size() > 1) comm_->all_reduce_sum(partial, partial, static_cast<size_t>(n));
}

bool Block::reserve(int rows, bool shadow) {
  MTP_REQUIRE(rows >= 1, "block: reserve(", rows, ")");
  if (scratch_ && scratch_->rows >= rows && (!shadow || scratch_->shadow_selection.size() > 0)) return false;
  const bool keep_shadow = shadow || (scratch_ && scratch_->shadow_selection.size() > 0);
  const int keep_rows = std::max(rows, scratch_ ? scratch_->rows : 0);
  scratch_ = std::make_shared<BlockScratch>(be_, dims_, keep_rows, share_width(), keep_shadow);
  anchor_ready_ = false;  // the new buffers hold no first draft's selection yet
  return true;
}

void Block::share_buffers(const Block& other) {
  const BlockDims& a = dims_;
  const BlockDims& b = other.dims_;
  MTP_REQUIRE(other.scratch_, "block: share_buffers from a block without buffers (reserve it first)");
  MTP_REQUIRE(share_extra_ < 0 && other.share_extra_ < 0, "block: a block that shares its indexer selection ",
              "(index_share) keeps its own buffers");
  MTP_REQUIRE(a.hidden == b.hidden && a.n_heads_local == b.n_heads_local && a.qk_nope == b.qk_nope &&
                  a.v_head == b.v_head && a.q_lora == b.q_lora && a.kv_lora == b.kv_lora &&
                  a.index_heads == b.index_heads && a.index_dim == b.index_dim &&
                  a.index_topk == b.index_topk && a.index_kpool == b.index_kpool &&
                  a.num_experts == b.num_experts && a.top_k == b.top_k && a.max_rows == b.max_rows,
              "block: share_buffers between blocks of other sizes");
  scratch_ = other.scratch_;
  anchor_ready_ = false;
}

void Block::enable_index_share(int max_drafts) {
  MTP_REQUIRE(max_drafts >= 1, "block: enable_index_share(", max_drafts, ")");
  if (share_extra_ >= max_drafts - 1) return;
  share_extra_ = max_drafts - 1;
  if (scratch_) {
    // The buffers again, now with the chained drafts' selections.
    const int rows = scratch_->rows;
    const bool shadow = scratch_->shadow_selection.size() > 0;
    scratch_.reset();
    reserve(rows, shadow);
  }
}

// The projections of u, each weight read once for all rows under RowsMode::batched (per_row: one
// GEMV group per row): kv_a, indexer wk and gate, and unless cache_only also q_a and weights_proj
// (scaled by 1/sqrt(n_I) as the group folds it: one fp32 multiply per value; none for chained
// drafts under index_share, whose w_idx only the indexer scores read), then the q_a norm and q_b.
// Each output of a group is bit-identical to its own linear, so their order and company change
// no bit.
void Block::project(const ops::RowBatch& rb, const bf16* x, const Options& o) {
  const BlockDims& d = dims_;
  BlockScratch& s = *scratch_;
  const int n = rb.rows;
  be_.rmsnorm(x, w_.input_norm.data(), s.u.data(), n, d.hidden, d.rms_eps);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(d.index_heads));
  const size_t n_outs = o.cache_only ? 3 : o.share_anchor_pos ? 4 : 5;
  if (o.proj_mode == ops::RowsMode::batched) {
    const ops::LinearOut outs[] = {
        {w_.kv_a.data(), s.ckv_pre.data(), d.kv_lora, false, 1.0f},
        {w_.idx_wk.data(), s.k_pre.data(), d.index_dim, false, 1.0f},
        {w_.idx_gate.data(), s.gate.data(), d.index_dim, true, 1.0f},
        {w_.q_a.data(), s.cq_pre.data(), d.q_lora, false, 1.0f},
        {w_.idx_weights_proj.data(), s.w_idx.data(), d.index_heads, true, w_scale},
    };
    be_.linear_rows_group(std::span<const ops::LinearOut>(outs, n_outs), s.u.data(), n, d.hidden);
  } else {
    for (int r = 0; r < n; ++r) {
      const size_t R = static_cast<size_t>(r);
      const ops::LinearOut outs[] = {
          {w_.kv_a.data(), s.ckv_pre.data() + R * d.kv_lora, d.kv_lora, false, 1.0f},
          {w_.idx_wk.data(), s.k_pre.data() + R * d.index_dim, d.index_dim, false, 1.0f},
          {w_.idx_gate.data(), s.gate.data() + R * d.index_dim, d.index_dim, true, 1.0f},
          {w_.q_a.data(), s.cq_pre.data() + R * d.q_lora, d.q_lora, false, 1.0f},
          {w_.idx_weights_proj.data(), s.w_idx.data() + R * d.index_heads, d.index_heads, true, w_scale},
      };
      be_.linear_rows_group(std::span<const ops::LinearOut>(outs, n_outs), s.u.data() + R * d.hidden, 1,
                            d.hidden);
    }
  }
  if (o.cache_only) return;
  be_.rmsnorm(s.cq_pre.data(), w_.q_a_norm.data(), s.cq.data(), n, d.q_lora, d.rms_eps);
  be_.linear(w_.q_b.data(), s.cq.data(), s.q.data(), n, d.n_heads_local * d.qk_nope, d.q_lora, o.proj_mode);
}

// On the CPU each row is bit-identical to the block on that row alone: the batched linears compute
// exactly the per-row GEMVs (the 1/sqrt(n_I) scale applied as the group applies it), the slot ops
// are the single-row ops per row in batch order, and the all-reduces sum elementwise (an element's
// sum does not depend on the other elements of the call at 2 ranks; at more ranks an
// implementation may pick its algorithm by message size).
void Block::forward(const ops::RowBatch& rb, const bf16* x, SlotCaches& caches, bf16* x_out,
                    const Options& o) {
  const BlockDims& d = dims_;
  const int n = rb.rows;
  MTP_REQUIRE(scratch_ && n >= 1 && n <= scratch_->rows, "block: forward of ", n, " rows, buffers for ",
              scratch_ ? scratch_->rows : 0, " (reserve first)");
  if (o.share_anchor_pos) {
    MTP_REQUIRE(share_extra_ >= 0,
                "block: a forward that shares its indexer selection needs enable_index_share");
    MTP_REQUIRE(
        anchor_ready_,
        "block: a forward that shares its indexer selection needs a scoring forward (the step's first "
        "draft) before it");
    MTP_REQUIRE(!o.cache_only, "block: a cache-only forward has no selection to share");
  }
  BlockScratch& s = *scratch_;
  const ops::KvSlots kv = caches.kv_slots();
  const ops::IndexerSlots idx = caches.indexer_slots();
  const int qidx_width = d.index_heads * d.index_dim;
  // ---- projections of u ----
  project(rb, x, o);
  // ---- each row's cache rows at (slot, pos): every row's before any row reads the caches ----
  be_.kv_norm_write_batch(s.ckv_pre.data(), w_.kv_a_norm.data(), d.rms_eps, rb, kv);
  be_.indexer_norm_store_batch(s.k_pre.data(), w_.idx_k_norm_w.data(), w_.idx_k_norm_b.data(), d.index_ln_eps,
                               s.gate.data(), w_.idx_ape.data(), rb, idx);
  if (o.cache_only) return;
  // ---- indexer over each row's own pool keys, then the selection; or (index_share) the first
  // draft's pools of each row plus its rows from that draft's tail on ----
  const int32_t* selection = s.selection.data();
  int width = d.selection_width();
  if (o.share_anchor_pos) {
    width = share_width();
    be_.indexer_share_select(s.selection.data(), o.share_anchor_pos, rb.pos, n, s.share_selection.data(),
                             width, d.index_topk, d.index_kpool);
    selection = s.share_selection.data();
  } else {
    be_.linear_f32(w_.idx_wq_b.data(), s.cq.data(), s.q_idx.data(), n, qidx_width, d.q_lora, o.qidx_mode);
    be_.indexer_scores_batch(s.q_idx.data(), s.w_idx.data(), rb, idx, s.scores.data(), d.index_heads);
    be_.indexer_select_batch(s.scores.data(), rb, s.selection.data(), d.index_topk, d.index_kpool,
                             d.max_pools());
    anchor_ready_ = true;
  }
  // ---- absorbed sparse MLA over this rank's heads, each row on its own latent rows ----
  if (d.n_heads_local > 0) {
    be_.mla_absorb_q_batch(s.q.data(), w_.kv_b.data(), s.q_abs.data(), n, d.n_heads_local, d.qk_nope,
                           d.v_head, d.kv_lora);
    be_.mla_decode_batch(s.q_abs.data(), selection, width, rb, kv, s.o_lat.data(), d.n_heads_local,
                         d.softmax_scale);
    be_.mla_out_v_batch(s.o_lat.data(), w_.kv_b.data(), s.o.data(), n, d.n_heads_local, d.qk_nope, d.v_head,
                        d.kv_lora);
    be_.linear_f32(w_.o_proj.data(), s.o.data(), s.attn_partial.data(), n, d.hidden,
                   d.n_heads_local * d.v_head, ops::RowsMode::batched);
  } else {
    be_.fill_bytes(s.attn_partial.data(), 0, static_cast<size_t>(n) * d.hidden * sizeof(float));
  }
  all_reduce(s.attn_partial.data(), n * d.hidden);
  // ---- MLP: the router per row and the routed experts grouped over the rows, or the dense MLP ----
  be_.residual_add_rmsnorm_rows(x, s.attn_partial.data(), x_out, w_.post_norm.data(), s.v.data(), n, d.hidden,
                                d.rms_eps);
  if (d.dense_mlp) {
    dense_mlp(rb);
  } else {
    moe(rb, o.routed_experts);
  }
  all_reduce(s.moe_partial.data(), n * d.hidden);
  if (o.out_norm) {
    be_.residual_add_rmsnorm_rows(x_out, s.moe_partial.data(), x_out, o.out_norm->w, o.out_norm->normed, n,
                                  d.hidden, o.out_norm->eps);
  } else {
    be_.residual_add(x_out, s.moe_partial.data(), x_out, n * d.hidden);
  }
}

// The router per row, then the routed experts grouped over the rows plus the shared expert, from
// the normed rows v into moe_partial; `routed_experts` (Options) replaces the router's ids.
void Block::moe(const ops::RowBatch& rb, const int32_t* routed_experts) {
  const BlockDims& d = dims_;
  BlockScratch& s = *scratch_;
  const int n = rb.rows;
  be_.linear_f32(w_.router.data(), s.v.data(), s.router_logits.data(), n, d.num_experts, d.hidden,
                 ops::RowsMode::batched);
  be_.moe_route_batch(s.router_logits.data(), w_.router_bias.data(), rb, d.num_experts, d.top_k, d.n_group,
                      d.topk_group, d.routed_scaling, s.expert_idx.data(), s.expert_w.data());
  if (routed_experts)
    be_.copy(s.expert_idx.data(), routed_experts, static_cast<size_t>(n) * d.top_k * sizeof(int32_t));
  const ops::ExpertWeights routed{w_.exp_gate.data(),   w_.exp_up.data(), w_.exp_down.data(), w_.first_expert,
                                  w_.num_local_experts, d.hidden,         d.moe_inter};
  const ops::ExpertWeights shared{w_.sh_gate.data(), w_.sh_up.data(),     w_.sh_down.data(), 0, 1,
                                  d.hidden,          d.shared_inter_local};
  be_.moe_experts_grouped(s.v.data(), routed, s.expert_idx.data(), s.expert_w.data(), rb, d.top_k,
                          d.shared_inter_local > 0 ? &shared : nullptr, d.swiglu_limit, s.moe_partial.data());
}

// The dense MLP, moe_partial = bf16(W_down a) with a = bf16(silu(min(g, L)) * clamp(u, -L, L)),
// g = bf16(W_gate v), u = bf16(W_up v): the shared expert of moe_experts_grouped with no routed
// expert (top_k 0), so every backend runs it on the kernels it has for the shared expert. A rank
// that holds no column of it adds 0.
void Block::dense_mlp(const ops::RowBatch& rb) {
  const BlockDims& d = dims_;
  BlockScratch& s = *scratch_;
  if (d.dense_inter_local <= 0) {
    be_.fill_bytes(s.moe_partial.data(), 0, static_cast<size_t>(rb.rows) * d.hidden * sizeof(float));
    return;
  }
  const ops::ExpertWeights none{nullptr, nullptr, nullptr, 0, 0, d.hidden, d.dense_inter_local};
  const ops::ExpertWeights mlp{w_.mlp_gate.data(), w_.mlp_up.data(),   w_.mlp_down.data(), 0, 1,
                               d.hidden,           d.dense_inter_local};
  be_.moe_experts_grouped(s.v.data(), none, s.expert_idx.data(), s.expert_w.data(), rb, 0, &mlp,
                          d.swiglu_limit, s.moe_partial.data());
}

void Block::forward(const ops::RowBatch& rb, const bf16* x, SlotCaches& caches, bf16* x_out) {
  forward(rb, x, caches, x_out, Options{});
}

void Block::shadow_select(const ops::RowBatch& rb, SlotCaches& caches) {
  const BlockDims& d = dims_;
  const int n = rb.rows;
  MTP_REQUIRE(scratch_ && scratch_->shadow_selection.size() > 0 && n >= 1 && n <= scratch_->rows,
              "block: shadow_select of ", n, " rows needs reserve(.., shadow = true)");
  BlockScratch& s = *scratch_;
  const int qidx_width = d.index_heads * d.index_dim;
  // The caches now also hold the rows after each row's position (the rest of the batch); a row's
  // selection reads pools and rows <= its position only (see forward), as they were when forward
  // selected. The scores go to the forward's scores buffer, which nothing reads after forward.
  be_.linear_f32(w_.idx_wq_b.data(), s.cq.data(), s.shadow_q_idx.data(), n, qidx_width, d.q_lora,
                 ops::RowsMode::per_row);
  be_.indexer_scores_batch(s.shadow_q_idx.data(), s.w_idx.data(), rb, caches.indexer_slots(), s.scores.data(),
                           d.index_heads);
  be_.indexer_select_batch(s.scores.data(), rb, s.shadow_selection.data(), d.index_topk, d.index_kpool,
                           d.max_pools());
}

}  // namespace mtplab::drafter
