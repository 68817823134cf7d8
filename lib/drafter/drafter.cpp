// MtpDrafter: forward_one chained k times, the context rows, rollback, and the cross-rank pick
// of the draft token (the four exchange protocols of DESIGN.md).
#include "drafter/drafter.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "drafter/graph.hpp"

namespace mtplab::drafter {

const char* to_string(Phase p) {
  static const char* names[] = {"prefill", "propose", "block", "head", "exchange", "after_verify", "catch_up"};
  return names[static_cast<int>(p)];
}

VocabShard vocab_shard(const model::ShardPlan& plan) {
  const int64_t V = plan.total_vocab;
  MTP_REQUIRE(plan.vocab.count > 0, "rank ", plan.rank, " of ", plan.world, " holds no vocab rows of ", V);
  const int64_t largest = plan.vocab_sharded() ? (V + plan.world - 1) / plan.world : V;
  return VocabShard{plan.vocab.begin, plan.vocab.count, largest};
}

BlockDims block_dims(const model::ModelConfig& cfg, int world, int rank, ops::KvDtype kv_dtype) {
  MTP_REQUIRE(cfg.n_heads % world == 0, "model ", cfg.name, ": n_heads ", cfg.n_heads,
              " is not divisible by the ", world, " ranks the attention heads are split over");
  BlockDims d;
  d.hidden = cfg.hidden;
  d.n_heads_local = cfg.n_heads / world;
  d.qk_nope = cfg.qk_nope_head_dim;
  d.v_head = cfg.v_head_dim;
  d.q_lora = cfg.q_lora_rank;
  d.kv_lora = cfg.kv_lora_rank;
  d.index_heads = cfg.index_n_heads;
  d.index_dim = cfg.index_head_dim;
  d.index_topk = cfg.index_topk;
  d.index_kpool = cfg.index_kpool;
  d.num_experts = cfg.n_routed_experts;
  d.top_k = cfg.num_experts_per_tok;
  d.n_group = cfg.n_group;
  d.topk_group = cfg.topk_group;
  d.moe_inter = cfg.moe_intermediate_size;
  const int shared = cfg.shared_intermediate();
  d.shared_inter_local = shared / world + (rank < shared % world ? 1 : 0);
  d.routed_scaling = cfg.routed_scaling_factor;
  d.swiglu_limit = cfg.swiglu_limit;
  d.rms_eps = cfg.rms_norm_eps;
  d.index_ln_eps = cfg.index_norm_eps;
  d.softmax_scale = cfg.softmax_scale();
  d.max_rows = cfg.max_seq_len;
  d.block_size = cfg.block_size;
  d.kv_dtype = kv_dtype;
  return d;
}

MtpDrafter::MtpDrafter(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg, BlockDims dims,
                       FrontWeights front, BlockWeights block, VocabShard shard, DrafterOptions options)
    : be_(be),
      comm_(comm),
      world_(comm ? comm->size() : 1),
      rank_(comm ? comm->rank() : 0),
      hidden_(cfg.hidden),
      vocab_(cfg.vocab),
      eps_(cfg.rms_norm_eps),
      opt_(options),
      shard_(shard),
      fw_(std::move(front)),
      block_(be, comm, dims, std::move(block)),
      max_rows_(dims.max_rows) {
  check_options(opt_, OptionsContext{world_, vocab_, be_.supports_graphs() ? 1 : 0});
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  if (opt_.cuda_graph) {
    graphs_ = std::make_unique<StepGraphs>(be_);
  }
  MTP_REQUIRE(!opt_.head_fp8 || fw_.lm_head_fp8.size() == static_cast<size_t>(shard_.n) * hidden_,
              "head_fp8 is on but the FP8 copy of the head shard is missing");
  const int k = opt_.draft_len;
  concat_ = ops::Array<bf16>(be_, 2 * static_cast<size_t>(hidden_));
  x_ = ops::Array<bf16>(be_, hidden_);
  y_ = ops::Array<bf16>(be_, hidden_);
  hidden_in_ = ops::Array<bf16>(be_, hidden_);
  tokens_ = ops::Array<int32_t>(be_, k + 1);
  positions_ = ops::Array<int32_t>(be_, k);
  pos_base_ = ops::Array<int32_t>(be_, 1);
  xchg_ = std::make_unique<ExchangeBuffers>(be_, world_, shard_.stride,
                                            sharded && opt_.exchange == Exchange::allgather_logits);
  row_chunk_ = 256;
  row_tokens_ = ops::Array<int32_t>(be_, row_chunk_);
  row_positions_ = ops::Array<int32_t>(be_, row_chunk_);
  row_hiddens_ = ops::Array<bf16>(be_, static_cast<size_t>(row_chunk_) * hidden_);
  if (opt_.context_rows == ContextRows::full || opt_.context_gemm) {
    row_x_ = ops::Array<bf16>(be_, static_cast<size_t>(row_chunk_) * hidden_);
    block_.reserve_rows(row_chunk_, checks_selection(), opt_.context_gemm);
  }
  if (opt_.context_gemm) row_concat_ = ops::Array<bf16>(be_, static_cast<size_t>(row_chunk_) * 2 * hidden_);
}

bool MtpDrafter::checks_selection() const {
  return opt_.batch_qidx && opt_.selection_check && opt_.context_rows == ContextRows::full;
}

MtpDrafter::~MtpDrafter() = default;

void MtpDrafter::release_graphs() noexcept {
  if (graphs_) graphs_->clear();
}

int MtpDrafter::graph_recordings() const { return graphs_ ? graphs_->recordings() : 0; }

void MtpDrafter::keep_head_inputs(bool on) {
  keep_head_inputs_ = on;
  if (on && head_inputs_.size() == 0)
    head_inputs_ = ops::Array<bf16>(be_, static_cast<size_t>(opt_.draft_len) * hidden_);
  // A recorded step does (or does not) copy the head inputs: record again.
  release_graphs();
}

std::vector<bf16> MtpDrafter::head_inputs() {
  MTP_REQUIRE(keep_head_inputs_, "drafter: head_inputs() needs keep_head_inputs(true) before the propose");
  std::vector<bf16> out(static_cast<size_t>(last_k_) * hidden_);
  wait_comm();
  be_.download(out.data(), head_inputs_.data(), out.size() * sizeof(bf16));
  return out;
}

void MtpDrafter::wait_comm() {
  if (comm_ && comm_->size() > 1) comm_->wait();
}

std::unique_ptr<SequenceState> MtpDrafter::new_sequence() {
  return std::make_unique<SequenceState>(be_, block_.dims());
}

void MtpDrafter::front(const int32_t* token_dev, const bf16* hidden_dev, bf16* x0) {
  be_.embed_rmsnorm(fw_.embed.data(), token_dev, fw_.enorm.data(), concat_.data(), hidden_, eps_);
  be_.rmsnorm(hidden_dev, fw_.hnorm.data(), concat_.data() + hidden_, 1, hidden_, eps_);
  be_.linear(fw_.eh_proj.data(), concat_.data(), x0, 1, hidden_, 2 * hidden_);
}

void MtpDrafter::front_rows(int rows) {
  // [enorm(embed(t_r)); hnorm(h_r)] for every row of the chunk, then eh_proj as one batched linear.
  for (int r = 0; r < rows; ++r) {
    bf16* concat = row_concat_.data() + static_cast<size_t>(r) * 2 * hidden_;
    be_.embed_rmsnorm(fw_.embed.data(), row_tokens_.data() + r, fw_.enorm.data(), concat, hidden_, eps_);
    be_.rmsnorm(row_hiddens_.data() + static_cast<size_t>(r) * hidden_, fw_.hnorm.data(), concat + hidden_, 1,
                hidden_, eps_);
  }
  be_.linear(fw_.eh_proj.data(), row_concat_.data(), row_x_.data(), rows, hidden_, 2 * hidden_,
             ops::RowsMode::batched);
}

void MtpDrafter::append_rows(SequenceState& st, const int32_t* next_tokens, const bf16* hiddens, int n, int row_base,
                             Phase phase) {
  if (row_base != st.seq_len_) {
    ++st.refused_writes_;
    MTP_FAIL("drafter: context rows written at row ", row_base, " but the sequence holds ", st.seq_len_,
             " rows; rows are dense and must append at the current length");
  }
  MTP_REQUIRE(n >= 0, "drafter: negative row count ", n);
  if (row_base + n > max_rows_) {
    ++st.refused_writes_;
    MTP_FAIL("drafter: rows ", row_base, "..", row_base + n - 1, " are past the capacity of ", max_rows_,
             " rows (max_seq_len rounded down to whole pools)");
  }
  for (int i = 0; i < n; ++i)
    MTP_REQUIRE(next_tokens[i] >= 0 && next_tokens[i] < vocab_, "drafter: token id ", next_tokens[i], " at row ",
                row_base + i, " is outside the vocab of ", vocab_);
  mark_begin(phase, 0);
  std::vector<int32_t> pos(row_chunk_);
  const bool full = opt_.context_rows == ContextRows::full;
  const ops::RowsMode qidx_mode = opt_.batch_qidx ? ops::RowsMode::batched : ops::RowsMode::per_row;
  for (int c0 = 0; c0 < n; c0 += row_chunk_) {
    const int rows = std::min(row_chunk_, n - c0);
    wait_comm();  // the uploads below synchronise the stream: collectives of full rows go first
    for (int r = 0; r < rows; ++r) pos[r] = row_base + c0 + r;
    be_.upload(row_tokens_.data(), next_tokens + c0, rows * sizeof(int32_t));
    be_.upload(row_positions_.data(), pos.data(), rows * sizeof(int32_t));
    be_.upload(row_hiddens_.data(), hiddens + static_cast<size_t>(c0) * hidden_,
               static_cast<size_t>(rows) * hidden_ * sizeof(bf16));
    if (!full && opt_.context_gemm) {
      front_rows(rows);
      block_.write_context_rows(rows, row_x_.data(), row_positions_.data(), st.cache);
      continue;
    }
    if (!full) {
      for (int r = 0; r < rows; ++r) {
        front(row_tokens_.data() + r, row_hiddens_.data() + static_cast<size_t>(r) * hidden_, x_.data());
        block_.write_context_row(x_.data(), row_positions_.data() + r, st.cache);
      }
      continue;
    }
    // The MTP front of a row does not depend on other rows: all of the chunk's, then the block.
    if (opt_.context_gemm) {
      front_rows(rows);
    } else {
      for (int r = 0; r < rows; ++r) {
        bf16* x = row_x_.data() + static_cast<size_t>(r) * hidden_;
        front(row_tokens_.data() + r, row_hiddens_.data() + static_cast<size_t>(r) * hidden_, x);
      }
    }
    block_.forward_rows(rows, row_x_.data(), row_positions_.data(), st.cache, row_x_.data(), qidx_mode,
                        opt_.context_gemm ? ops::RowsMode::batched : ops::RowsMode::per_row);
    if (checks_selection()) {
      // Untimed: the phase is closed while the per-row selections are made and compared.
      mark_end(phase, 0);
      check_chunk(st, rows);
      mark_begin(phase, 0);
    }
  }
  st.seq_len_ += n;
  mark_end(phase, 0);
}

void MtpDrafter::check_chunk(SequenceState& st, int rows) {
  const size_t width = static_cast<size_t>(block_.dims().selection_width());
  block_.shadow_select_rows(rows, row_positions_.data(), st.cache);
  check_batched_.resize(static_cast<size_t>(rows) * width);
  check_per_row_.resize(static_cast<size_t>(rows) * width);
  wait_comm();
  be_.download(check_batched_.data(), block_.rows_selection(), check_batched_.size() * sizeof(int32_t));
  be_.download(check_per_row_.data(), block_.rows_shadow_selection(),
               check_per_row_.size() * sizeof(int32_t));
  SelectionCheck c =
      compare_selections(check_batched_.data(), check_per_row_.data(), rows, static_cast<int>(width));
  c.rows_multi = rows >= 2 ? rows : 0;
  check_ += c;
}

std::vector<int32_t> MtpDrafter::propose(SequenceState& st, int32_t token, const bf16* hidden, int k) {
  MTP_REQUIRE(k >= 1 && k <= opt_.draft_len, "drafter: draft length ", k, " outside 1..", opt_.draft_len);
  MTP_REQUIRE(token >= 0 && token < vocab_, "drafter: token id ", token, " is outside the vocab of ", vocab_);
  MTP_REQUIRE(st.propose_start_ < 0, "drafter: propose called twice without after_verify");
  if (st.seq_len_ + k > max_rows_)
    MTP_FAIL("drafter: a propose of ", k, " drafts at row ", st.seq_len_, " would pass the capacity of ", max_rows_,
             " rows");
  const int32_t base = st.seq_len_;
  be_.upload(tokens_.data(), &token, sizeof token);
  be_.upload(hidden_in_.data(), hidden, static_cast<size_t>(hidden_) * sizeof(bf16));
  be_.upload(pos_base_.data(), &base, sizeof base);
  st.propose_start_ = base;
  st.last_drafted_ = k;
  last_k_ = k;
  int written = 0;
  mark_begin(Phase::propose, 0);
  if (graphs_ && graph_warm_) {
    // Only Phase::propose is timed: the inner phases run inside the graph.
    PhaseTimer* const timer = timer_;
    timer_ = nullptr;
    const int rows_before = st.cache.rows();
    const StepGraphs::Key key{k,
                              {st.cache.block_table.data(), st.cache.kv().data, st.cache.k_cache.data(),
                               st.cache.gate_cache.data(), st.cache.valid.data(), st.cache.pool_keys.data()}};
    bool recorded = false;
    try {
      ops::Graph& graph = graphs_->get(key, [&] { written = draft_step(st, k); }, recorded);
      if (!recorded) {
        // A replay: apply the host-side effects the recording applied once.
        written = opt_.skip == Skip::block ? 0 : k;
        st.cache.set_rows(rows_before + written);
      }
      graph.launch();
    } catch (...) {
      timer_ = timer;
      st.propose_start_ = -1;
      throw;
    }
    timer_ = timer;
  } else if (graphs_) {
    PhaseTimer* const timer = timer_;
    timer_ = nullptr;
    try {
      written = draft_step(st, k);
    } catch (...) {
      timer_ = timer;
      throw;
    }
    timer_ = timer;
    graph_warm_ = true;
  } else {
    written = draft_step(st, k);
  }
  mark_end(Phase::propose, 0);
  st.rows_written_by_propose_ = written;
  st.seq_len_ += written;
  std::vector<int32_t> drafts(k);
  wait_comm();
  be_.download(drafts.data(), tokens_.data() + 1, k * sizeof(int32_t));
  return drafts;
}

int MtpDrafter::draft_step(SequenceState& st, int k) {
  int written = 0;
  for (int i = 0; i < k; ++i) {
    be_.add_i32(pos_base_.data(), i, positions_.data() + i);
    front(tokens_.data() + i, i == 0 ? hidden_in_.data() : y_.data(), x_.data());
    mark_begin(Phase::block, i);
    // The head's shared_head.norm rides on the block's last residual add (one launch less; its
    // time counts in Phase::block then).
    const bool norm_in_block = opt_.skip == Skip::none;
    if (opt_.skip != Skip::block) {
      const Block::OutNorm head_norm{fw_.shared_head_norm.data(), y_.data(), eps_};
      block_.forward(x_.data(), positions_.data() + i, st.cache, x_.data(),
                     norm_in_block ? &head_norm : nullptr);
      ++written;
    }
    mark_end(Phase::block, i);
    if (opt_.skip == Skip::head) {
      // Timing arm: no shared_head.norm, head or pick; the draft is token 0 and the block
      // output is recycled as the next hidden.
      be_.fill_bytes(tokens_.data() + i + 1, 0, sizeof(int32_t));
      be_.copy(y_.data(), x_.data(), static_cast<size_t>(hidden_) * sizeof(bf16));
      continue;
    }
    mark_begin(Phase::head, i);
    if (!norm_in_block) be_.rmsnorm(x_.data(), fw_.shared_head_norm.data(), y_.data(), 1, hidden_, eps_);
    if (keep_head_inputs_)
      be_.copy(head_inputs_.data() + static_cast<size_t>(i) * hidden_, y_.data(),
               static_cast<size_t>(hidden_) * sizeof(bf16));
    head_pick(i, tokens_.data() + i + 1);
    mark_end(Phase::head, i);
  }
  return written;
}

void MtpDrafter::head_pick(int draft_index, int32_t* token_out) {
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  const bf16* W = fw_.lm_head.data();
  const fp8e4m3* W8 = opt_.head_fp8 ? fw_.lm_head_fp8.data() : nullptr;
  const float* scale = opt_.head_fp8 ? fw_.lm_head_scale.data() : nullptr;
  const int n = static_cast<int>(shard_.n);
  bf16* logits = (sharded && opt_.exchange == Exchange::allgather_logits) ? xchg_->logits.data() : nullptr;
  // Unsharded, the head writes the token itself; sharded, what the protocol starts from (the
  // packed key for packed_u64), so no launch sits between the head and the collective.
  ops::HeadExtras extras;
  if (sharded) {
    extras = head_extras_for(opt_.exchange, *xchg_);
  } else {
    extras.token = token_out;
  }
  be_.head_argmax(W, W8, scale, y_.data(), n, hidden_, shard_.v0, logits, xchg_->local_max.data(), extras);
  if (!sharded) return;
  mark_begin(Phase::exchange, draft_index);
  exchange_pick(be_, *comm_, opt_.exchange, vocab_, *xchg_, token_out, /*key_from_head=*/true);
  mark_end(Phase::exchange, draft_index);
}

void MtpDrafter::after_verify(SequenceState& st, int accepted) {
  MTP_REQUIRE(st.propose_start_ >= 0, "drafter: after_verify without a propose");
  MTP_REQUIRE(accepted >= 0 && accepted <= st.last_drafted_, "drafter: accepted ", accepted, " of ",
              st.last_drafted_, " drafts");
  mark_begin(Phase::after_verify, 0);
  const int written = st.rows_written_by_propose_;
  const int keep = opt_.draft_rows == DraftRows::rewrite ? std::min(1, written) : std::min(accepted, written);
  const int new_len = st.propose_start_ + keep;
  // Rewinding the host-side length is enough: rows past it are rewritten before any read (the
  // indexer reads pools whose last row is <= pos, and a pool's key is rewritten with its last row).
  st.cache.set_rows(new_len);
  st.seq_len_ = new_len;
  st.propose_start_ = -1;
  st.rows_written_by_propose_ = 0;
  mark_end(Phase::after_verify, 0);
}

}  // namespace mtplab::drafter
