// The trace and weight caches of a run (point_inputs.hpp).
#include "harness/point_inputs.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/world_ops.hpp"
#include "drafter/target.hpp"
#include "harness/progress.hpp"
#include "harness/replay.hpp"

namespace mtplab::harness {
namespace {

using Clock = std::chrono::steady_clock;

// Rank 0's sequences on every rank.
void broadcast_trace(std::vector<io::TraceSequence>& seqs, int hidden, const dist::Group& world, int rank) {
  int64_t count = static_cast<int64_t>(seqs.size());
  dist::broadcast(world, count);
  if (rank != 0) seqs.assign(static_cast<size_t>(count), io::TraceSequence{});
  for (auto& s : seqs) {
    int64_t meta[3] = {s.index, s.prompt_length, s.length()};
    dist::broadcast(world, std::span<int64_t>(meta));
    if (rank != 0) {
      s.index = meta[0];
      s.prompt_length = static_cast<int32_t>(meta[1]);
      s.hidden = hidden;
      s.tokens.resize(static_cast<size_t>(meta[2]));
      s.hiddens.resize(static_cast<size_t>(meta[2]) * static_cast<size_t>(hidden));
    }
    dist::broadcast(world, std::span<int32_t>(s.tokens));
    dist::broadcast(world, std::span<bf16>(s.hiddens));  // split below MPI's int counts by dist
  }
}

}  // namespace

TraceKey trace_key(const PointConfig& p) {
  TraceKey k;
  k.model = p.model;
  k.trace = p.trace;
  k.weights_seed = p.trace.synthetic ? p.weights.seed : 0;
  k.take = p.measure.sequences;
  return k;
}

WeightsKey weights_key(const PointConfig& p) {
  return WeightsKey{p.model, p.weights, p.arms.drafter.head_sharding};
}

TargetKey target_key(const PointConfig& p) {
  const ReplayOptions& r = p.arms.replay;
  return TargetKey{trace_key(p), weights_key(p), r.temperature, r.top_k, r.top_p};
}

const std::vector<io::TraceSequence>& PointInputs::trace(const PointConfig& p) {
  TraceKey key = trace_key(p);
  if (trace_key_ && *trace_key_ == key) return trace_;
  trace_.clear();
  trace_key_.reset();
  const model::ModelConfig& cfg = p.model;
  const int want = p.measure.sequences;
  if (p.trace.synthetic) {
    const int count = want > 0 ? std::min(want, p.trace.sequences) : p.trace.sequences;
    // The other ranks wait for rank 0's generation without the collective timeout (it may take
    // minutes; the timeout bounds waits for peers that stopped, not for work).
    std::optional<dist::PatientWait> patient;
    if (rank_ != 0) patient.emplace("rank 0 generates the synthetic trace");
    if (rank_ == 0) {
      const auto t0 = Clock::now();
      auto last_log = t0;
      drafter::SyntheticTarget target(be_, cfg, p.trace.layers, p.weights.seed, p.trace.seed,
                                      p.trace.prompt_len + p.trace.new_tokens);
      const int batch = std::min(p.trace.batch, std::max(count, 1));
      trace_ = drafter::synthetic_trace(
          target, cfg.vocab, count, p.trace.prompt_len, p.trace.new_tokens, p.trace.seed, p.trace.sampling,
          batch, [&](int done) {
            const auto now = Clock::now();
            if (done < count && now - last_log > std::chrono::seconds(10)) {
              last_log = now;
              log_info("synthetic trace: ", done, "/", count, " sequence(s) after ",
                       format_duration(std::chrono::duration<double>(now - t0).count()));
            }
          });
      log_info("synthetic trace: ", count, " sequence(s) of ", p.trace.prompt_len, " + ", p.trace.new_tokens,
               " tokens (", p.trace.sampling.describe(), ") from a ", p.trace.layers, "-layer target, ",
               batch, " at a time, in ",
               format_duration(std::chrono::duration<double>(Clock::now() - t0).count()));
    }
    broadcast_trace(trace_, cfg.hidden, world_, rank_);
  } else {
    io::TraceReader reader(p.trace.path, cfg.hidden, cfg.vocab);
    const int64_t n = want > 0 ? std::min<int64_t>(want, reader.num_sequences()) : reader.num_sequences();
    for (int64_t s = 0; s < n; ++s) {
      MTP_REQUIRE(reader.sequence_length(s) <= cfg.max_seq_len, p.trace.path, ": sequence ", s, " has ",
                  reader.sequence_length(s), " positions, more than model.max_seq_len ", cfg.max_seq_len);
      trace_.push_back(reader.sequence(s));
    }
  }
  trace_key_ = std::move(key);
  return trace_;
}

const std::vector<std::vector<float>>& PointInputs::target_logprobs(const PointConfig& p,
                                                                    drafter::MtpDrafter& drafter) {
  TargetKey key = target_key(p);
  if (target_key_ && *target_key_ == key) return target_logprobs_;
  target_key_.reset();
  target_logprobs_.clear();
  const auto& seqs = trace(p);
  const SamplingVerify v = sampling_verify(p.arms.replay);
  const std::string name = p.trace.synthetic ? std::string("trace.synthetic") : p.trace.path;
  const auto t0 = Clock::now();
  target_logprobs_ = trace_target_logprobs(drafter, seqs, v.transform, name);
  int64_t rows = 0;
  for (const io::TraceSequence& seq : seqs) rows += std::max<int64_t>(0, seq.length() - seq.prompt_length);
  if (rank_ == 0)
    log_info("target log-probabilities: ", rows, " trace rows at temperature ", v.transform.temperature,
             ", top_k ", v.transform.top_k, ", top_p ", v.transform.top_p, " in ",
             format_duration(std::chrono::duration<double>(Clock::now() - t0).count()));
  target_key_ = std::move(key);
  return target_logprobs_;
}

std::vector<Prompt> PointInputs::prompts(const PointConfig& p) const {
  const int want = p.measure.sequences;
  std::vector<Prompt> out;
  if (p.trace.synthetic) {
    const int count = want > 0 ? std::min(want, p.trace.sequences) : p.trace.sequences;
    drafter::PromptGenerator gen(p.trace.seed, static_cast<int>(p.model.vocab));
    for (int s = 0; s < count; ++s) out.push_back(Prompt{s, gen.next(p.trace.prompt_len)});
    return out;
  }
  io::TraceReader reader(p.trace.path, p.model.hidden, p.model.vocab);
  const int64_t n = want > 0 ? std::min<int64_t>(want, reader.num_sequences()) : reader.num_sequences();
  for (int64_t s = 0; s < n; ++s) {
    const auto tokens = reader.tokens(s);
    out.push_back(Prompt{s, std::vector<int32_t>(tokens.begin(), tokens.begin() + reader.prompt_length(s))});
  }
  return out;
}

model::MtpWeights& PointInputs::weights(const PointConfig& p) {
  WeightsKey key = weights_key(p);
  if (weights_key_ && *weights_key_ == key) return weights_;
  weights_key_.reset();
  weights_ = model::MtpWeights{};
  const auto plan = model::make_shard_plan(p.model, rank_, world_size_, p.arms.drafter.head_sharding);
  weights_ = p.weights.synthetic ? model::synthesize_mtp_weights(p.model, plan, p.weights.seed)
                                 : model::load_mtp_weights(p.model, plan, p.weights.checkpoint);
  weights_key_ = std::move(key);
  return weights_;
}

}  // namespace mtplab::harness
