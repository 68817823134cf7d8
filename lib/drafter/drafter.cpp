// MtpDrafter: forward_one chained k times over a batch of sequences (one sequence is a batch of
// one), the context rows, rollback, and the cross-rank pick of the draft token (the four exchange
// protocols of docs/model.md, "The head, sharded and in FP8").
#include "drafter/drafter.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "drafter/graph.hpp"

namespace mtplab::drafter {

const char* to_string(Phase p) {
  static const char* names[] = {"prefill",      "propose",  "block", "head",  "exchange",
                                "after_verify", "catch_up", "stats", "verify"};
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

MtpDrafter::MtpDrafter(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg,
                       BlockDims dims, FrontWeights front, BlockWeights block, VocabShard shard,
                       DrafterOptions options)
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
  if (opt_.cuda_graph) {
    graphs_ = std::make_unique<StepGraphs>(be_);
  }
  if (opt_.index_share) block_.enable_index_share(opt_.draft_len);
  MTP_REQUIRE(!opt_.head_fp8 || fw_.lm_head_fp8.size() == static_cast<size_t>(shard_.n) * hidden_,
              "head_fp8 is on but the FP8 copy of the head shard is missing");
  concat_ = ops::Array<bf16>(be_, 2 * static_cast<size_t>(hidden_));
  row_chunk_ = 256;
  row_tokens_ = ops::Array<int32_t>(be_, row_chunk_);
  row_positions_ = ops::Array<int32_t>(be_, row_chunk_);
  row_slots_ = ops::Array<int32_t>(be_, row_chunk_);
  row_hiddens_ = ops::Array<bf16>(be_, static_cast<size_t>(row_chunk_) * hidden_);
  row_x_ = ops::Array<bf16>(be_, static_cast<size_t>(row_chunk_) * hidden_);
  // One set of block buffers serves every forward: a chunk of context rows, a step's rows
  // (reserve_batch grows it).
  block_.reserve(row_chunk_, checks_selection());
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
  if (on && batch_rows_ > 0 && batch_head_inputs_.size() == 0)
    batch_head_inputs_ = ops::Array<bf16>(
        be_, static_cast<size_t>(opt_.draft_len) * batch_rows_ * static_cast<size_t>(hidden_));
  // A recorded step does (or does not) copy the head inputs: record again.
  release_graphs();
}

std::vector<bf16> MtpDrafter::batch_head_inputs() {
  MTP_REQUIRE(keep_head_inputs_ && batch_head_inputs_.size() > 0,
              "drafter: batch_head_inputs() needs keep_head_inputs(true) before the propose_batch");
  std::vector<bf16> dev(static_cast<size_t>(last_batch_k_) * last_batch_n_ * hidden_);
  wait_comm();
  be_.download(dev.data(), batch_head_inputs_.data(), dev.size() * sizeof(bf16));
  // Device layout [k, n, H] (draft-major, as the step's rows) -> [B, k, H].
  const size_t H = static_cast<size_t>(hidden_), n = static_cast<size_t>(last_batch_n_);
  std::vector<bf16> out(static_cast<size_t>(last_batch_rows_) * last_batch_k_ * H);
  for (size_t b = 0; b < static_cast<size_t>(last_batch_rows_); ++b)
    for (size_t i = 0; i < static_cast<size_t>(last_batch_k_); ++i)
      std::copy_n(dev.data() + (i * n + b) * H, H, out.data() + (b * last_batch_k_ + i) * H);
  return out;
}

std::vector<bf16> MtpDrafter::head_inputs() {
  MTP_REQUIRE(last_batch_rows_ == 1,
              "drafter: head_inputs() is a batch of one's; the last propose drafted for ", last_batch_rows_,
              " rows (batch_head_inputs())");
  return batch_head_inputs();
}

void MtpDrafter::wait_comm() {
  if (comm_ && comm_->size() > 1) comm_->wait();
}

std::unique_ptr<BatchState> MtpDrafter::new_sequence() {
  auto one = new_batch(1);
  new_sequence(*one);
  return one;
}

namespace {
void require_one(const BatchState& one, const char* call) {
  MTP_REQUIRE(one.slots() == 1 && one.live(0), "drafter: ", call, " without a slot is for a batch of one (",
              "new_sequence()); this batch has ", one.slots(), " slots (name the slot)");
}
}  // namespace

void MtpDrafter::append_rows(BatchState& one, const int32_t* next_tokens, const bf16* hiddens, int n,
                             int row_base, Phase phase) {
  require_one(one, "append_rows");
  append_rows(one, 0, next_tokens, hiddens, n, row_base, phase);
}

std::vector<int32_t> MtpDrafter::propose(BatchState& one, int32_t token, const bf16* hidden, int k,
                                         const ProposeExtras& extras) {
  require_one(one, "propose");
  const BatchRow row{0, token, hidden};
  return propose_batch(one, std::span<const BatchRow>(&row, 1), k, extras);
}

void MtpDrafter::after_verify(BatchState& one, int accepted) {
  require_one(one, "after_verify");
  after_verify(one, 0, accepted);
}

void MtpDrafter::front(const int32_t* token_dev, const int32_t* slot_dev, const bf16* hidden_dev, bf16* x0) {
  be_.embed_rmsnorm_batch(fw_.embed.data(), token_dev, ops::RowBatch{slot_dev, nullptr, 1, 1},
                          fw_.enorm.data(), concat_.data(), hidden_, hidden_, eps_);
  be_.rmsnorm(hidden_dev, fw_.hnorm.data(), concat_.data() + hidden_, 1, hidden_, eps_);
  be_.linear(fw_.eh_proj.data(), concat_.data(), x0, 1, hidden_, 2 * hidden_);
}

void MtpDrafter::front_rows(int rows) {
  // [enorm(embed(t_r)); hnorm(h_r)] for every row of the chunk (each row's norms as one row's),
  // then eh_proj as one batched linear.
  be_.embed_rmsnorm_batch(fw_.embed.data(), row_tokens_.data(),
                          ops::RowBatch{row_slots_.data(), nullptr, rows, rows}, fw_.enorm.data(),
                          row_concat_.data(), 2 * hidden_, hidden_, eps_);
  be_.rmsnorm_strided(row_hiddens_.data(), hidden_, fw_.hnorm.data(), row_concat_.data() + hidden_,
                      2 * hidden_, rows, hidden_, eps_);
  be_.linear(fw_.eh_proj.data(), row_concat_.data(), row_x_.data(), rows, hidden_, 2 * hidden_,
             ops::RowsMode::batched);
}

void MtpDrafter::append_rows_to(RowCounters& rc, SlotCaches& caches, int slot, const int32_t* next_tokens,
                                const bf16* hiddens, int n, int row_base, Phase phase) {
  if (row_base != rc.seq_len) {
    ++rc.refused_writes;
    MTP_FAIL("drafter: context rows written at row ", row_base, " but the sequence holds ", rc.seq_len,
             " rows; rows are dense and must append at the current length");
  }
  MTP_REQUIRE(n >= 0, "drafter: negative row count ", n);
  if (row_base + n > max_rows_) {
    ++rc.refused_writes;
    MTP_FAIL("drafter: rows ", row_base, "..", row_base + n - 1, " are past the capacity of ", max_rows_,
             " rows (max_seq_len rounded down to whole pools)");
  }
  for (int i = 0; i < n; ++i)
    MTP_REQUIRE(next_tokens[i] >= 0 && next_tokens[i] < vocab_, "drafter: token id ", next_tokens[i],
                " at row ", row_base + i, " is outside the vocab of ", vocab_);
  mark_begin(phase, 0);
  std::vector<int32_t> pos(row_chunk_);
  const std::vector<int32_t> slots(static_cast<size_t>(row_chunk_), slot);
  Block::Options o;
  o.cache_only = opt_.context_rows == ContextRows::cache_only;
  o.proj_mode = opt_.context_gemm ? ops::RowsMode::batched : ops::RowsMode::per_row;
  o.qidx_mode = opt_.batch_qidx ? ops::RowsMode::batched : ops::RowsMode::per_row;
  for (int c0 = 0; c0 < n; c0 += row_chunk_) {
    const int rows = std::min(row_chunk_, n - c0);
    const int held = row_base + c0;  // rows the sequence holds before this chunk
    wait_comm();  // the uploads below synchronise the stream: collectives of full rows go first
    for (int r = 0; r < rows; ++r) pos[r] = held + r;
    be_.upload(row_tokens_.data(), next_tokens + c0, rows * sizeof(int32_t));
    be_.upload(row_positions_.data(), pos.data(), rows * sizeof(int32_t));
    be_.upload(row_slots_.data(), slots.data(), rows * sizeof(int32_t));
    be_.upload(row_hiddens_.data(), hiddens + static_cast<size_t>(c0) * hidden_,
               static_cast<size_t>(rows) * hidden_ * sizeof(bf16));
    // The MTP front of a row does not depend on other rows: all of the chunk's, then the block
    // on the chunk as one sequence's ragged rows.
    if (opt_.context_gemm) {
      front_rows(rows);
    } else {
      for (int r = 0; r < rows; ++r) {
        bf16* x = row_x_.data() + static_cast<size_t>(r) * hidden_;
        front(row_tokens_.data() + r, row_slots_.data() + r,
              row_hiddens_.data() + static_cast<size_t>(r) * hidden_, x);
      }
    }
    const ops::RowBatch rb{row_slots_.data(), row_positions_.data(), rows, rows};
    block_.forward(rb, row_x_.data(), caches, row_x_.data(), o);
    if (!o.cache_only && checks_selection()) {
      // Untimed: the phase is closed while the per-row selections are made and compared.
      mark_end(phase, 0);
      check_chunk(rb, caches);
      mark_begin(phase, 0);
    }
  }
  rc.seq_len += n;
  mark_end(phase, 0);
}

void MtpDrafter::check_chunk(const ops::RowBatch& rb, SlotCaches& caches) {
  const int rows = rb.rows;
  const size_t width = static_cast<size_t>(block_.dims().selection_width());
  block_.shadow_select(rb, caches);
  check_batched_.resize(static_cast<size_t>(rows) * width);
  check_per_row_.resize(static_cast<size_t>(rows) * width);
  wait_comm();
  be_.download(check_batched_.data(), block_.selection(), check_batched_.size() * sizeof(int32_t));
  be_.download(check_per_row_.data(), block_.shadow_selection(), check_per_row_.size() * sizeof(int32_t));
  SelectionCheck c =
      compare_selections(check_batched_.data(), check_per_row_.data(), rows, static_cast<int>(width));
  c.rows_multi = rows >= 2 ? rows : 0;
  check_ += c;
}

namespace {

/// Sets the drafter's per-step extras flags for one call, and clears them however it ends.
class StepFlags {
 public:
  StepFlags(bool& chain, bool& logits, bool chain_on, bool logits_on) : chain_(chain), logits_(logits) {
    chain_ = chain_on;
    logits_ = logits_on;
  }
  ~StepFlags() { chain_ = logits_ = false; }
  StepFlags(const StepFlags&) = delete;
  StepFlags& operator=(const StepFlags&) = delete;

 private:
  bool& chain_;
  bool& logits_;
};

/// The graph key variant of a step with these extras (0: the plain step, the graph of today).
int step_variant(bool chain, bool logits) { return (chain ? 1 : 0) | (logits ? 2 : 0); }

}  // namespace

bool MtpDrafter::check_extras(const ProposeExtras& x, int rows, int k) const {
  const size_t R = static_cast<size_t>(rows), K = static_cast<size_t>(k);
  if (!x.chain_tokens.empty()) {
    MTP_REQUIRE(x.chain_tokens.size() == R * (K - 1), "drafter: chain_tokens holds ", x.chain_tokens.size(),
                " tokens; a propose of ", rows, " row(s) x ", k,
                " drafts takes rows * (k - 1) = ", R * (K - 1));
    for (size_t i = 0; i < x.chain_tokens.size(); ++i)
      MTP_REQUIRE(x.chain_tokens[i] >= 0 && x.chain_tokens[i] < vocab_, "drafter: chain token ",
                  x.chain_tokens[i], " (row ", i / (K - 1), ", draft ", i % (K - 1) + 1,
                  ") is outside the vocab of ", vocab_);
  }
  if (!x.requested.empty()) {
    MTP_REQUIRE(x.stats, "drafter: requested tokens given without a stats vector to report them in");
    MTP_REQUIRE(x.requested.size() == R * K, "drafter: requested holds ", x.requested.size(),
                " tokens; a propose of ", rows, " row(s) x ", k, " drafts takes rows * k = ", R * K);
    for (size_t i = 0; i < x.requested.size(); ++i)
      MTP_REQUIRE(x.requested[i] >= 0 && x.requested[i] < vocab_, "drafter: requested token ", x.requested[i],
                  " (row ", i / K, ", draft ", i % K, ") is outside the vocab of ", vocab_);
  }
  if (x.stats) {
    MTP_REQUIRE(opt_.skip != Skip::head,
                "drafter: stats need the head's logits, and skip: head runs no head");
    check_transform(x.transform);
  }
  return !x.chain_tokens.empty() && k > 1;
}

void MtpDrafter::reserve_stats(int rows) {
  const int need = opt_.draft_len * rows;
  if (stats_ && stats_->rows >= need) return;
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  stats_ = std::make_unique<StatsBuffers>(be_, world_, shard_.stride, need, sharded);
  // Recorded steps bake the old buffers' addresses in.
  release_graphs();
}

bf16* MtpDrafter::step_logits(int draft_index, int n) {
  if (!step_logits_) return nullptr;
  return stats_->logits.data() + static_cast<size_t>(draft_index) * n * static_cast<size_t>(stats_->stride);
}

void MtpDrafter::stats_pass(int k, int n, int B, bool with_requested, bool truncate,
                            std::vector<DraftStats>& out) {
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  const int rows = k * n;
  auto run = [&] {
    stats_rows(be_, comm_, sharded, vocab_, shard_.v0, shard_.n, *stats_, rows, with_requested, truncate);
  };
  mark_begin(Phase::stats, 0);
  if (graphs_ && stats_warm_) {
    // Its own graph per (k, rows, variant): the parameters, the requested tokens and the logits
    // are read from fixed buffers, so one recording serves every call.
    const StepGraphs::Key key{k, {}, n, 4 | (with_requested ? 8 : 0) | (truncate ? 16 : 0)};
    bool recorded = false;
    graphs_->get(key, run, recorded).launch();
  } else {
    run();  // with cuda_graph: the first pass runs op by op (it sizes the backend's scratch)
    stats_warm_ = graphs_ != nullptr;
  }
  mark_end(Phase::stats, 0);
  std::vector<ops::TokenStats> dev(static_cast<size_t>(rows));
  wait_comm();
  be_.download(dev.data(), stats_->out.data(), dev.size() * sizeof(ops::TokenStats));
  out.assign(static_cast<size_t>(B) * k, DraftStats{});
  const float none = std::numeric_limits<float>::quiet_NaN();
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < k; ++i) {
      const ops::TokenStats& t = dev[static_cast<size_t>(i) * n + b];
      out[static_cast<size_t>(b) * k + i] =
          DraftStats{t.margin, t.logprob, with_requested ? t.req_logprob : none};
    }
}

void MtpDrafter::require_verify(const RowCounters& rc, int accepted) const {
  MTP_REQUIRE(rc.propose_start >= 0, "drafter: after_verify without a propose");
  MTP_REQUIRE(accepted >= 0 && accepted <= rc.last_drafted, "drafter: accepted ", accepted, " of ",
              rc.last_drafted, " drafts");
}

int MtpDrafter::trim_rows(RowCounters& rc, int accepted) {
  const int written = rc.rows_written_by_propose;
  const int keep = opt_.draft_rows == DraftRows::rewrite ? std::min(1, written) : std::min(accepted, written);
  const int new_len = rc.propose_start + keep;
  rc.seq_len = new_len;
  rc.propose_start = -1;
  rc.rows_written_by_propose = 0;
  return new_len;
}

// ---- batched drafting ------------------------------------------------------------------------

int batch_bucket(int rows) {
  MTP_REQUIRE(rows >= 1 && rows <= kMaxBatch, "drafter: a batch of ", rows, " rows (1 .. ", kMaxBatch, ")");
  int bucket = 1;
  while (bucket < rows) bucket *= 2;
  return bucket;
}

int BatchState::live_count() const { return static_cast<int>(std::count(live_.begin(), live_.end(), 1)); }

const RowCounters& BatchState::at(int slot) const {
  MTP_REQUIRE(live(slot), "drafter: slot ", slot, " of the batch's ", slots(), " holds no sequence");
  return rows_[static_cast<size_t>(slot)];
}

std::unique_ptr<BatchState> MtpDrafter::new_batch(int slots, std::optional<BatchPadding> padding) {
  MTP_REQUIRE(slots >= 1, "drafter: a batch of ", slots, " slots");
  const BatchPadding pad = padding.value_or(opt_.cuda_graph ? BatchPadding::bucket : BatchPadding::exact);
  auto batch = std::make_unique<BatchState>(be_, block_.dims(), slots, pad);
  const int most = std::min(slots, kMaxBatch);
  reserve_batch(pad == BatchPadding::bucket ? batch_bucket(most) : most);
  return batch;
}

void MtpDrafter::reserve_batch(int rows) {
  if (rows <= batch_rows_) return;
  block_.reserve(rows);
  batch_rows_ = rows;
  const size_t R = static_cast<size_t>(rows), H = static_cast<size_t>(hidden_);
  const size_t k = static_cast<size_t>(opt_.draft_len);
  batch_slot_ = ops::Array<int32_t>(be_, R);
  batch_pos_ = ops::Array<int32_t>(be_, k * R);
  batch_tokens_ = ops::Array<int32_t>(be_, (k + 1) * R);
  batch_chain_ = ops::Array<int32_t>(be_, std::max<size_t>(1, k - 1) * R);
  batch_hidden_ = ops::Array<bf16>(be_, R * H);
  batch_concat_ = ops::Array<bf16>(be_, R * 2 * H);
  batch_x_ = ops::Array<bf16>(be_, R * H);
  batch_y_ = ops::Array<bf16>(be_, R * H);
  if (keep_head_inputs_) batch_head_inputs_ = ops::Array<bf16>(be_, k * R * H);
  // Padded rows of the row ops compute on what their rows hold: zeros, not uninitialised bytes.
  be_.fill_bytes(batch_slot_.data(), 0xFF, batch_slot_.bytes());
  for (ops::Array<int32_t>* a : {&batch_pos_, &batch_tokens_, &batch_chain_})
    be_.fill_bytes(a->data(), 0, a->bytes());
  for (ops::Array<bf16>* a : {&batch_hidden_, &batch_concat_, &batch_x_, &batch_y_})
    be_.fill_bytes(a->data(), 0, a->bytes());
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  batch_xchg_ = std::make_unique<ExchangeBuffers>(
      be_, world_, shard_.stride, sharded && opt_.exchange == Exchange::allgather_logits, rows);
  // Recorded steps bake the old buffers' addresses in.
  release_graphs();
  batch_warm_.clear();
}

int MtpDrafter::new_sequence(BatchState& batch) {
  for (int s = 0; s < batch.slots(); ++s) {
    if (batch.live_[static_cast<size_t>(s)]) continue;
    batch.caches.clear(be_, s);
    batch.rows_[static_cast<size_t>(s)] = RowCounters{};
    batch.live_[static_cast<size_t>(s)] = 1;
    return s;
  }
  MTP_FAIL("drafter: every one of the batch's ", batch.slots(), " slots holds a sequence; release one first");
}

std::vector<int32_t> MtpDrafter::last_experts(int rows) {
  if (!proposed_ || rows <= 0 || opt_.skip == Skip::block) return {};
  const int32_t* dev = block_.experts();
  if (!dev) return {};
  MTP_REQUIRE(rows <= last_batch_rows_, "drafter: the experts of ", rows,
              " rows asked for; the last propose drafted for ", last_batch_rows_);
  const int n = rows;
  std::vector<int32_t> ids(static_cast<size_t>(n) * block_.dims().top_k);
  wait_comm();
  be_.download(ids.data(), dev, ids.size() * sizeof(int32_t));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

int MtpDrafter::fork_sequence(BatchState& batch, int from) {
  const RowCounters src = batch.at(from);  // checks the slot is live
  MTP_REQUIRE(src.propose_start < 0, "drafter: slot ", from,
              " has a pending propose; verify it before forking the sequence");
  const int to = new_sequence(batch);
  batch.caches.copy_slot(be_, from, to, src.seq_len);
  RowCounters& dst = batch.at(to);
  dst.seq_len = src.seq_len;
  return to;
}

void MtpDrafter::release(BatchState& batch, int slot) {
  batch.at(slot);  // checks the slot is live
  batch.live_[static_cast<size_t>(slot)] = 0;
  batch.rows_[static_cast<size_t>(slot)] = RowCounters{};
}

void MtpDrafter::append_rows(BatchState& batch, int slot, const int32_t* next_tokens, const bf16* hiddens,
                             int n, int row_base, Phase phase) {
  append_rows_to(batch.at(slot), batch.caches, slot, next_tokens, hiddens, n, row_base, phase);
}

void MtpDrafter::after_verify(BatchState& batch, int slot, int accepted) {
  RowCounters& rc = batch.at(slot);
  require_verify(rc, accepted);
  mark_begin(Phase::after_verify, 0);
  trim_rows(rc, accepted);
  mark_end(Phase::after_verify, 0);
}

std::vector<int32_t> MtpDrafter::propose_batch(BatchState& batch, std::span<const BatchRow> rows, int k,
                                               const ProposeExtras& extras) {
  const int B = static_cast<int>(rows.size());
  MTP_REQUIRE(B >= 1 && B <= kMaxBatch, "drafter: a batched propose of ", B, " rows (1 .. ", kMaxBatch, ")");
  proposed_ = true;
  MTP_REQUIRE(k >= 1 && k <= opt_.draft_len, "drafter: draft length ", k, " outside 1..", opt_.draft_len);
  std::vector<uint8_t> seen(static_cast<size_t>(batch.slots()), 0);
  for (int b = 0; b < B; ++b) {
    const BatchRow& row = rows[static_cast<size_t>(b)];
    MTP_REQUIRE(batch.live(row.slot), "drafter: batch row ", b, " names slot ", row.slot,
                ", which holds no sequence");
    MTP_REQUIRE(!seen[static_cast<size_t>(row.slot)], "drafter: slot ", row.slot, " is in the batch twice");
    seen[static_cast<size_t>(row.slot)] = 1;
    const RowCounters& rc = batch.at(row.slot);
    MTP_REQUIRE(rc.propose_start < 0, "drafter: propose on slot ", row.slot, " twice without after_verify");
    MTP_REQUIRE(row.token >= 0 && row.token < vocab_, "drafter: token id ", row.token, " of slot ", row.slot,
                " is outside the vocab of ", vocab_);
    MTP_REQUIRE(row.hidden, "drafter: batch row ", b, " has no hidden");
    if (rc.seq_len + k > max_rows_)
      MTP_FAIL("drafter: a propose of ", k, " drafts at row ", rc.seq_len, " of slot ", row.slot,
               " would pass the capacity of ", max_rows_, " rows");
  }
  const bool chain = check_extras(extras, B, k);
  const bool stats = extras.stats != nullptr;
  const int n = batch.padding() == BatchPadding::bucket ? batch_bucket(B) : B;
  reserve_batch(n);
  if (stats) reserve_stats(n);
  // Everything that varies per step goes to fixed backend buffers before the step: per row its
  // slot (-1 for padded rows), input token, hidden and each draft's position.
  const size_t H = static_cast<size_t>(hidden_);
  std::vector<int32_t> slot_h(static_cast<size_t>(n), -1), tok_h(static_cast<size_t>(n), 0);
  std::vector<int32_t> pos_h(static_cast<size_t>(k) * n, 0);
  std::vector<bf16> hid_h(static_cast<size_t>(B) * H);
  for (int b = 0; b < B; ++b) {
    const BatchRow& row = rows[static_cast<size_t>(b)];
    slot_h[static_cast<size_t>(b)] = row.slot;
    tok_h[static_cast<size_t>(b)] = row.token;
    for (int i = 0; i < k; ++i) pos_h[static_cast<size_t>(i) * n + b] = batch.at(row.slot).seq_len + i;
    std::copy(row.hidden, row.hidden + H, hid_h.begin() + static_cast<ptrdiff_t>(b * H));
  }
  wait_comm();
  be_.upload(batch_slot_.data(), slot_h.data(), slot_h.size() * sizeof(int32_t));
  be_.upload(batch_tokens_.data(), tok_h.data(), tok_h.size() * sizeof(int32_t));
  be_.upload(batch_pos_.data(), pos_h.data(), pos_h.size() * sizeof(int32_t));
  be_.upload(batch_hidden_.data(), hid_h.data(), hid_h.size() * sizeof(bf16));
  // The extras go draft-major as the tokens ([k - 1, n] chain, [k, n] requested; padded rows 0).
  if (chain) {
    std::vector<int32_t> chain_h(static_cast<size_t>(k - 1) * n, 0);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i + 1 < k; ++i)
        chain_h[static_cast<size_t>(i) * n + b] = extras.chain_tokens[static_cast<size_t>(b) * (k - 1) + i];
    be_.upload(batch_chain_.data(), chain_h.data(), chain_h.size() * sizeof(int32_t));
  }
  if (stats) {
    const ops::SampleParams p = sample_params(extras.transform);
    be_.upload(stats_->params.data(), &p, sizeof p);
    if (!extras.requested.empty()) {
      std::vector<int32_t> req_h(static_cast<size_t>(k) * n, 0);
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < k; ++i)
          req_h[static_cast<size_t>(i) * n + b] = extras.requested[static_cast<size_t>(b) * k + i];
      be_.upload(stats_->requested.data(), req_h.data(), req_h.size() * sizeof(int32_t));
    }
  }
  const StepFlags flags(step_chain_, step_logits_, chain, stats);
  for (const BatchRow& row : rows) {
    RowCounters& rc = batch.at(row.slot);
    rc.propose_start = rc.seq_len;
    rc.last_drafted = k;
  }
  int written = 0;
  PhaseTimer* const timer = timer_;
  try {
    mark_begin(Phase::propose, 0);
    const bool warm = std::find(batch_warm_.begin(), batch_warm_.end(), n) != batch_warm_.end();
    if (graphs_ && warm) {
      // As propose: only Phase::propose is timed, the inner phases run inside the graph.
      timer_ = nullptr;
      SlotCaches& c = batch.caches;
      const StepGraphs::Key key{k,
                                {c.block_tables.data(), c.kv_slots().cache.data, c.k_cache.data(),
                                 c.gate_cache.data(), c.valid.data(), c.pool_keys.data()},
                                n,
                                step_variant(chain, stats)};
      bool recorded = false;
      ops::Graph& graph = graphs_->get(
          key, [&] { written = draft_step_batch(batch, n, k); }, recorded);
      if (!recorded) written = opt_.skip == Skip::block ? 0 : k;
      graph.launch();
    } else if (graphs_) {
      timer_ = nullptr;  // the op-by-op step that sizes the backend's scratch for this row count
      written = draft_step_batch(batch, n, k);
      batch_warm_.push_back(n);
    } else {
      written = draft_step_batch(batch, n, k);
    }
    timer_ = timer;
    mark_end(Phase::propose, 0);
  } catch (...) {
    timer_ = timer;
    for (const BatchRow& row : rows) batch.at(row.slot).propose_start = -1;
    throw;
  }
  for (const BatchRow& row : rows) {
    RowCounters& rc = batch.at(row.slot);
    rc.rows_written_by_propose = written;
    rc.seq_len += written;
  }
  if (stats) stats_pass(k, n, B, !extras.requested.empty(), truncates(extras.transform), *extras.stats);
  last_batch_k_ = k;
  last_batch_n_ = n;
  last_batch_rows_ = B;
  std::vector<int32_t> tokens(static_cast<size_t>(k) * n);
  wait_comm();
  be_.download(tokens.data(), batch_tokens_.data() + n, tokens.size() * sizeof(int32_t));
  std::vector<int32_t> drafts(static_cast<size_t>(B) * k);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < k; ++i)
      drafts[static_cast<size_t>(b) * k + i] = tokens[static_cast<size_t>(i) * n + b];
  return drafts;
}

void MtpDrafter::front_batch(int n, const int32_t* tokens_dev, const bf16* hiddens_dev) {
  // [enorm(embed(t_b)); hnorm(h_b)] per row (the single front's two norms, strided into the
  // [e ; h] rows), then eh_proj once for the n rows.
  be_.embed_rmsnorm_batch(fw_.embed.data(), tokens_dev, ops::RowBatch{batch_slot_.data(), nullptr, n, 1},
                          fw_.enorm.data(), batch_concat_.data(), 2 * hidden_, hidden_, eps_);
  be_.rmsnorm_strided(hiddens_dev, hidden_, fw_.hnorm.data(), batch_concat_.data() + hidden_, 2 * hidden_, n,
                      hidden_, eps_);
  be_.linear(fw_.eh_proj.data(), batch_concat_.data(), batch_x_.data(), n, hidden_, 2 * hidden_,
             ops::RowsMode::batched);
}

int MtpDrafter::draft_step_batch(BatchState& batch, int n, int k) {
  int written = 0;
  const size_t H = static_cast<size_t>(hidden_);
  for (int i = 0; i < k; ++i) {
    const int32_t* pos = batch_pos_.data() + static_cast<size_t>(i) * n;
    const int32_t* in_tokens = i > 0 && step_chain_ ? batch_chain_.data() + static_cast<size_t>(i - 1) * n
                                                    : batch_tokens_.data() + static_cast<size_t>(i) * n;
    front_batch(n, in_tokens, i == 0 ? batch_hidden_.data() : batch_y_.data());
    mark_begin(Phase::block, i);
    const bool norm_in_block = opt_.skip == Skip::none;
    if (opt_.skip != Skip::block) {
      const Block::OutNorm head_norm{fw_.shared_head_norm.data(), batch_y_.data(), eps_};
      Block::Options o;
      o.out_norm = norm_in_block ? &head_norm : nullptr;
      o.share_anchor_pos = opt_.index_share && i > 0 ? batch_pos_.data() : nullptr;  // draft 1's positions
      block_.forward(ops::RowBatch{batch_slot_.data(), pos, n, 1}, batch_x_.data(), batch.caches,
                     batch_x_.data(), o);
      ++written;
    }
    mark_end(Phase::block, i);
    int32_t* tokens_out = batch_tokens_.data() + static_cast<size_t>(i + 1) * n;
    if (opt_.skip == Skip::head) {
      // As propose: draft 0 for every row, the block output recycled as the next hidden.
      be_.fill_bytes(tokens_out, 0, static_cast<size_t>(n) * sizeof(int32_t));
      be_.copy(batch_y_.data(), batch_x_.data(), static_cast<size_t>(n) * H * sizeof(bf16));
      continue;
    }
    mark_begin(Phase::head, i);
    if (!norm_in_block)
      be_.rmsnorm(batch_x_.data(), fw_.shared_head_norm.data(), batch_y_.data(), n, hidden_, eps_);
    if (keep_head_inputs_)
      be_.copy(batch_head_inputs_.data() + static_cast<size_t>(i) * n * H, batch_y_.data(),
               static_cast<size_t>(n) * H * sizeof(bf16));
    head_pick_batch(i, n, tokens_out);
    mark_end(Phase::head, i);
  }
  return written;
}

void MtpDrafter::head_pick_batch(int draft_index, int n, int32_t* tokens_out) {
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  const bf16* W = fw_.lm_head.data();
  const fp8e4m3* W8 = opt_.head_fp8 ? fw_.lm_head_fp8.data() : nullptr;
  const float* scale = opt_.head_fp8 ? fw_.lm_head_scale.data() : nullptr;
  ExchangeBuffers& xb = *batch_xchg_;
  bf16* exchange_logits =
      (sharded && opt_.exchange == Exchange::allgather_logits) ? xb.logits.data() : nullptr;
  // With stats the head keeps this draft's logits for the stats pass (the exchange reads a copy).
  bf16* kept = step_logits(draft_index, n);
  bf16* logits = kept ? kept : exchange_logits;
  // Unsharded, the head writes each row's token itself; sharded, what the protocol starts from
  // (the packed key for packed_u64), so no launch sits between the head and the collective, and
  // then ONE collective carries every row's.
  ops::HeadExtras extras;
  if (sharded) {
    extras = head_extras_for(opt_.exchange, xb);
  } else {
    extras.token = tokens_out;
  }
  if (n == 1 && !sharded) {
    // A bucket of one (live) row: the single-row head, as the block's experts (docs/drafter.md).
    be_.head_argmax(W, W8, scale, batch_y_.data(), static_cast<int>(shard_.n), hidden_, shard_.v0, logits,
                    xb.local_max.data(), extras);
  } else {
    be_.head_argmax_batch(W, W8, scale, batch_y_.data(), ops::RowBatch{batch_slot_.data(), nullptr, n, 1},
                          static_cast<int>(shard_.n), hidden_, shard_.v0, logits, static_cast<int>(xb.stride),
                          xb.local_max.data(), extras);
  }
  if (kept && exchange_logits)
    be_.copy(exchange_logits, kept, static_cast<size_t>(n) * static_cast<size_t>(xb.stride) * sizeof(bf16));
  if (!sharded) return;
  mark_begin(Phase::exchange, draft_index);
  exchange_pick_rows(be_, *comm_, opt_.exchange, vocab_, xb, n, tokens_out, /*key_from_head=*/true);
  mark_end(Phase::exchange, draft_index);
}

// ---- the target's log p ----------------------------------------------------------------------

std::vector<float> MtpDrafter::target_logprobs(const bf16* hiddens, const int32_t* tokens, int n,
                                               const SamplingTransform& transform) {
  const ops::SampleParams params = sample_params(transform);  // checks the transform
  MTP_REQUIRE(n >= 0, "drafter: target_logprobs of ", n, " rows");
  for (int r = 0; r < n; ++r)
    MTP_REQUIRE(tokens[r] >= 0 && tokens[r] < vocab_, "drafter: target_logprobs: token ", tokens[r],
                " of row ", r, " is outside the vocab of ", vocab_);
  std::vector<float> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  constexpr int kChunk = 64;  // rows per head call: every head row read once per chunk
  const size_t H = static_cast<size_t>(hidden_);
  if (!target_) {
    target_ = std::make_unique<StatsBuffers>(be_, world_, shard_.stride, kChunk, sharded);
    target_hidden_ = ops::Array<bf16>(be_, kChunk * H);
    target_slot_ = ops::Array<int32_t>(be_, kChunk);
    be_.fill_bytes(target_slot_.data(), 0, target_slot_.bytes());
    target_max_ = ops::Array<ops::ArgMax>(be_, kChunk);
  }
  wait_comm();
  be_.upload(target_->params.data(), &params, sizeof params);
  std::vector<ops::TokenStats> st(kChunk);
  for (int r0 = 0; r0 < n; r0 += kChunk) {
    const int rows = std::min(kChunk, n - r0);
    wait_comm();  // the uploads synchronise the stream: the last chunk's collectives go first
    be_.upload(target_hidden_.data(), hiddens + static_cast<size_t>(r0) * H, rows * H * sizeof(bf16));
    be_.upload(target_->requested.data(), tokens + r0, static_cast<size_t>(rows) * sizeof(int32_t));
    // The target's head is the BF16 lm_head (whatever head_fp8 says of the drafter's), no norm:
    // the trace's hidden is already post-final-norm.
    be_.head_argmax_batch(fw_.lm_head.data(), nullptr, nullptr, target_hidden_.data(),
                          ops::RowBatch{target_slot_.data(), nullptr, rows, rows}, static_cast<int>(shard_.n),
                          hidden_, shard_.v0, target_->logits.data(), static_cast<int>(target_->stride),
                          target_max_.data(), {});
    stats_rows(be_, comm_, sharded, vocab_, shard_.v0, shard_.n, *target_, rows, true, truncates(transform));
    wait_comm();
    be_.download(st.data(), target_->out.data(), static_cast<size_t>(rows) * sizeof(ops::TokenStats));
    for (int j = 0; j < rows; ++j) out[static_cast<size_t>(r0 + j)] = st[static_cast<size_t>(j)].req_logprob;
  }
  return out;
}

}  // namespace mtplab::drafter
