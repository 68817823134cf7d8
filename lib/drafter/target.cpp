#include "drafter/target.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "drafter/factory.hpp"
#include "model/sharding.hpp"
#include "model/weights.hpp"

namespace mtplab::drafter {

// ---- Target -------------------------------------------------------------------------------------

int TargetState::live_count() const { return static_cast<int>(std::count(live_.begin(), live_.end(), 1)); }

int TargetState::seq_len(int slot) const {
  MTP_REQUIRE(live(slot), "target: slot ", slot, " of the batch's ", slots(), " holds no sequence");
  return len_[static_cast<size_t>(slot)];
}

Target::Target(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg,
               const model::TargetWeights& w, const TargetOptions& options)
    : Target(
          be, comm, cfg, w, static_cast<int>(w.layers.size()),
          [&w](int i) { return w.layers[static_cast<size_t>(i)]; }, options) {}

Target::Target(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg,
               const model::TargetWeights& trunk, int layers,
               const std::function<model::LayerWeights(int)>& layer, const TargetOptions& options)
    : be_(be),
      comm_(comm),
      world_(comm ? comm->size() : 1),
      rank_(comm ? comm->rank() : 0),
      cfg_(cfg),
      opt_(options) {
  MTP_REQUIRE(layers >= 1, "target: ", layers, " layers");
  MTP_REQUIRE(opt_.max_positions >= 0, "target: max_positions ", opt_.max_positions, " is negative");
  MTP_REQUIRE(opt_.max_rows >= 1, "target: max_rows ", opt_.max_rows, " (at least 1 row a forward)");
  const model::ShardPlan& plan = trunk.plan;
  MTP_REQUIRE(plan.world == world_ && plan.rank == rank_, "target: weights were sharded for rank ", plan.rank,
              " of ", plan.world, " but this is rank ", rank_, " of ", world_);
  MTP_REQUIRE(plan.head_sharding == opt_.head_sharding, "target: weights were sharded for head_sharding ",
              model::to_string(plan.head_sharding), " but the options say ",
              model::to_string(opt_.head_sharding));
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  if (sharded && opt_.exchange == Exchange::bf16_lanes) {
    MTP_REQUIRE(world_ == 2, "target: exchange bf16_lanes runs on exactly 2 ranks, not ", world_);
    MTP_REQUIRE(cfg.vocab <= (1 << 24),
                "target: exchange bf16_lanes carries token ids below 2^24; the vocab is ", cfg.vocab);
  }
  if (opt_.max_positions > 0) {
    const int P = cfg.index_kpool;
    const int64_t rows = (static_cast<int64_t>(opt_.max_positions) + P - 1) / P * P;
    if (rows < cfg_.max_seq_len) cfg_.set_max_seq_len(static_cast<int>(rows));
  }
  shard_ = vocab_shard(plan);
  const int64_t H = cfg.hidden;
  MTP_REQUIRE(trunk.embed_tokens.shape == (std::vector<int64_t>{cfg.vocab, H}) &&
                  trunk.lm_head.shape == (std::vector<int64_t>{shard_.n, H}) &&
                  trunk.final_norm.shape == (std::vector<int64_t>{H}),
              "target: the embedding ", model::shape_str(trunk.embed_tokens.shape), ", head ",
              model::shape_str(trunk.lm_head.shape), " and final norm ",
              model::shape_str(trunk.final_norm.shape), " are not [", cfg.vocab, ", ", H, "], [", shard_.n,
              ", ", H, "] and [", H, "]");
  embed_ = upload(be_, trunk.embed_tokens);
  lm_head_ = upload(be_, trunk.lm_head);
  final_norm_ = upload(be_, trunk.final_norm);
  for (int i = 0; i < layers; ++i) add_layer(layer(i));
}

Target::~Target() = default;

void Target::add_layer(const model::LayerWeights& w) {
  const int i = layers();
  MTP_REQUIRE(w.index == i && w.dense == cfg_.dense_layer(i), "target: layer ", i,
              " was given the weights of ", w.dense ? "dense-MLP" : "routed-expert", " layer ", w.index,
              " (first_k_dense_replace ", cfg_.first_k_dense_replace, ")");
  MTP_REQUIRE(w.plan.world == world_ && w.plan.rank == rank_, "target: layer ", i, " was sharded for rank ",
              w.plan.rank, " of ", w.plan.world, " but this is rank ", rank_, " of ", world_);
  BlockDims d = block_dims(cfg_, world_, rank_, opt_.kv_cache_dtype);
  d.n_heads_local = static_cast<int>(w.plan.heads.count);
  d.shared_inter_local = static_cast<int>(w.moe.shared_gate.shape.empty() ? 0 : w.moe.shared_gate.shape[0]);
  d.dense_mlp = w.dense;
  d.dense_inter_local = w.dense ? static_cast<int>(w.plan.dense_inter.count) : 0;
  blocks_.push_back(std::make_unique<Block>(be_, comm_, d, upload_block_weights(be_, w)));
}

int Target::dense_layers() const { return std::min(cfg_.first_k_dense_replace, layers()); }

void Target::wait_comm() {
  if (comm_ && comm_->size() > 1) comm_->wait();
}

std::unique_ptr<TargetState> Target::new_batch(int slots) {
  MTP_REQUIRE(slots >= 1, "target: a batch of ", slots, " slots");
  auto state = std::make_unique<TargetState>();
  for (const auto& blk : blocks_)
    state->caches_.push_back(std::make_unique<SlotCaches>(be_, blk->dims(), slots));
  state->len_.assign(static_cast<size_t>(slots), 0);
  state->live_.assign(static_cast<size_t>(slots), 0);
  return state;
}

int Target::new_sequence(TargetState& state) {
  for (int s = 0; s < state.slots(); ++s) {
    if (state.live_[static_cast<size_t>(s)]) continue;
    for (auto& c : state.caches_) c->clear(be_, s);
    state.len_[static_cast<size_t>(s)] = 0;
    state.live_[static_cast<size_t>(s)] = 1;
    return s;
  }
  MTP_FAIL("target: every one of the batch's ", state.slots(), " slots holds a sequence; release one first");
}

void Target::release(TargetState& state, int slot) {
  (void)state.seq_len(slot);  // checks the slot is live
  state.live_[static_cast<size_t>(slot)] = 0;
  state.len_[static_cast<size_t>(slot)] = 0;
}

void Target::rollback(TargetState& state, int slot, int length) {
  const int held = state.seq_len(slot);
  MTP_REQUIRE(length >= 0 && length <= held, "target: rollback of slot ", slot, " to ", length,
              " rows; it holds ", held, " (a rollback keeps rows, it cannot add them)");
  state.len_[static_cast<size_t>(slot)] = length;
}

std::vector<Target::Row> Target::rows_of(const TargetState& state, std::span<const VerifySeq> seqs,
                                         std::vector<int>& first_row) const {
  MTP_REQUIRE(!seqs.empty(), "target: a forward of no sequence");
  std::vector<uint8_t> seen(static_cast<size_t>(state.slots()), 0);
  std::vector<Row> rows;
  first_row.assign(1, 0);
  for (size_t b = 0; b < seqs.size(); ++b) {
    const VerifySeq& q = seqs[b];
    MTP_REQUIRE(state.live(q.slot), "target: sequence ", b, " of the forward names slot ", q.slot,
                ", which holds no sequence");
    MTP_REQUIRE(!seen[static_cast<size_t>(q.slot)], "target: slot ", q.slot, " is in the forward twice");
    seen[static_cast<size_t>(q.slot)] = 1;
    const int n = static_cast<int>(q.tokens.size());
    const int len = state.seq_len(q.slot);
    MTP_REQUIRE(n >= 1, "target: sequence ", b, " of the forward (slot ", q.slot, ") has no row");
    MTP_REQUIRE(len + n <= capacity(), "target: ", n, " rows at position ", len, " of slot ", q.slot,
                " pass the capacity of ", capacity(), " rows");
    for (int j = 0; j < n; ++j) {
      const int32_t t = q.tokens[static_cast<size_t>(j)];
      MTP_REQUIRE(t >= 0 && t < cfg_.vocab, "target: token ", t, " at position ", len + j, " of slot ",
                  q.slot, " is outside the vocab of ", cfg_.vocab);
      rows.push_back(Row{q.slot, len + j, t});
    }
    first_row.push_back(static_cast<int>(rows.size()));
  }
  return rows;
}

VerifyResult Target::verify(TargetState& state, std::span<const VerifySeq> seqs, const VerifyExtras& extras) {
  std::vector<int> first_row;
  const std::vector<Row> rows = rows_of(state, seqs, first_row);
  return run(state, rows, std::move(first_row), 0, extras);
}

VerifyResult Target::prefill(TargetState& state, int slot, std::span<const int32_t> tokens,
                             const VerifyExtras& extras) {
  const VerifySeq seq{slot, tokens};
  std::vector<int> first_row;
  const std::vector<Row> rows = rows_of(state, std::span<const VerifySeq>(&seq, 1), first_row);
  const int n = static_cast<int>(rows.size());
  return run(state, rows, std::move(first_row), n - 1, extras);  // the head on the last row
}

void Target::reserve(int rows, bool logit_rows) {
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  if (rows > buf_rows_) {
    buf_rows_ = rows;
    const size_t R = static_cast<size_t>(rows), H = static_cast<size_t>(cfg_.hidden);
    slot_ = ops::Array<int32_t>(be_, R);
    pos_ = ops::Array<int32_t>(be_, R);
    x_ = ops::Array<bf16>(be_, R * H);
    normed_ = ops::Array<bf16>(be_, R * H);
    arg_ = ops::Array<ops::ArgMax>(be_, R);
    tokens_ = ops::Array<int32_t>(be_, R);
    // One set of block buffers for every layer: they run one after another.
    blocks_.front()->reserve(rows);
    for (size_t l = 1; l < blocks_.size(); ++l) blocks_[l]->share_buffers(*blocks_.front());
    xchg_ = std::make_unique<ExchangeBuffers>(be_, world_, shard_.stride,
                                              sharded && opt_.exchange == Exchange::allgather_logits, rows);
    stats_.reset();
  }
  if (logit_rows && !stats_)
    stats_ = std::make_unique<StatsBuffers>(be_, world_, shard_.stride, buf_rows_, sharded);
}

VerifyResult Target::run(TargetState& state, const std::vector<Row>& rows, std::vector<int> first_row,
                         int first_head_row, const VerifyExtras& extras) {
  const int total = static_cast<int>(rows.size());
  const int headed = extras.head ? total - first_head_row : 0;
  if (!extras.requested.empty()) {
    MTP_REQUIRE(extras.transform, "target: requested tokens given without a transform to report them under");
    MTP_REQUIRE(static_cast<int>(extras.requested.size()) == headed, "target: requested holds ",
                extras.requested.size(), " tokens for ", headed, " headed rows");
    for (size_t i = 0; i < extras.requested.size(); ++i)
      MTP_REQUIRE(extras.requested[i] >= 0 && extras.requested[i] < cfg_.vocab, "target: requested token ",
                  extras.requested[i], " (row ", i, ") is outside the vocab of ", cfg_.vocab);
  }
  const bool keep_logits = headed > 0 && (extras.transform || extras.logits);
  const int chunk = std::min(total, opt_.max_rows);
  reserve(chunk, keep_logits);
  if (headed > 0 && extras.transform) {
    const ops::SampleParams params = sample_params(*extras.transform);  // checks the transform
    wait_comm();
    be_.upload(stats_->params.data(), &params, sizeof params);
  }
  const size_t H = static_cast<size_t>(cfg_.hidden);
  VerifyResult out;
  out.rows = total;
  out.first_row = std::move(first_row);
  out.hiddens.resize(static_cast<size_t>(total) * H);
  std::vector<int32_t> slot_h(static_cast<size_t>(chunk)), pos_h(static_cast<size_t>(chunk));
  for (int r0 = 0; r0 < total; r0 += chunk) {
    const int n = std::min(chunk, total - r0);
    // The most rows of one slot in the chunk (a sequence's rows are consecutive).
    int max_seq_rows = 0;
    for (int r = 0, run_rows = 0; r < n; ++r) {
      const Row& row = rows[static_cast<size_t>(r0 + r)];
      run_rows = r > 0 && rows[static_cast<size_t>(r0 + r - 1)].slot == row.slot ? run_rows + 1 : 1;
      max_seq_rows = std::max(max_seq_rows, run_rows);
      slot_h[static_cast<size_t>(r)] = row.slot;
      pos_h[static_cast<size_t>(r)] = row.pos;
    }
    wait_comm();  // the uploads synchronise the stream: the last chunk's collectives go first
    be_.upload(slot_.data(), slot_h.data(), static_cast<size_t>(n) * sizeof(int32_t));
    be_.upload(pos_.data(), pos_h.data(), static_cast<size_t>(n) * sizeof(int32_t));
    for (int r = 0; r < n; ++r)
      be_.copy(x_.data() + static_cast<size_t>(r) * H,
               embed_.data() + static_cast<size_t>(rows[static_cast<size_t>(r0 + r)].token) * H,
               H * sizeof(bf16));
    const ops::RowBatch rb{slot_.data(), pos_.data(), n, max_seq_rows};
    for (size_t l = 0; l < blocks_.size(); ++l) {
      blocks_[l]->forward(rb, x_.data(), state.caches(static_cast<int>(l)), x_.data());
      if (extras.routing) record_routing(static_cast<int>(l), r0, n, out);
    }
    be_.rmsnorm(x_.data(), final_norm_.data(), normed_.data(), n, cfg_.hidden, cfg_.rms_norm_eps);
    wait_comm();
    be_.download(out.hiddens.data() + static_cast<size_t>(r0) * H, normed_.data(),
                 static_cast<size_t>(n) * H * sizeof(bf16));
    if (headed > 0) {
      const int from = std::max(first_head_row - r0, 0);
      if (from < n) {
        const int32_t* requested =
            extras.requested.empty() ? nullptr : extras.requested.data() + (r0 + from - first_head_row);
        head(from, n - from, requested, extras, out);
      }
    }
  }
  for (size_t b = 0; b + 1 < out.first_row.size(); ++b) {
    const Row& first = rows[static_cast<size_t>(out.first_row[b])];
    state.len_[static_cast<size_t>(first.slot)] = first.pos + (out.first_row[b + 1] - out.first_row[b]);
  }
  return out;
}

void Target::record_routing(int layer, int first, int n, VerifyResult& out) {
  const size_t K = static_cast<size_t>(cfg_.num_experts_per_tok);
  const size_t W = blocks_.size() * K;
  if (out.routing.empty()) out.routing.assign(static_cast<size_t>(out.rows) * W, -1);
  if (layer < dense_layers()) return;  // a dense MLP routes nothing: its slots stay -1
  std::vector<int32_t> ids(static_cast<size_t>(n) * K);
  wait_comm();  // a download synchronises the stream: the layer's collectives go first
  be_.download(ids.data(), blocks_[static_cast<size_t>(layer)]->experts(), ids.size() * sizeof(int32_t));
  for (int r = 0; r < n; ++r)
    std::copy_n(ids.data() + static_cast<size_t>(r) * K, K,
                out.routing.data() + static_cast<size_t>(first + r) * W + static_cast<size_t>(layer) * K);
}

void Target::head(int from, int n, const int32_t* requested, const VerifyExtras& extras, VerifyResult& out) {
  const bool sharded = opt_.head_sharding == HeadSharding::vocab && world_ > 1;
  const size_t H = static_cast<size_t>(cfg_.hidden);
  const bf16* x = normed_.data() + static_cast<size_t>(from) * H;
  const ops::RowBatch rb{slot_.data() + from, nullptr, n, 1};
  const size_t stride = static_cast<size_t>(shard_.stride);
  bf16* kept = extras.transform || extras.logits ? stats_->logits.data() : nullptr;
  bf16* exchange_logits =
      sharded && opt_.exchange == Exchange::allgather_logits ? xchg_->logits.data() : nullptr;
  bf16* logits = kept ? kept : exchange_logits;
  const size_t at = out.tokens.size();
  out.tokens.resize(at + static_cast<size_t>(n));
  if (!sharded) {
    // Each row's (max, argmax) over the whole vocab: the token is the argmax.
    be_.head_argmax_batch(lm_head_.data(), nullptr, nullptr, x, rb, static_cast<int>(shard_.n), cfg_.hidden,
                          shard_.v0, logits, static_cast<int>(stride), arg_.data());
    std::vector<ops::ArgMax> arg(static_cast<size_t>(n));
    be_.download(arg.data(), arg_.data(), arg.size() * sizeof(ops::ArgMax));
    for (int b = 0; b < n; ++b) out.tokens[at + static_cast<size_t>(b)] = arg[static_cast<size_t>(b)].index;
  } else {
    be_.head_argmax_batch(lm_head_.data(), nullptr, nullptr, x, rb, static_cast<int>(shard_.n), cfg_.hidden,
                          shard_.v0, logits, static_cast<int>(stride), xchg_->local_max.data(),
                          head_extras_for(opt_.exchange, *xchg_));
    if (kept && exchange_logits)
      be_.copy(exchange_logits, kept, static_cast<size_t>(n) * stride * sizeof(bf16));
    exchange_pick_rows(be_, *comm_, opt_.exchange, cfg_.vocab, *xchg_, n, tokens_.data(),
                       /*key_from_head=*/true);
    wait_comm();
    be_.download(out.tokens.data() + at, tokens_.data(), static_cast<size_t>(n) * sizeof(int32_t));
  }
  if (extras.transform) {
    if (requested) {
      wait_comm();
      be_.upload(stats_->requested.data(), requested, static_cast<size_t>(n) * sizeof(int32_t));
    }
    stats_rows(be_, comm_, sharded, cfg_.vocab, shard_.v0, shard_.n, *stats_, n, requested != nullptr,
               truncates(*extras.transform));
    std::vector<ops::TokenStats> st(static_cast<size_t>(n));
    wait_comm();
    be_.download(st.data(), stats_->out.data(), st.size() * sizeof(ops::TokenStats));
    if (!requested)
      for (ops::TokenStats& t : st) t.req_logprob = std::numeric_limits<float>::quiet_NaN();
    out.stats.insert(out.stats.end(), st.begin(), st.end());
  }
  if (extras.logits) {
    const size_t V = static_cast<size_t>(cfg_.vocab);
    const size_t base = out.logits.size();
    out.logits.resize(base + static_cast<size_t>(n) * V);
    if (!sharded) {
      std::vector<bf16> rows_h(static_cast<size_t>(n) * stride);
      be_.download(rows_h.data(), kept, rows_h.size() * sizeof(bf16));
      for (int b = 0; b < n; ++b)
        std::copy_n(rows_h.data() + static_cast<size_t>(b) * stride, V, out.logits.data() + base + b * V);
    } else {
      // Every rank's shard of the rows, then each row put together segment by segment.
      const size_t per_rank = static_cast<size_t>(n) * stride;
      comm_->all_gather(kept, stats_->gathered_logits.data(), per_rank * sizeof(bf16));
      std::vector<bf16> all(per_rank * static_cast<size_t>(world_));
      wait_comm();
      be_.download(all.data(), stats_->gathered_logits.data(), all.size() * sizeof(bf16));
      for (int r = 0; r < world_; ++r) {
        const ops::VocabSegment seg = ops::vocab_segment(cfg_.vocab, world_, r);
        for (int b = 0; b < n; ++b)
          std::copy_n(all.data() + static_cast<size_t>(r) * per_rank + static_cast<size_t>(b) * stride,
                      static_cast<size_t>(seg.count),
                      out.logits.data() + base + static_cast<size_t>(b) * V + static_cast<size_t>(seg.begin));
      }
    }
  }
}

std::unique_ptr<Target> make_synthetic_target(ops::Backend& be, dist::Communicator* comm,
                                              const model::ModelConfig& cfg, int layers, uint64_t weight_seed,
                                              uint64_t target_seed, const TargetOptions& options) {
  const int world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const model::ShardPlan plan = model::make_shard_plan(cfg, rank, world, options.head_sharding);
  const model::TargetWeights trunk = model::synthesize_target_trunk(cfg, plan, weight_seed, target_seed);
  return std::make_unique<Target>(
      be, comm, cfg, trunk, layers,
      [&](int i) {
        return model::synthesize_layer_weights(cfg, plan, i, target_seed + 1 + static_cast<uint64_t>(i));
      },
      options);
}

std::unique_ptr<Target> make_target_behind(ops::Backend& be, dist::Communicator* comm,
                                           const model::ModelConfig& cfg, const model::MtpWeights& w,
                                           int layers, uint64_t target_seed, const TargetOptions& options) {
  const model::ShardPlan& plan = w.plan;
  const model::TargetWeights trunk = model::target_trunk_of(cfg, w, target_seed);
  return std::make_unique<Target>(
      be, comm, cfg, trunk, layers,
      [&](int i) {
        return model::synthesize_layer_weights(cfg, plan, i, target_seed + 1 + static_cast<uint64_t>(i));
      },
      options);
}

std::unique_ptr<Target> load_target(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg,
                                    int layers, const std::string& checkpoint_path,
                                    const TargetOptions& options) {
  const int world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  MTP_REQUIRE(cfg.num_hidden_layers == 0 || layers <= cfg.num_hidden_layers, "target: ", layers,
              " layers of a model whose trunk has ", cfg.num_hidden_layers, " (num_hidden_layers)");
  const model::ShardPlan plan = model::make_shard_plan(cfg, rank, world, options.head_sharding);
  const model::Checkpoint ckpt(checkpoint_path);
  const model::TargetWeights trunk = model::load_target_trunk(cfg, plan, ckpt);
  return std::make_unique<Target>(
      be, comm, cfg, trunk, layers, [&](int i) { return model::load_layer_weights(cfg, plan, i, ckpt); },
      options);
}

// ---- SyntheticTarget ----------------------------------------------------------------------------

SyntheticTarget::SyntheticTarget(ops::Backend& be, const model::ModelConfig& cfg, int layers,
                                 uint64_t weight_seed, uint64_t target_seed, int max_positions) {
  MTP_REQUIRE(layers >= 1 && layers <= 64, "synthetic target: layers ", layers, " outside 1..64");
  MTP_REQUIRE(max_positions >= 0, "synthetic target: max_positions ", max_positions, " is negative");
  TargetOptions o;
  o.max_positions = max_positions;
  o.max_rows = kMaxTargetBatch;
  target_ = make_synthetic_target(be, nullptr, cfg, layers, weight_seed, target_seed, o);
}

SyntheticTarget::~SyntheticTarget() = default;

io::TraceSequence SyntheticTarget::generate(const std::vector<int32_t>& prompt, int new_tokens) {
  return generate(prompt, new_tokens, io::TraceSampling{}, 0);
}

io::TraceSequence SyntheticTarget::generate(const std::vector<int32_t>& prompt, int new_tokens,
                                            const io::TraceSampling& sampling, int64_t sequence) {
  // A batch of one: the same forward as every batch (the same bits at every batch size on the CPU).
  return std::move(generate_batch({prompt}, new_tokens, sampling, sequence).front());
}

std::vector<io::TraceSequence> SyntheticTarget::generate_batch(
    const std::vector<std::vector<int32_t>>& prompts, int new_tokens, const io::TraceSampling& sampling,
    int64_t first_sequence) {
  return drafter::generate_batch(*target_, prompts, new_tokens, sampling, first_sequence);
}

std::vector<io::TraceSequence> generate_batch(Target& target,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              int new_tokens, const io::TraceSampling& sampling,
                                              int64_t first_sequence, bool routing) {
  io::validate(sampling, "target generation");
  const model::ModelConfig& cfg = target.config();
  const int n = static_cast<int>(prompts.size());
  MTP_REQUIRE(n >= 1 && n <= kMaxTargetBatch, "target generation: a batch of ", n, " sequences (1 .. ",
              kMaxTargetBatch, ")");
  const int prompt_len = static_cast<int>(prompts[0].size());
  MTP_REQUIRE(prompt_len > 0, "target generation: empty prompt");
  for (const auto& pr : prompts)
    MTP_REQUIRE(static_cast<int>(pr.size()) == prompt_len,
                "target generation: the prompts of a batch differ in length (", pr.size(), " and ",
                prompt_len, " tokens)");
  MTP_REQUIRE(new_tokens >= 0, "target generation: ", new_tokens, " new tokens");
  const int total = prompt_len + new_tokens;
  MTP_REQUIRE(total <= target.capacity(), "target generation: ", total, " positions exceed the capacity of ",
              target.capacity(), " rows");
  const int H = cfg.hidden;
  const size_t V = static_cast<size_t>(cfg.vocab);
  const size_t row = static_cast<size_t>(H);
  const size_t rows = static_cast<size_t>(n);
  const size_t W = static_cast<size_t>(target.layers() * cfg.num_experts_per_tok);
  std::vector<io::TraceSequence> seqs(rows);
  for (size_t b = 0; b < rows; ++b) {
    io::TraceSequence& q = seqs[b];
    q.hidden = H;
    q.prompt_length = prompt_len;
    q.tokens = prompts[b];
    q.tokens.reserve(static_cast<size_t>(total));
    q.hiddens.resize(static_cast<size_t>(total) * row);
    if (routing) q.routing.resize(static_cast<size_t>(total) * W);
  }
  // Sequence b is slot b; every step is one row per sequence, all at the same position.
  auto state = target.new_batch(n);
  for (int b = 0; b < n; ++b) target.new_sequence(*state);
  std::vector<int32_t> step_tokens(rows);
  std::vector<VerifySeq> step(rows);
  for (size_t b = 0; b < rows; ++b)
    step[b] = VerifySeq{static_cast<int>(b), std::span<const int32_t>(step_tokens.data() + b, 1)};
  for (int p = 0; p < total; ++p) {
    const size_t at = static_cast<size_t>(p);
    for (size_t b = 0; b < rows; ++b) {
      const int32_t tok = seqs[b].tokens[at];
      MTP_REQUIRE(tok >= 0 && tok < cfg.vocab, "target generation: token ", tok, " at position ", p,
                  " of sequence ", first_sequence + static_cast<int64_t>(b), " is outside the vocab of ",
                  cfg.vocab);
      step_tokens[b] = tok;
    }
    VerifyExtras extras;
    extras.head = p + 1 < total && p + 1 >= prompt_len;  // a token follows and it is generated
    extras.logits = extras.head && sampling.sampled;
    extras.routing = routing;
    const VerifyResult r = target.verify(*state, step, extras);
    for (size_t b = 0; b < rows; ++b) {
      std::copy_n(r.hiddens.data() + b * row, row, seqs[b].hiddens.data() + at * row);
      if (routing) std::copy_n(r.routing.data() + b * W, W, seqs[b].routing.data() + at * W);
    }
    if (!extras.head) continue;
    for (size_t b = 0; b < rows; ++b) {
      if (!sampling.sampled) {
        seqs[b].tokens.push_back(r.tokens[b]);
      } else {
        seqs[b].tokens.push_back(sample_transformed(
            std::span<const bf16>(r.logits.data() + b * V, V), sampling.temperature, sampling.top_k,
            sampling.top_p,
            sampling_uniform(sampling.seed, first_sequence + static_cast<int64_t>(b), p + 1)));
      }
    }
  }
  return seqs;
}

std::vector<int32_t> PromptGenerator::next(int length) {
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (auto& t : prompt) {
    state_ ^= state_ << 13, state_ ^= state_ >> 7, state_ ^= state_ << 17;
    t = static_cast<int32_t>(state_ % static_cast<uint64_t>(vocab_));
  }
  return prompt;
}

void synthetic_trace_groups(SyntheticTarget& target, int vocab, int count, int prompt_len, int new_tokens,
                            uint64_t seed, const io::TraceSampling& sampling, int batch,
                            const std::function<void(std::vector<io::TraceSequence>&&)>& fn) {
  MTP_REQUIRE(batch >= 1 && batch <= kMaxTargetBatch, "synthetic trace: batch ", batch, " outside 1 .. ",
              kMaxTargetBatch);
  PromptGenerator prompts(seed, vocab);
  for (int s0 = 0; s0 < count; s0 += batch) {
    const int m = std::min(batch, count - s0);
    std::vector<io::TraceSequence> group;
    if (batch == 1) {
      group.push_back(target.generate(prompts.next(prompt_len), new_tokens, sampling, s0));
    } else {
      std::vector<std::vector<int32_t>> ps;
      for (int i = 0; i < m; ++i) ps.push_back(prompts.next(prompt_len));
      group = target.generate_batch(ps, new_tokens, sampling, s0);
    }
    for (int i = 0; i < m; ++i) group[static_cast<size_t>(i)].index = s0 + i;
    fn(std::move(group));
  }
}

std::vector<io::TraceSequence> synthetic_trace(SyntheticTarget& target, int vocab, int count, int prompt_len,
                                               int new_tokens, uint64_t seed,
                                               const io::TraceSampling& sampling, int batch,
                                               const std::function<void(int)>& progress) {
  std::vector<io::TraceSequence> out;
  out.reserve(static_cast<size_t>(std::max(count, 0)));
  synthetic_trace_groups(target, vocab, count, prompt_len, new_tokens, seed, sampling, batch,
                         [&](std::vector<io::TraceSequence>&& group) {
                           for (io::TraceSequence& q : group) out.push_back(std::move(q));
                           if (progress) progress(static_cast<int>(out.size()));
                         });
  return out;
}

double sampling_uniform(int64_t seed, int64_t sequence, int64_t position) {
  return counter_uniform(0x73796e7468657469ull, seed, sequence, position);  // "syntheti"
}

namespace {
// The transform of sample_transformed: z = logits / temperature, the kept set {z >= threshold}
// (top-k, then top-p, ties at a threshold kept), and the softmax's max and normaliser over it.
struct Transformed {
  std::vector<double> z;
  double threshold = -INFINITY;
  double zmax = 0;
  double sum = 0;  // sum over the kept tokens of exp(z - zmax)
};

Transformed transform_logits(std::span<const bf16> logits, double temperature, int64_t top_k, double top_p) {
  const size_t n = logits.size();
  MTP_REQUIRE(n > 0 && temperature > 0 && top_p > 0 && top_p <= 1 && top_k >= 0,
              "sample_transformed: bad transform (temperature ", temperature, ", top_k ", top_k, ", top_p ",
              top_p, ") or empty logits");
  Transformed t;
  std::vector<double>& z = t.z;
  z.resize(n);
  for (size_t i = 0; i < n; ++i) z[i] = static_cast<double>(to_float(logits[i])) / temperature;
  // Descending logit order (stable: equal logits by id), for the thresholds.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
  size_t kept = n;  // tokens order[0 .. kept) are the candidates (ties at the threshold included)
  if (top_k > 0 && static_cast<size_t>(top_k) < n) {
    t.threshold = z[order[static_cast<size_t>(top_k) - 1]];
    kept = static_cast<size_t>(top_k);
    while (kept < n && z[order[kept]] >= t.threshold) ++kept;
  }
  const double zmax = z[order[0]];
  t.zmax = zmax;
  double total = 0;
  for (size_t j = 0; j < kept; ++j) total += std::exp(z[order[j]] - zmax);
  if (top_p < 1) {
    // The largest threshold whose kept mass reaches top_p: walk down by distinct logit values.
    double mass = 0;
    size_t j = 0;
    while (j < kept) {
      const double v = z[order[j]];
      while (j < kept && z[order[j]] == v) mass += std::exp(z[order[j++]] - zmax);
      if (mass >= top_p * total) break;
    }
    kept = j;
    t.threshold = z[order[kept - 1]];
  }
  for (size_t i = 0; i < n; ++i)
    if (z[i] >= t.threshold) t.sum += std::exp(z[i] - zmax);
  return t;
}
}  // namespace

int32_t sample_transformed(std::span<const bf16> logits, double temperature, int64_t top_k, double top_p,
                           double u) {
  const Transformed t = transform_logits(logits, temperature, top_k, top_p);
  double cum = 0;
  int32_t last = -1;
  for (size_t i = 0; i < t.z.size(); ++i) {
    if (t.z[i] < t.threshold) continue;
    cum += std::exp(t.z[i] - t.zmax) / t.sum;
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  return last;  // u within rounding of 1: the last kept token
}

std::vector<double> transformed_probabilities(std::span<const bf16> logits, double temperature, int64_t top_k,
                                              double top_p) {
  const Transformed t = transform_logits(logits, temperature, top_k, top_p);
  std::vector<double> prob(t.z.size(), 0.0);
  for (size_t i = 0; i < t.z.size(); ++i)
    if (t.z[i] >= t.threshold) prob[i] = std::exp(t.z[i] - t.zmax) / t.sum;
  return prob;
}

int32_t draw_token(std::span<const double> prob, double u) {
  double total = 0;
  for (const double x : prob) total += x;
  MTP_REQUIRE(total > 0, "draw_token: no token of the ", prob.size(), " has a positive probability");
  // A distribution that sums to 1 is drawn with u itself (the bits of sample_transformed's walk).
  const double target = total == 1.0 ? u : u * total;
  double cum = 0;
  int32_t last = -1;
  for (size_t i = 0; i < prob.size(); ++i) {
    if (!(prob[i] > 0)) continue;
    cum += prob[i];
    last = static_cast<int32_t>(i);
    if (target < cum) return last;
  }
  return last;
}

}  // namespace mtplab::drafter
