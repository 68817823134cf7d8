// MtpWeights: the host-side weights of one rank's shard of the MTP layer (plus the trunk's
// embedding and this rank's lm_head rows), ready to upload to a backend.
//
// Invariants:
// - Every tensor is row-major with its shape in `shape`; BF16 unless marked fp32.
// - The shard follows `plan` (model/sharding.hpp): q_b_proj / kv_b_proj hold this rank's heads'
//   rows, o_proj this rank's heads' columns, lm_head this rank's vocab rows, the experts this
//   rank's experts stacked in global id order, the shared expert this rank's slice of its
//   intermediate dimension; everything else is whole on every rank.
// - Synthetic weights are a pure function of (seed, tensor name, element index in the whole
//   tensor), so a rank that generates only its shard gets exactly the values of the same slice
//   of a single rank's weights (docs/weights.md has the scheme and its scales).
// - A checkpoint load reads only this rank's rows / columns / experts from disk.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/numeric.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/sharding.hpp"

namespace mtplab::model {

template <typename T>
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<T> data;

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  size_t bytes() const { return data.size() * sizeof(T); }
  bool empty() const { return data.empty(); }
  int64_t dim(size_t i) const { return shape.at(i); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
};
using TensorBF16 = HostTensor<bf16>;
using TensorF32 = HostTensor<float>;
using TensorFP8 = HostTensor<fp8e4m3>;

/// MLA attention. n = plan.heads.count local heads, dqk = qk_head_dim(), dv = v_head_dim.
struct AttentionWeights {
  TensorBF16 q_a_proj;            ///< [q_lora, H]
  TensorBF16 q_a_layernorm;       ///< [q_lora]
  TensorBF16 q_b_proj;            ///< [n * dqk, q_lora]      rows of heads [h0, h0+n)
  TensorBF16 kv_a_proj_with_mqa;  ///< [kv_lora + rope, H]
  TensorBF16 kv_a_layernorm;      ///< [kv_lora]
  TensorBF16 kv_b_proj;           ///< [n * (nope + dv), kv_lora]  per head [k_nope ; v]
  TensorBF16 o_proj;              ///< [H, n * dv]            columns of heads [h0, h0+n)
};

/// The pooled lightning indexer (replicated on every rank).
struct IndexerWeights {
  TensorBF16 wq_b;           ///< [n_I * D, q_lora]
  TensorBF16 wk;             ///< [D, H]
  TensorBF16 k_norm_weight;  ///< [D]
  TensorBF16 k_norm_bias;    ///< [D]
  TensorBF16 weights_proj;   ///< [n_I, H]
  TensorBF16 compress_gate;  ///< [D, H]  (index_kpool_compress_gate; applied in fp32)
  TensorF32 compress_ape;    ///< [P, D]  (index_kpool_compress_ape) fp32
};

/// MoE. n = plan.experts.count local experts (global ids plan.experts.begin ...); s =
/// plan.shared_inter.count columns of the fused shared expert (of cfg.shared_intermediate();
/// the shared tensors are empty when s is 0). Both partial outputs are summed over ranks.
struct MoeWeights {
  TensorBF16 gate;                    ///< router mlp.gate [E, H]
  TensorF32 e_score_correction_bias;  ///< [E] fp32
  TensorBF16 experts_gate;            ///< [n, I, H]
  TensorBF16 experts_up;              ///< [n, I, H]
  TensorBF16 experts_down;            ///< [n, H, I]
  TensorBF16 shared_gate;             ///< [s, H]  rows plan.shared_inter
  TensorBF16 shared_up;               ///< [s, H]  rows plan.shared_inter
  TensorBF16 shared_down;             ///< [H, s]  columns plan.shared_inter
};

/// An FP8 E4M3 copy of a row-major BF16 matrix with one fp32 scale per row:
/// value = to_float(weight[r, c]) * scale[r].
struct Fp8Rows {
  TensorFP8 weight;  ///< [rows, cols]
  TensorF32 scale;   ///< [rows]
  bool empty() const { return weight.empty(); }
};

struct MtpWeights {
  ShardPlan plan;

  TensorBF16 embed_tokens;  ///< [V, H] whole: any token's row may be needed on any rank
  TensorBF16 lm_head;       ///< [plan.vocab.count, H]: rows [plan.vocab.begin, plan.vocab.end())
  Fp8Rows lm_head_fp8;      ///< empty until quantize_head_fp8()

  TensorBF16 enorm;                     ///< [H]
  TensorBF16 hnorm;                     ///< [H]
  TensorBF16 eh_proj;                   ///< [H, 2H]: columns [embedding ; hidden]
  TensorBF16 input_layernorm;           ///< [H]
  TensorBF16 post_attention_layernorm;  ///< [H]
  TensorBF16 shared_head_norm;          ///< [H] (shared_head.norm)

  AttentionWeights attn;
  IndexerWeights indexer;
  MoeWeights moe;

  /// Host bytes of all tensors.
  size_t bytes() const;
};

/// A dense MLP (a trunk layer below first_k_dense_replace): the clamped SwiGLU of the experts at
/// cfg.intermediate_size, this rank's slice s = plan.dense_inter.count of it (gate / up rows, down
/// columns; the partial outputs are summed over ranks, as the shared expert's).
struct DenseMlpWeights {
  TensorBF16 gate_proj;  ///< [s, H]  rows plan.dense_inter
  TensorBF16 up_proj;    ///< [s, H]  rows plan.dense_inter
  TensorBF16 down_proj;  ///< [H, s]  columns plan.dense_inter
};

/// One layer of the target's trunk: the MTP layer's block without its front (enorm, hnorm,
/// eh_proj) and its shared_head.norm; routed experts (moe) or, below first_k_dense_replace, a dense
/// MLP (mlp). Checkpoint names: cfg.layer_prefix(index) + the MTP layer's relative names, and
/// mlp.{gate,up,down}_proj.weight for the dense MLP.
struct LayerWeights {
  ShardPlan plan;
  int index = 0;       ///< the trunk layer
  bool dense = false;  ///< cfg.dense_layer(index): mlp holds the MLP, moe is empty

  TensorBF16 input_layernorm;           ///< [H]
  TensorBF16 post_attention_layernorm;  ///< [H]
  AttentionWeights attn;
  IndexerWeights indexer;
  MoeWeights moe;       ///< empty when dense
  DenseMlpWeights mlp;  ///< empty unless dense

  size_t bytes() const;
};

/// The target (docs/target.md): the embedding, this rank's lm_head rows, the final RMSNorm and
/// its first layers.size() trunk layers, all sharded by `plan`.
struct TargetWeights {
  ShardPlan plan;
  TensorBF16 embed_tokens;  ///< [V, H] whole
  TensorBF16 lm_head;       ///< [plan.vocab.count, H]
  TensorBF16 final_norm;    ///< [H]
  std::vector<LayerWeights> layers;

  size_t bytes() const;
};

/// The 64 random bits of element `index` of tensor `name` under `seed` (splitmix64 finaliser
/// of a per-tensor key and the index). `name` is the tensor's canonical name (see weights.md),
/// independent of the checkpoint prefixes.
uint64_t synthetic_bits(uint64_t seed, std::string_view name, uint64_t index);

/// Parts of the weights to synthesise (a bitmask): the embedding, this rank's lm_head rows, the
/// five MTP norms (enorm, hnorm, input / post-attention, shared_head.norm), and the layer (eh_proj,
/// attention, indexer, MoE). A tensor outside the parts is left empty.
inline constexpr unsigned kEmbedPart = 1, kHeadPart = 2, kNormParts = 4, kLayerPart = 8;
inline constexpr unsigned kAllParts = kEmbedPart | kHeadPart | kNormParts | kLayerPart;

/// Synthetic weights of `plan`'s shard; see docs/weights.md for the distributions. Each value
/// depends only on (seed, tensor, index), so a subset of `parts` holds the same values as the
/// whole.
MtpWeights synthesize_mtp_weights(const ModelConfig& cfg, const ShardPlan& plan, uint64_t seed,
                                  unsigned parts = kAllParts);

/// Reads `plan`'s shard from a checkpoint (a .safetensors file or a directory, see Checkpoint)
/// with the names of cfg (checkpoint.*). A missing tensor or a wrong shape is an error naming
/// the tensor, its file and the expected vs found shape.
MtpWeights load_mtp_weights(const ModelConfig& cfg, const ShardPlan& plan,
                            const std::string& checkpoint_path);

/// The checkpoint names and views of whole-model weights (plan.world == 1 and the whole vocab),
/// experts one tensor per expert, as load_mtp_weights expects them.
std::vector<TensorView> checkpoint_views(const ModelConfig& cfg, const MtpWeights& whole);

/// Writes whole-model weights as a checkpoint: one file when max_file_bytes == 0, else a
/// directory of files of at most max_file_bytes with model.safetensors.index.json.
void export_mtp_weights(const ModelConfig& cfg, const MtpWeights& whole, const std::string& path,
                        uint64_t max_file_bytes = 0);

/// Synthetic weights of trunk layer `index` (dense when cfg.dense_layer(index)) under `seed`: the
/// same canonical names, distributions and values as the block tensors of synthesize_mtp_weights
/// under that seed; the dense MLP's canonical names are mlp.{gate,up,down}_proj.weight.
LayerWeights synthesize_layer_weights(const ModelConfig& cfg, const ShardPlan& plan, int index,
                                      uint64_t seed);

/// The synthetic target's embedding, head rows and final norm (no layers): the embedding and
/// lm_head of synthesize_mtp_weights under `weight_seed` (the MTP layer reads the target's embedding
/// and head), the final norm the shared_head.norm values under `target_seed` (docs/weights.md).
TargetWeights synthesize_target_trunk(const ModelConfig& cfg, const ShardPlan& plan, uint64_t weight_seed,
                                      uint64_t target_seed);
/// The trunk behind an MTP layer's weights: `w`'s embedding and lm_head rows (its shard plan), and
/// the final norm synthetic under `target_seed` (as synthesize_target_trunk's). With synthetic `w`
/// of seed S it equals synthesize_target_trunk(cfg, w.plan, S, target_seed).
TargetWeights target_trunk_of(const ModelConfig& cfg, const MtpWeights& w, uint64_t target_seed);
/// The synthetic target of `layers` trunk layers: synthesize_target_trunk, and layer i from
/// synthesize_layer_weights under `target_seed + 1 + i`.
TargetWeights synthesize_target_weights(const ModelConfig& cfg, const ShardPlan& plan, int layers,
                                        uint64_t weight_seed, uint64_t target_seed);

/// Reads `plan`'s shard of the target's embedding, head rows and final norm (no layers) from a
/// checkpoint (the names of cfg: checkpoint.embed_tokens, .lm_head, .final_norm).
TargetWeights load_target_trunk(const ModelConfig& cfg, const ShardPlan& plan, const Checkpoint& ckpt);
/// Reads `plan`'s shard of trunk layer `index` (under cfg.layer_prefix(index); dense when
/// cfg.dense_layer(index)) from a checkpoint.
LayerWeights load_layer_weights(const ModelConfig& cfg, const ShardPlan& plan, int index,
                                const Checkpoint& ckpt);
/// load_target_trunk and the first `layers` trunk layers. A missing tensor or a wrong shape is an
/// error naming the tensor and the file (the checkpoint's).
TargetWeights load_target_weights(const ModelConfig& cfg, const ShardPlan& plan, int layers,
                                  const std::string& checkpoint_path);

/// The checkpoint names and views of a whole target (plan.world == 1, the whole vocab), experts one
/// tensor per expert, as load_target_weights expects them (the head once when it is the embedding).
std::vector<TensorView> target_checkpoint_views(const ModelConfig& cfg, const TargetWeights& whole);

/// Per-row FP8 E4M3 quantisation of a 2-D BF16 matrix: scale = amax / 448 (1 for an all-zero
/// row), weight = to_fp8e4m3(x / scale).
Fp8Rows quantize_rows_fp8(const TensorBF16& w);
/// Fills w.lm_head_fp8 from w.lm_head.
void quantize_head_fp8(MtpWeights& w);

}  // namespace mtplab::model
