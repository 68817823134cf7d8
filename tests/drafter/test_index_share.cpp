// The index_share arm on the CPU backend (one rank): drafts 2..k of a propose reuse draft 1's
// indexer pool selection (docs/drafter.md, "Index share").
// - The op: indexer_share_select on planted anchors (pools, the tail from the anchor's, padding,
//   refusals).
// - Contexts where every selection holds every row (positions <= K + P - 2): on and off give
//   bit-identical drafts and head inputs, single-sequence and batched, for every step arm.
// - Longer contexts: every propose of a replay (rollbacks and catch-ups between them) equals a
//   direct op-by-op recomputation of the chain from the sequence's caches in which draft 1 scores
//   and selects and drafts 2..k attend to draft 1's pools plus the rows from its tail to their own
//   position. The same recomputation with every draft selecting for itself reproduces the drafter
//   with index_share off, so the reference is the drafter's own arithmetic. Shared selections
//   differ from the drafts' own ones there, and so do some drafts: the arm can change results.
// - Batched drafting with index_share: a sequence's drafts at B = 1, 3, 16 equal its drafts alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "batch_replay.hpp"
#include "common/drafter.hpp"
#include "ops/one_row.hpp"

using namespace mtplab;
using drafter::DrafterOptions;

namespace {

constexpr int kDraft = 4;

using Fixture = test::TinyCpuDrafterOf<kDraft>;

/// 12 sequences of 72 tokens (positions well past the tiny preset's dense window of 19 rows).
const std::vector<io::TraceSequence>& long_trace() { return test::shared_tiny_trace(12, 16, 56, 21); }

/// 8 sequences of 21 tokens: a replay drafts at positions up to 18 = K + P - 2 only, where every
/// selection is every row 0 .. position.
const std::vector<io::TraceSequence>& short_trace() { return test::shared_tiny_trace(8, 4, 17, 23); }

std::vector<int> short_prompts(size_t n) { return test::spread_prompts(n, 2, 5, 13); }  // 2 .. 14
std::vector<int> long_prompts(size_t n) { return test::spread_prompts(n, 3, 11, 41); }  // 3 .. 43

using Arm = test::DrafterArm;

std::vector<Arm> step_arms() {
  using drafter::ContextRows, drafter::DraftRows, drafter::Skip;
  return {
      {"default", {}},
      {"context_rows full", {.context_rows = ContextRows::full}},
      {"skip head", {.skip = Skip::head}},
      {"skip block", {.skip = Skip::block}},
      {"draft_rows keep + head_fp8", {.head_fp8 = true, .draft_rows = DraftRows::keep}},
      {"full + context_gemm + batch_qidx",
       {.context_rows = ContextRows::full, .batch_qidx = true, .context_gemm = true}},
      {"FP8 latent cache", {}, ops::KvDtype::fp8},
  };
}

DrafterOptions with_share(DrafterOptions o, bool on) {
  o.index_share = on;
  return o;
}

/// The host selection of a chained draft at `pos` sharing the anchor selection made at `anchor`
/// (MODEL.md's rule written out): the anchor's pools (its first min(K/P, floor((a+1)/P)) * P
/// entries), then rows P * floor((a+1)/P) .. pos, then -1 up to `width`.
std::vector<int32_t> shared_selection(const std::vector<int32_t>& anchor_sel, int anchor, int pos, int K,
                                      int P, int width) {
  const int cand = (anchor + 1) / P;
  const int pools = std::min(K / P, cand);
  std::vector<int32_t> s(anchor_sel.begin(), anchor_sel.begin() + pools * P);
  for (int t = cand * P; t <= pos; ++t) s.push_back(t);
  s.resize(static_cast<size_t>(width), -1);
  return s;
}

std::set<int32_t> as_set(const std::vector<int32_t>& sel) {
  std::set<int32_t> s;
  for (int32_t t : sel)
    if (t >= 0) s.insert(t);
  return s;
}

/// The drafter's chain recomputed op by op (MODEL.md, forward_one k times) on the CPU backend from
/// a sequence's caches after a propose, with each draft's selection made here: draft 1 scores and
/// selects; drafts 2..k either do the same at their own position (share false) or attend to draft
/// 1's pools plus their rows from its tail on (share true). A row at position p reads the caches
/// only at rows <= p (the pools whose last row is <= p, the selected latent rows), which the rest
/// of the propose did not change, so recomputing after the propose sees what each draft saw.
class ChainReference {
 public:
  ChainReference(ops::Backend& be, const model::ModelConfig& cfg, const model::MtpWeights& w)
      : be_(be), cfg_(cfg), d_(drafter::block_dims(cfg, 1, 0, ops::KvDtype::bf16)) {
    d_.n_heads_local = cfg.n_heads;
    d_.shared_inter_local = cfg.shared_intermediate();
    bw_ = drafter::upload_block_weights(be, w);
    embed_ = drafter::upload(be, w.embed_tokens);
    enorm_ = drafter::upload(be, w.enorm);
    hnorm_ = drafter::upload(be, w.hnorm);
    eh_proj_ = drafter::upload(be, w.eh_proj);
    head_norm_ = drafter::upload(be, w.shared_head_norm);
    lm_head_ = drafter::upload(be, w.lm_head);
  }

  struct Chain {
    std::vector<int32_t> drafts;
    std::vector<bf16> y;                          ///< [k, H] head inputs
    std::vector<std::vector<int32_t>> selection;  ///< the selection each draft attended to
    std::vector<std::vector<int32_t>> own;  ///< each draft's own selection (drafts 2..k: not used with share)
  };

  /// `cache`: a sequence's pool of one slot (slot 0).
  Chain run(drafter::SlotCaches& cache, int base, int32_t token, const bf16* hidden, int k, bool share) {
    const int H = cfg_.hidden, K = d_.index_topk, P = d_.index_kpool;
    const int nh = d_.n_heads_local, L = d_.kv_lora, nI = d_.index_heads, D = d_.index_dim;
    const int width = d_.selection_width() + (share ? k - 1 : 0);
    const float eps = cfg_.rms_norm_eps;
    auto bf = [&](size_t n) { return ops::Array<bf16>(be_, n); };
    auto f32 = [&](size_t n) { return ops::Array<float>(be_, n); };
    auto concat = bf(2 * H), x0 = bf(H), u = bf(H), cq_pre = bf(d_.q_lora), cq = bf(d_.q_lora);
    auto q = bf(static_cast<size_t>(nh) * d_.qk_nope), q_abs = bf(static_cast<size_t>(nh) * L);
    auto o_lat = bf(static_cast<size_t>(nh) * L), o = bf(static_cast<size_t>(nh) * d_.v_head);
    auto r = bf(H), v = bf(H), x1 = bf(H), y = bf(H), h = bf(H);
    auto q_idx = f32(static_cast<size_t>(nI) * D), w_idx = f32(nI), scores = f32(d_.max_pools());
    auto attn = f32(H), logits = f32(d_.num_experts), moe = f32(H), ew = f32(d_.top_k);
    ops::Array<int32_t> tok(be_, 1), pos(be_, 1), own_sel(be_, d_.selection_width()), sel(be_, width),
        eidx(be_, d_.top_k);
    ops::Array<ops::ArgMax> am(be_, 1);
    be_.upload(tok.data(), &token, sizeof token);
    be_.upload(h.data(), hidden, static_cast<size_t>(H) * sizeof(bf16));
    Chain out;
    std::vector<int32_t> anchor_sel;
    for (int i = 0; i < k; ++i) {
      const int32_t p = base + i;
      be_.upload(pos.data(), &p, sizeof p);
      // front: x0 = eh_proj [enorm(E[t]) ; hnorm(h)]
      mtplab::ops::OneRow(be_).embed_rmsnorm(embed_.data(), tok.data(), enorm_.data(), concat.data(), H, eps);
      be_.rmsnorm(h.data(), hnorm_.data(), concat.data() + H, 1, H, eps);
      be_.linear(eh_proj_.data(), concat.data(), x0.data(), 1, H, 2 * H);
      // attention queries
      be_.rmsnorm(x0.data(), bw_.input_norm.data(), u.data(), 1, H, d_.rms_eps);
      be_.linear(bw_.q_a.data(), u.data(), cq_pre.data(), 1, d_.q_lora, H);
      be_.rmsnorm(cq_pre.data(), bw_.q_a_norm.data(), cq.data(), 1, d_.q_lora, d_.rms_eps);
      be_.linear(bw_.q_b.data(), cq.data(), q.data(), 1, nh * d_.qk_nope, d_.q_lora);
      // this draft's own selection: I_j = sum_h w_h relu(q_h . K_j / sqrt(D)), top K/P pools + tail
      be_.linear_f32(bw_.idx_wq_b.data(), cq.data(), q_idx.data(), 1, nI * D, d_.q_lora);
      be_.linear_f32(bw_.idx_weights_proj.data(), u.data(), w_idx.data(), 1, nI, H);
      be_.scale_f32(w_idx.data(), 1.0f / std::sqrt(static_cast<float>(nI)), nI);
      be_.indexer_scores(q_idx.data(), w_idx.data(), cache.pool_keys.data(), pos.data(), scores.data(), nI, D,
                         P, d_.max_pools());
      be_.indexer_select(scores.data(), pos.data(), own_sel.data(), K, P, d_.max_pools());
      std::vector<int32_t> own(static_cast<size_t>(d_.selection_width()));
      be_.download(own.data(), own_sel.data(), own.size() * sizeof(int32_t));
      if (i == 0) anchor_sel = own;
      std::vector<int32_t> chosen = own;
      if (share) chosen = shared_selection(anchor_sel, base, p, K, P, width);
      chosen.resize(static_cast<size_t>(width), -1);
      be_.upload(sel.data(), chosen.data(), chosen.size() * sizeof(int32_t));
      // absorbed sparse MLA, o_proj, MoE, shared_head.norm, head
      mtplab::ops::OneRow(be_).mla_absorb_q(q.data(), bw_.kv_b.data(), q_abs.data(), nh, d_.qk_nope,
                                            d_.v_head, L);
      mtplab::ops::OneRow(be_).mla_decode(q_abs.data(), sel.data(), width, cache.block_tables.data(),
                                          cache.kv_slots().cache, o_lat.data(), nh, d_.softmax_scale);
      mtplab::ops::OneRow(be_).mla_out_v(o_lat.data(), bw_.kv_b.data(), o.data(), nh, d_.qk_nope, d_.v_head,
                                         L);
      be_.linear_f32(bw_.o_proj.data(), o.data(), attn.data(), 1, H, nh * d_.v_head);
      mtplab::ops::OneRow(be_).residual_add_rmsnorm(x0.data(), attn.data(), r.data(), bw_.post_norm.data(),
                                                    v.data(), H, d_.rms_eps);
      be_.linear_f32(bw_.router.data(), v.data(), logits.data(), 1, d_.num_experts, H);
      mtplab::ops::OneRow(be_).moe_route(logits.data(), bw_.router_bias.data(), d_.num_experts, d_.top_k,
                                         d_.n_group, d_.topk_group, d_.routed_scaling, eidx.data(),
                                         ew.data());
      const ops::ExpertWeights routed{bw_.exp_gate.data(), bw_.exp_up.data(),     bw_.exp_down.data(),
                                      bw_.first_expert,    bw_.num_local_experts, H,
                                      d_.moe_inter};
      const ops::ExpertWeights shared{bw_.sh_gate.data(),   bw_.sh_up.data(), bw_.sh_down.data(), 0, 1, H,
                                      d_.shared_inter_local};
      mtplab::ops::OneRow(be_).moe_experts_shared(v.data(), routed, eidx.data(), ew.data(), d_.top_k, shared,
                                                  d_.swiglu_limit, moe.data());
      mtplab::ops::OneRow(be_).residual_add_rmsnorm(r.data(), moe.data(), x1.data(), head_norm_.data(),
                                                    y.data(), H, eps);
      be_.head_argmax(lm_head_.data(), nullptr, nullptr, y.data(), static_cast<int>(cfg_.vocab), H, 0,
                      nullptr, am.data());
      ops::ArgMax best{};
      be_.download(&best, am.data(), sizeof best);
      out.drafts.push_back(best.index);
      std::vector<bf16> yh(static_cast<size_t>(H));
      be_.download(yh.data(), y.data(), yh.size() * sizeof(bf16));
      out.y.insert(out.y.end(), yh.begin(), yh.end());
      out.selection.push_back(chosen);
      out.own.push_back(own);
      // chaining: the next draft reads (draft, y) at position + 1
      be_.upload(tok.data(), &best.index, sizeof best.index);
      be_.copy(h.data(), y.data(), static_cast<size_t>(H) * sizeof(bf16));
    }
    return out;
  }

 private:
  ops::Backend& be_;
  const model::ModelConfig& cfg_;
  drafter::BlockDims d_;
  drafter::BlockWeights bw_;
  ops::Array<bf16> embed_, enorm_, hnorm_, eh_proj_, head_norm_, lm_head_;
};

/// bf16's == is bitwise.
bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) { return a == b; }

/// What a replay of `trace` checked against the reference.
struct ReferenceReplay {
  int proposes = 0;
  int sparse_proposes = 0;  ///< proposes whose first draft's selection is sparse
  int chained_drafts = 0;   ///< drafts 2..k of sparse proposes
  int shared_differs = 0;   ///< of those, drafts whose shared selection differs from their own (as sets)
  std::vector<int32_t> drafts;
};

/// Replays every sequence (scripted accepted counts, catch-up from the trace) with `d`, checking
/// every propose against the reference's chain with `share` (drafts and head inputs, bit for bit).
ReferenceReplay replay_against_reference(Fixture& f, drafter::MtpDrafter& d, ChainReference& ref,
                                         bool share) {
  const auto& trace = long_trace();
  const auto prompts = long_prompts(trace.size());
  const int H = f.cfg.hidden, K = f.cfg.index_topk, P = f.cfg.index_kpool;
  d.keep_head_inputs(true);
  ReferenceReplay out;
  for (size_t s = 0; s < trace.size(); ++s) {
    const io::TraceSequence& t = trace[s];
    const int N = static_cast<int>(t.tokens.size());
    auto st = d.new_sequence();
    d.append_rows(*st, t.tokens.data() + 1, test::hidden_row(t, 0, H), prompts[s] - 1, 0);
    for (int L = prompts[s], step = 0; L + kDraft <= N - 1; ++step) {
      const int base = st->seq_len(0);
      const auto drafts = d.propose(*st, t.tokens[L], test::hidden_row(t, L - 1, H), kDraft);
      const auto chain = ref.run(st->caches, base, t.tokens[L], test::hidden_row(t, L - 1, H), kDraft, share);
      const std::string where = "sequence " + std::to_string(s) + ", propose at row " + std::to_string(base) +
                                (share ? " (index_share on)" : " (index_share off)");
      EXPECT_EQ(drafts, chain.drafts) << where;
      EXPECT_TRUE(same_bits(d.head_inputs(), chain.y)) << where << ": head inputs differ";
      ++out.proposes;
      out.drafts.insert(out.drafts.end(), drafts.begin(), drafts.end());
      if ((base + 1) / P > K / P) {
        ++out.sparse_proposes;
        for (int i = 1; i < kDraft; ++i) {
          ++out.chained_drafts;
          out.shared_differs +=
              as_set(chain.selection[static_cast<size_t>(i)]) != as_set(chain.own[static_cast<size_t>(i)]);
        }
      }
      const int a = test::scripted_accepted(static_cast<int>(s), step, kDraft);
      d.after_verify(*st, a);
      const int next_L = L + a + 1;
      const int from = st->seq_len(0);
      d.append_rows(*st, t.tokens.data() + from + 1, test::hidden_row(t, from, H), next_L - 1 - from, from,
                    drafter::Phase::catch_up);
      L = next_L;
    }
  }
  return out;
}

}  // namespace

TEST(IndexShareOp, SharesTheAnchorsPoolsAndExtendsItsTail) {
  auto be = ops::make_cpu_backend();
  const int K = 16, P = 4, W = K + P - 1, extra = 3, width = W + extra;
  // Anchor at position 30: 7 complete pools, 4 selected (pools 1, 3, 4, 6 in ascending order), tail 28..30.
  std::vector<int32_t> anchor;
  for (int j : {1, 3, 4, 6})
    for (int m = 0; m < P; ++m) anchor.push_back(j * P + m);
  for (int t = 28; t <= 30; ++t) anchor.push_back(t);
  anchor.resize(W, -1);
  // Rows 0..3: positions 30..33, each with anchor 30 (row b reads anchor row b: the same anchor).
  const int rows = 4;
  std::vector<int32_t> anchors, anchor_pos(rows, 30), pos(rows);
  for (int b = 0; b < rows; ++b) {
    anchors.insert(anchors.end(), anchor.begin(), anchor.end());
    pos[static_cast<size_t>(b)] = 30 + b;
  }
  std::vector<int32_t> out(static_cast<size_t>(rows) * width, 12345);
  be->indexer_share_select(anchors.data(), anchor_pos.data(), pos.data(), rows, out.data(), width, K, P);
  for (int b = 0; b < rows; ++b) {
    std::vector<int32_t> want(anchor.begin(), anchor.begin() + 16);
    for (int t = 28; t <= 30 + b; ++t) want.push_back(t);  // 31 completes pool 7: its rows stay
    want.resize(width, -1);
    const std::vector<int32_t> got(out.begin() + b * width, out.begin() + (b + 1) * width);
    EXPECT_EQ(got, want) << "row " << b;
  }
  // A short anchor (position 9: pools 0, 1 and tail 8..9, fewer than K/P pools): every row 0..pos.
  std::vector<int32_t> short_anchor;
  for (int t = 0; t <= 9; ++t) short_anchor.push_back(t);
  short_anchor.resize(W, -1);
  const int32_t a9 = 9, p12 = 12;
  std::vector<int32_t> one(width, 777);
  be->indexer_share_select(short_anchor.data(), &a9, &p12, 1, one.data(), width, K, P);
  std::vector<int32_t> want(13);
  for (int t = 0; t <= 12; ++t) want[static_cast<size_t>(t)] = t;
  want.resize(width, -1);
  EXPECT_EQ(one, want);
  // Refused: a position before its anchor, a width that cannot hold the rows, a negative anchor.
  const int32_t a31 = 31, p30 = 30, p34 = 34, neg = -1;
  EXPECT_THROW(be->indexer_share_select(anchor.data(), &a31, &p30, 1, one.data(), width, K, P), Error);
  EXPECT_THROW(be->indexer_share_select(anchor.data(), &anchor_pos[0], &p34, 1, one.data(), width, K, P),
               Error);
  EXPECT_THROW(be->indexer_share_select(anchor.data(), &neg, &p30, 1, one.data(), width, K, P), Error);
}

TEST(IndexShare, DenseContextsGiveBitIdenticalDraftsSingleAndBatched) {
  // Every draft at a position <= K + P - 2 (= 18) selects every row 0 .. position, with or without
  // sharing; the shared selection is then the same rows in the same order, so nothing may change.
  Fixture f;
  const auto& trace = short_trace();
  const auto prompts = short_prompts(trace.size());
  const int H = f.cfg.hidden;
  ASSERT_EQ(f.cfg.index_topk + f.cfg.index_kpool - 2, 18);
  for (const Arm& arm : step_arms()) {
    auto off = f.make(with_share(arm.opt, false), arm.kv);
    auto on = f.make(with_share(arm.opt, true), arm.kv);
    off->keep_head_inputs(true);
    on->keep_head_inputs(true);
    int proposes = 0, crossings = 0;
    for (size_t s = 0; s < trace.size(); ++s) {
      const io::TraceSequence& t = trace[s];
      const int N = static_cast<int>(t.tokens.size());
      auto so = off->new_sequence();
      auto sn = on->new_sequence();
      off->append_rows(*so, t.tokens.data() + 1, test::hidden_row(t, 0, H), prompts[s] - 1, 0);
      on->append_rows(*sn, t.tokens.data() + 1, test::hidden_row(t, 0, H), prompts[s] - 1, 0);
      for (int L = prompts[s], step = 0; L + kDraft <= N - 1; ++step) {
        const int base = so->seq_len(0);
        ASSERT_LE(base + kDraft - 1, 18) << arm.name;
        const auto a = off->propose(*so, t.tokens[L], test::hidden_row(t, L - 1, H), kDraft);
        const auto b = on->propose(*sn, t.tokens[L], test::hidden_row(t, L - 1, H), kDraft);
        EXPECT_EQ(a, b) << arm.name << ", sequence " << s << ", row " << base;
        if (arm.opt.skip != drafter::Skip::head) {
          EXPECT_TRUE(same_bits(off->head_inputs(), on->head_inputs())) << arm.name << ", row " << base;
        }
        ++proposes;
        crossings += (base + 1) / 4 != (base + kDraft) / 4;  // a pool completes inside the propose
        const int acc = test::scripted_accepted(static_cast<int>(s), step, kDraft);
        off->after_verify(*so, acc);
        on->after_verify(*sn, acc);
        const int next_L = L + acc + 1;
        const int from = so->seq_len(0);
        ASSERT_EQ(sn->seq_len(0), from);
        off->append_rows(*so, t.tokens.data() + from + 1, test::hidden_row(t, from, H), next_L - 1 - from,
                         from, drafter::Phase::catch_up);
        on->append_rows(*sn, t.tokens.data() + from + 1, test::hidden_row(t, from, H), next_L - 1 - from,
                        from, drafter::Phase::catch_up);
        L = next_L;
      }
    }
    EXPECT_GT(proposes, 20) << arm.name;
    EXPECT_GT(crossings, 5) << arm.name << ": proposes inside which a pool completes";
    // Batched, 3 slots: the same drafts as the single-sequence drafter with the arm off.
    auto single = f.make(with_share(arm.opt, false), arm.kv);
    const auto want = test::replay_single(*single, trace, prompts, kDraft, H);
    auto batched = f.make(with_share(arm.opt, true), arm.kv);
    const auto got = test::replay_batched(*batched, trace, prompts, kDraft, H, 3);
    EXPECT_TRUE(got.drafts == want) << arm.name << ": batched with index_share on";
  }
}

TEST(IndexShare, SparseContextsEqualARecomputationFromDraftOnesSelection) {
  Fixture f;
  ChainReference ref(*f.be, f.cfg, f.w);
  // The reference with every draft selecting for itself reproduces the drafter with the arm off:
  // the reference computes what the drafter computes.
  auto off = f.make(with_share({}, false));
  const ReferenceReplay own = replay_against_reference(f, *off, ref, false);
  // With the arm on, drafts 2..k attend to draft 1's pools plus their rows from its tail on.
  auto on = f.make(with_share({}, true));
  const ReferenceReplay shared = replay_against_reference(f, *on, ref, true);
  EXPECT_EQ(own.proposes, shared.proposes);
  EXPECT_GT(shared.sparse_proposes, 30) << "too few proposes past the dense window to test the arm";
  // The arm can change results: shared selections differ from the drafts' own, and drafts follow.
  EXPECT_GT(shared.shared_differs, 0) << "no chained draft's own selection differed from draft 1's";
  size_t differ = 0;
  for (size_t i = 0; i < std::min(own.drafts.size(), shared.drafts.size()); ++i)
    differ += own.drafts[i] != shared.drafts[i];
  EXPECT_GT(differ, 0u) << "index_share on and off drafted alike everywhere";
  std::printf(
      "[index-share] %d proposes (%d sparse): %d of %d chained drafts' own selections differ from "
      "the shared one; %zu of %zu drafts differ from index_share off\n",
      shared.proposes, shared.sparse_proposes, shared.shared_differs, shared.chained_drafts, differ,
      shared.drafts.size());
}

TEST(IndexShare, BatchedDraftsEqualTheSingleSequenceDrafter) {
  Fixture f;
  const auto& trace = long_trace();
  const auto prompts = long_prompts(trace.size());
  const int H = f.cfg.hidden;
  for (const Arm& arm : step_arms()) {
    const DrafterOptions opt = with_share(arm.opt, true);
    auto single = f.make(opt, arm.kv);
    const auto want = test::replay_single(*single, trace, prompts, kDraft, H);
    for (int slots : {1, 3, 16}) {
      auto batched = f.make(opt, arm.kv);
      const auto got =
          test::replay_batched(*batched, trace, prompts, kDraft, H, slots,
                               slots == 3 ? std::optional(drafter::BatchPadding::bucket) : std::nullopt);
      EXPECT_TRUE(got.drafts == want) << arm.name << ", " << slots << " slots";
      EXPECT_EQ(got.max_rows, std::min<int>(slots, static_cast<int>(trace.size()))) << arm.name;
    }
  }
}
