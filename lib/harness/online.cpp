// The online loop (online.hpp): prompts through the target and the drafter, step by step, with
// continuous batching over both slot pools.
#include "harness/online.hpp"

#include <algorithm>
#include <limits>
#include <memory>

#include "core/error.hpp"

namespace mtplab::harness {

const char* to_string(RunMode m) { return kRunModeNames[static_cast<size_t>(m)]; }
const char* to_string(TargetSource t) { return kTargetSourceNames[static_cast<size_t>(t)]; }

const std::vector<Setting<OnlineOptions>>& online_settings() {
  using O = OnlineOptions;
  static const std::vector<Setting<O>> table = [] {
    std::vector<Setting<O>> r;
    r.push_back(
        int_setting("max_new_tokens", &O::max_new_tokens, 1, 1 << 20,
                    "a sequence steps while a step's drafts lie within its first max_new_tokens tokens"));
    r.push_back(int_setting("target_layers", &O::target_layers, 1, 1024, "the target's trunk layers"));
    r.push_back(int_setting("target_seed", &O::target_seed, 0, int64_t{1} << 62,
                            "the synthetic trunk's seed (final norm; layer i under target_seed + 1 + i)"));
    r.push_back(choice_setting("target", &O::target, kTargetSourceNames,
                               "the trunk's layers synthetic (seeded) or from weights.checkpoint"));
    check_settings(r, "online settings");
    return r;
  }();
  return table;
}

SpeculativeStep speculative_step(std::span<const std::vector<double>> p,
                                 std::span<const std::vector<double>> q, std::span<const int32_t> drafts,
                                 const std::function<double(int)>& coin,
                                 const std::function<double(int)>& draw) {
  const int k = static_cast<int>(drafts.size());
  MTP_REQUIRE(p.size() == drafts.size() + 1 && q.size() == drafts.size(), "speculative_step: ", p.size(),
              " target rows and ", q.size(), " drafter rows for ", k, " drafts (k + 1 and k)");
  SpeculativeStep out;
  out.accept_prob.assign(static_cast<size_t>(k), 0.0f);
  std::vector<double> alpha(static_cast<size_t>(k), 0.0);
  for (int i = 0; i < k; ++i) {
    const std::vector<double>& pi = p[static_cast<size_t>(i)];
    const std::vector<double>& qi = q[static_cast<size_t>(i)];
    const int32_t d = drafts[static_cast<size_t>(i)];
    MTP_REQUIRE(d >= 0 && static_cast<size_t>(d) < pi.size() && (qi.empty() || qi.size() == pi.size()),
                "speculative_step: draft ", d, " or a drafter row of ", qi.size(), " outside the vocab of ",
                pi.size());
    const double qd = qi.empty() ? 1.0 : qi[static_cast<size_t>(d)];
    const double a = qd > 0 ? std::min(1.0, pi[static_cast<size_t>(d)] / qd) : 0.0;
    alpha[static_cast<size_t>(i)] = a;
    out.accept_prob[static_cast<size_t>(i)] = static_cast<float>(a);
  }
  while (out.accepted < k && coin(out.accepted) < alpha[static_cast<size_t>(out.accepted)]) ++out.accepted;
  if (out.accepted == k) return out;
  // The residual of the first rejected draft: max(0, p - q), drawn without normalising (draw_token
  // scales its uniform by the total).
  const int i = out.accepted;
  const std::vector<double>& pi = p[static_cast<size_t>(i)];
  const std::vector<double>& qi = q[static_cast<size_t>(i)];
  std::vector<double> residual(pi.size());
  for (size_t t = 0; t < pi.size(); ++t) {
    const double qt =
        qi.empty() ? (static_cast<int32_t>(t) == drafts[static_cast<size_t>(i)] ? 1.0 : 0.0) : qi[t];
    residual[t] = std::max(0.0, pi[t] - qt);
  }
  out.residual_token = drafter::draw_token(residual, draw(i));
  return out;
}

namespace {

// The online loop's state (header comment of online.hpp): per slot its sequence's tokens and the
// target's hiddens of every row it holds, its next position L and its steps.
class OnlineBatch {
 public:
  OnlineBatch(drafter::Target& target, drafter::MtpDrafter* drafter, std::span<const Prompt> prompts,
              const OnlineRun& run, const OnlineHooks& hooks)
      : target_(target),
        drafter_(drafter),
        prompts_(prompts),
        run_(run),
        hooks_(hooks),
        k_(run.draft_len),
        H_(static_cast<size_t>(target.config().hidden)),
        V_(static_cast<size_t>(target.config().vocab)),
        slots_(std::min<int>(run.batch_size, static_cast<int>(std::max<size_t>(prompts.size(), 1)))),
        state_(target.new_batch(slots_)),
        live_(static_cast<size_t>(slots_)) {
    if (drafter_) batch_ = drafter_->new_batch(slots_);
    fill();
  }

  // One step of every live sequence; false when none is left or a hook ended the run.
  bool step() {
    std::vector<int> slots;
    std::vector<drafter::BatchRow> inputs;
    for (int s = 0; s < slots_; ++s) {
      const Live& l = live_[static_cast<size_t>(s)];
      if (l.prompt < 0) continue;
      slots.push_back(s);
      inputs.push_back(drafter::BatchRow{s, l.seq.tokens[static_cast<size_t>(l.L)], hidden(l, l.L - 1)});
    }
    if (slots.empty()) return false;
    if (hooks_.before_step) hooks_.before_step();
    const size_t B = slots.size(), k = static_cast<size_t>(k_);
    std::vector<int32_t> drafts;
    std::vector<drafter::DraftStats> stats;
    if (k_ > 0) {
      drafter::ProposeExtras extras;
      if (hooks_.draft_stats) extras.stats = &stats;
      drafts = drafter_->propose_batch(*batch_, inputs, k_, extras);
      MTP_REQUIRE(drafts.size() == B * k, "online: the drafter returned ", drafts.size(), " drafts for ", B,
                  " x ", k);
    }
    // The verify rows: per sequence its last token t_L and its drafts.
    std::vector<int32_t> rows(B * (k + 1));
    std::vector<drafter::VerifySeq> seqs(B);
    for (size_t b = 0; b < B; ++b) {
      const Live& l = live_[static_cast<size_t>(slots[b])];
      int32_t* r = rows.data() + b * (k + 1);
      r[0] = l.seq.tokens[static_cast<size_t>(l.L)];
      std::copy_n(drafts.data() + b * k, k, r + 1);
      seqs[b] = drafter::VerifySeq{slots[b], std::span<const int32_t>(r, k + 1)};
    }
    drafter::VerifyExtras vx;
    vx.logits = run_.sampling != nullptr;
    mark_begin(drafter::Phase::verify);
    const drafter::VerifyResult v = target_.verify(*state_, seqs, vx);
    mark_end(drafter::Phase::verify);
    std::vector<StepRecord> recs(B);
    for (size_t b = 0; b < B; ++b) {
      const int s = slots[b];
      Live& l = live_[static_cast<size_t>(s)];
      StepRecord& rec = recs[b];
      rec.sequence = static_cast<int32_t>(l.seq.index);
      rec.position = l.L;
      rec.batch_rows = static_cast<int32_t>(B);
      rec.drafts.assign(drafts.begin() + static_cast<std::ptrdiff_t>(b * k),
                        drafts.begin() + static_cast<std::ptrdiff_t>((b + 1) * k));
      if (hooks_.draft_stats && k_ > 0)
        rec.stats.assign(stats.begin() + static_cast<std::ptrdiff_t>(b * k),
                         stats.begin() + static_cast<std::ptrdiff_t>((b + 1) * k));
      const int first = v.first_row[b];
      const int32_t emitted = verify_row(l, v, first, rec);
      const int a = rec.accepted;
      rec.targets.assign(k, -1);
      for (int i = 0; i < a; ++i) rec.targets[static_cast<size_t>(i)] = rec.drafts[static_cast<size_t>(i)];
      if (static_cast<size_t>(a) < k) rec.targets[static_cast<size_t>(a)] = emitted;
      // The sequence keeps rows L .. L + a of the step (their hiddens) and its tokens d_1 .. d_a
      // and the emitted one; the target rolls back to them, the drafter trims and catches up.
      l.seq.tokens.insert(l.seq.tokens.end(), rec.drafts.begin(), rec.drafts.begin() + a);
      l.seq.tokens.push_back(emitted);
      l.hiddens.insert(l.hiddens.end(), v.hiddens.begin() + static_cast<std::ptrdiff_t>(first * H_),
                       v.hiddens.begin() + static_cast<std::ptrdiff_t>((first + a + 1) * H_));
      target_.rollback(*state_, s, l.L + a + 1);
      if (drafter_) catch_up(s, l, a);
      l.L += a + 1;
      ++l.seq.steps;
    }
    ++steps_;
    const bool go_on = !hooks_.after_step || hooks_.after_step(recs);
    for (int s = 0; s < slots_; ++s) {
      Live& l = live_[static_cast<size_t>(s)];
      if (l.prompt >= 0 && (done(l) || !go_on)) leave(s);
    }
    if (go_on) fill();
    return go_on;
  }

  int64_t steps() const { return steps_; }

 private:
  struct Live {
    int prompt = -1;  // index into prompts; -1: a free slot
    int L = 0;        // the next step's position: t_L is the last token, not yet a target row
    OnlineSequence seq;
    std::vector<bf16> hiddens;  // [rows held, H]: the target's hidden of every row it keeps
  };

  const bf16* hidden(const Live& l, int row) const {
    return l.hiddens.data() + static_cast<size_t>(row) * H_;
  }

  bool done(const Live& l) const { return l.L + k_ > l.seq.prompt_length + run_.max_new_tokens - 1; }

  void mark_begin(drafter::Phase p) const {
    if (hooks_.timer) hooks_.timer->begin(p, 0);
  }
  void mark_end(drafter::Phase p) const {
    if (hooks_.timer) hooks_.timer->end(p, 0);
  }

  // The token the target emits at position `pos` from logits row `row` of `v` (sampling), with
  // the sequence's uniform for that position.
  int32_t sample_at(const drafter::VerifyResult& v, int row, int64_t index, int pos) const {
    const SamplingVerify& smp = *run_.sampling;
    return drafter::sample_transformed(
        std::span<const bf16>(v.logits.data() + static_cast<size_t>(row) * V_, V_), smp.transform.temperature,
        smp.transform.top_k, smp.transform.top_p, drafter::sampling_uniform(smp.seed, index, pos));
  }

  // Decides the step of one sequence (rows first .. first + k of v): rec.accepted and
  // rec.accept_prob; returns the token emitted after the accepted drafts.
  int32_t verify_row(const Live& l, const drafter::VerifyResult& v, int first, StepRecord& rec) const {
    const int k = k_;
    const int64_t index = l.seq.index;
    if (!run_.sampling) {
      rec.accept_prob.assign(static_cast<size_t>(k), 0.0f);
      int a = 0;
      for (int i = 0; i < k; ++i)
        rec.accept_prob[static_cast<size_t>(i)] =
            rec.drafts[static_cast<size_t>(i)] == v.tokens[static_cast<size_t>(first + i)] ? 1.0f : 0.0f;
      while (a < k && rec.accept_prob[static_cast<size_t>(a)] == 1.0f) ++a;
      rec.accepted = a;
      return v.tokens[static_cast<size_t>(first + a)];
    }
    const SamplingVerify& smp = *run_.sampling;
    const drafter::SamplingTransform& t = smp.transform;
    std::vector<std::vector<double>> p(static_cast<size_t>(k) + 1), q(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i)
      p[static_cast<size_t>(i)] = drafter::transformed_probabilities(
          std::span<const bf16>(v.logits.data() + static_cast<size_t>(first + i) * V_, V_), t.temperature,
          t.top_k, t.top_p);
    const int L = l.L;
    const SpeculativeStep st = speculative_step(
        p, q, rec.drafts, [&](int i) { return verify_uniform(smp.seed, index, L + 1 + i); },
        [&](int i) { return drafter::sampling_uniform(smp.seed, index, L + 1 + i); });
    rec.accepted = st.accepted;
    rec.accept_prob = st.accept_prob;
    // Every draft accepted: the bonus token from p_k, drawn as the target's own sampler draws.
    return st.residual_token >= 0 ? st.residual_token : sample_at(v, first + k, index, L + 1 + k);
  }

  // The drafter's rows after the step of slot s (a accepted): after_verify, then the context rows
  // from its length up to row L + a - 1 from the target's hiddens.
  void catch_up(int s, const Live& l, int a) {
    drafter_->after_verify(*batch_, s, a);
    const int rows = l.L + a;
    const int from = batch_->seq_len(s);
    const int n = rows - from;
    MTP_REQUIRE(n >= 0, "online: sequence ", l.seq.index, ": the drafter holds ", from,
                " rows, more than the ", rows, " verified");
    drafter_->append_rows(*batch_, s, l.seq.tokens.data() + from + 1, hidden(l, from), n, from,
                          drafter::Phase::catch_up);
  }

  void leave(int s) {
    Live& l = live_[static_cast<size_t>(s)];
    target_.release(*state_, s);
    if (drafter_) drafter_->release(*batch_, s);
    if (hooks_.after_sequence) hooks_.after_sequence(l.prompt, l.seq);
    l = Live{};
  }

  // Free slots take the next prompts: the target's prefill (its first token t_P), the drafter's
  // context rows 0 .. P - 2. A sequence with no step leaves at once.
  void fill() {
    for (int s = 0; s < slots_; ++s) {
      Live& l = live_[static_cast<size_t>(s)];
      while (l.prompt < 0 && next_ < prompts_.size()) {
        const int pi = static_cast<int>(next_++);
        const Prompt& pr = prompts_[static_cast<size_t>(pi)];
        const int P = static_cast<int>(pr.tokens.size());
        MTP_REQUIRE(P >= 1, "online: prompt ", pr.index, " is empty");
        const int ts = target_.new_sequence(*state_);
        MTP_REQUIRE(ts == s, "online: the target gave slot ", ts, " where slot ", s, " was free");
        if (drafter_) {
          const int ds = drafter_->new_sequence(*batch_);
          MTP_REQUIRE(ds == s, "online: the drafter gave slot ", ds, " where slot ", s, " was free");
        }
        drafter::VerifyExtras px;
        px.logits = run_.sampling != nullptr;
        mark_begin(drafter::Phase::prefill);
        const drafter::VerifyResult r = target_.prefill(*state_, s, pr.tokens, px);
        mark_end(drafter::Phase::prefill);
        l.prompt = pi;
        l.L = P;
        l.seq = OnlineSequence{pr.index, P, pr.tokens, 0};
        l.seq.tokens.push_back(run_.sampling ? sample_at(r, 0, pr.index, P) : r.tokens.at(0));
        l.hiddens = r.hiddens;
        if (drafter_)
          drafter_->append_rows(*batch_, s, l.seq.tokens.data() + 1, l.hiddens.data(), P - 1, 0,
                                drafter::Phase::prefill);
        if (hooks_.after_prefill) hooks_.after_prefill(pi);
        if (done(l)) leave(s);
      }
    }
  }

  drafter::Target& target_;
  drafter::MtpDrafter* drafter_;
  std::span<const Prompt> prompts_;
  const OnlineRun& run_;
  const OnlineHooks& hooks_;
  int k_;
  size_t H_, V_;
  int slots_;
  std::unique_ptr<drafter::TargetState> state_;
  std::unique_ptr<drafter::BatchState> batch_;
  std::vector<Live> live_;
  size_t next_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

int64_t run_online(drafter::Target& target, drafter::MtpDrafter* drafter, std::span<const Prompt> prompts,
                   const OnlineRun& run, const OnlineHooks& hooks) {
  MTP_REQUIRE(run.draft_len >= 0, "online: draft_len ", run.draft_len, " < 0");
  MTP_REQUIRE((run.draft_len == 0) == (drafter == nullptr), "online: draft_len ", run.draft_len,
              run.draft_len == 0 ? " runs no drafter, but one was given" : " needs a drafter");
  if (drafter)
    MTP_REQUIRE(run.draft_len <= drafter->options().draft_len, "online: draft_len ", run.draft_len,
                " exceeds the drafter's ", drafter->options().draft_len);
  MTP_REQUIRE(run.batch_size >= 1 && run.batch_size <= drafter::kMaxBatch, "online: batch_size ",
              run.batch_size, " outside 1..", drafter::kMaxBatch);
  MTP_REQUIRE(run.max_new_tokens >= 1, "online: max_new_tokens ", run.max_new_tokens, " < 1");
  if (run.sampling)
    MTP_REQUIRE(run.sampling->proposal == DraftProposal::greedy,
                "online: sampling verification with draft_proposal sampled is not supported (the drafter "
                "proposes its argmax; draft_proposal: greedy)");
  for (const Prompt& pr : prompts) {
    const int64_t need = static_cast<int64_t>(pr.tokens.size()) + run.max_new_tokens;
    MTP_REQUIRE(need <= target.capacity(), "online: prompt ", pr.index, " of ", pr.tokens.size(),
                " tokens + max_new_tokens ", run.max_new_tokens, " exceed the target's capacity of ",
                target.capacity(), " rows");
  }
  if (prompts.empty()) return 0;
  OnlineBatch batch(target, drafter, prompts, run, hooks);
  while (batch.step()) {
  }
  return batch.steps();
}

}  // namespace mtplab::harness
