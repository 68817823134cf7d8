// ModelConfig: every size of the MTP layer of a GLM-5.3-Flash-class model (docs/model.md, "Sizes"),
// read strictly from a YAML preset (configs/<name>.yaml) or from a checkpoint's Hugging Face
// config.json (a glm5_next config; docs/model-config.md lists every key and every field). The
// fields are described once, in the table of model/fields.hpp, which the readers, validate() and
// the writers walk: a new member is a new row there.
//
// Invariants after a successful load (checked again, with the rank counts, by validate(tp, ep)):
// - index_topk is a whole number of pools (index_topk % index_kpool == 0);
// - max_seq_len is the usable capacity: the requested length rounded down to whole pools, > 0;
// - n_group divides n_routed_experts, topk_group <= n_group, num_experts_per_tok fits in the
//   experts the group limit keeps;
// - qk_rope_head_dim == 0 (GLM-5.3-Flash has no RoPE; the field exists for a GLM-5 preset);
// - checkpoint.mtp_layer_index and checkpoint.mtp_prefix agree when both are given (the prefix
//   ends with "layers.<index>.").
// - first_k_dense_replace <= num_hidden_layers (when given), and intermediate_size > 0 when a
//   layer is dense.
// Every error names the file, the key, its line and column when the value came from a file.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/yaml.hpp"

namespace mtplab::model {

struct ModelConfig {
  std::string name;    ///< preset name ("tiny", "glm5.3-flash"); the file stem when not given
  std::string source;  ///< the file it was read from, "" when built in code
  /// "yaml" (a mtplab preset or mapping) or "hf" (a Hugging Face config.json, `source`).
  std::string source_format = "yaml";

  // ---- trunk ----------------------------------------------------------------------------------
  int hidden = 0;  ///< H
  int vocab = 0;   ///< V
  float rms_norm_eps = 1e-5f;

  // ---- MLA attention --------------------------------------------------------------------------
  int n_heads = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;  ///< 0 for GLM-5.3-Flash; anything else is refused by validate()
  int v_head_dim = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;

  // ---- pooled lightning indexer ---------------------------------------------------------------
  int index_n_heads = 0;         ///< n_I
  int index_head_dim = 0;        ///< D
  int index_topk = 0;            ///< K, rows selected (a whole number of pools)
  int index_kpool = 0;           ///< P, rows per pool
  float index_norm_eps = 1e-6f;  ///< eps of the indexer's k_norm LayerNorm

  // ---- MoE ------------------------------------------------------------------------------------
  int n_routed_experts = 0;       ///< E
  int num_experts_per_tok = 0;    ///< top-k
  int n_shared_experts = 0;       ///< fused into one MLP of n_shared_experts * I columns
  int moe_intermediate_size = 0;  ///< I
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling_factor = 1.0f;
  float swiglu_limit = 0.0f;  ///< L; 0 disables the clamp

  // ---- context --------------------------------------------------------------------------------
  int max_seq_len_requested = 0;  ///< as written in the preset
  int max_seq_len = 0;            ///< usable rows: max_seq_len_requested rounded down to whole pools
  int block_size = 64;            ///< rows per block of the paged latent KV cache

  // ---- the target's trunk (docs/target.md) ---------------------------------------------------
  int num_hidden_layers = 0;      ///< the trunk's layers (0: not given); the MTP layer follows them
  int first_k_dense_replace = 0;  ///< trunk layers 0 .. first_k_dense_replace - 1 have a dense MLP
  int intermediate_size = 0;      ///< the dense MLP's intermediate width (0: no dense layer)

  // ---- checkpoint names -----------------------------------------------------------------------
  int mtp_layer_index = 45;  ///< -1 when mtp_prefix names no numbered layer
  std::string embed_tokens_name = "model.language_model.embed_tokens.weight";
  std::string lm_head_name = "lm_head.weight";
  std::string mtp_prefix = "model.language_model.layers.45.";  ///< ends with '.'
  /// Trunk layer i's tensors are under layers_prefix + i + '.' (ends with '.').
  std::string layers_prefix = "model.language_model.layers.";
  std::string final_norm_name = "model.language_model.norm.weight";  ///< the trunk's final RMSNorm

  // ---- derived sizes --------------------------------------------------------------------------
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  /// Rows of kv_b_proj per head: [k_nope ; v].
  int kv_b_head_rows() const { return qk_nope_head_dim + v_head_dim; }
  /// Rows of kv_a_proj_with_mqa: the latent plus the shared rope key.
  int kv_a_rows() const { return kv_lora_rank + qk_rope_head_dim; }
  /// Intermediate size of the fused shared-expert MLP (0 when there is none).
  int shared_intermediate() const { return n_shared_experts * moe_intermediate_size; }
  /// Complete pools the context can hold.
  int max_pools() const { return index_kpool > 0 ? max_seq_len / index_kpool : 0; }
  /// Width of the selection S(p): K selected rows plus the incomplete tail (at most P - 1).
  int selection_width() const { return index_topk + index_kpool - 1; }
  /// Blocks of block_size rows that hold max_seq_len rows.
  int kv_blocks() const { return block_size > 0 ? (max_seq_len + block_size - 1) / block_size : 0; }
  /// 1 / sqrt(qk_head_dim), the attention softmax scale.
  float softmax_scale() const;
  /// Whether trunk layer i has a dense MLP (gate / up / down of intermediate_size) instead of
  /// routed experts.
  bool dense_layer(int i) const { return i < first_k_dense_replace; }
  /// The checkpoint prefix of trunk layer i: layers_prefix + i + '.'.
  std::string layer_prefix(int i) const { return layers_prefix + std::to_string(i) + "."; }

  /// Sets the requested length and the usable (pool-rounded) capacity together; for configs
  /// built in code. Throws when fewer than one pool remains.
  void set_max_seq_len(int requested);

  /// Checks every invariant for `tp` attention ranks and `ep` expert ranks; throws an Error
  /// naming the key (and its file:line:col when it came from a file). Rules:
  /// - n_heads % tp == 0 (every rank runs the same head count; production TP always divides);
  /// - experts may split unevenly over ep (the first E % ep ranks own one more): routing is
  ///   replicated and the partial outputs are summed, so any partition is exact; each rank
  ///   must own at least one expert (ep <= E).
  void validate(int tp, int ep) const;

  /// "file:line:col: key" for a key read from a file, else "model config <name>: key".
  std::string where(const std::string& key) const;

  /// One line: the main sizes, for logs.
  std::string summary() const;

  /// Locations of the keys read from YAML (key path -> "file:line:col: path").
  std::map<std::string, std::string> key_locations;

  /// Field by field (key_locations included: two configs read from different places compare
  /// unequal, which costs a cache reload at worst).
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

/// Reads a ModelConfig from a mapping (a preset file's root, or a `model:` mapping inlined in
/// an experiment). Unknown keys, missing required keys, wrong types and out-of-range values
/// are errors; the structural invariants are checked with validate(1, 1).
ModelConfig parse_model_config(const YamlNode& node);
/// Reads a preset file.
ModelConfig load_model_config(const std::string& path);
/// Reads a checkpoint's Hugging Face config: `path` is the checkpoint directory (its config.json)
/// or the config.json itself. model_type glm5_next (the text fields at the top or nested under
/// text_config) or glm5_next_text. Sizes, eps, the MTP layer index (num_hidden_layers) and the
/// checkpoint tensor names are derived from it; a field whose value mtplab does not implement is
/// an error naming the field and the value, and every other field must be one that is ignored on
/// purpose (docs/model-config.md, "Hugging Face configs"): an unknown field is an error too. The
/// result is validate(1, 1)-checked; its errors point at the config.json field.
ModelConfig load_hf_config(const std::string& path);
/// `name_or_path` is a checkpoint directory or a .json file (load_hf_config), a YAML file path
/// (contains '/' or ends with .yaml/.yml), or a preset name found as configs/<name>.yaml under
/// $MTPLAB_SOURCE_DIR, else under the source tree mtplab was built from (a bare name that is no
/// preset but a directory is read as a checkpoint directory).
ModelConfig load_model_preset(const std::string& name_or_path);
/// The configs/ directory load_model_preset searches.
std::string presets_dir();
/// The config as a mtplab preset mapping (every key of docs/model-config.md, `checkpoint:`
/// included): parse_model_config of it gives back the same sizes and names. What an experiment's
/// `{preset: DIR, KEY: VALUE}` merges its overrides into when the preset is a Hugging Face config.
YAML::Node to_preset_yaml(const ModelConfig& cfg);

}  // namespace mtplab::model
