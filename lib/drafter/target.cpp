#include "drafter/target.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "drafter/factory.hpp"
#include "model/weights.hpp"

namespace mtplab::drafter {

SyntheticTarget::SyntheticTarget(ops::Backend& be, const model::ModelConfig& cfg, int layers,
                                 uint64_t weight_seed, uint64_t target_seed)
    : be_(be), cfg_(cfg) {
  MTP_REQUIRE(layers >= 1 && layers <= 64, "synthetic target: layers ", layers, " outside 1..64");
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
  x_ = ops::Array<bf16>(be, cfg.hidden);
  logits_ = ops::Array<bf16>(be, cfg.vocab);
  arg_ = ops::Array<ops::ArgMax>(be, 1);
}

SyntheticTarget::~SyntheticTarget() = default;

io::TraceSequence SyntheticTarget::generate(const std::vector<int32_t>& prompt, int new_tokens) {
  return generate(prompt, new_tokens, io::TraceSampling{}, 0);
}

io::TraceSequence SyntheticTarget::generate(const std::vector<int32_t>& prompt, int new_tokens,
                                            const io::TraceSampling& sampling, int64_t sequence) {
  io::validate(sampling, "synthetic target");
  const int H = cfg_.hidden;
  std::vector<bf16> logits(sampling.sampled ? static_cast<size_t>(cfg_.vocab) : 0);
  const int total = static_cast<int>(prompt.size()) + new_tokens;
  MTP_REQUIRE(!prompt.empty(), "synthetic target: empty prompt");
  MTP_REQUIRE(total <= cfg_.max_seq_len, "synthetic target: ", total, " positions exceed max_seq_len ",
              cfg_.max_seq_len);
  std::vector<LayerCache> caches;
  caches.reserve(blocks_.size());
  for (auto& b : blocks_) caches.emplace_back(be_, b->dims());
  io::TraceSequence seq;
  seq.hidden = H;
  seq.prompt_length = static_cast<int32_t>(prompt.size());
  seq.tokens = prompt;
  seq.hiddens.resize(static_cast<size_t>(total) * H);
  // Every position's hidden stays in backend memory until the end and the positions go up once,
  // so the prompt's rows run without a host round trip per row (only a generated token, which the
  // next row embeds, is read back as it is made).
  ops::Array<bf16> hiddens(be_, static_cast<size_t>(total) * H);
  ops::Array<int32_t> positions(be_, static_cast<size_t>(total));
  {
    std::vector<int32_t> pos_h(static_cast<size_t>(total));
    std::iota(pos_h.begin(), pos_h.end(), 0);
    be_.upload(positions.data(), pos_h.data(), pos_h.size() * sizeof(int32_t));
  }
  for (int p = 0; p < total; ++p) {
    const int32_t tok = seq.tokens[p];
    MTP_REQUIRE(tok >= 0 && tok < cfg_.vocab, "synthetic target: token ", tok, " at position ", p,
                " is outside the vocab of ", cfg_.vocab);
    be_.copy(x_.data(), embed_.data() + static_cast<size_t>(tok) * H, H * sizeof(bf16));
    for (size_t l = 0; l < blocks_.size(); ++l)
      blocks_[l]->forward(x_.data(), positions.data() + p, caches[l], x_.data());
    bf16* h = hiddens.data() + static_cast<size_t>(p) * H;
    be_.rmsnorm(x_.data(), final_norm_.data(), h, 1, H, cfg_.rms_norm_eps);
    if (p + 1 < total && p + 1 >= static_cast<int>(prompt.size())) {
      if (!sampling.sampled) {
        be_.head_argmax(lm_head_.data(), nullptr, nullptr, h, cfg_.vocab, H, 0, nullptr, arg_.data());
        ops::ArgMax a{};
        be_.download(&a, arg_.data(), sizeof a);
        seq.tokens.push_back(a.index);
      } else {
        // The head's own BF16 logits (the op the drafter's head uses), sampled on the host.
        be_.head_argmax(lm_head_.data(), nullptr, nullptr, h, cfg_.vocab, H, 0, logits_.data(), arg_.data());
        be_.download(logits.data(), logits_.data(), logits.size() * sizeof(bf16));
        seq.tokens.push_back(sample_transformed(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                                                sampling_uniform(sampling.seed, sequence, p + 1)));
      }
    }
  }
  be_.download(seq.hiddens.data(), hiddens.data(), seq.hiddens.size() * sizeof(bf16));
  return seq;
}

std::vector<int32_t> PromptGenerator::next(int length) {
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (auto& t : prompt) {
    state_ ^= state_ << 13, state_ ^= state_ >> 7, state_ ^= state_ << 17;
    t = static_cast<int32_t>(state_ % static_cast<uint64_t>(vocab_));
  }
  return prompt;
}

std::vector<io::TraceSequence> synthetic_trace(SyntheticTarget& target, int vocab, int count, int prompt_len,
                                               int new_tokens, uint64_t seed,
                                               const io::TraceSampling& sampling) {
  PromptGenerator prompts(seed, vocab);
  std::vector<io::TraceSequence> out;
  for (int s = 0; s < count; ++s) {
    out.push_back(target.generate(prompts.next(prompt_len), new_tokens, sampling, s));
    out.back().index = s;
  }
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
