#include "drafter/target.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "drafter/factory.hpp"
#include "model/weights.hpp"

namespace mtplab::drafter {

SyntheticTarget::SyntheticTarget(ops::Backend& be, const model::ModelConfig& cfg, int layers,
                                 uint64_t weight_seed, uint64_t target_seed, int max_positions)
    : be_(be), cfg_(cfg) {
  MTP_REQUIRE(layers >= 1 && layers <= 64, "synthetic target: layers ", layers, " outside 1..64");
  MTP_REQUIRE(max_positions >= 0, "synthetic target: max_positions ", max_positions, " is negative");
  if (max_positions > 0) {
    const int P = cfg.index_kpool;
    const int64_t rows = (static_cast<int64_t>(max_positions) + P - 1) / P * P;
    if (rows < cfg_.max_seq_len) cfg_.set_max_seq_len(static_cast<int>(rows));
  }
  const model::ShardPlan plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  {
    model::MtpWeights trunk =
        model::synthesize_mtp_weights(cfg, plan, weight_seed, model::kEmbedPart | model::kHeadPart);
    embed_ = upload(be, trunk.embed_tokens);
    lm_head_ = upload(be, trunk.lm_head);
  }
  {
    model::MtpWeights norm_src = model::synthesize_mtp_weights(cfg, plan, target_seed, model::kNormParts);
    final_norm_ = upload(be, norm_src.shared_head_norm);
  }
  const BlockDims dims = block_dims(cfg, 1, 0, ops::KvDtype::bf16);
  for (int i = 0; i < layers; ++i) {
    model::MtpWeights w = model::synthesize_mtp_weights(cfg, plan, target_seed + 1 + static_cast<uint64_t>(i),
                                                        model::kNormParts | model::kLayerPart);
    blocks_.push_back(std::make_unique<Block>(be, nullptr, dims, upload_block_weights(be, w)));
  }
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

std::vector<io::TraceSequence> SyntheticTarget::generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                              int new_tokens, const io::TraceSampling& sampling,
                                                              int64_t first_sequence) {
  io::validate(sampling, "synthetic target");
  const int n = static_cast<int>(prompts.size());
  MTP_REQUIRE(n >= 1 && n <= kMaxTargetBatch, "synthetic target: a batch of ", n, " sequences (1 .. ",
              kMaxTargetBatch, ")");
  const int prompt_len = static_cast<int>(prompts[0].size());
  MTP_REQUIRE(prompt_len > 0, "synthetic target: empty prompt");
  for (const auto& pr : prompts)
    MTP_REQUIRE(static_cast<int>(pr.size()) == prompt_len,
                "synthetic target: the prompts of a batch differ in length (", pr.size(), " and ", prompt_len,
                " tokens)");
  MTP_REQUIRE(new_tokens >= 0, "synthetic target: ", new_tokens, " new tokens");
  const int total = prompt_len + new_tokens;
  MTP_REQUIRE(total <= cfg_.max_seq_len, "synthetic target: ", total, " positions exceed max_seq_len ",
              cfg_.max_seq_len);
  const int H = cfg_.hidden;
  const size_t V = static_cast<size_t>(cfg_.vocab);
  const size_t row = static_cast<size_t>(H);
  const size_t rows = static_cast<size_t>(n);
  std::vector<io::TraceSequence> seqs(rows);
  for (size_t b = 0; b < rows; ++b) {
    io::TraceSequence& q = seqs[b];
    q.hidden = H;
    q.prompt_length = prompt_len;
    q.tokens = prompts[b];
    q.tokens.reserve(static_cast<size_t>(total));
    q.hiddens.resize(static_cast<size_t>(total) * row);
  }
  // Sequence b is slot b of every layer's pool; all rows of a step sit at the same position.
  std::vector<std::unique_ptr<SlotCaches>> caches;
  for (auto& blk : blocks_) {
    blk->reserve(n);
    caches.push_back(std::make_unique<SlotCaches>(be_, blk->dims(), n));
  }
  ops::Array<bf16> x(be_, rows * row), normed(be_, rows * row);
  ops::Array<int32_t> slot(be_, rows), pos(be_, rows);
  ops::Array<ops::ArgMax> arg(be_, rows);
  std::optional<ops::Array<bf16>> logits;
  if (sampling.sampled) logits.emplace(be_, rows * V);
  std::vector<int32_t> host_i(rows);
  std::iota(host_i.begin(), host_i.end(), 0);
  be_.upload(slot.data(), host_i.data(), host_i.size() * sizeof(int32_t));
  std::vector<bf16> host_h(rows * row);
  std::vector<ops::ArgMax> host_arg(rows);
  std::vector<bf16> host_logits(sampling.sampled ? rows * V : 0);
  for (int p = 0; p < total; ++p) {
    const size_t at = static_cast<size_t>(p);
    for (size_t b = 0; b < rows; ++b) {
      const int32_t tok = seqs[b].tokens[at];
      MTP_REQUIRE(tok >= 0 && tok < cfg_.vocab, "synthetic target: token ", tok, " at position ", p,
                  " of sequence ", first_sequence + static_cast<int64_t>(b), " is outside the vocab of ",
                  cfg_.vocab);
      be_.copy(x.data() + b * row, embed_.data() + static_cast<size_t>(tok) * row, row * sizeof(bf16));
    }
    std::fill(host_i.begin(), host_i.end(), p);
    be_.upload(pos.data(), host_i.data(), host_i.size() * sizeof(int32_t));
    for (size_t l = 0; l < blocks_.size(); ++l)
      blocks_[l]->forward(ops::RowBatch{slot.data(), pos.data(), n, 1}, x.data(), *caches[l], x.data());
    be_.rmsnorm(x.data(), final_norm_.data(), normed.data(), n, H, cfg_.rms_norm_eps);
    be_.download(host_h.data(), normed.data(), host_h.size() * sizeof(bf16));
    for (size_t b = 0; b < rows; ++b)
      std::copy_n(host_h.data() + b * row, row, seqs[b].hiddens.data() + at * row);
    if (p + 1 < total && p + 1 >= prompt_len) {
      be_.head_argmax_batch(lm_head_.data(), nullptr, nullptr, normed.data(), ops::RowBatch{slot.data(), nullptr, n, 1},
                            cfg_.vocab, H, 0, logits ? logits->data() : nullptr, cfg_.vocab, arg.data());
      if (!sampling.sampled) {
        be_.download(host_arg.data(), arg.data(), host_arg.size() * sizeof(ops::ArgMax));
        for (size_t b = 0; b < rows; ++b) seqs[b].tokens.push_back(host_arg[b].index);
      } else {
        be_.download(host_logits.data(), logits->data(), host_logits.size() * sizeof(bf16));
        for (size_t b = 0; b < rows; ++b)
          seqs[b].tokens.push_back(sample_transformed(
              std::span<const bf16>(host_logits.data() + b * V, V), sampling.temperature, sampling.top_k,
              sampling.top_p, sampling_uniform(sampling.seed, first_sequence + static_cast<int64_t>(b), p + 1)));
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
                                               int new_tokens, uint64_t seed, const io::TraceSampling& sampling,
                                               int batch, const std::function<void(int)>& progress) {
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

int32_t sample_transformed(std::span<const bf16> logits, double temperature, int64_t top_k, double top_p,
                           double u) {
  const size_t n = logits.size();
  MTP_REQUIRE(n > 0 && temperature > 0 && top_p > 0 && top_p <= 1 && top_k >= 0,
              "sample_transformed: bad transform (temperature ", temperature, ", top_k ", top_k, ", top_p ",
              top_p, ") or empty logits");
  std::vector<double> z(n);
  for (size_t i = 0; i < n; ++i) z[i] = static_cast<double>(to_float(logits[i])) / temperature;
  // Descending logit order (stable: equal logits by id), for the thresholds.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
  double threshold = -INFINITY;
  size_t kept = n;  // tokens order[0 .. kept) are the candidates (ties at the threshold included)
  if (top_k > 0 && static_cast<size_t>(top_k) < n) {
    threshold = z[order[static_cast<size_t>(top_k) - 1]];
    kept = static_cast<size_t>(top_k);
    while (kept < n && z[order[kept]] >= threshold) ++kept;
  }
  const double zmax = z[order[0]];
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
    threshold = z[order[kept - 1]];
  }
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    if (z[i] >= threshold) sum += std::exp(z[i] - zmax);
  double cum = 0;
  int32_t last = -1;
  for (size_t i = 0; i < n; ++i) {
    if (z[i] < threshold) continue;
    cum += std::exp(z[i] - zmax) / sum;
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  return last;  // u within rounding of 1: the last kept token
}

}  // namespace mtplab::drafter
