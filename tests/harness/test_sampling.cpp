// Sampling verification in replay (docs/acceptance.md), on the CPU backend with synthetic traces
// sampled by the synthetic target:
// - the coins (verify_uniform) and the synthetic sampler (sample_transformed): uniform,
//   reproducible, and the sampler's frequencies follow the transformed softmax;
// - the trace's sampling attributes: written, read back, absent = greedy, bad values refused;
// - (a greedy proposal under sampling verification accepting what greedy verification accepts,
//   and T -> 0 giving greedy's figures, need a drafter that accepts something: they are tested
//   on the trained tiny model, tests/drafter/test_trained_tiny_sampling.cpp);
// - the expected accepted count agrees with the realised one within 4 standard errors of their
//   difference (a martingale: the variance is the sum of the steps' conditional variances);
// - the same seed gives the same steps, batch 1 and batch 4 give the same steps;
// - refusals: a sampling point on a greedy trace or on one sampled with other settings (synthetic
//   at expansion, a file when checked), a trace token outside the target's truncated support, the
//   new keys' bad values; greedy points that differ only in the sampling arms are one point.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <optional>

#include "common/error_of.hpp"
#include "common/trace.hpp"
#include "drafter/factory.hpp"
#include "drafter/target.hpp"
#include "experiment_text.hpp"
#include "harness/experiment.hpp"
#include "harness/replay.hpp"
#include "io/trace.hpp"
#include "model/weights.hpp"

using namespace mtplab;
using namespace mtplab::harness;

namespace {

std::string message_of(const std::function<void()>& f) { return test::error_of(f); }

constexpr uint64_t kWeightSeed = 7;  // the synthetic target's trunk (test::make_trace's)
// The random-weight drafter and target agree on little, so at T = 1 most a_i are near 0; at T = 4
// both distributions are flattened and the a_i spread over (0, 1): the coins matter. (The
// trained tiny model's sampled traces test the rules at T = 0.7 and 1: test_trained_tiny_sampling.)
constexpr double kHot = 4.0;

io::TraceSampling sampled_at(double t, int64_t top_k = 0, double top_p = 1.0, int64_t seed = 11) {
  io::TraceSampling s;
  s.sampled = true;
  s.temperature = t;
  s.top_k = top_k;
  s.top_p = top_p;
  s.seed = seed;
  return s;
}

std::vector<io::TraceSequence> trace_of(ops::Backend& be, const model::ModelConfig& cfg, int count,
                                        int prompt, int gen, uint64_t seed,
                                        const io::TraceSampling& sampling) {
  drafter::SyntheticTarget target(be, cfg, 2, kWeightSeed, seed);
  return drafter::synthetic_trace(target, cfg.vocab, count, prompt, gen, seed, sampling);
}

std::unique_ptr<drafter::MtpDrafter> drafter_for(ops::Backend& be, const model::ModelConfig& cfg, int k,
                                                 model::MtpWeights& w) {
  drafter::DrafterOptions opt;
  opt.draft_len = k;
  return drafter::make_drafter(be, nullptr, cfg, w, opt);
}

SamplingVerify verify_at(double t, DraftProposal proposal, int64_t seed = 1, int64_t top_k = 0,
                         double top_p = 1.0) {
  SamplingVerify v;
  v.proposal = proposal;
  v.transform.temperature = t;
  v.transform.top_k = static_cast<int>(top_k);
  v.transform.top_p = top_p;
  v.seed = seed;
  return v;
}

// Every step of every sequence through replay_sequence (sampling null: greedy verification).
std::vector<StepRecord> replay_all(drafter::MtpDrafter& d, const std::vector<io::TraceSequence>& seqs, int k,
                                   int hidden, const SamplingVerify* v,
                                   const std::vector<std::vector<float>>& logp, AcceptanceStats& stats) {
  std::vector<StepRecord> out;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto steps = replay_sequence(d, seqs[i], static_cast<int>(seqs[i].index), k, hidden, stats, ReplayHooks{},
                                 v, v ? std::span<const float>(logp[i]) : std::span<const float>());
    out.insert(out.end(), steps.begin(), steps.end());
  }
  return out;
}

struct Tiny {
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  model::ModelConfig cfg = test::tiny_config(256);
  model::MtpWeights w;
  Tiny() {
    const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
    w = model::synthesize_mtp_weights(cfg, plan, kWeightSeed);
  }
};

}  // namespace

// ---- the coins and the sampler -----------------------------------------------------------------

TEST(VerifyUniform, ReproducibleUniformAndIndependentOfEachInput) {
  EXPECT_EQ(verify_uniform(1, 2, 3), verify_uniform(1, 2, 3));
  EXPECT_NE(verify_uniform(1, 2, 3), verify_uniform(2, 2, 3));
  EXPECT_NE(verify_uniform(1, 2, 3), verify_uniform(1, 3, 3));
  EXPECT_NE(verify_uniform(1, 2, 3), verify_uniform(1, 2, 4));
  EXPECT_NE(verify_uniform(1, 0, 0), verify_uniform(0, 0, 0));
  // Uniform on [0, 1): the mean and the fraction below 1/4 over 200k (sequence, position) pairs,
  // each within 4 standard errors (1/sqrt(12 n) and sqrt(3/16 / n)).
  const int n = 200000;
  double sum = 0;
  int below = 0;
  for (int i = 0; i < n; ++i) {
    const double u = verify_uniform(5, i % 97, i / 97);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    below += u < 0.25;
  }
  EXPECT_NEAR(sum / n, 0.5, 4 / std::sqrt(12.0 * n));
  EXPECT_NEAR(static_cast<double>(below) / n, 0.25, 4 * std::sqrt(3.0 / 16 / n));
  // The synthetic sampler's uniforms are another stream (another domain constant).
  EXPECT_NE(drafter::sampling_uniform(5, 1, 2), verify_uniform(5, 1, 2));
}

TEST(AcceptProbability, RatioClampedAndGreedyIndicator) {
  EXPECT_EQ(accept_probability(DraftProposal::greedy, 4, 4, -9.0f, -1.0f), 1.0f);
  EXPECT_EQ(accept_probability(DraftProposal::greedy, 4, 5, -0.1f, -1.0f), 0.0f);
  EXPECT_NEAR(accept_probability(DraftProposal::sampled, 4, 5, std::log(0.2f), std::log(0.5f)), 0.4f, 1e-6f);
  EXPECT_EQ(accept_probability(DraftProposal::sampled, 4, 5, std::log(0.7f), std::log(0.5f)), 1.0f);
  EXPECT_EQ(accept_probability(DraftProposal::sampled, 4, 5, -INFINITY, std::log(0.5f)), 0.0f);
}

TEST(SampleTransformed, FollowsTheTransformedSoftmax) {
  // Logits 2, 1, 1, 0, -1 (BF16-exact); T = 0.5.
  const std::vector<bf16> logits = {to_bf16(1.0f), to_bf16(2.0f), to_bf16(1.0f), to_bf16(0.0f),
                                    to_bf16(-1.0f)};
  auto probs = [&](double t, int64_t top_k, double top_p) {
    std::vector<double> count(logits.size(), 0);
    const int n = 100000;
    for (int i = 0; i < n; ++i)
      ++count[static_cast<size_t>(drafter::sample_transformed(logits, t, top_k, top_p, (i + 0.5) / n))];
    for (auto& c : count) c /= n;
    return count;
  };
  auto softmax = [&](double t, const std::vector<int>& keep) {
    std::vector<double> p(logits.size(), 0);
    double z = 0;
    for (int i : keep) z += std::exp(to_float(logits[static_cast<size_t>(i)]) / t);
    for (int i : keep) p[static_cast<size_t>(i)] = std::exp(to_float(logits[static_cast<size_t>(i)]) / t) / z;
    return p;
  };
  // Stratified uniforms: the frequencies are the probabilities to 1/n.
  const auto all = probs(0.5, 0, 1.0), want_all = softmax(0.5, {0, 1, 2, 3, 4});
  for (size_t i = 0; i < all.size(); ++i) EXPECT_NEAR(all[i], want_all[i], 2e-5) << i;
  // top_k 2: the 2nd largest is 1, tied by tokens 0 and 2: both kept (ties at the threshold).
  const auto k2 = probs(0.5, 2, 1.0), want_k2 = softmax(0.5, {0, 1, 2});
  for (size_t i = 0; i < k2.size(); ++i) EXPECT_NEAR(k2[i], want_k2[i], 2e-5) << i;
  // top_p 0.5: token 1 alone has mass e^4 / (e^4 + 2 e^2 + 1 + e^-2) = 0.78 >= 0.5.
  const auto p5 = probs(0.5, 0, 0.5);
  EXPECT_EQ(p5[1], 1.0);
  // top_p 0.9: token 1 is not enough; the next distinct logit (1) brings in tokens 0 and 2 together.
  const auto p9 = probs(0.5, 0, 0.9), want_p9 = softmax(0.5, {0, 1, 2});
  for (size_t i = 0; i < p9.size(); ++i) EXPECT_NEAR(p9[i], want_p9[i], 2e-5) << i;
  // T -> 0: the argmax.
  EXPECT_EQ(drafter::sample_transformed(logits, 1e-4, 0, 1.0, 0.999), 1);
}

// ---- trace attributes ----------------------------------------------------------------------------

TEST(TraceSampling, AttributesRoundTripAndAbsentIsGreedy) {
  Tiny s;
  const auto dir = std::filesystem::temp_directory_path() / ("mtplab-sampling-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto seqs = trace_of(*s.be, s.cfg, 1, 8, 6, 3, sampled_at(0.7, 5, 0.9, 42));
  auto write = [&](const std::string& name, const std::optional<io::TraceSampling>& smp) {
    const std::string path = (dir / name).string();
    io::TraceWriter w(path, s.cfg.hidden, s.cfg.vocab, io::TraceProvenance{});
    w.add_sequence(seqs[0]);
    if (smp) w.set_sampling(*smp);
    w.commit();
    return path;
  };
  const std::string plain = write("plain.h5", std::nullopt);
  EXPECT_FALSE(io::TraceReader(plain).sampling().sampled);
  EXPECT_FALSE(io::read_trace_sampling(plain).sampled);
  const std::string sampled = write("sampled.h5", sampled_at(0.7, 5, 0.9, 42));
  EXPECT_EQ(io::TraceReader(sampled).sampling(), sampled_at(0.7, 5, 0.9, 42));
  EXPECT_EQ(io::read_trace_sampling(sampled), sampled_at(0.7, 5, 0.9, 42));
  // A writer refuses a bad description, naming the attribute.
  io::TraceWriter bad((dir / "bad.h5").string(), s.cfg.hidden, s.cfg.vocab, io::TraceProvenance{});
  EXPECT_NE(message_of([&] { bad.set_sampling(sampled_at(0.0)); }).find("temperature"), std::string::npos);
  EXPECT_NE(message_of([&] { bad.set_sampling(sampled_at(1.0, -1)); }).find("top_k"), std::string::npos);
  EXPECT_NE(message_of([&] { bad.set_sampling(sampled_at(1.0, 0, 1.5)); }).find("top_p"), std::string::npos);
  // The check of a point against a file names the file and both settings.
  PointConfig p;
  p.trace.path = plain;
  p.arms.replay.verify = Verify::sampling;
  p.arms.replay.temperature = 0.7;
  const std::string greedy_msg = message_of([&] { check_trace_file(p); });
  EXPECT_NE(greedy_msg.find(plain), std::string::npos) << greedy_msg;
  EXPECT_NE(greedy_msg.find("greedy"), std::string::npos) << greedy_msg;
  EXPECT_NE(greedy_msg.find("temperature 0.7"), std::string::npos) << greedy_msg;
  p.trace.path = sampled;
  p.arms.replay.top_k = 5;
  p.arms.replay.top_p = 0.9;
  EXPECT_NO_THROW(check_trace_file(p));
  p.arms.replay.temperature = 1.0;
  const std::string other = message_of([&] { check_trace_file(p); });
  EXPECT_NE(other.find(sampled), std::string::npos) << other;
  EXPECT_NE(other.find("temperature 1,"), std::string::npos) << other;
  EXPECT_NE(other.find("temperature 0.7"), std::string::npos) << other;
  p.arms.replay.verify = Verify::greedy;  // greedy verification replays any trace
  EXPECT_NO_THROW(check_trace_file(p));
  std::filesystem::remove_all(dir);
}

// ---- the synthetic target at temperature ---------------------------------------------------------

TEST(SyntheticTarget, SampledContinuationsAreSeededAndInTheTargetsSupport) {
  Tiny s;
  const auto a = trace_of(*s.be, s.cfg, 2, 8, 24, 3, sampled_at(1.0, 0, 1.0, 5));
  const auto b = trace_of(*s.be, s.cfg, 2, 8, 24, 3, sampled_at(1.0, 0, 1.0, 5));
  const auto c = trace_of(*s.be, s.cfg, 2, 8, 24, 3, sampled_at(1.0, 0, 1.0, 6));
  const auto g = trace_of(*s.be, s.cfg, 2, 8, 24, 3, io::TraceSampling{});
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_NE(a[i].tokens, c[i].tokens);
    EXPECT_NE(a[i].tokens, g[i].tokens);  // T = 1 over 4096 random-weight logits: not the argmax path
    EXPECT_TRUE(
        std::equal(a[i].tokens.begin(), a[i].tokens.begin() + 8, g[i].tokens.begin()));  // same prompt
  }
  // Sampled at top_k 3: every continuation token is in the target's top-3 support, so the target
  // side finds a finite log p everywhere; the same trace read as top_k 1 is refused, naming the
  // sequence and a position.
  const auto k3 = trace_of(*s.be, s.cfg, 2, 8, 24, 3, sampled_at(1.0, 3, 1.0, 5));
  auto d = drafter_for(*s.be, s.cfg, 2, s.w);
  drafter::SamplingTransform t3;
  t3.top_k = 3;
  const auto logp = trace_target_logprobs(*d, k3, t3, "k3.h5");
  int not_argmax = 0;
  for (const auto& seq : k3)
    for (int t = seq.prompt_length; t < seq.length(); ++t) {
      EXPECT_TRUE(std::isfinite(logp[static_cast<size_t>(seq.index)][static_cast<size_t>(t)]));
      EXPECT_LE(logp[static_cast<size_t>(seq.index)][static_cast<size_t>(t)], 0.0f);
      not_argmax += logp[static_cast<size_t>(seq.index)][static_cast<size_t>(t)] < std::log(0.5f);
    }
  EXPECT_GT(not_argmax, 0);
  drafter::SamplingTransform t1;
  t1.top_k = 1;
  const std::string msg = message_of([&] { trace_target_logprobs(*d, k3, t1, "k3.h5"); });
  EXPECT_NE(msg.find("k3.h5: sequence "), std::string::npos) << msg;
  EXPECT_NE(msg.find("position "), std::string::npos) << msg;
  EXPECT_NE(msg.find("outside the truncated support"), std::string::npos) << msg;
}

namespace {
// The target's log p of every trace token of `seqs` at temperature kHot (no truncation).
std::vector<std::vector<float>> hot_target_logprobs(drafter::MtpDrafter& d,
                                                    const std::vector<io::TraceSequence>& seqs) {
  drafter::SamplingTransform tr;
  tr.temperature = kHot;
  return trace_target_logprobs(d, seqs, tr, "trace");
}
}  // namespace

// ---- replay ----------------------------------------------------------------------------------------

TEST(SamplingReplay, ExpectedAgreesWithRealisedWithinFourStandardErrors) {
  Tiny s;
  const int k = 3;
  // T = 4: the random-weight drafter's q and the target's p are both flattened, so most a_i lie
  // strictly between 0 and 1 and the coins matter (at T = 1 they are mostly near 0).
  const auto seqs = trace_of(*s.be, s.cfg, 6, 16, 200, 21, sampled_at(kHot));
  auto d = drafter_for(*s.be, s.cfg, k, s.w);
  const auto logp = hot_target_logprobs(*d, seqs);
  AcceptanceStats stats;
  const SamplingVerify v = verify_at(kHot, DraftProposal::sampled, 3);
  const auto steps = replay_all(*d, seqs, k, s.cfg.hidden, &v, logp, stats);
  // realised - expected = sum of (a - E[a | a_1..a_k]), increments of a martingale: its variance
  // is sum Var(a | ...), with P(a >= i) = prod_{j<=i} a_j and E[a^2] = sum_i (2i - 1) P(a >= i).
  double var = 0;
  int interior = 0;
  for (const auto& st : steps) {
    double prod = 1, ea = 0, ea2 = 0;
    for (int i = 0; i < k; ++i) {
      prod *= st.accept_prob[static_cast<size_t>(i)];
      ea += prod;
      ea2 += (2 * i + 1) * prod;
      interior +=
          st.accept_prob[static_cast<size_t>(i)] > 0.01f && st.accept_prob[static_cast<size_t>(i)] < 0.99f;
    }
    var += ea2 - ea * ea;
  }
  const double se = std::sqrt(var);
  std::printf(
      "[expected vs realised] %lld steps: realised %lld, expected %.2f, se %.2f (rate %.4f vs %.4f)\n",
      static_cast<long long>(stats.steps), static_cast<long long>(stats.accepted), stats.expected_accepted,
      se, stats.rate(), stats.expected_rate());
  ASSERT_GT(stats.steps, 500);
  ASSERT_GT(interior, static_cast<int>(stats.steps))
      << "a_i are mostly 0 / 1: the test would not test the coins";
  ASSERT_GT(se, 1.0);
  EXPECT_LT(std::abs(static_cast<double>(stats.accepted) - stats.expected_accepted), 4 * se);
  // The bound can fail: a replay whose coins ignored a_i (accept everything) is far outside it.
  double all = 0;
  for (const auto& st : steps) all += k - st.expected_accepted();
  EXPECT_GT(all, 4 * se);
}

TEST(SamplingReplay, SameSeedSameStepsAndBatchSizeDoesNotMatter) {
  Tiny s;
  const int k = 2;
  const auto seqs = trace_of(*s.be, s.cfg, 5, 12, 40, 4, sampled_at(kHot));
  auto d = drafter_for(*s.be, s.cfg, k, s.w);
  const auto logp = hot_target_logprobs(*d, seqs);
  const SamplingVerify v = verify_at(kHot, DraftProposal::sampled, 17);
  AcceptanceStats s1, s2, s3;
  const auto one = replay_all(*d, seqs, k, s.cfg.hidden, &v, logp, s1);
  const auto two = replay_all(*d, seqs, k, s.cfg.hidden, &v, logp, s2);
  auto same_steps = [](const StepRecord& a, const StepRecord& b) {
    return a.sequence == b.sequence && a.position == b.position && a.accepted == b.accepted &&
           a.drafts == b.drafts && a.accept_prob == b.accept_prob;
  };
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(same_steps(one[i], two[i])) << "step " << i;
  // Another seed flips other coins.
  const SamplingVerify other = verify_at(kHot, DraftProposal::sampled, 18);
  const auto three = replay_all(*d, seqs, k, s.cfg.hidden, &other, logp, s3);
  bool differ = one.size() != three.size();
  for (size_t i = 0; !differ && i < one.size(); ++i) differ = one[i].accepted != three[i].accepted;
  EXPECT_TRUE(differ);
  // Batch 4 (continuous batching over 5 sequences): every (sequence, position) step as at batch 1.
  std::map<std::pair<int, int>, StepRecord> batched;
  BatchReplayHooks hooks;
  hooks.after_step = [&](const std::vector<StepRecord>& rows) {
    for (const auto& r : rows) batched[{r.sequence, r.position}] = r;
    return true;
  };
  replay_batched(*d, seqs, 4, k, s.cfg.hidden, hooks, &v, logp);
  ASSERT_EQ(batched.size(), one.size());
  for (const auto& st : one) {
    auto it = batched.find({st.sequence, st.position});
    ASSERT_NE(it, batched.end()) << st.sequence << "@" << st.position;
    EXPECT_TRUE(same_steps(st, it->second)) << st.sequence << "@" << st.position;
  }
}

// ---- experiments: keys, rules, refusals --------------------------------------------------------

namespace {
const std::string kSampled = test::tiny_experiment(
    "sequences: 2, prompt_len: 8, new_tokens: 40, seed: 5, layers: 1,\n              sampling: sampling, "
    "temperature: 0.7, sampling_seed: 9",
    R"(output: out.h5
backend: cpu
verify: sampling
temperature: 0.7
)");
}  // namespace

TEST(SamplingExperiment, KeysAreReadAndRecorded) {
  const Experiment ex =
      parse_experiment(kSampled, "exp.yaml", {"draft_proposal=sampled", "sampling_seed=4"}, 1);
  ASSERT_EQ(ex.points.size(), 1u);
  const PointConfig& p = ex.points[0];
  EXPECT_EQ(p.arms.replay.verify, Verify::sampling);
  EXPECT_EQ(p.arms.replay.temperature, 0.7);
  EXPECT_EQ(p.arms.replay.draft_proposal, DraftProposal::sampled);
  EXPECT_EQ(p.arms.replay.sampling_seed, 4);
  EXPECT_EQ(p.trace.sampling, sampled_at(0.7, 0, 1.0, 9));
  EXPECT_NE(p.canonical.find("\nverify: sampling"), std::string::npos) << p.canonical;
  EXPECT_NE(p.canonical.find("\ntemperature: 0.7"), std::string::npos) << p.canonical;
  EXPECT_NE(p.canonical.find("sampling_seed: 9"), std::string::npos) << p.canonical;  // the trace's
  // A greedy trace spec records `sampling: greedy` alone (the other keys are not in effect).
  const Experiment g =
      parse_experiment(kSampled, "exp.yaml", {"trace.synthetic.sampling=greedy", "verify=greedy"}, 1);
  const std::string& c = g.points[0].canonical;
  EXPECT_NE(c.find("\n    sampling: greedy\nmeasure:"), std::string::npos) << c;
  EXPECT_EQ(c.find("sampling_seed: 9"), std::string::npos) << c;
}

TEST(SamplingExperiment, GreedyPointsIgnoreTheSamplingArms) {
  // Under verify: greedy the sampling arms are not in effect: normalised to their defaults, so two
  // greedy points that differ only in them have the same identity; sampling points do not.
  const std::vector<std::string> sweep = {"sweep.grid.temperature=[0.7, 1.0]",
                                          "sweep.grid.draft_proposal=[greedy, sampled]",
                                          "trace.synthetic.sampling=greedy"};
  std::vector<std::string> greedy = sweep;
  greedy.push_back("verify=greedy");
  const Experiment g = parse_experiment(kSampled, "exp.yaml", greedy, 1);
  ASSERT_EQ(g.points.size(), 4u);
  for (const auto& p : g.points) {
    EXPECT_EQ(p.canonical, g.points[0].canonical);
    EXPECT_EQ(p.arms.replay, ReplayOptions{});
  }
  const Experiment s =
      parse_experiment(kSampled, "exp.yaml",
                       {"sweep.grid.draft_proposal=[greedy, sampled]", "sweep.grid.sampling_seed=[1, 2]"}, 1);
  ASSERT_EQ(s.points.size(), 4u);
  for (size_t i = 1; i < s.points.size(); ++i) EXPECT_NE(s.points[i].canonical, s.points[0].canonical);
}

TEST(SamplingExperiment, SamplingPointsNeedAMatchingSampledTrace) {
  // A greedy synthetic trace.
  const std::string greedy =
      message_of([] { parse_experiment(kSampled, "exp.yaml", {"trace.synthetic.sampling=greedy"}, 1); });
  EXPECT_NE(greedy.find("trace.synthetic"), std::string::npos) << greedy;
  EXPECT_NE(greedy.find("greedy"), std::string::npos) << greedy;
  EXPECT_NE(greedy.find("temperature 0.7"), std::string::npos) << greedy;
  // Sampled with another temperature / top_k / top_p: both values named.
  const std::string t = message_of([] { parse_experiment(kSampled, "exp.yaml", {"temperature=1.0"}, 1); });
  EXPECT_NE(t.find("temperature 1,"), std::string::npos) << t;
  EXPECT_NE(t.find("sampled at temperature 0.7"), std::string::npos) << t;
  // A temperature a hair away from the trace's is refused, and the message tells the two apart.
  const std::string hair =
      message_of([] { parse_experiment(kSampled, "exp.yaml", {"temperature=0.7000001"}, 1); });
  EXPECT_NE(hair.find("temperature 0.7000001,"), std::string::npos) << hair;
  EXPECT_NE(hair.find("sampled at temperature 0.7,"), std::string::npos) << hair;
  const std::string k = message_of([] { parse_experiment(kSampled, "exp.yaml", {"top_k=5"}, 1); });
  EXPECT_NE(k.find("top_k 5"), std::string::npos) << k;
  EXPECT_NE(k.find("top_k 0"), std::string::npos) << k;
  const std::string p = message_of([] { parse_experiment(kSampled, "exp.yaml", {"top_p=0.9"}, 1); });
  EXPECT_NE(p.find("top_p 0.9"), std::string::npos) << p;
  // Greedy verification replays a sampled trace.
  EXPECT_NO_THROW(parse_experiment(kSampled, "exp.yaml", {"verify=greedy"}, 1));
  // The timing arms give no distribution to verify.
  const std::string skip = message_of([] { parse_experiment(kSampled, "exp.yaml", {"skip=head"}, 1); });
  EXPECT_NE(skip.find("skip"), std::string::npos) << skip;
  EXPECT_NE(skip.find("verify: sampling"), std::string::npos) << skip;
}

TEST(SamplingExperiment, BadValuesNameTheKey) {
  struct Case {
    std::string set, key;
  };
  const std::vector<Case> cases = {
      {"verify=maybe", "verify"},
      {"temperature=0", "temperature"},
      {"temperature=-1", "temperature"},
      {"temperature=hot", "temperature"},
      {"top_k=-1", "top_k"},
      {"top_p=0", "top_p"},
      {"top_p=1.5", "top_p"},
      {"draft_proposal=random", "draft_proposal"},
      {"sampling_seed=-3", "sampling_seed"},
      {"trace.synthetic.sampling=sometimes", "trace.synthetic.sampling"},
      {"trace.synthetic.temperature=0", "trace.synthetic.temperature"},
      {"trace.synthetic.top_k=-2", "trace.synthetic.top_k"},
      {"trace.synthetic.top_p=2", "trace.synthetic.top_p"},
      {"trace.synthetic.sampling_seed=-1", "trace.synthetic.sampling_seed"},
      {"trace.synthetic.top_k=5000", "top_k"},
  };
  for (const auto& c : cases) {
    const std::string msg = message_of([&] { parse_experiment(kSampled, "exp.yaml", {c.set}, 1); });
    EXPECT_NE(msg.find(c.key), std::string::npos) << c.set << ": " << msg;
  }
}

TEST(SamplingExperiment, ShippedTemperatureExperiment) {
  // experiments/temperature.yaml: 48 points, every sampling point on the trace sampled at its
  // temperature (the file's attributes agree), greedy points with the sampling arms normalised.
  const char* src = std::getenv("MTPLAB_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "MTPLAB_SOURCE_DIR is not set";
  // The experiment's paths are relative to the repository root, where mtplab runs.
  const std::filesystem::path was = std::filesystem::current_path();
  std::filesystem::current_path(src);
  const Experiment ex = load_experiment("experiments/temperature.yaml", {}, 1);
  ASSERT_EQ(ex.points.size(), 48u);
  int sampling = 0;
  for (const PointConfig& p : ex.points) {
    EXPECT_NO_THROW(check_trace_file(p)) << p.label();
    if (p.arms.replay.verify == Verify::sampling) {
      ++sampling;
      EXPECT_NE(p.trace.path.find(p.arms.replay.temperature == 0.7 ? "T0.7" : "T1.0"), std::string::npos);
    } else {
      EXPECT_EQ(p.arms.replay, ReplayOptions{});
    }
  }
  EXPECT_EQ(sampling, 32);
  std::filesystem::current_path(was);
}
