// Block::forward over ragged rows (context chunks of one sequence; several sequences of several
// rows) against one row at a time, the batch_qidx selection check of the drafter, and the pure
// selection comparison, on the CPU.
//
// - A ragged forward writes every row's caches before any row's selection; a row reads pools and
//   rows <= its own position only, so it must give bit-identical row outputs, selections and caches
//   to the per-row loop, also across propose / rollback / catch-up (stale rows past the length),
//   across chunk boundaries and with several sequences of several rows in one batch.
// - The CPU's batched linear computes exactly what the per-row one does, so with batch_qidx the
//   check must count every context row and find no difference; the drafts equal the other arms'.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/trace.hpp"
#include "drafter/factory.hpp"
#include "drafter/selection_check.hpp"
#include "harness/replay.hpp"
#include "model/weights.hpp"

using namespace mtplab;
using drafter::DrafterOptions;

namespace {

// ---- the pure comparison ------------------------------------------------------------------------

TEST(SelectionCheck, SameSetInAnotherOrderIsNotADifference) {
  const int width = 7;
  // Two rows; row 0 the same entries permuted (padding in other places), row 1 identical.
  const std::vector<int32_t> b = {0, 1, 2, 3, 8, -1, -1, /**/ 4, 5, 6, 7, -1, -1, -1};
  const std::vector<int32_t> r = {8, -1, 3, 2, 1, 0, -1, /**/ 4, 5, 6, 7, -1, -1, -1};
  const auto c = drafter::compare_selections(b.data(), r.data(), 2, width);
  EXPECT_EQ(c.rows_checked, 2);
  EXPECT_EQ(c.rows_differ, 0);
  EXPECT_EQ(c.entries_differ, 0);
}

TEST(SelectionCheck, PlantedDifferencesAreCounted) {
  const int width = 7;
  const std::vector<int32_t> b = {
      0,  1,  2,  3,  8,  9,  -1,  // row 0: pool {0..3} vs {4..7} swapped: 4 entries differ
      0,  1,  2,  3,  4,  -1, -1,  // row 1: same set
      12, 13, 14, 15, 16, -1, -1,  // row 2: one entry differs (16 vs 17), other order
      0,  1,  2,  3,  -1, -1, -1,  // row 3: a strict subset of the per-row set: 1 entry
  };
  const std::vector<int32_t> r = {
      4,  5,  6,  7,  8,  9,  -1,  //
      4,  3,  2,  1,  0,  -1, -1,  //
      17, 15, 14, 13, 12, -1, -1,  //
      0,  1,  2,  3,  5,  -1, -1,  //
  };
  const auto c = drafter::compare_selections(b.data(), r.data(), 4, width);
  EXPECT_EQ(c.rows_checked, 4);
  EXPECT_EQ(c.rows_differ, 3);
  EXPECT_EQ(c.entries_differ, 4 + 1 + 1);
  EXPECT_DOUBLE_EQ(c.differ_rate(), 3.0 / 4);
  // Symmetric in its arguments.
  const auto d = drafter::compare_selections(r.data(), b.data(), 4, width);
  EXPECT_EQ(d.rows_differ, c.rows_differ);
  EXPECT_EQ(d.entries_differ, c.entries_differ);
  // No rows: nothing counted, rate 0.
  EXPECT_EQ(drafter::compare_selections(b.data(), r.data(), 0, width).rows_checked, 0);
}

// ---- ragged rows vs one row at a time -------------------------------------------------------------

/// One block on the tiny preset with a pool of `slots` sequence slots.
struct BlockRig {
  BlockRig(ops::Backend& be, const model::ModelConfig& cfg, const model::MtpWeights& w, int slots = 1)
      : dims(make_dims(cfg, w)),
        block(be, nullptr, dims, drafter::upload_block_weights(be, w)),
        cache(be, dims, slots) {}
  static drafter::BlockDims make_dims(const model::ModelConfig& cfg, const model::MtpWeights& w) {
    drafter::BlockDims d = drafter::block_dims(cfg, 1, 0, ops::KvDtype::bf16);
    d.n_heads_local = static_cast<int>(w.plan.heads.count);
    d.shared_inter_local = static_cast<int>(w.moe.shared_gate.shape[0]);
    return d;
  }
  drafter::BlockDims dims;
  drafter::Block block;
  drafter::SlotCaches cache;
};

template <typename T>
std::vector<T> fetch(ops::Backend& be, const T* src, size_t n) {
  std::vector<T> out(n);
  be.download(out.data(), src, n * sizeof(T));
  return out;
}

/// Slot sa of a's caches and slot sb of b's: rows 0 .. rows-1 (and the pools they complete), bit for
/// bit. Logical block j of slot s of a pool of S slots is physical block j * S + s.
void expect_same_caches(ops::Backend& be, BlockRig& a, int sa, BlockRig& b, int sb, int rows,
                        const std::string& where) {
  const auto& d = a.dims;
  const size_t D = static_cast<size_t>(d.index_dim), R = static_cast<size_t>(d.max_rows);
  const size_t n = static_cast<size_t>(rows);
  auto latent = [&](BlockRig& rig, int slot) {
    std::vector<bf16> out;
    const size_t S = static_cast<size_t>(rig.cache.slots()), B = static_cast<size_t>(d.block_size);
    const auto* kv = static_cast<const bf16*>(rig.cache.kv_slots().cache.data);
    for (size_t j = 0; j * B < n; ++j) {
      const auto blk = fetch(be, kv + (j * S + static_cast<size_t>(slot)) * B * d.kv_lora, B * d.kv_lora);
      out.insert(out.end(), blk.begin(),
                 blk.begin() + static_cast<std::ptrdiff_t>(std::min(B, n - j * B) * d.kv_lora));
    }
    return out;
  };
  EXPECT_EQ(latent(a, sa), latent(b, sb)) << where << ": latent rows";
  const size_t oa = static_cast<size_t>(sa), ob = static_cast<size_t>(sb);
  EXPECT_EQ(fetch(be, a.cache.k_cache.data() + oa * R * D, n * D),
            fetch(be, b.cache.k_cache.data() + ob * R * D, n * D))
      << where << ": indexer rows";
  const auto ga = fetch(be, a.cache.gate_cache.data() + oa * R * D, n * D),
             gb = fetch(be, b.cache.gate_cache.data() + ob * R * D, n * D);
  EXPECT_EQ(0, std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float))) << where << ": gate rows";
  EXPECT_EQ(fetch(be, a.cache.valid.data() + oa * R, R), fetch(be, b.cache.valid.data() + ob * R, R))
      << where;
  const size_t P = static_cast<size_t>(d.max_pools()), pools = n / d.index_kpool;
  const auto ka = fetch(be, a.cache.pool_keys.data() + oa * P * D, pools * D),
             kb = fetch(be, b.cache.pool_keys.data() + ob * P * D, pools * D);
  EXPECT_EQ(0, std::memcmp(ka.data(), kb.data(), ka.size() * sizeof(float))) << where << ": pool keys";
}

class ForwardRows : public ::testing::TestWithParam<ops::RowsMode> {};

// A scripted replay on two blocks with the same weights: A runs every row as a forward of one row;
// B runs the context rows (prefill, catch-up) as ragged forwards of up to 64 rows of one sequence
// and the draft rows one at a time, as the drafter does. Inputs are fresh random rows; the script
// covers several prefill chunks, sparse selections (K + P - 1 = 19 < rows), rollbacks that leave
// stale rows and pools past the length, and catch-ups of 0 to 3 rows.
TEST_P(ForwardRows, EqualsOneForwardPerRow) {
  const ops::RowsMode mode = GetParam();
  const model::ModelConfig cfg = test::tiny_config(512);
  auto be = ops::make_cpu_backend();
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  const auto w = model::synthesize_mtp_weights(cfg, plan, 11);
  BlockRig a(*be, cfg, w), b(*be, cfg, w);
  const int chunk = 64;
  a.block.reserve(1);
  b.block.reserve(chunk, true);
  drafter::Block::Options ob;
  ob.proj_mode = ob.qidx_mode = mode;
  const int H = cfg.hidden;
  const size_t width = static_cast<size_t>(a.dims.selection_width());
  std::mt19937 gen(20261207);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_rows = [&](int n) {
    std::vector<bf16> v(static_cast<size_t>(n) * H);
    for (auto& x : v) x = to_bf16(normal(gen));
    return v;
  };
  ops::Array<bf16> xa(*be, static_cast<size_t>(chunk) * H), xb(*be, static_cast<size_t>(chunk) * H);
  ops::Array<int32_t> pos(*be, chunk), slot(*be, chunk);
  be->fill_bytes(slot.data(), 0, slot.bytes());
  int rows_compared = 0;

  // Context rows base .. base+n-1: A one forward each, B one ragged forward per chunk of 64.
  auto context = [&](int base, int n, const std::string& what) {
    for (int c0 = 0; c0 < n; c0 += chunk) {
      const int m = std::min(chunk, n - c0);
      const auto x = random_rows(m);
      std::vector<int32_t> p(static_cast<size_t>(m));
      for (int r = 0; r < m; ++r) p[static_cast<size_t>(r)] = base + c0 + r;
      be->upload(pos.data(), p.data(), p.size() * sizeof(int32_t));
      be->upload(xa.data(), x.data(), x.size() * sizeof(bf16));
      be->upload(xb.data(), x.data(), x.size() * sizeof(bf16));
      std::vector<int32_t> sel_a;
      for (int r = 0; r < m; ++r) {
        a.block.forward(ops::RowBatch{slot.data(), pos.data() + r, 1, 1},
                        xa.data() + static_cast<size_t>(r) * H, a.cache,
                        xa.data() + static_cast<size_t>(r) * H);
        const auto s = fetch(*be, a.block.selection(), width);
        sel_a.insert(sel_a.end(), s.begin(), s.end());
      }
      const ops::RowBatch rb{slot.data(), pos.data(), m, m};
      b.block.forward(rb, xb.data(), b.cache, xb.data(), ob);
      const std::string where =
          what + " rows " + std::to_string(base + c0) + ".." + std::to_string(base + c0 + m - 1);
      EXPECT_EQ(fetch(*be, xa.data(), x.size()), fetch(*be, xb.data(), x.size())) << where << ": row outputs";
      EXPECT_EQ(sel_a, fetch(*be, b.block.selection(), static_cast<size_t>(m) * width)) << where;
      // The shadow (per-row GEMV) selection, made after the chunk, is the one A used.
      b.block.shadow_select(rb, b.cache);
      EXPECT_EQ(sel_a, fetch(*be, b.block.shadow_selection(), static_cast<size_t>(m) * width)) << where;
      rows_compared += m;
    }
  };
  // Draft rows (propose): one row at a time on both, from the same inputs.
  auto drafts = [&](int base, int k) {
    const auto x = random_rows(k);
    std::vector<int32_t> p(static_cast<size_t>(k));
    for (int r = 0; r < k; ++r) p[static_cast<size_t>(r)] = base + r;
    be->upload(pos.data(), p.data(), p.size() * sizeof(int32_t));
    be->upload(xa.data(), x.data(), x.size() * sizeof(bf16));
    be->upload(xb.data(), x.data(), x.size() * sizeof(bf16));
    for (int r = 0; r < k; ++r) {
      const ops::RowBatch one{slot.data(), pos.data() + r, 1, 1};
      a.block.forward(one, xa.data() + static_cast<size_t>(r) * H, a.cache,
                      xa.data() + static_cast<size_t>(r) * H);
      b.block.forward(one, xb.data() + static_cast<size_t>(r) * H, b.cache,
                      xb.data() + static_cast<size_t>(r) * H);
    }
    EXPECT_EQ(fetch(*be, xa.data(), x.size()), fetch(*be, xb.data(), x.size())) << "draft rows at " << base;
  };

  int L = 150;
  context(0, L - 1, "prefill");
  expect_same_caches(*be, a, 0, b, 0, L - 1, "after the prefill");
  int high = L - 1;
  for (int step = 0; step < 12; ++step) {
    const int k = 3, accepted = (step * 7) % 4;  // 0..3
    drafts(L - 1, k);
    high = std::max(high, L - 1 + k);
    // Rollback (rewrite): keep row L-1; the rows after it stay in the caches, stale.
    if (accepted > 0) context(L, accepted, "catch-up");
    L += accepted + 1;
    expect_same_caches(*be, a, 0, b, 0, high, "step " + std::to_string(step));
  }
  EXPECT_GE(rows_compared, 149 + 12);
}

INSTANTIATE_TEST_SUITE_P(Modes, ForwardRows,
                         ::testing::Values(ops::RowsMode::per_row, ops::RowsMode::batched),
                         [](const ::testing::TestParamInfo<ops::RowsMode>& p) {
                           return std::string(p.param == ops::RowsMode::batched ? "batched" : "per_row");
                         });

// B sequences of R rows each in one ragged forward (the verification shape: every sequence's last
// token and its k drafts), padded rows mixed in, sequences at different lengths and sparse
// positions: each row's output, selection and routed experts, and every slot's caches, equal the
// rows run one at a time per sequence in order, bit for bit on the CPU.
TEST(RaggedRows, SequencesOfSeveralRowsEqualOneRowAtATime) {
  const model::ModelConfig cfg = test::tiny_config(256);
  auto be = ops::make_cpu_backend();
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  const auto w = model::synthesize_mtp_weights(cfg, plan, 13);
  const int S = 4;
  BlockRig a(*be, cfg, w, S), b(*be, cfg, w, S);
  const int H = cfg.hidden, top_k = a.dims.top_k;
  const size_t width = static_cast<size_t>(a.dims.selection_width());
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_rows = [&](int n) {
    std::vector<bf16> v(static_cast<size_t>(n) * H);
    for (auto& x : v) x = to_bf16(normal(gen));
    return v;
  };
  const int max_rows = 64;
  a.block.reserve(max_rows);
  b.block.reserve(max_rows);
  ops::Array<bf16> xa(*be, static_cast<size_t>(max_rows) * H), xb(*be, static_cast<size_t>(max_rows) * H);
  ops::Array<int32_t> pos(*be, max_rows), slot(*be, max_rows);
  // Prefill each slot to its own length, one row at a time on A, one ragged forward per slot on B.
  std::vector<int> len = {37, 5, 90, 61};
  auto run = [&](const std::vector<int32_t>& slots, const std::vector<int32_t>& p, int max_seq_rows,
                 const std::string& where) {
    const int n = static_cast<int>(slots.size());
    const auto x = random_rows(n);
    be->upload(slot.data(), slots.data(), slots.size() * sizeof(int32_t));
    be->upload(pos.data(), p.data(), p.size() * sizeof(int32_t));
    be->upload(xa.data(), x.data(), x.size() * sizeof(bf16));
    be->upload(xb.data(), x.data(), x.size() * sizeof(bf16));
    std::vector<int32_t> sel_a, exp_a;
    for (int r = 0; r < n; ++r) {
      if (slots[static_cast<size_t>(r)] < 0) {
        sel_a.insert(sel_a.end(), width, -2);
        exp_a.insert(exp_a.end(), static_cast<size_t>(top_k), -2);
        continue;
      }
      a.block.forward(ops::RowBatch{slot.data() + r, pos.data() + r, 1, 1},
                      xa.data() + static_cast<size_t>(r) * H, a.cache,
                      xa.data() + static_cast<size_t>(r) * H);
      const auto s = fetch(*be, a.block.selection(), width);
      const auto e = fetch(*be, a.block.experts(), static_cast<size_t>(top_k));
      sel_a.insert(sel_a.end(), s.begin(), s.end());
      exp_a.insert(exp_a.end(), e.begin(), e.end());
    }
    b.block.forward(ops::RowBatch{slot.data(), pos.data(), n, max_seq_rows}, xb.data(), b.cache, xb.data());
    const auto ya = fetch(*be, xa.data(), x.size()), yb = fetch(*be, xb.data(), x.size());
    auto sel_b = fetch(*be, b.block.selection(), static_cast<size_t>(n) * width);
    auto exp_b = fetch(*be, b.block.experts(), static_cast<size_t>(n) * top_k);
    for (int r = 0; r < n; ++r) {
      const size_t R = static_cast<size_t>(r);
      if (slots[R] < 0) {  // a padded row: nothing of it is compared
        std::fill_n(sel_b.begin() + static_cast<std::ptrdiff_t>(R * width), width, -2);
        std::fill_n(exp_b.begin() + static_cast<std::ptrdiff_t>(R * top_k), top_k, -2);
        continue;
      }
      EXPECT_TRUE(std::equal(ya.begin() + static_cast<std::ptrdiff_t>(R * H),
                             ya.begin() + static_cast<std::ptrdiff_t>((R + 1) * H),
                             yb.begin() + static_cast<std::ptrdiff_t>(R * H)))
          << where << ": row " << r << " (slot " << slots[R] << ", position " << p[R] << ")";
    }
    EXPECT_EQ(sel_a, sel_b) << where << ": selections";
    EXPECT_EQ(exp_a, exp_b) << where << ": routed experts";
  };
  for (int s = 0; s < S; ++s) {
    for (int c0 = 0; c0 < len[static_cast<size_t>(s)]; c0 += max_rows) {
      const int m = std::min(max_rows, len[static_cast<size_t>(s)] - c0);
      std::vector<int32_t> slots(static_cast<size_t>(m), s), p(static_cast<size_t>(m));
      for (int r = 0; r < m; ++r) p[static_cast<size_t>(r)] = c0 + r;
      run(slots, p, m, "prefill of slot " + std::to_string(s));
    }
  }
  // Verification-shaped steps: every slot's next R rows (R = 2 .. 5, differing per slot), with a
  // padded row between two sequences; then the next step starts after a partial acceptance.
  for (int step = 0; step < 6; ++step) {
    std::vector<int32_t> slots, p;
    int most = 0;
    for (int s = 0; s < S; ++s) {
      const int R = 2 + (s + step) % 4;
      most = std::max(most, R);
      for (int r = 0; r < R; ++r) {
        slots.push_back(s);
        p.push_back(len[static_cast<size_t>(s)] + r);
      }
      if (s == 1) {
        slots.push_back(-1);
        p.push_back(0);
      }
      len[static_cast<size_t>(s)] += 1 + (s * 3 + step) % R;  // the accepted rows stay, the rest go stale
    }
    run(slots, p, most, "step " + std::to_string(step));
  }
  for (int s = 0; s < S; ++s)
    expect_same_caches(*be, a, s, b, s, len[static_cast<size_t>(s)], "slot " + std::to_string(s));
}

TEST(RaggedRows, Refusals) {
  const model::ModelConfig cfg = test::tiny_config(128);
  auto be = ops::make_cpu_backend();
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  const auto w = model::synthesize_mtp_weights(cfg, plan, 11);
  BlockRig rig(*be, cfg, w, 2);
  ops::Array<bf16> x(*be, static_cast<size_t>(8) * cfg.hidden);
  ops::Array<int32_t> pos(*be, 8), slot(*be, 8);
  auto put = [&](std::vector<int32_t> s, std::vector<int32_t> p) {
    be->upload(slot.data(), s.data(), s.size() * sizeof(int32_t));
    be->upload(pos.data(), p.data(), p.size() * sizeof(int32_t));
  };
  put({0, 0, 0, 0}, {0, 1, 2, 3});
  EXPECT_THROW(rig.block.forward(ops::RowBatch{slot.data(), pos.data(), 4, 4}, x.data(), rig.cache, x.data()),
               Error)
      << "no buffers reserved";
  rig.block.reserve(4);
  EXPECT_THROW(rig.block.forward(ops::RowBatch{slot.data(), pos.data(), 5, 5}, x.data(), rig.cache, x.data()),
               Error)
      << "more rows than reserved";
  EXPECT_THROW(rig.block.forward(ops::RowBatch{slot.data(), pos.data(), 4, 3}, x.data(), rig.cache, x.data()),
               Error)
      << "more rows of one slot than max_seq_rows";
  put({0, 1, 0, 1}, {0, 0, 2, 1});
  EXPECT_NO_THROW(
      rig.block.forward(ops::RowBatch{slot.data(), pos.data(), 4, 2}, x.data(), rig.cache, x.data()));
  put({0, 0, 1, 1}, {3, 2, 0, 1});
  EXPECT_THROW(rig.block.forward(ops::RowBatch{slot.data(), pos.data(), 4, 2}, x.data(), rig.cache, x.data()),
               Error)
      << "rows of one slot at descending positions";
  put({0, 1, 1, 1}, {0, 1, 1, 2});
  EXPECT_THROW(rig.block.forward(ops::RowBatch{slot.data(), pos.data(), 4, 3}, x.data(), rig.cache, x.data()),
               Error)
      << "two rows of one slot at one position";
  EXPECT_THROW(rig.block.shadow_select(ops::RowBatch{slot.data(), pos.data(), 1, 1}, rig.cache), Error)
      << "no shadow buffers";
}

// ---- the drafter: arms and the selection check over a replay ------------------------------------

struct Replayed {
  std::vector<std::vector<int32_t>> drafts;
  std::vector<bf16> kv, k_rows;  // the sequence's latent and indexer rows after the replay
  int64_t context_rows = 0;      // rows append_rows wrote (prefill and catch-up)
  drafter::SelectionCheck check;
};

// The replay of harness/replay.hpp, keeping the sequence state to read its caches at the end.
Replayed replay(const DrafterOptions& opt, const model::ModelConfig& cfg, model::MtpWeights& w,
                const io::TraceSequence& seq, int k) {
  auto be = ops::make_cpu_backend();
  auto d = drafter::make_drafter(*be, nullptr, cfg, w, opt);
  const int H = cfg.hidden, N = static_cast<int>(seq.tokens.size()), P = seq.prompt_length;
  auto hidden_row = [&](int r) { return seq.hiddens.data() + static_cast<size_t>(r) * H; };
  Replayed out;
  auto st = d->new_sequence();
  d->append_rows(*st, seq.tokens.data() + 1, hidden_row(0), P - 1, 0);
  out.context_rows += P - 1;
  int L = P;
  while (L + k <= N - 1) {
    out.drafts.push_back(d->propose(*st, seq.tokens[L], hidden_row(L - 1), k));
    const std::vector<int32_t> targets(seq.tokens.begin() + L + 1, seq.tokens.begin() + L + 1 + k);
    const int a = harness::accepted_prefix(out.drafts.back(), targets);
    d->after_verify(*st, a);
    const int from = st->seq_len(0), n = L + a - from;
    d->append_rows(*st, seq.tokens.data() + from + 1, hidden_row(from), n, from, drafter::Phase::catch_up);
    out.context_rows += n;
    L += a + 1;
  }
  const size_t rows = static_cast<size_t>(st->seq_len(0));
  out.kv.resize(rows * cfg.kv_lora_rank);
  // A pool of one slot: logical block j is physical block j.
  be->download(out.kv.data(), st->caches.kv_slots().cache.data, out.kv.size() * sizeof(bf16));
  out.k_rows.resize(rows * cfg.index_head_dim);
  be->download(out.k_rows.data(), st->caches.k_cache.data(), out.k_rows.size() * sizeof(bf16));
  out.check = d->selection_check();
  return out;
}

TEST(BatchQidx, SameDraftsAndCachesAndNoSelectionDifferenceOnTheCpu) {
  // A prompt of 300 tokens: a prefill of 299 rows is two chunks (256 + 43), far past the dense
  // range (K + P - 1 = 19 rows), so the selections are sparse.
  const model::ModelConfig cfg = test::tiny_config(512);
  auto be = ops::make_cpu_backend();
  const auto seq = test::make_trace(*be, cfg, 1, 300, 40, 5)[0];
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  auto w = model::synthesize_mtp_weights(cfg, plan, 11);
  const int k = 3;
  DrafterOptions cache_only, full, batched, unchecked;
  cache_only.draft_len = full.draft_len = batched.draft_len = unchecked.draft_len = k;
  full.context_rows = batched.context_rows = unchecked.context_rows = drafter::ContextRows::full;
  batched.batch_qidx = unchecked.batch_qidx = true;
  unchecked.selection_check = false;
  const Replayed rc = replay(cache_only, cfg, w, seq, k);
  const Replayed rf = replay(full, cfg, w, seq, k);
  const Replayed rb = replay(batched, cfg, w, seq, k);
  const Replayed ru = replay(unchecked, cfg, w, seq, k);
  ASSERT_GT(rc.drafts.size(), 5u);
  EXPECT_EQ(rf.drafts, rc.drafts);
  EXPECT_EQ(rb.drafts, rc.drafts);
  EXPECT_EQ(ru.drafts, rc.drafts);
  ASSERT_FALSE(rc.kv.empty());
  EXPECT_EQ(rf.kv, rc.kv);
  EXPECT_EQ(rb.kv, rc.kv);
  EXPECT_EQ(rf.k_rows, rc.k_rows);
  EXPECT_EQ(rb.k_rows, rc.k_rows);
  // Every context row (the prefill's P - 1, then each step's catch-up) is checked once.
  EXPECT_GE(rb.context_rows, seq.prompt_length - 1);
  EXPECT_EQ(rb.check.rows_checked, rb.context_rows);
  EXPECT_EQ(rb.check.rows_differ, 0);
  EXPECT_EQ(rb.check.entries_differ, 0);
  EXPECT_GE(rb.check.rows_multi, seq.prompt_length - 1);  // the prefill chunks at least
  EXPECT_LE(rb.check.rows_multi, rb.check.rows_checked);
  // No check without batch_qidx, nor with it switched off.
  EXPECT_EQ(rf.check.rows_checked, 0);
  EXPECT_EQ(ru.check.rows_checked, 0);
  EXPECT_EQ(rc.check.rows_checked, 0);
}

// context_gemm: the fronts' eh_proj and the block's projections of a chunk of context rows as one
// batched linear each. The CPU's batched linear computes the per-row bits, so every arm must give
// the per-row drafts and caches exactly: a row written to the wrong slot, a wrong row stride or a
// missing cache write would change them. (On CUDA the GEMM sums in another order;
// tests/gpu_e2e/test_gpu_context_gemm.cpp measures that.)
TEST(ContextGemm, SameDraftsAndCachesAsPerRowOnTheCpu) {
  const model::ModelConfig cfg = test::tiny_config(512);
  auto be = ops::make_cpu_backend();
  const auto seq = test::make_trace(*be, cfg, 1, 300, 40, 5)[0];  // a two-chunk prefill (256 + 43)
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  auto w = model::synthesize_mtp_weights(cfg, plan, 11);
  const int k = 3;
  DrafterOptions base;
  base.draft_len = k;
  const Replayed ref = replay(base, cfg, w, seq, k);
  ASSERT_GT(ref.drafts.size(), 5u);
  ASSERT_FALSE(ref.kv.empty());
  for (auto rows : {drafter::ContextRows::cache_only, drafter::ContextRows::full}) {
    for (bool qidx : {false, true}) {
      if (qidx && rows == drafter::ContextRows::cache_only) continue;
      DrafterOptions opt = base;
      opt.context_rows = rows;
      opt.context_gemm = true;
      opt.batch_qidx = qidx;
      SCOPED_TRACE(std::string("context_rows ") + drafter::to_string(rows) + (qidx ? " batch_qidx" : ""));
      const Replayed r = replay(opt, cfg, w, seq, k);
      EXPECT_EQ(r.drafts, ref.drafts);
      EXPECT_EQ(r.kv, ref.kv);
      EXPECT_EQ(r.k_rows, ref.k_rows);
      EXPECT_EQ(r.check.rows_differ, 0);
    }
  }
}

TEST(BatchQidx, CheckCountsOnlyFullContextRows) {
  const model::ModelConfig cfg = test::tiny_config(128);
  auto be = ops::make_cpu_backend();
  const auto seq = test::make_trace(*be, cfg, 1, 24, 20, 3)[0];
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  auto w = model::synthesize_mtp_weights(cfg, plan, 11);
  DrafterOptions opt;
  opt.batch_qidx = true;  // context_rows cache_only: nothing to batch, nothing checked
  auto d = drafter::make_drafter(*be, nullptr, cfg, w, opt);
  EXPECT_FALSE(d->checks_selection());
  auto st = d->new_sequence();
  d->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), 20, 0);
  EXPECT_EQ(d->selection_check().rows_checked, 0);
  opt.context_rows = drafter::ContextRows::full;
  auto f = drafter::make_drafter(*be, nullptr, cfg, w, opt);
  EXPECT_TRUE(f->checks_selection());
  auto sf = f->new_sequence();
  f->append_rows(*sf, seq.tokens.data() + 1, seq.hiddens.data(), 20, 0);
  f->append_rows(*sf, seq.tokens.data() + 21, seq.hiddens.data() + 20 * cfg.hidden, 1, 20,
                 drafter::Phase::catch_up);
  EXPECT_EQ(f->selection_check().rows_checked, 21);
  EXPECT_EQ(f->selection_check().rows_multi, 20);  // the one-row catch-up is a GEMV either way
  EXPECT_EQ(f->selection_check().rows_differ, 0);
  f->reset_selection_check();
  EXPECT_EQ(f->selection_check().rows_checked, 0);
}

}  // namespace
