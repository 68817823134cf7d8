// MtpWeights: one table of tensor specs (canonical name, checkpoint name, whole shape, the part
// this rank keeps, initial distribution, destination) drives synthesis, loading and export, so
// the three cannot disagree about a name, a shape or a slice.
#include "model/weights.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "core/hash.hpp"

namespace mtplab::model {
namespace {

/// Which part of the whole tensor this rank keeps.
enum class Split {
  whole,
  vocab_rows,
  head_rows,
  head_cols,
  shared_rows,
  shared_cols,
  dense_rows,
  dense_cols
};

struct Spec {
  std::string canonical;      ///< the name synthetic values are keyed on
  std::string ckpt;           ///< the checkpoint name
  std::vector<int64_t> full;  ///< the whole tensor's shape (as in the checkpoint)
  Split split = Split::whole;
  int64_t unit = 0;  ///< rows (head_rows) or columns (head_cols) per head
  float mean = 0.0f;
  float stddev = 0.0f;
  TensorBF16* bf = nullptr;  ///< exactly one of bf / f32 is set
  TensorF32* f32 = nullptr;
  int64_t dst_offset = 0;  ///< elements into the destination (a stacked expert's slot)
};

Block block_of(const Spec& s, const ShardPlan& plan) {
  // The part of the split's axis this rank keeps; the *_cols splits cut columns, the others rows.
  Block b;
  Range part{0, -1};
  switch (s.split) {
    case Split::whole:
      break;
    case Split::vocab_rows:
      part = plan.vocab;
      break;
    case Split::head_rows:
    case Split::head_cols:
      part = Range{plan.heads.begin * s.unit, plan.heads.count * s.unit};
      break;
    case Split::shared_rows:
    case Split::shared_cols:
      part = plan.shared_inter;
      break;
    case Split::dense_rows:
    case Split::dense_cols:
      part = plan.dense_inter;
      break;
  }
  const bool cols =
      s.split == Split::head_cols || s.split == Split::shared_cols || s.split == Split::dense_cols;
  (cols ? b.cols : b.rows) = part;
  const int64_t nrows = s.full.empty() ? 1 : s.full[0];
  const int64_t ncols = shape_numel(s.full) / std::max<int64_t>(nrows, 1);
  if (b.rows.count < 0) b.rows = Range{0, nrows};
  if (b.cols.count < 0) b.cols = Range{0, ncols};
  return b;
}

/// Shapes a block's attention and indexer tensors for `plan` through `set(tensor, shape)` (the MTP
/// layer and every trunk layer share them).
template <typename Set>
void shape_attention(const ModelConfig& c, const ShardPlan& plan, AttentionWeights& a, IndexerWeights& x,
                     Set& set) {
  const int64_t H = c.hidden, nh = plan.heads.count;
  set(a.q_a_proj, {c.q_lora_rank, H});
  set(a.q_a_layernorm, {c.q_lora_rank});
  set(a.q_b_proj, {nh * c.qk_head_dim(), c.q_lora_rank});
  set(a.kv_a_proj_with_mqa, {c.kv_a_rows(), H});
  set(a.kv_a_layernorm, {c.kv_lora_rank});
  set(a.kv_b_proj, {nh * c.kv_b_head_rows(), c.kv_lora_rank});
  set(a.o_proj, {H, nh * c.v_head_dim});
  set(x.wq_b, {static_cast<int64_t>(c.index_n_heads) * c.index_head_dim, c.q_lora_rank});
  set(x.wk, {c.index_head_dim, H});
  set(x.k_norm_weight, {c.index_head_dim});
  set(x.k_norm_bias, {c.index_head_dim});
  set(x.weights_proj, {c.index_n_heads, H});
  set(x.compress_gate, {c.index_head_dim, H});
  set(x.compress_ape, {c.index_kpool, c.index_head_dim});
}

/// Shapes a block's routed and shared experts and router for `plan` through `set(tensor, shape)`.
template <typename Set>
void shape_moe(const ModelConfig& c, const ShardPlan& plan, MoeWeights& m, Set& set) {
  const int64_t H = c.hidden, ne = plan.experts.count;
  const int64_t I = c.moe_intermediate_size, SI = plan.shared_inter.count;
  set(m.gate, {c.n_routed_experts, H});
  set(m.e_score_correction_bias, {c.n_routed_experts});
  set(m.experts_gate, {ne, I, H});
  set(m.experts_up, {ne, I, H});
  set(m.experts_down, {ne, H, I});
  set(m.shared_gate, {SI, H});
  set(m.shared_up, {SI, H});
  set(m.shared_down, {H, SI});
}

/// Sets every tensor's shape for `plan` and sizes its storage.
/// Tensors outside `parts` stay empty (no shape, no storage).
void shape_weights(const ModelConfig& c, const ShardPlan& plan, MtpWeights& w, unsigned parts = kAllParts) {
  const int64_t H = c.hidden, V = c.vocab;
  unsigned part = kLayerPart;  // the category of the tensors set next
  auto set = [&](auto& t, std::vector<int64_t> shape) {
    if (!(parts & part)) return;
    t.shape = std::move(shape);
    t.data.assign(static_cast<size_t>(shape_numel(t.shape)), {});
  };
  w.plan = plan;
  part = kEmbedPart;
  set(w.embed_tokens, {V, H});
  part = kHeadPart;
  set(w.lm_head, {plan.vocab.count, H});
  part = kNormParts;
  for (TensorBF16* t :
       {&w.enorm, &w.hnorm, &w.input_layernorm, &w.post_attention_layernorm, &w.shared_head_norm})
    set(*t, {H});
  part = kLayerPart;
  set(w.eh_proj, {H, 2 * H});
  shape_attention(c, plan, w.attn, w.indexer, set);
  shape_moe(c, plan, w.moe, set);
  w.lm_head_fp8 = {};
}

/// Specs of tensors under one prefix (the MTP layer's, or a trunk layer's). Scales: projections
/// uniform with std 1/sqrt(fan_in) (activations keep RMS ~1), norm weights 1 +- noise, embedding
/// std 1, lm_head std 3/sqrt(H) (logit std ~3). Why each: docs/weights.md.
struct SpecList {
  std::vector<Spec>& specs;
  std::string prefix;
  static constexpr float kNormNoise = 0.1f;
  static float inv_sqrt(int64_t n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }

  void add(const std::string& rel, std::vector<int64_t> full, float mean, float sd, TensorBF16* bf,
           TensorF32* f32 = nullptr, Split split = Split::whole, int64_t unit = 0) {
    specs.push_back(Spec{rel, prefix + rel, std::move(full), split, unit, mean, sd, bf, f32, 0});
  }
  void proj(const std::string& rel, std::vector<int64_t> full, TensorBF16* bf, Split split = Split::whole,
            int64_t unit = 0) {
    const float sd = inv_sqrt(full[1]);
    add(rel, std::move(full), 0.0f, sd, bf, nullptr, split, unit);
  }
  void norm(const std::string& rel, int64_t n, TensorBF16* bf) { add(rel, {n}, 1.0f, kNormNoise, bf); }
};

/// The embedding and this rank's lm_head rows (the trunk's, which the MTP layer reads).
void add_trunk_specs(const ModelConfig& c, std::vector<Spec>& specs, TensorBF16& embed, TensorBF16& lm_head) {
  const int64_t H = c.hidden, V = c.vocab;
  specs.push_back(Spec{
      "embed_tokens.weight", c.embed_tokens_name, {V, H}, Split::whole, 0, 0.0f, 1.0f, &embed, nullptr, 0});
  specs.push_back(Spec{"lm_head.weight",
                       c.lm_head_name,
                       {V, H},
                       Split::vocab_rows,
                       0,
                       0.0f,
                       3.0f * SpecList::inv_sqrt(H),
                       &lm_head,
                       nullptr,
                       0});
}

/// MLA attention and the pooled indexer of one block.
void add_attention_specs(const ModelConfig& c, SpecList& l, AttentionWeights& a, IndexerWeights& x) {
  const int64_t H = c.hidden;
  const int64_t nh_all = c.n_heads;
  l.proj("self_attn.q_a_proj.weight", {c.q_lora_rank, H}, &a.q_a_proj);
  l.norm("self_attn.q_a_layernorm.weight", c.q_lora_rank, &a.q_a_layernorm);
  l.proj("self_attn.q_b_proj.weight", {nh_all * c.qk_head_dim(), c.q_lora_rank}, &a.q_b_proj,
         Split::head_rows, c.qk_head_dim());
  l.proj("self_attn.kv_a_proj_with_mqa.weight", {c.kv_a_rows(), H}, &a.kv_a_proj_with_mqa);
  l.norm("self_attn.kv_a_layernorm.weight", c.kv_lora_rank, &a.kv_a_layernorm);
  l.proj("self_attn.kv_b_proj.weight", {nh_all * c.kv_b_head_rows(), c.kv_lora_rank}, &a.kv_b_proj,
         Split::head_rows, c.kv_b_head_rows());
  l.proj("self_attn.o_proj.weight", {H, nh_all * c.v_head_dim}, &a.o_proj, Split::head_cols, c.v_head_dim);

  const int64_t D = c.index_head_dim;
  l.proj("self_attn.indexer.wq_b.weight", {c.index_n_heads * D, c.q_lora_rank}, &x.wq_b);
  l.proj("self_attn.indexer.wk.weight", {D, H}, &x.wk);
  l.norm("self_attn.indexer.k_norm.weight", D, &x.k_norm_weight);
  l.add("self_attn.indexer.k_norm.bias", {D}, 0.0f, SpecList::kNormNoise, &x.k_norm_bias);
  l.proj("self_attn.indexer.weights_proj.weight", {c.index_n_heads, H}, &x.weights_proj);
  l.proj("self_attn.indexer.index_kpool_compress_gate", {D, H}, &x.compress_gate);
  // ape shifts a pool's softmax per position; 0.5 makes it matter (HF initialises it to 0).
  l.add("self_attn.indexer.index_kpool_compress_ape", {c.index_kpool, D}, 0.0f, 0.5f, nullptr,
        &x.compress_ape);
}

/// The router, this rank's routed experts and its slice of the shared expert.
void add_moe_specs(const ModelConfig& c, const ShardPlan& plan, SpecList& l, MoeWeights& m) {
  const int64_t H = c.hidden, I = c.moe_intermediate_size, SI = c.shared_intermediate();
  l.proj("mlp.gate.weight", {c.n_routed_experts, H}, &m.gate);
  // Comparable to the gaps between the top sigmoid scores, so a router that ignores it differs.
  l.add("mlp.gate.e_score_correction_bias", {c.n_routed_experts}, 0.0f, 0.05f, nullptr,
        &m.e_score_correction_bias);
  for (int64_t le = 0; le < plan.experts.count; ++le) {
    const int64_t e = plan.experts.begin + le;
    const std::string p = str("mlp.experts.", e, ".");
    l.proj(p + "gate_proj.weight", {I, H}, &m.experts_gate);
    l.specs.back().dst_offset = le * I * H;
    l.proj(p + "up_proj.weight", {I, H}, &m.experts_up);
    l.specs.back().dst_offset = le * I * H;
    l.proj(p + "down_proj.weight", {H, I}, &m.experts_down);
    l.specs.back().dst_offset = le * H * I;
  }
  if (SI > 0) {
    l.proj("mlp.shared_experts.gate_proj.weight", {SI, H}, &m.shared_gate, Split::shared_rows);
    l.proj("mlp.shared_experts.up_proj.weight", {SI, H}, &m.shared_up, Split::shared_rows);
    l.proj("mlp.shared_experts.down_proj.weight", {H, SI}, &m.shared_down, Split::shared_cols);
  }
}

/// The dense MLP of a trunk layer below first_k_dense_replace (this rank's slice).
void add_dense_specs(const ModelConfig& c, SpecList& l, DenseMlpWeights& d) {
  const int64_t H = c.hidden, I = c.intermediate_size;
  l.proj("mlp.gate_proj.weight", {I, H}, &d.gate_proj, Split::dense_rows);
  l.proj("mlp.up_proj.weight", {I, H}, &d.up_proj, Split::dense_rows);
  l.proj("mlp.down_proj.weight", {H, I}, &d.down_proj, Split::dense_cols);
}

/// The MTP weights' table.
std::vector<Spec> build_specs(const ModelConfig& c, const ShardPlan& plan, MtpWeights& w) {
  const int64_t H = c.hidden;
  std::vector<Spec> specs;
  add_trunk_specs(c, specs, w.embed_tokens, w.lm_head);
  SpecList l{specs, c.mtp_prefix};
  l.norm("enorm.weight", H, &w.enorm);
  l.norm("hnorm.weight", H, &w.hnorm);
  l.proj("eh_proj.weight", {H, 2 * H}, &w.eh_proj);
  l.norm("input_layernorm.weight", H, &w.input_layernorm);
  l.norm("post_attention_layernorm.weight", H, &w.post_attention_layernorm);
  l.norm("shared_head.norm.weight", H, &w.shared_head_norm);
  add_attention_specs(c, l, w.attn, w.indexer);
  add_moe_specs(c, plan, l, w.moe);
  return specs;
}

/// Trunk layer w.index's table (w.dense says which MLP), under cfg.layer_prefix(index).
std::vector<Spec> layer_specs(const ModelConfig& c, const ShardPlan& plan, LayerWeights& w) {
  std::vector<Spec> specs;
  SpecList l{specs, c.layer_prefix(w.index)};
  l.norm("input_layernorm.weight", c.hidden, &w.input_layernorm);
  l.norm("post_attention_layernorm.weight", c.hidden, &w.post_attention_layernorm);
  add_attention_specs(c, l, w.attn, w.indexer);
  if (w.dense)
    add_dense_specs(c, l, w.mlp);
  else
    add_moe_specs(c, plan, l, w.moe);
  return specs;
}

/// The final norm's spec: the values of the MTP layer's shared_head.norm under the same seed (the
/// synthetic target's final norm, docs/weights.md), the name checkpoint.final_norm.
Spec final_norm_spec(const ModelConfig& c, TensorBF16& final_norm) {
  return Spec{"shared_head.norm.weight",
              c.final_norm_name,
              {c.hidden},
              Split::whole,
              0,
              1.0f,
              SpecList::kNormNoise,
              &final_norm,
              nullptr,
              0};
}

/// Shapes one trunk layer's tensors for `plan` (w.index and w.dense set) and sizes their storage.
void shape_layer(const ModelConfig& c, const ShardPlan& plan, LayerWeights& w) {
  const int64_t H = c.hidden, DI = plan.dense_inter.count;
  auto set = [](auto& t, std::vector<int64_t> shape) {
    t.shape = std::move(shape);
    t.data.assign(static_cast<size_t>(shape_numel(t.shape)), {});
  };
  w.plan = plan;
  set(w.input_layernorm, {H});
  set(w.post_attention_layernorm, {H});
  shape_attention(c, plan, w.attn, w.indexer, set);
  if (w.dense) {
    set(w.mlp.gate_proj, {DI, H});
    set(w.mlp.up_proj, {DI, H});
    set(w.mlp.down_proj, {H, DI});
    return;
  }
  shape_moe(c, plan, w.moe, set);
}

/// Runs fn(row_begin, row_end) over [0, rows) on up to hardware_concurrency threads, when the
/// work is large enough to pay for them.
template <typename F>
void parallel_rows(int64_t rows, int64_t cols, F fn) {
  const int64_t work = rows * cols;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t nt = std::min<int64_t>({hw, rows, std::max<int64_t>(1, work / (int64_t{1} << 20))});
  if (nt <= 1) {
    fn(int64_t{0}, rows);
    return;
  }
  std::vector<std::thread> threads;
  std::exception_ptr failure;
  std::mutex mu;
  for (int64_t t = 0; t < nt; ++t) {
    const int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
    threads.emplace_back([&, r0, r1] {
      try {
        fn(r0, r1);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (auto& th : threads) th.join();
  if (failure) std::rethrow_exception(failure);
}

// The standard FNV-1a 64 of the name, mixed with the seed by the splitmix64 finaliser
// (core/hash.hpp); element i is the finaliser of key + (i + 1) * gamma.
uint64_t tensor_key(uint64_t seed, std::string_view name) {
  return splitmix64_mix(seed ^ splitmix64_mix(fnv1a64(name)));
}
uint64_t element_bits(uint64_t key, uint64_t index) {
  return splitmix64_mix(key + (index + 1) * kSplitmix64Gamma);
}

/// Uniform in (-1, 1), symmetric, from the top 24 bits.
double uniform_pm1(uint64_t bits) {
  return (static_cast<double>(bits >> 40) + 0.5) * (2.0 / 16777216.0) - 1.0;
}

void synthesize(const Spec& s, const ShardPlan& plan, uint64_t seed) {
  const Block b = block_of(s, plan);
  const int64_t nrows = s.full.empty() ? 1 : s.full[0];
  const int64_t ncols = shape_numel(s.full) / std::max<int64_t>(nrows, 1);
  const uint64_t key = tensor_key(seed, s.canonical);
  const double amp = std::sqrt(3.0) * s.stddev;  // uniform on (-a, a) has std a / sqrt(3)
  const double mean = s.mean;
  parallel_rows(b.rows.count, b.cols.count, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t gr = b.rows.begin + r;
      const int64_t out = s.dst_offset + r * b.cols.count;
      for (int64_t c = 0; c < b.cols.count; ++c) {
        const uint64_t idx = static_cast<uint64_t>(gr * ncols + b.cols.begin + c);
        const float v = static_cast<float>(mean + amp * uniform_pm1(element_bits(key, idx)));
        if (s.bf)
          s.bf->data[static_cast<size_t>(out + c)] = to_bf16(v);
        else
          s.f32->data[static_cast<size_t>(out + c)] = v;
      }
    }
  });
}

/// A plan made for another config would silently synthesise or read the wrong slices.
void check_plan(const ModelConfig& c, const ShardPlan& p) {
  MTP_REQUIRE(
      p.total_vocab == c.vocab && p.vocab.begin >= 0 && p.vocab.end() <= c.vocab && p.heads.begin >= 0 &&
          p.heads.end() <= c.n_heads && p.experts.begin >= 0 && p.experts.end() <= c.n_routed_experts &&
          p.shared_inter.begin >= 0 && p.shared_inter.end() <= c.shared_intermediate() &&
          p.dense_inter.begin >= 0 && p.dense_inter.end() <= c.intermediate_size,
      "shard plan of rank ", p.rank, "/", p.world, " (vocab [", p.vocab.begin, ", ", p.vocab.end(), ") of ",
      p.total_vocab, ", heads [", p.heads.begin, ", ", p.heads.end(), "), experts [", p.experts.begin, ", ",
      p.experts.end(), ")) does not fit model config '", c.name, "' (V ", c.vocab, ", ", c.n_heads,
      " heads, ", c.n_routed_experts, " experts): make it with make_shard_plan(cfg, ...)");
}

/// Reads spec s's block for `plan` from the checkpoint into its destination. A NaN or Inf weight (in
/// the file, or an F32 / FP8 value beyond BF16's range) would run to the end and draft garbage (an
/// all-NaN norm drafts token 0 everywhere): refused here, naming the tensor and its first bad element
/// in the whole tensor's coordinates.
void read_spec(const Checkpoint& ckpt, const Spec& s, const ShardPlan& plan) {
  auto require_finite = [&](const Block& b, size_t count, auto value_at) {
    for (size_t i = 0; i < count; ++i) {
      const float v = value_at(i);
      if (std::isfinite(v)) continue;
      const int64_t nrows = s.full.empty() ? 1 : s.full[0];
      const int64_t ncols = shape_numel(s.full) / std::max<int64_t>(nrows, 1);
      const int64_t cols = b.cols.count < 0 ? ncols - b.cols.begin : b.cols.count;
      const int64_t row = b.rows.begin + static_cast<int64_t>(i) / cols;
      const int64_t col = b.cols.begin + static_cast<int64_t>(i) % cols;
      const std::string at = s.full.size() <= 1
                                 ? str("[", row, "]")
                                 : str("[", row, ", ", col, "] of the [", nrows, ", ", ncols, "] view");
      MTP_FAIL(
          "tensor \"", s.ckpt, "\" in ", ckpt.file_of(s.ckpt), " ", shape_str(s.full), ": element ", at,
          " (flat index ", row * ncols + col, ") is ", std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf"),
          " as loaded, the first non-finite value this rank reads; a checkpoint's weights must be finite");
    }
  };
  const Block b = block_of(s, plan);
  if (s.bf) {
    const std::vector<bf16> v = ckpt.read_bf16(s.ckpt, s.full, b);
    require_finite(b, v.size(), [&](size_t i) { return to_float(v[i]); });
    std::copy(v.begin(), v.end(), s.bf->data.begin() + s.dst_offset);
  } else {
    const std::vector<float> v = ckpt.read_f32(s.ckpt, s.full, b);
    require_finite(b, v.size(), [&](size_t i) { return v[i]; });
    std::copy(v.begin(), v.end(), s.f32->data.begin() + s.dst_offset);
  }
}

/// The whole tensors of `specs` as views for a checkpoint writer (`what` names the caller).
void append_views(const char* what, const std::vector<Spec>& specs, std::vector<TensorView>& views) {
  for (const Spec& s : specs) {
    TensorView v;
    v.name = s.ckpt;
    v.shape = s.full;
    const size_t n = static_cast<size_t>(shape_numel(s.full));
    if (s.bf) {
      MTP_REQUIRE(s.bf->data.size() >= static_cast<size_t>(s.dst_offset) + n, what, ": ", s.ckpt,
                  " holds fewer elements than its shape ", shape_str(s.full));
      v.dtype = DType::bf16;
      v.data = s.bf->data.data() + s.dst_offset;
      v.nbytes = n * sizeof(bf16);
    } else {
      MTP_REQUIRE(s.f32->data.size() >= static_cast<size_t>(s.dst_offset) + n, what, ": ", s.ckpt,
                  " holds fewer elements than its shape ", shape_str(s.full));
      v.dtype = DType::f32;
      v.data = s.f32->data.data() + s.dst_offset;
      v.nbytes = n * sizeof(float);
    }
    views.push_back(std::move(v));
  }
}

/// Whether `p` is the whole model's plan (world 1, every vocab row, expert, head and column).
bool whole_plan(const ModelConfig& c, const ShardPlan& p) {
  return p.experts == (Range{0, c.n_routed_experts}) && p.heads == (Range{0, c.n_heads}) &&
         p.vocab == (Range{0, c.vocab}) && p.shared_inter == (Range{0, c.shared_intermediate()}) &&
         p.dense_inter == (Range{0, c.intermediate_size});
}

size_t attention_bytes(const AttentionWeights& a, const IndexerWeights& x) {
  size_t n = x.compress_ape.bytes();
  for (const TensorBF16* t :
       {&a.q_a_proj, &a.q_a_layernorm, &a.q_b_proj, &a.kv_a_proj_with_mqa, &a.kv_a_layernorm, &a.kv_b_proj,
        &a.o_proj, &x.wq_b, &x.wk, &x.k_norm_weight, &x.k_norm_bias, &x.weights_proj, &x.compress_gate})
    n += t->bytes();
  return n;
}

size_t moe_bytes(const MoeWeights& m) {
  size_t n = m.e_score_correction_bias.bytes();
  for (const TensorBF16* t : {&m.gate, &m.experts_gate, &m.experts_up, &m.experts_down, &m.shared_gate,
                              &m.shared_up, &m.shared_down})
    n += t->bytes();
  return n;
}

}  // namespace

size_t MtpWeights::bytes() const {
  size_t n = embed_tokens.bytes() + lm_head.bytes() + lm_head_fp8.weight.bytes() + lm_head_fp8.scale.bytes();
  for (const TensorBF16* t : {&enorm,
                              &hnorm,
                              &eh_proj,
                              &input_layernorm,
                              &post_attention_layernorm,
                              &shared_head_norm,
                              &attn.q_a_proj,
                              &attn.q_a_layernorm,
                              &attn.q_b_proj,
                              &attn.kv_a_proj_with_mqa,
                              &attn.kv_a_layernorm,
                              &attn.kv_b_proj,
                              &attn.o_proj,
                              &indexer.wq_b,
                              &indexer.wk,
                              &indexer.k_norm_weight,
                              &indexer.k_norm_bias,
                              &indexer.weights_proj,
                              &indexer.compress_gate,
                              &moe.gate,
                              &moe.experts_gate,
                              &moe.experts_up,
                              &moe.experts_down,
                              &moe.shared_gate,
                              &moe.shared_up,
                              &moe.shared_down})
    n += t->bytes();
  return n + indexer.compress_ape.bytes() + moe.e_score_correction_bias.bytes();
}

size_t LayerWeights::bytes() const {
  return input_layernorm.bytes() + post_attention_layernorm.bytes() + attention_bytes(attn, indexer) +
         moe_bytes(moe) + mlp.gate_proj.bytes() + mlp.up_proj.bytes() + mlp.down_proj.bytes();
}

size_t TargetWeights::bytes() const {
  size_t n = embed_tokens.bytes() + lm_head.bytes() + final_norm.bytes();
  for (const LayerWeights& l : layers) n += l.bytes();
  return n;
}

uint64_t synthetic_bits(uint64_t seed, std::string_view name, uint64_t index) {
  return element_bits(tensor_key(seed, name), index);
}

MtpWeights synthesize_mtp_weights(const ModelConfig& cfg, const ShardPlan& plan, uint64_t seed,
                                  unsigned parts) {
  check_plan(cfg, plan);
  MTP_REQUIRE(parts != 0 && (parts & ~kAllParts) == 0, "synthesize_mtp_weights: parts ", parts,
              " is not a non-empty combination of kEmbedPart, kHeadPart, kNormParts, kLayerPart");
  MtpWeights w;
  shape_weights(cfg, plan, w, parts);
  for (const Spec& s : build_specs(cfg, plan, w)) {
    // Tensors outside `parts` have no storage; a tensor's values never depend on which others
    // are made (they are a function of seed, name and index only).
    if ((s.bf && s.bf->data.empty()) || (s.f32 && s.f32->data.empty())) continue;
    synthesize(s, plan, seed);
  }
  return w;
}

MtpWeights load_mtp_weights(const ModelConfig& cfg, const ShardPlan& plan,
                            const std::string& checkpoint_path) {
  check_plan(cfg, plan);
  const Checkpoint ckpt(checkpoint_path);
  MtpWeights w;
  shape_weights(cfg, plan, w);
  for (const Spec& s : build_specs(cfg, plan, w)) read_spec(ckpt, s, plan);
  return w;
}

std::vector<TensorView> checkpoint_views(const ModelConfig& cfg, const MtpWeights& whole) {
  const ShardPlan& p = whole.plan;
  MTP_REQUIRE(whole_plan(cfg, p), "checkpoint_views: the weights are rank ", p.rank, "'s shard of ", p.world,
              "; a checkpoint needs the whole model (world 1)");
  // build_specs only records destinations; nothing is written through them here.
  std::vector<TensorView> views;
  append_views("checkpoint_views", build_specs(cfg, p, const_cast<MtpWeights&>(whole)), views);
  return views;
}

void export_mtp_weights(const ModelConfig& cfg, const MtpWeights& whole, const std::string& path,
                        uint64_t max_file_bytes) {
  const std::vector<TensorView> views = checkpoint_views(cfg, whole);
  if (max_file_bytes == 0) {
    write_safetensors(path, views, {{"format", "pt"}, {"mtplab_model", cfg.name}});
  } else {
    write_safetensors_sharded(path, views, max_file_bytes);
  }
}

namespace {

/// Trunk layer `index` shaped for `plan`, each tensor filled by fill(spec) (`what`: the caller,
/// for errors).
template <typename Fill>
LayerWeights make_layer(const char* what, const ModelConfig& cfg, const ShardPlan& plan, int index,
                        Fill fill) {
  check_plan(cfg, plan);
  MTP_REQUIRE(index >= 0, what, ": layer ", index);
  LayerWeights w;
  w.index = index;
  w.dense = cfg.dense_layer(index);
  shape_layer(cfg, plan, w);
  for (const Spec& s : layer_specs(cfg, plan, w)) fill(s);
  return w;
}

}  // namespace

LayerWeights synthesize_layer_weights(const ModelConfig& cfg, const ShardPlan& plan, int index,
                                      uint64_t seed) {
  return make_layer("synthesize_layer_weights", cfg, plan, index,
                    [&](const Spec& s) { synthesize(s, plan, seed); });
}

namespace {

/// A TargetWeights with its trunk tensors shaped for `plan` and no layers.
TargetWeights shaped_trunk(const ModelConfig& cfg, const ShardPlan& plan) {
  TargetWeights w;
  w.plan = plan;
  w.embed_tokens.shape = {cfg.vocab, cfg.hidden};
  w.lm_head.shape = {plan.vocab.count, cfg.hidden};
  w.final_norm.shape = {cfg.hidden};
  for (TensorBF16* t : {&w.embed_tokens, &w.lm_head, &w.final_norm})
    t->data.assign(static_cast<size_t>(shape_numel(t->shape)), {});
  return w;
}

}  // namespace

TargetWeights synthesize_target_trunk(const ModelConfig& cfg, const ShardPlan& plan, uint64_t weight_seed,
                                      uint64_t target_seed) {
  check_plan(cfg, plan);
  TargetWeights w = shaped_trunk(cfg, plan);
  std::vector<Spec> trunk;
  add_trunk_specs(cfg, trunk, w.embed_tokens, w.lm_head);
  for (const Spec& s : trunk) synthesize(s, plan, weight_seed);
  synthesize(final_norm_spec(cfg, w.final_norm), plan, target_seed);
  return w;
}

TargetWeights target_trunk_of(const ModelConfig& cfg, const MtpWeights& w, uint64_t target_seed) {
  check_plan(cfg, w.plan);
  MTP_REQUIRE(w.embed_tokens.shape == (std::vector<int64_t>{cfg.vocab, cfg.hidden}) &&
                  w.lm_head.shape == (std::vector<int64_t>{w.plan.vocab.count, cfg.hidden}),
              "target_trunk_of: the MTP weights' embedding ", shape_str(w.embed_tokens.shape), " and head ",
              shape_str(w.lm_head.shape), " are not the model's");
  TargetWeights t;
  t.plan = w.plan;
  t.embed_tokens = w.embed_tokens;
  t.lm_head = w.lm_head;
  t.final_norm.shape = {cfg.hidden};
  t.final_norm.data.assign(static_cast<size_t>(cfg.hidden), {});
  synthesize(final_norm_spec(cfg, t.final_norm), w.plan, target_seed);
  return t;
}

TargetWeights synthesize_target_weights(const ModelConfig& cfg, const ShardPlan& plan, int layers,
                                        uint64_t weight_seed, uint64_t target_seed) {
  MTP_REQUIRE(layers >= 1, "synthesize_target_weights: ", layers, " layers");
  TargetWeights w = synthesize_target_trunk(cfg, plan, weight_seed, target_seed);
  for (int i = 0; i < layers; ++i)
    w.layers.push_back(synthesize_layer_weights(cfg, plan, i, target_seed + 1 + static_cast<uint64_t>(i)));
  return w;
}

TargetWeights load_target_trunk(const ModelConfig& cfg, const ShardPlan& plan, const Checkpoint& ckpt) {
  check_plan(cfg, plan);
  TargetWeights w = shaped_trunk(cfg, plan);
  std::vector<Spec> trunk;
  add_trunk_specs(cfg, trunk, w.embed_tokens, w.lm_head);
  trunk.push_back(final_norm_spec(cfg, w.final_norm));
  for (const Spec& s : trunk) read_spec(ckpt, s, plan);
  return w;
}

LayerWeights load_layer_weights(const ModelConfig& cfg, const ShardPlan& plan, int index,
                                const Checkpoint& ckpt) {
  return make_layer("load_layer_weights", cfg, plan, index, [&](const Spec& s) { read_spec(ckpt, s, plan); });
}

TargetWeights load_target_weights(const ModelConfig& cfg, const ShardPlan& plan, int layers,
                                  const std::string& checkpoint_path) {
  MTP_REQUIRE(layers >= 1, "load_target_weights: ", layers, " layers");
  MTP_REQUIRE(cfg.num_hidden_layers == 0 || layers <= cfg.num_hidden_layers, "load_target_weights: ", layers,
              " layers of a model whose trunk has ", cfg.num_hidden_layers, " (num_hidden_layers)");
  const Checkpoint ckpt(checkpoint_path);
  TargetWeights w = load_target_trunk(cfg, plan, ckpt);
  for (int i = 0; i < layers; ++i) w.layers.push_back(load_layer_weights(cfg, plan, i, ckpt));
  return w;
}

std::vector<TensorView> target_checkpoint_views(const ModelConfig& cfg, const TargetWeights& whole) {
  const ShardPlan& p = whole.plan;
  MTP_REQUIRE(whole_plan(cfg, p), "target_checkpoint_views: the weights are rank ", p.rank, "'s shard of ",
              p.world, "; a checkpoint needs the whole model (world 1)");
  // The spec builders only record destinations; nothing is written through them here.
  TargetWeights& w = const_cast<TargetWeights&>(whole);
  std::vector<Spec> trunk;
  add_trunk_specs(cfg, trunk, w.embed_tokens, w.lm_head);
  if (cfg.lm_head_name == cfg.embed_tokens_name) trunk.pop_back();  // tied: one tensor
  trunk.push_back(final_norm_spec(cfg, w.final_norm));
  std::vector<TensorView> views;
  append_views("target_checkpoint_views", trunk, views);
  for (LayerWeights& l : w.layers) append_views("target_checkpoint_views", layer_specs(cfg, p, l), views);
  return views;
}

Fp8Rows quantize_rows_fp8(const TensorBF16& w) {
  MTP_REQUIRE(w.shape.size() == 2, "quantize_rows_fp8: expected a 2-D matrix, got shape ",
              shape_str(w.shape));
  const int64_t rows = w.shape[0], cols = w.shape[1];
  Fp8Rows q;
  q.weight.shape = {rows, cols};
  q.weight.data.resize(static_cast<size_t>(rows * cols));
  q.scale.shape = {rows};
  q.scale.data.resize(static_cast<size_t>(rows));
  parallel_rows(rows, cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const bf16* x = w.data.data() + r * cols;
      float amax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(to_float(x[c])));
      const float scale = amax > 0.0f ? amax / kE4M3Max : 1.0f;
      q.scale.data[static_cast<size_t>(r)] = scale;
      fp8e4m3* out = q.weight.data.data() + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = to_fp8e4m3(to_float(x[c]) / scale);
    }
  });
  return q;
}

void quantize_head_fp8(MtpWeights& w) { w.lm_head_fp8 = quantize_rows_fp8(w.lm_head); }

}  // namespace mtplab::model
