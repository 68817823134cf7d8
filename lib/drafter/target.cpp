#include "drafter/target.hpp"

#include "core/error.hpp"
#include "drafter/factory.hpp"
#include "model/weights.hpp"

namespace mtplab::drafter {

SyntheticTarget::SyntheticTarget(ops::Backend& be, const model::ModelConfig& cfg, int layers, uint64_t weight_seed,
                                 uint64_t target_seed)
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
  h_ = ops::Array<bf16>(be, cfg.hidden);
  pos_ = ops::Array<int32_t>(be, 1);
  arg_ = ops::Array<ops::ArgMax>(be, 1);
}

SyntheticTarget::~SyntheticTarget() = default;

io::TraceSequence SyntheticTarget::generate(const std::vector<int32_t>& prompt, int new_tokens) {
  const int H = cfg_.hidden;
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
  for (int p = 0; p < total; ++p) {
    const int32_t tok = seq.tokens[p];
    MTP_REQUIRE(tok >= 0 && tok < cfg_.vocab, "synthetic target: token ", tok, " at position ", p,
                " is outside the vocab of ", cfg_.vocab);
    be_.copy(x_.data(), embed_.data() + static_cast<size_t>(tok) * H, H * sizeof(bf16));
    be_.upload(pos_.data(), &p, sizeof p);
    for (size_t l = 0; l < blocks_.size(); ++l) blocks_[l]->forward(x_.data(), pos_.data(), caches[l], x_.data());
    be_.rmsnorm(x_.data(), final_norm_.data(), h_.data(), 1, H, cfg_.rms_norm_eps);
    be_.download(seq.hiddens.data() + static_cast<size_t>(p) * H, h_.data(), H * sizeof(bf16));
    if (p + 1 < total && p + 1 >= static_cast<int>(prompt.size())) {
      be_.head_argmax(lm_head_.data(), nullptr, nullptr, h_.data(), cfg_.vocab, H, 0, nullptr, arg_.data());
      ops::ArgMax a{};
      be_.download(&a, arg_.data(), sizeof a);
      seq.tokens.push_back(a.index);
    }
  }
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
                                               int new_tokens, uint64_t seed) {
  PromptGenerator prompts(seed, vocab);
  std::vector<io::TraceSequence> out;
  for (int s = 0; s < count; ++s) {
    out.push_back(target.generate(prompts.next(prompt_len), new_tokens));
    out.back().index = s;
  }
  return out;
}

}  // namespace mtplab::drafter
