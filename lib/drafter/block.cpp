// The DSA + MoE block's forward, op by op (docs/model.md, "DSA attention", "The pooled indexer", "MoE").
#include "drafter/block.hpp"

#include <cmath>
#include <numeric>

#include "core/error.hpp"

namespace mtplab::drafter {

LayerCache::LayerCache(ops::Backend& be, const BlockDims& d) {
  MTP_REQUIRE(d.max_rows > 0 && d.max_rows % d.index_kpool == 0, "layer cache: capacity ", d.max_rows,
              " is not a positive whole number of pools of ", d.index_kpool);
  const int num_blocks = (d.max_rows + d.block_size - 1) / d.block_size;
  block_table = ops::Array<int32_t>(be, num_blocks);
  // One sequence owns its blocks; the table maps logical to physical blocks (identity here, but
  // every access goes through it, as in a shared paged pool).
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  be.upload(block_table.data(), table.data(), table.size() * sizeof(int32_t));
  const size_t elem = d.kv_dtype == ops::KvDtype::bf16 ? 2 : 1;
  kv_data_ = ops::Array<uint8_t>(be, static_cast<size_t>(num_blocks) * d.block_size * d.kv_lora * elem);
  kv_ = ops::KvCache{kv_data_.data(), d.kv_dtype, d.kv_scale, num_blocks, d.block_size, d.kv_lora};
  k_cache = ops::Array<bf16>(be, static_cast<size_t>(d.max_rows) * d.index_dim);
  gate_cache = ops::Array<float>(be, static_cast<size_t>(d.max_rows) * d.index_dim);
  valid = ops::Array<uint8_t>(be, d.max_rows);
  pool_keys = ops::Array<float>(be, static_cast<size_t>(d.max_pools()) * d.index_dim);
  be.fill_bytes(valid.data(), 0, valid.bytes());
}

CacheView LayerCache::view() {
  return CacheView{block_table.data(), kv_,          k_cache.data(),
                   gate_cache.data(),  valid.data(), pool_keys.data()};
}

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

CacheView SlotCaches::view(int slot) {
  MTP_REQUIRE(slot >= 0 && slot < slots_, "slot caches: slot ", slot, " of ", slots_);
  const size_t s = static_cast<size_t>(slot);
  const size_t rows = static_cast<size_t>(dims_.max_rows);
  const size_t D = static_cast<size_t>(dims_.index_dim);
  return CacheView{block_tables.data() + s * max_blocks_,
                   kv_,
                   k_cache.data() + s * rows * D,
                   gate_cache.data() + s * rows * D,
                   valid.data() + s * rows,
                   pool_keys.data() + s * dims_.max_pools() * D};
}

ops::KvSlots SlotCaches::kv_slots() { return ops::KvSlots{kv_, block_tables.data(), slots_, max_blocks_}; }

ops::IndexerSlots SlotCaches::indexer_slots() {
  return ops::IndexerSlots{k_cache.data(), gate_cache.data(), valid.data(),    pool_keys.data(),
                           slots_,         dims_.max_rows,    dims_.index_dim, dims_.index_kpool};
}

void SlotCaches::clear(ops::Backend& be, int slot) {
  be.fill_bytes(view(slot).valid, 0, static_cast<size_t>(dims_.max_rows));
}

void SlotCaches::copy_slot(ops::Backend& be, int from, int to, int rows) {
  MTP_REQUIRE(rows >= 0 && rows <= dims_.max_rows, "slot caches: copy of ", rows, " rows, capacity ",
              dims_.max_rows);
  MTP_REQUIRE(from != to, "slot caches: copy of slot ", from, " onto itself");
  const CacheView src = view(from), dst = view(to);
  const size_t elem = dims_.kv_dtype == ops::KvDtype::bf16 ? 2 : 1;
  const size_t block_bytes = static_cast<size_t>(dims_.block_size) * dims_.kv_lora * elem;
  auto* kv = static_cast<uint8_t*>(kv_.data);
  const size_t S = static_cast<size_t>(slots_);
  for (int j = 0; j * dims_.block_size < rows; ++j)  // logical block j of a slot: physical j * slots + slot
    be.copy(kv + (static_cast<size_t>(j) * S + static_cast<size_t>(to)) * block_bytes,
            kv + (static_cast<size_t>(j) * S + static_cast<size_t>(from)) * block_bytes, block_bytes);
  const size_t D = static_cast<size_t>(dims_.index_dim);
  const size_t n = static_cast<size_t>(rows);
  be.copy(dst.k_cache, src.k_cache, n * D * sizeof(bf16));
  be.copy(dst.gate_cache, src.gate_cache, n * D * sizeof(float));
  be.fill_bytes(dst.valid, 0, static_cast<size_t>(dims_.max_rows));
  be.copy(dst.valid, src.valid, n);
  be.copy(dst.pool_keys, src.pool_keys, (n / static_cast<size_t>(dims_.index_kpool)) * D * sizeof(float));
}

BatchScratch::BatchScratch(ops::Backend& be, const BlockDims& d, int n, int share_width)
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
}

BlockScratch::BlockScratch(ops::Backend& be, const BlockDims& d)
    : u(be, d.hidden),
      cq_pre(be, d.q_lora),
      cq(be, d.q_lora),
      q(be, static_cast<size_t>(d.n_heads_local) * d.qk_nope),
      ckv_pre(be, d.kv_lora),
      k_pre(be, d.index_dim),
      q_abs(be, static_cast<size_t>(d.n_heads_local) * d.kv_lora),
      o_lat(be, static_cast<size_t>(d.n_heads_local) * d.kv_lora),
      o(be, static_cast<size_t>(d.n_heads_local) * d.v_head),
      v(be, d.hidden),
      gate(be, d.index_dim),
      q_idx(be, static_cast<size_t>(d.index_heads) * d.index_dim),
      w_idx(be, d.index_heads),
      scores(be, d.max_pools()),
      attn_partial(be, d.hidden),
      router_logits(be, d.num_experts),
      moe_partial(be, d.hidden),
      selection(be, d.selection_width()),
      expert_idx(be, d.top_k),
      expert_w(be, d.top_k) {}

RowsScratch::RowsScratch(ops::Backend& be, const BlockDims& d, int rows, bool shadow, bool with_gemm)
    : max_rows(rows),
      gemm(with_gemm),
      cq(be, static_cast<size_t>(rows) * d.q_lora),
      q(be, static_cast<size_t>(rows) * d.n_heads_local * d.qk_nope),
      w_idx(be, static_cast<size_t>(rows) * d.index_heads),
      q_idx(be, static_cast<size_t>(rows) * d.index_heads * d.index_dim),
      selection(be, static_cast<size_t>(rows) * d.selection_width()) {
  if (with_gemm) {
    u = ops::Array<bf16>(be, static_cast<size_t>(rows) * d.hidden);
    cq_pre = ops::Array<bf16>(be, static_cast<size_t>(rows) * d.q_lora);
    ckv_pre = ops::Array<bf16>(be, static_cast<size_t>(rows) * d.kv_lora);
    k_pre = ops::Array<bf16>(be, static_cast<size_t>(rows) * d.index_dim);
    gate = ops::Array<float>(be, static_cast<size_t>(rows) * d.index_dim);
  }
  if (shadow) {
    shadow_q_idx = ops::Array<float>(be, static_cast<size_t>(rows) * d.index_heads * d.index_dim);
    shadow_selection = ops::Array<int32_t>(be, static_cast<size_t>(rows) * d.selection_width());
  }
}

Block::Block(ops::Backend& be, dist::Communicator* comm, BlockDims dims, BlockWeights weights)
    : be_(be), comm_(comm), dims_(dims), w_(std::move(weights)), scratch_(be, dims_) {
  MTP_REQUIRE(dims_.softmax_scale > 0, "block: softmax_scale is not set");
  MTP_REQUIRE(dims_.index_topk % dims_.index_kpool == 0, "block: index_topk ", dims_.index_topk,
              " is not divisible by index_kpool ", dims_.index_kpool);
}

void Block::all_reduce(float* partial, int n) {
  if (comm_ && comm_->size() > 1) comm_->all_reduce_sum(partial, partial, static_cast<size_t>(n));
}

void Block::write_caches(const int32_t* pos, const CacheView& cache) {
  auto& s = scratch_;
  write_caches_from(s.ckv_pre.data(), s.k_pre.data(), s.gate.data(), pos, cache);
}

void Block::write_caches_from(const bf16* ckv_pre, const bf16* k_pre, const float* gate, const int32_t* pos,
                              const CacheView& cache) {
  const BlockDims& d = dims_;
  // Latent row: c_kv = RMSNorm_kva(W_kva u), cached at slot pos (the norm and the write in one op;
  // c_kv is read from the cache only, so it is not kept elsewhere).
  be_.kv_norm_write(ckv_pre, w_.kv_a_norm.data(), d.rms_eps, cache.block_table, pos, cache.kv);
  // Indexer row: k_normed = LayerNorm(W_k u) (weight and bias), gate = W_gate u in fp32, stored
  // with the pool key when the row completes a pool (one op).
  be_.indexer_norm_store(k_pre, w_.idx_k_norm_w.data(), w_.idx_k_norm_b.data(), d.index_ln_eps, gate,
                         w_.idx_ape.data(), pos, cache.k_cache, cache.gate_cache, cache.valid,
                         cache.pool_keys, d.index_dim, d.index_kpool);
}

namespace {
// The projections of u for n rows, each weight read once for all of them (RowsMode::batched):
// the input norm, kv_a, indexer wk and gate, and with `full` also q_a, weights_proj (scaled by
// 1/sqrt(n_I) as linear_group folds it: one fp32 multiply per value), the q_a norm and q_b. The
// projections of u are one linear_rows_group, each output bit-identical to its own batched linear.
// Context rows (RowsScratch) and the batched draft step (BatchScratch) share it; the outputs are
// independent, so their order does not change a bit. `indexer_query` false (chained drafts under
// index_share): no weights_proj, whose w_idx only the indexer scores read.
template <typename Scratch>
void project_rows(ops::Backend& be, const BlockWeights& w, const BlockDims& d, int n, const bf16* x,
                  Scratch& s, bool full, bool indexer_query = true) {
  be.rmsnorm(x, w.input_norm.data(), s.u.data(), n, d.hidden, d.rms_eps);
  // Every projection of u in one op (one launch where the multi-row GEMV takes them all).
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(d.index_heads));
  const ops::LinearOut outs[] = {
      {w.kv_a.data(), s.ckv_pre.data(), d.kv_lora, false, 1.0f},
      {w.idx_wk.data(), s.k_pre.data(), d.index_dim, false, 1.0f},
      {w.idx_gate.data(), s.gate.data(), d.index_dim, true, 1.0f},
      {w.q_a.data(), s.cq_pre.data(), d.q_lora, false, 1.0f},
      {w.idx_weights_proj.data(), s.w_idx.data(), d.index_heads, true, w_scale},
  };
  const size_t n_outs = !full ? 3 : indexer_query ? 5 : 4;
  be.linear_rows_group(std::span<const ops::LinearOut>(outs, n_outs), s.u.data(), n, d.hidden);
  if (!full) return;
  be.rmsnorm(s.cq_pre.data(), w.q_a_norm.data(), s.cq.data(), n, d.q_lora, d.rms_eps);
  be.linear(w.q_b.data(), s.cq.data(), s.q.data(), n, d.n_heads_local * d.qk_nope, d.q_lora,
            ops::RowsMode::batched);
}
}  // namespace

void Block::project_rows_batched(int n, const bf16* x, bool full) {
  project_rows(be_, w_, dims_, n, x, *rows_, full);
}

void Block::write_context_rows(int n, const bf16* x, const int32_t* pos, LayerCache& cache) {
  write_context_rows(n, x, pos, cache.view(), cache.rows());
  cache.set_rows(cache.rows() + n);
}

void Block::write_context_rows(int n, const bf16* x, const int32_t* pos, const CacheView& cache, int rows) {
  const BlockDims& d = dims_;
  MTP_REQUIRE(rows_ && rows_->gemm && n >= 1 && n <= rows_->max_rows, "block: write_context_rows of ", n,
              " rows needs reserve_rows(", n, ", .., gemm = true)");
  MTP_REQUIRE(rows + n <= d.max_rows, "block: context rows ", rows, "..", rows + n - 1,
              " are past the capacity of ", d.max_rows, " rows");
  RowsScratch& rs = *rows_;
  project_rows_batched(n, x, false);
  for (int r = 0; r < n; ++r)
    write_caches_from(rs.ckv_pre.data() + static_cast<size_t>(r) * d.kv_lora,
                      rs.k_pre.data() + static_cast<size_t>(r) * d.index_dim,
                      rs.gate.data() + static_cast<size_t>(r) * d.index_dim, pos + r, cache);
}

void Block::write_context_row(const bf16* x, const int32_t* pos, LayerCache& cache) {
  write_context_row(x, pos, cache.view(), cache.rows());
  cache.set_rows(cache.rows() + 1);
}

void Block::write_context_row(const bf16* x, const int32_t* pos, const CacheView& cache, int rows) {
  MTP_REQUIRE(rows < dims_.max_rows, "block: context row ", rows, " is past the capacity of ", dims_.max_rows,
              " rows");
  auto& s = scratch_;
  be_.rmsnorm(x, w_.input_norm.data(), s.u.data(), 1, dims_.hidden, dims_.rms_eps);
  // The cache-side projections of u (kv_a, indexer wk, gate) in one op.
  const ops::LinearOut outs[] = {
      {w_.kv_a.data(), s.ckv_pre.data(), dims_.kv_lora, false, 1.0f},
      {w_.idx_wk.data(), s.k_pre.data(), dims_.index_dim, false, 1.0f},
      {w_.idx_gate.data(), s.gate.data(), dims_.index_dim, true, 1.0f},
  };
  be_.linear_group(outs, s.u.data(), dims_.hidden);
  write_caches(pos, cache);
}

void Block::project_row(const bf16* x, const int32_t* pos, const CacheView& cache, bf16* cq, bf16* q,
                        float* w_idx) {
  const BlockDims& d = dims_;
  auto& s = scratch_;
  be_.rmsnorm(x, w_.input_norm.data(), s.u.data(), 1, d.hidden, d.rms_eps);
  // Every projection of u in one op: q_a, kv_a, indexer wk and gate, and the indexer head weights
  // w = W_w u / sqrt(n_I) (fp32, the scale applied as scale_f32 would: bit-identical). Each output
  // of the group is the same bits without the others, so leaving w out (no w_idx) changes none.
  const ops::LinearOut outs[] = {
      {w_.q_a.data(), s.cq_pre.data(), d.q_lora, false, 1.0f},
      {w_.kv_a.data(), s.ckv_pre.data(), d.kv_lora, false, 1.0f},
      {w_.idx_wk.data(), s.k_pre.data(), d.index_dim, false, 1.0f},
      {w_.idx_gate.data(), s.gate.data(), d.index_dim, true, 1.0f},
      {w_.idx_weights_proj.data(), w_idx, d.index_heads, true,
       1.0f / std::sqrt(static_cast<float>(d.index_heads))},
  };
  be_.linear_group(std::span<const ops::LinearOut>(outs, w_idx ? 5 : 4), s.u.data(), d.hidden);
  be_.rmsnorm(s.cq_pre.data(), w_.q_a_norm.data(), cq, 1, d.q_lora, d.rms_eps);
  be_.linear(w_.q_b.data(), cq, q, 1, d.n_heads_local * d.qk_nope, d.q_lora);
  write_caches(pos, cache);
}

void Block::finish_row(const bf16* x, const int32_t* pos, const CacheView& cache, bf16* x_out, const bf16* q,
                       const float* w_idx, const float* q_idx, int32_t* selection, const OutNorm* out_norm,
                       const int32_t* share_anchor_pos) {
  const BlockDims& d = dims_;
  auto& s = scratch_;
  int width = d.selection_width();
  if (share_anchor_pos) {
    // index_share: the anchor's pools (scratch_.selection, the first draft's) and the rows from its
    // tail to pos, instead of scores and a selection of this row's own.
    width = share_width();
    be_.indexer_share_select(s.selection.data(), share_anchor_pos, pos, 1, s.share_selection.data(), width,
                             d.index_topk, d.index_kpool);
    selection = s.share_selection.data();
  } else {
    // Indexer scores over the complete pools visible at pos, then the top-k selection.
    be_.indexer_scores(q_idx, w_idx, cache.pool_keys, pos, s.scores.data(), d.index_heads, d.index_dim,
                       d.index_kpool, d.max_pools());
    be_.indexer_select(s.scores.data(), pos, selection, d.index_topk, d.index_kpool, d.max_pools());
  }
  // Absorbed sparse MLA over this rank's heads.
  if (d.n_heads_local > 0) {
    be_.mla_absorb_q(q, w_.kv_b.data(), s.q_abs.data(), d.n_heads_local, d.qk_nope, d.v_head, d.kv_lora);
    be_.mla_decode(s.q_abs.data(), selection, width, cache.block_table, cache.kv, s.o_lat.data(),
                   d.n_heads_local, d.softmax_scale);
    be_.mla_out_v(s.o_lat.data(), w_.kv_b.data(), s.o.data(), d.n_heads_local, d.qk_nope, d.v_head,
                  d.kv_lora);
    be_.linear_f32(w_.o_proj.data(), s.o.data(), s.attn_partial.data(), 1, d.hidden,
                   d.n_heads_local * d.v_head);
  } else {
    be_.fill_bytes(s.attn_partial.data(), 0, s.attn_partial.bytes());
  }
  all_reduce(s.attn_partial.data(), d.hidden);
  // ---- MoE ---- (x_out = x + attn, v = RMSNorm_post(x_out): one op)
  be_.residual_add_rmsnorm(x, s.attn_partial.data(), x_out, w_.post_norm.data(), s.v.data(), d.hidden,
                           d.rms_eps);
  be_.linear_f32(w_.router.data(), s.v.data(), s.router_logits.data(), 1, d.num_experts, d.hidden);
  be_.moe_route(s.router_logits.data(), w_.router_bias.data(), d.num_experts, d.top_k, d.n_group,
                d.topk_group, d.routed_scaling, s.expert_idx.data(), s.expert_w.data());
  ops::ExpertWeights routed{w_.exp_gate.data(),   w_.exp_up.data(), w_.exp_down.data(), w_.first_expert,
                            w_.num_local_experts, d.hidden,         d.moe_inter};
  if (d.shared_inter_local > 0) {
    // Routed experts, then the shared expert's slice added last: one op (one pass, two launches).
    ops::ExpertWeights shared{w_.sh_gate.data(), w_.sh_up.data(),     w_.sh_down.data(), 0, 1,
                              d.hidden,          d.shared_inter_local};
    be_.moe_experts_shared(s.v.data(), routed, s.expert_idx.data(), s.expert_w.data(), d.top_k, shared,
                           d.swiglu_limit, s.moe_partial.data());
  } else {
    be_.moe_experts(s.v.data(), routed, s.expert_idx.data(), s.expert_w.data(), d.top_k, d.swiglu_limit,
                    s.moe_partial.data());
  }
  all_reduce(s.moe_partial.data(), d.hidden);
  if (out_norm) {
    be_.residual_add_rmsnorm(x_out, s.moe_partial.data(), x_out, out_norm->w, out_norm->normed, d.hidden,
                             out_norm->eps);
  } else {
    be_.residual_add(x_out, s.moe_partial.data(), x_out, d.hidden);
  }
}

void Block::forward(const bf16* x, const int32_t* pos, LayerCache& cache, bf16* x_out,
                    const OutNorm* out_norm, const int32_t* share_anchor_pos) {
  const BlockDims& d = dims_;
  auto& s = scratch_;
  MTP_REQUIRE(cache.rows() < d.max_rows, "block: row ", cache.rows(), " is past the capacity of ", d.max_rows,
              " rows");
  if (share_anchor_pos) {
    MTP_REQUIRE(share_extra_ >= 0,
                "block: a forward that shares its indexer selection needs enable_index_share");
    MTP_REQUIRE(anchor_ready_,
                "block: a forward that shares its indexer selection needs a scoring forward "
                "(the propose's first draft) before it");
  }
  const CacheView view = cache.view();
  project_row(x, pos, view, s.cq.data(), s.q.data(), share_anchor_pos ? nullptr : s.w_idx.data());
  // Indexer query side: q^I = W_qbI c_q (none for a chained draft that shares the selection).
  if (!share_anchor_pos)
    be_.linear_f32(w_.idx_wq_b.data(), s.cq.data(), s.q_idx.data(), 1, d.index_heads * d.index_dim, d.q_lora);
  finish_row(x, pos, view, x_out, s.q.data(), s.w_idx.data(), s.q_idx.data(), s.selection.data(), out_norm,
             share_anchor_pos);
  if (!share_anchor_pos) anchor_ready_ = true;
  cache.set_rows(cache.rows() + 1);
}

void Block::enable_index_share(int max_drafts) {
  MTP_REQUIRE(max_drafts >= 1, "block: enable_index_share(", max_drafts, ")");
  if (share_extra_ >= max_drafts - 1) return;
  share_extra_ = max_drafts - 1;
  scratch_.share_selection = ops::Array<int32_t>(be_, static_cast<size_t>(share_width()));
  be_.fill_bytes(scratch_.share_selection.data(), 0xFF, scratch_.share_selection.bytes());
  if (batch_) {
    // The batch buffers again, now with the chained drafts' selections.
    const int rows = batch_->rows;
    batch_.reset();
    batch_anchor_ready_ = false;
    reserve_batch(rows);
  }
}

void Block::reserve_rows(int max_rows, bool shadow, bool gemm) {
  MTP_REQUIRE(max_rows >= 1, "block: reserve_rows(", max_rows, ")");
  if (rows_ && rows_->max_rows >= max_rows && (!shadow || rows_->shadow_selection.size() > 0) &&
      (!gemm || rows_->gemm))
    return;
  rows_ = std::make_unique<RowsScratch>(be_, dims_, max_rows, shadow, gemm);
}

// Why all rows' caches may be written (phase A) before any row's selection and attention
// (phase C), with the same result as one row at a time: row r at position p reads from the
// caches only through `pos` = p. indexer_scores reads the keys of pools j with jP + P - 1 <= p
// (a pool key is written when its last row is stored, so rows past p never touch these keys);
// indexer_select ranks those pools and adds the tail rows up to p; mla_decode reads the latent
// rows of that selection only, all <= p. The rows p+1 .. of the chunk that phase A wrote early
// are never read by row r: in the per-row loop those slots held stale rows (or nothing), which
// row r did not read either. Nothing else row r computes depends on the caches.
void Block::forward_rows(int n, const bf16* x, const int32_t* pos, LayerCache& cache, bf16* x_out,
                         ops::RowsMode qidx_mode, ops::RowsMode proj_mode) {
  forward_rows(n, x, pos, cache.view(), cache.rows(), x_out, qidx_mode, proj_mode);
  cache.set_rows(cache.rows() + n);
}

void Block::forward_rows(int n, const bf16* x, const int32_t* pos, const CacheView& cache, int rows,
                         bf16* x_out, ops::RowsMode qidx_mode, ops::RowsMode proj_mode) {
  const BlockDims& d = dims_;
  MTP_REQUIRE(rows_ && n >= 1 && n <= rows_->max_rows, "block: forward_rows of ", n,
              " rows, chunk buffers for ", rows_ ? rows_->max_rows : 0, " (reserve_rows first)");
  MTP_REQUIRE(rows + n <= d.max_rows, "block: rows ", rows, "..", rows + n - 1, " are past the capacity of ",
              d.max_rows, " rows");
  RowsScratch& rs = *rows_;
  const size_t H = static_cast<size_t>(d.hidden);
  const size_t q_width = static_cast<size_t>(d.n_heads_local) * d.qk_nope;
  const int qidx_width = d.index_heads * d.index_dim;
  const size_t width = static_cast<size_t>(d.selection_width());
  // Phase A: everything up to and including the cache writes, per row or batched.
  if (proj_mode == ops::RowsMode::batched) {
    MTP_REQUIRE(rs.gemm, "block: forward_rows with batched projections needs reserve_rows(.., gemm = true)");
    project_rows_batched(n, x, true);
    for (int r = 0; r < n; ++r)
      write_caches_from(rs.ckv_pre.data() + static_cast<size_t>(r) * d.kv_lora,
                        rs.k_pre.data() + static_cast<size_t>(r) * d.index_dim,
                        rs.gate.data() + static_cast<size_t>(r) * d.index_dim, pos + r, cache);
  } else {
    for (int r = 0; r < n; ++r) {
      project_row(x + r * H, pos + r, cache, rs.cq.data() + static_cast<size_t>(r) * d.q_lora,
                  rs.q.data() + r * q_width, rs.w_idx.data() + static_cast<size_t>(r) * d.index_heads);
    }
  }
  // Phase B: the indexer queries q^I = W_qbI c_q of all rows.
  if (qidx_mode == ops::RowsMode::batched) {
    be_.linear_f32(w_.idx_wq_b.data(), rs.cq.data(), rs.q_idx.data(), n, qidx_width, d.q_lora,
                   ops::RowsMode::batched);
  } else {
    for (int r = 0; r < n; ++r)
      be_.linear_f32(w_.idx_wq_b.data(), rs.cq.data() + static_cast<size_t>(r) * d.q_lora,
                     rs.q_idx.data() + static_cast<size_t>(r) * qidx_width, 1, qidx_width, d.q_lora);
  }
  // Phase C: per row, selection, attention and MoE.
  for (int r = 0; r < n; ++r) {
    finish_row(x + r * H, pos + r, cache, x_out + r * H, rs.q.data() + r * q_width,
               rs.w_idx.data() + static_cast<size_t>(r) * d.index_heads,
               rs.q_idx.data() + static_cast<size_t>(r) * qidx_width, rs.selection.data() + r * width);
  }
}

void Block::shadow_select_rows(int n, const int32_t* pos, LayerCache& cache) {
  shadow_select_rows(n, pos, cache.view());
}

void Block::shadow_select_rows(int n, const int32_t* pos, const CacheView& cache) {
  const BlockDims& d = dims_;
  MTP_REQUIRE(rows_ && rows_->shadow_selection.size() > 0 && n >= 1 && n <= rows_->max_rows,
              "block: shadow_select_rows of ", n, " rows needs reserve_rows with the shadow buffers");
  RowsScratch& rs = *rows_;
  const int qidx_width = d.index_heads * d.index_dim;
  const size_t width = static_cast<size_t>(d.selection_width());
  // The caches now also hold the rows after each row's position (the rest of the chunk); the
  // selection of a row reads pools and rows <= its position only (see forward_rows), which are
  // as they were when phase C ran.
  for (int r = 0; r < n; ++r) {
    float* q_idx = rs.shadow_q_idx.data() + static_cast<size_t>(r) * qidx_width;
    be_.linear_f32(w_.idx_wq_b.data(), rs.cq.data() + static_cast<size_t>(r) * d.q_lora, q_idx, 1, qidx_width,
                   d.q_lora);
    be_.indexer_scores(q_idx, rs.w_idx.data() + static_cast<size_t>(r) * d.index_heads, cache.pool_keys,
                       pos + r, scratch_.scores.data(), d.index_heads, d.index_dim, d.index_kpool,
                       d.max_pools());
    be_.indexer_select(scratch_.scores.data(), pos + r, rs.shadow_selection.data() + r * width, d.index_topk,
                       d.index_kpool, d.max_pools());
  }
}

// ---- batched: one row per sequence ------------------------------------------------------------

bool Block::reserve_batch(int rows) {
  MTP_REQUIRE(rows >= 1, "block: reserve_batch(", rows, ")");
  if (batch_ && batch_->rows >= rows) return false;
  batch_ = std::make_unique<BatchScratch>(be_, dims_, rows, share_width());
  batch_anchor_ready_ = false;  // the new buffers hold no first draft's selection yet
  return true;
}

// The single-row forward, op for op, with every op over the n rows at once. On the CPU each row is
// bit-identical to forward(): the batched linears compute exactly the per-row GEMVs of
// linear_group (the 1/sqrt(n_I) scale applied as the group applies it), the batched ops are the
// single-row ops per row, and the all-reduces sum elementwise (an element's sum does not depend on
// the other elements of the call at 2 ranks; at more ranks an implementation may pick its
// algorithm by message size).
void Block::forward_batch(int n, const bf16* x, const int32_t* slot, const int32_t* pos, SlotCaches& caches,
                          bf16* x_out, const OutNorm* out_norm, const int32_t* share_anchor_pos) {
  const BlockDims& d = dims_;
  MTP_REQUIRE(batch_ && n >= 1 && n <= batch_->rows, "block: forward_batch of ", n, " rows, buffers for ",
              batch_ ? batch_->rows : 0, " (reserve_batch first)");
  if (share_anchor_pos) {
    MTP_REQUIRE(share_extra_ >= 0,
                "block: a forward_batch that shares its indexer selection needs enable_index_share");
    MTP_REQUIRE(batch_anchor_ready_,
                "block: a forward_batch that shares its indexer selection needs a scoring "
                "forward_batch (the step's first draft) before it");
  }
  BatchScratch& bs = *batch_;
  constexpr ops::RowsMode kBatched = ops::RowsMode::batched;
  const ops::KvSlots kv = caches.kv_slots();
  const ops::IndexerSlots idx = caches.indexer_slots();
  const int qidx_width = d.index_heads * d.index_dim;
  // ---- projections of u, every weight once for the n rows ----
  project_rows(be_, w_, d, n, x, bs, /*full=*/true, /*indexer_query=*/share_anchor_pos == nullptr);
  // ---- each row's cache rows at (slot, pos) ----
  be_.kv_norm_write_batch(bs.ckv_pre.data(), w_.kv_a_norm.data(), d.rms_eps, slot, pos, n, kv);
  be_.indexer_norm_store_batch(bs.k_pre.data(), w_.idx_k_norm_w.data(), w_.idx_k_norm_b.data(),
                               d.index_ln_eps, bs.gate.data(), w_.idx_ape.data(), slot, pos, n, idx);
  // ---- indexer over each row's own pool keys, then the selection; or (index_share) the first
  // draft's pools of each row plus its rows from that draft's tail on ----
  const int32_t* selection = bs.selection.data();
  int width = d.selection_width();
  if (share_anchor_pos) {
    width = share_width();
    be_.indexer_share_select(bs.selection.data(), share_anchor_pos, pos, n, bs.share_selection.data(), width,
                             d.index_topk, d.index_kpool);
    selection = bs.share_selection.data();
  } else {
    be_.linear_f32(w_.idx_wq_b.data(), bs.cq.data(), bs.q_idx.data(), n, qidx_width, d.q_lora, kBatched);
    be_.indexer_scores_batch(bs.q_idx.data(), bs.w_idx.data(), slot, pos, n, idx, bs.scores.data(),
                             d.index_heads);
    be_.indexer_select_batch(bs.scores.data(), slot, pos, n, bs.selection.data(), d.index_topk, d.index_kpool,
                             d.max_pools());
    batch_anchor_ready_ = true;
  }
  // ---- absorbed sparse MLA over this rank's heads, each row on its own latent rows ----
  if (d.n_heads_local > 0) {
    be_.mla_absorb_q_batch(bs.q.data(), w_.kv_b.data(), bs.q_abs.data(), n, d.n_heads_local, d.qk_nope,
                           d.v_head, d.kv_lora);
    be_.mla_decode_batch(bs.q_abs.data(), selection, width, slot, n, kv, bs.o_lat.data(), d.n_heads_local,
                         d.softmax_scale);
    be_.mla_out_v_batch(bs.o_lat.data(), w_.kv_b.data(), bs.o.data(), n, d.n_heads_local, d.qk_nope, d.v_head,
                        d.kv_lora);
    be_.linear_f32(w_.o_proj.data(), bs.o.data(), bs.attn_partial.data(), n, d.hidden,
                   d.n_heads_local * d.v_head, kBatched);
  } else {
    be_.fill_bytes(bs.attn_partial.data(), 0, static_cast<size_t>(n) * d.hidden * sizeof(float));
  }
  all_reduce(bs.attn_partial.data(), n * d.hidden);
  // ---- MoE: the router per row, the routed experts grouped over the rows ----
  be_.residual_add_rmsnorm_rows(x, bs.attn_partial.data(), x_out, w_.post_norm.data(), bs.v.data(), n,
                                d.hidden, d.rms_eps);
  be_.linear_f32(w_.router.data(), bs.v.data(), bs.router_logits.data(), n, d.num_experts, d.hidden,
                 kBatched);
  be_.moe_route_batch(bs.router_logits.data(), w_.router_bias.data(), slot, n, d.num_experts, d.top_k,
                      d.n_group, d.topk_group, d.routed_scaling, bs.expert_idx.data(), bs.expert_w.data());
  const ops::ExpertWeights routed{w_.exp_gate.data(),   w_.exp_up.data(), w_.exp_down.data(), w_.first_expert,
                                  w_.num_local_experts, d.hidden,         d.moe_inter};
  const ops::ExpertWeights shared{w_.sh_gate.data(), w_.sh_up.data(),     w_.sh_down.data(), 0, 1,
                                  d.hidden,          d.shared_inter_local};
  if (n == 1) {
    // A bucket of one row holds a live row (the batch is never empty): the single-row expert
    // kernels, which stream one row's experts faster than the grouped plan (docs/drafter.md).
    if (d.shared_inter_local > 0) {
      be_.moe_experts_shared(bs.v.data(), routed, bs.expert_idx.data(), bs.expert_w.data(), d.top_k, shared,
                             d.swiglu_limit, bs.moe_partial.data());
    } else {
      be_.moe_experts(bs.v.data(), routed, bs.expert_idx.data(), bs.expert_w.data(), d.top_k, d.swiglu_limit,
                      bs.moe_partial.data());
    }
  } else {
    be_.moe_experts_grouped(bs.v.data(), routed, bs.expert_idx.data(), bs.expert_w.data(), slot, n, d.top_k,
                            d.shared_inter_local > 0 ? &shared : nullptr, d.swiglu_limit,
                            bs.moe_partial.data());
  }
  all_reduce(bs.moe_partial.data(), n * d.hidden);
  if (out_norm) {
    be_.residual_add_rmsnorm_rows(x_out, bs.moe_partial.data(), x_out, out_norm->w, out_norm->normed, n,
                                  d.hidden, out_norm->eps);
  } else {
    be_.residual_add(x_out, bs.moe_partial.data(), x_out, n * d.hidden);
  }
}

const int32_t* Block::rows_selection() const { return rows_ ? rows_->selection.data() : nullptr; }
const int32_t* Block::rows_shadow_selection() const {
  return rows_ ? rows_->shadow_selection.data() : nullptr;
}

}  // namespace mtplab::drafter
