// Sampling statistics across 2 ranks (MPI communicator, CPU backend), for each head_sharding value:
// - each draft's DraftStats equal the one-rank computation on the same head input: the fp64
//   recomputation from the whole head (stats_reference.hpp) within 1e-5, and the one-rank stats
//   ops on the whole row within 1e-6 (a vocab-sharded head combines per-rank partials: the sum is
//   rounded to fp32 per rank, so a few ulps apart; with truncation it gathers the rows and
//   summarises them exactly as one rank, bit for bit);
// - the stats pass issues exactly ONE collective per propose: an all-gather of the [k * rows]
//   partials without truncation, of the [k * rows, stride] logit rows with it (none unsharded);
// - propose_batch equals propose per sequence, bit for bit; target_logprobs equals a one-rank
//   drafter's (the target's head does not depend on the block).
// A failure on any rank fails the job.
#include <gtest/gtest.h>

#include "common/mpi.hpp"
#include "common/recording_comm.hpp"
#include "common/trace.hpp"
#include "drafter/exchange.hpp"
#include "drafter/factory.hpp"
#include "forced_rows.hpp"
#include "model/weights.hpp"
#include "stats_reference.hpp"

using namespace mtplab;
using drafter::DraftStats;
using drafter::SamplingTransform;

namespace {
dist::Runtime* g_runtime = nullptr;

/// The collectives other than all-gathers and barriers that `comm` recorded.
int others(const test::RecordingComm& comm) {
  int n = 0;
  for (const auto& c : comm.calls)
    n += c.kind != test::RecordingComm::gather && c.kind != test::RecordingComm::sync;
  return n;
}

std::vector<SamplingTransform> transforms() {
  return {SamplingTransform{1.0, 0, 1.0}, SamplingTransform{0.7, 0, 1.0}, SamplingTransform{1.0, 5, 1.0},
          SamplingTransform{0.7, 0, 0.9}, SamplingTransform{0.7, 5, 0.9}};
}

std::string name_of(const SamplingTransform& t) {
  return str("T=", t.temperature, " top_k=", t.top_k, " top_p=", t.top_p);
}

struct World {
  model::ModelConfig cfg = test::tiny_config();
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  // The whole head (one rank's plan) for the host's logits.
  model::MtpWeights whole =
      model::synthesize_mtp_weights(cfg, model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none), 11);
  std::vector<io::TraceSequence> trace = test::make_trace(*be, cfg, 2, 24, 48, 5);
  int H = cfg.hidden;
  int V = static_cast<int>(cfg.vocab);
  World() { model::quantize_head_fp8(whole); }
  std::vector<float> logits(const bf16* y, bool fp8) {
    return test::head_logits(*be, whole.lm_head.data.data(),
                             fp8 ? whole.lm_head_fp8.weight.data.data() : nullptr,
                             fp8 ? whole.lm_head_fp8.scale.data.data() : nullptr, y, V, H);
  }
  /// The one-rank stats ops on the whole row (what one rank computes from these logits).
  ops::TokenStats one_rank(const std::vector<float>& l, int32_t requested, const SamplingTransform& t) {
    std::vector<bf16> row(l.size());
    for (size_t i = 0; i < l.size(); ++i) row[i] = to_bf16(l[i]);
    ops::LogitRows v;
    v.data = row.data();
    v.rows = 1;
    v.ld = v.n = V;
    const ops::SampleParams p = drafter::sample_params(t);
    ops::LogitStats part{};
    ops::TokenStats out{};
    be->logit_stats_batch(v, &requested, &p, &part);
    be->logit_stats_combine(&part, 1, 1, &p, &out);
    return out;
  }
};

}  // namespace

TEST(DraftStatsMpi, EveryShardingGivesTheOneRankStats) {
  auto group = g_runtime->world_group();
  auto& mpi = group.connect(dist::Transport::mpi);
  test::RecordingComm comm(mpi);
  World s;
  const int k = 3, L = 30;
  const auto& seq = s.trace[0];
  struct Arm {
    model::HeadSharding sharding;
    drafter::Exchange exchange;
    bool fp8;
  };
  const Arm arms[] = {{model::HeadSharding::none, drafter::Exchange::packed_u64, false},
                      {model::HeadSharding::vocab, drafter::Exchange::packed_u64, false},
                      {model::HeadSharding::vocab, drafter::Exchange::allgather_logits, false},
                      {model::HeadSharding::vocab, drafter::Exchange::packed_u64, true}};
  for (const Arm& arm : arms) {
    drafter::DrafterOptions opt;
    opt.head_sharding = arm.sharding;
    opt.exchange = arm.exchange;
    opt.head_fp8 = arm.fp8;
    opt.draft_len = k;
    const auto plan = model::make_shard_plan(s.cfg, comm.rank(), comm.size(), arm.sharding);
    auto w = model::synthesize_mtp_weights(s.cfg, plan, 11);
    auto d = drafter::make_drafter(*s.be, &comm, s.cfg, w, opt);
    d->keep_head_inputs(true);
    const bool sharded = arm.sharding == model::HeadSharding::vocab;
    const std::string arm_name =
        str(model::to_string(arm.sharding), "/", drafter::to_string(arm.exchange), arm.fp8 ? "/fp8" : "");
    for (const SamplingTransform& t : transforms()) {
      const std::string what = arm_name + " " + name_of(t);
      auto plain_seq = d->new_sequence(), st = d->new_sequence();
      for (auto* q : {plain_seq.get(), st.get()})
        d->append_rows(*q, seq.tokens.data() + 1, seq.hiddens.data(), L - 1, 0);
      const auto plain = d->propose(*plain_seq, seq.tokens[L], seq.hiddens.data() + (L - 1) * s.H, k);
      const auto ys0 = d->head_inputs();
      std::vector<int32_t> req(static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) {
        const auto l = s.logits(ys0.data() + static_cast<size_t>(i) * s.H, arm.fp8);
        req[static_cast<size_t>(i)] = i % 2 ? test::lowest_token(l) : test::runner_up(l);
      }
      std::vector<DraftStats> stats;
      drafter::ProposeExtras x;
      x.requested = req;
      x.transform = t;
      x.stats = &stats;
      // The plain step's collectives, then the one with stats: it adds exactly the stats pass's.
      comm.calls.clear();
      d->after_verify(*plain_seq, 0);
      auto again = d->new_sequence();
      d->append_rows(*again, seq.tokens.data() + 1, seq.hiddens.data(), L - 1, 0);
      comm.calls.clear();
      d->propose(*again, seq.tokens[L], seq.hiddens.data() + (L - 1) * s.H, k);
      const auto plain_gathers = comm.sizes(test::RecordingComm::gather);
      const int plain_others = others(comm);
      comm.calls.clear();
      const auto drafts = d->propose(*st, seq.tokens[L], seq.hiddens.data() + (L - 1) * s.H, k, x);
      EXPECT_EQ(drafts, plain) << what;
      EXPECT_EQ(others(comm), plain_others) << what;
      auto extra = comm.sizes(test::RecordingComm::gather);
      ASSERT_GE(extra.size(), plain_gathers.size()) << what;
      extra.erase(extra.begin(), extra.begin() + static_cast<ptrdiff_t>(plain_gathers.size()));
      if (!sharded) {
        EXPECT_TRUE(extra.empty()) << what << ": an unsharded head needs no collective";
      } else {
        ASSERT_EQ(extra.size(), 1u) << what << ": ONE collective per stats pass";
        const size_t stride = static_cast<size_t>(d->shard().stride);
        EXPECT_EQ(extra[0], drafter::truncates(t) ? k * stride * sizeof(bf16) : k * sizeof(ops::LogitStats))
            << what;
      }
      const auto ys = d->head_inputs();
      ASSERT_EQ(ys, ys0) << what;
      for (int i = 0; i < k; ++i) {
        const auto l = s.logits(ys.data() + static_cast<size_t>(i) * s.H, arm.fp8);
        const int32_t r = req[static_cast<size_t>(i)];
        const auto ref = test::reference_stats(l, r, t);
        const DraftStats& got = stats[static_cast<size_t>(i)];
        const std::string at = what + str(" draft ", i);
        EXPECT_EQ(ref.argmax, drafts[static_cast<size_t>(i)]) << at;
        EXPECT_NEAR(got.margin, ref.margin, 1e-6) << at;
        EXPECT_TRUE(test::close(got.logprob, ref.logprob, 1e-5, 1e-5)) << at << " " << got.logprob;
        EXPECT_TRUE(test::close(got.req_logprob, ref.req_logprob, 1e-5, 1e-5))
            << at << " " << got.req_logprob;
        const ops::TokenStats one = s.one_rank(l, r, t);
        if (!sharded || drafter::truncates(t)) {
          EXPECT_EQ(float_to_bits(got.logprob), float_to_bits(one.logprob)) << at;
          EXPECT_EQ(float_to_bits(got.req_logprob), float_to_bits(one.req_logprob)) << at;
        } else {
          EXPECT_TRUE(test::close(got.logprob, one.logprob, 1e-6, 1e-6)) << at;
          EXPECT_TRUE(test::close(got.req_logprob, one.req_logprob, 1e-6, 1e-6)) << at;
        }
        EXPECT_EQ(float_to_bits(got.margin), float_to_bits(one.margin)) << at;
      }
    }
  }
}

TEST(DraftStatsMpi, BatchedEqualsSingleAndTargetEqualsOneRank) {
  auto group = g_runtime->world_group();
  auto& comm = group.connect(dist::Transport::mpi);
  World s;
  const int k = 3;
  const int lens[2] = {26, 33};
  auto one_rank = drafter::make_drafter(*s.be, nullptr, s.cfg, s.whole, drafter::DrafterOptions{});
  for (auto sharding : {model::HeadSharding::none, model::HeadSharding::vocab}) {
    drafter::DrafterOptions opt;
    opt.head_sharding = sharding;
    opt.draft_len = k;
    const auto plan = model::make_shard_plan(s.cfg, comm.rank(), comm.size(), sharding);
    auto w = model::synthesize_mtp_weights(s.cfg, plan, 11);
    auto d = drafter::make_drafter(*s.be, &comm, s.cfg, w, opt);
    for (const SamplingTransform& t : {SamplingTransform{0.7, 0, 1.0}, SamplingTransform{1.0, 5, 0.9}}) {
      const std::string what = str(model::to_string(sharding), " ", name_of(t));
      auto batch = d->new_batch(2);
      const test::ForcedRows one = test::forced_rows(*d, *batch, s.trace, lens, k, s.H, t, false);
      std::vector<DraftStats> stats;
      EXPECT_EQ(test::propose_forced(*d, *batch, one, k, t, stats), one.single_drafts) << what;
      ASSERT_EQ(stats.size(), one.single_stats.size());
      for (size_t j = 0; j < stats.size(); ++j)
        test::expect_same_bits(stats[j], one.single_stats[j], str(what, " ", j));
      // The target: 40 trace rows, against the one-rank drafter's values.
      const auto& seq = s.trace[1];
      const int n = 40;
      const auto got = d->target_logprobs(seq.hiddens.data(), seq.tokens.data() + 1, n, t);
      const auto want = one_rank->target_logprobs(seq.hiddens.data(), seq.tokens.data() + 1, n, t);
      for (int r = 0; r < n; ++r) {
        const size_t j = static_cast<size_t>(r);
        if (sharding == model::HeadSharding::none || drafter::truncates(t)) {
          EXPECT_EQ(float_to_bits(got[j]), float_to_bits(want[j])) << what << " row " << r;
        } else {
          EXPECT_TRUE(test::close(got[j], want[j], 1e-6, 1e-6))
              << what << " row " << r << " " << got[j] << " vs " << want[j];
        }
      }
    }
  }
}

int main(int argc, char** argv) {
  return test::mpi_test_main(argc, argv, [](dist::Runtime& runtime) {
    g_runtime = &runtime;
    return test::run_all_tests_on_every_rank(runtime);
  });
}
