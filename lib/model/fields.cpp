// The rows of ModelConfig's field table (fields.hpp says who walks it). Ranges, defaults and
// notes are those of docs/model-config.md, "Keys" and "Hugging Face configs".
#include "model/fields.hpp"

#include "core/error.hpp"

namespace mtplab::model {
namespace {

using C = ModelConfig;
constexpr int64_t kMaxDim = 1 << 20;

FieldRange ints(int64_t lo, int64_t hi) { return FieldRange{lo, hi, 0, 0}; }
FieldRange reals(double lo, double hi) { return FieldRange{0, 0, lo, hi}; }
HfField hf_required(const char* key) { return HfField{HfRead::required, key, nullptr, nullptr}; }
HfField hf_optional(const char* key) { return HfField{HfRead::optional, key, nullptr, nullptr}; }
HfField hf_derived(const char* key, const char* note) { return HfField{HfRead::derived, key, nullptr, note}; }
HfField hf_none(const char* note) { return HfField{HfRead::none, nullptr, nullptr, note}; }
/// A preset key that must be given and positive, named as its member, read from config.json's
/// `hf_key`: the most common row.
ModelField required_positive(const char* name, FieldMember<C> member, FieldRange range, const char* hf_key,
                             const char* doc) {
  return ModelField{.name = name,
                    .key = name,
                    .member = member,
                    .required = true,
                    .range = range,
                    .check = FieldCheck::positive,
                    .hf = hf_required(hf_key),
                    .doc = doc};
}

// clang-format off
const ModelField kFields[] = {
    {.name = "name", .key = "name", .member = &C::name,
     .hf = hf_none("the checkpoint directory's name"),
     .doc = "preset name, recorded with results; the file's stem when not given"},
    // ---- trunk
    required_positive("hidden", &C::hidden, ints(1, kMaxDim), "hidden_size", "H, the model width"),
    required_positive("vocab", &C::vocab, ints(1, int64_t{1} << 26), "vocab_size",
                      "V, rows of embed_tokens and lm_head"),
    required_positive("rms_norm_eps", &C::rms_norm_eps, reals(1e-12, 0.1), "rms_norm_eps", "eps of every RMSNorm"),
    // ---- MLA attention
    required_positive("n_heads", &C::n_heads, ints(1, 4096), "num_attention_heads", "attention heads n_h"),
    required_positive("qk_nope_head_dim", &C::qk_nope_head_dim, ints(1, 4096), "qk_nope_head_dim",
                      "per-head query/key width without RoPE"),
    {.name = "qk_rope_head_dim", .key = "qk_rope_head_dim", .member = &C::qk_rope_head_dim,
     .range = ints(0, 4096),
     .check = FieldCheck::zero, .check_note = "RoPE is not implemented (GLM-5.3-Flash has none), set it to 0",
     .hf = {HfRead::default_only, "qk_rope_head_dim", nullptr,
            "RoPE is not implemented (GLM-5.3-Flash has none); the MTP layer's queries and keys have no "
            "rotary part in mtplab"},
     .doc = "per-head RoPE width; must be 0 (the key exists for a GLM-5 preset)"},
    required_positive("v_head_dim", &C::v_head_dim, ints(1, 4096), "v_head_dim", "per-head value width"),
    required_positive("q_lora_rank", &C::q_lora_rank, ints(1, kMaxDim), "q_lora_rank", "query latent width"),
    required_positive("kv_lora_rank", &C::kv_lora_rank, ints(1, kMaxDim), "kv_lora_rank",
                      "KV latent width (one cached row per position)"),
    // ---- pooled lightning indexer
    required_positive("index_n_heads", &C::index_n_heads, ints(1, 4096), "index_n_heads", "indexer heads n_I"),
    required_positive("index_head_dim", &C::index_head_dim, ints(1, 4096), "index_head_dim", "indexer width D"),
    required_positive("index_topk", &C::index_topk, ints(1, kMaxDim), "index_topk",
                      "K, rows selected per query; a multiple of index_kpool"),
    required_positive("index_kpool", &C::index_kpool, ints(1, 1024), "index_kpool", "P, rows per pool"),
    {.name = "index_norm_eps", .key = "index_norm_eps", .member = &C::index_norm_eps,
     .range = reals(1e-12, 0.1), .check = FieldCheck::positive,
     .hf = hf_none("transformers' indexer k_norm hard-codes LayerNorm(eps=1e-6), the default"),
     .doc = "eps of the indexer's k_norm LayerNorm"},
    // ---- MoE
    {.name = "n_routed_experts", .key = "n_routed_experts", .member = &C::n_routed_experts, .required = true,
     .range = ints(1, 65536), .check = FieldCheck::positive,
     .hf = {HfRead::required, "n_routed_experts", "num_local_experts", nullptr},
     .doc = "E, the routed experts"},
    required_positive("num_experts_per_tok", &C::num_experts_per_tok, ints(1, 1024), "num_experts_per_tok",
                      "top-k experts per token"),
    {.name = "n_shared_experts", .key = "n_shared_experts", .member = &C::n_shared_experts, .required = true,
     .range = ints(0, 64), .check = FieldCheck::non_negative, .hf = hf_required("n_shared_experts"),
     .doc = "shared experts, fused into one MLP of n_shared_experts * moe_intermediate_size"},
    required_positive("moe_intermediate_size", &C::moe_intermediate_size, ints(1, kMaxDim), "moe_intermediate_size",
                      "I, each expert's intermediate width"),
    {.name = "n_group", .key = "n_group", .member = &C::n_group, .range = ints(1, 65536),
     .check = FieldCheck::positive, .hf = hf_optional("n_group"),
     .doc = "router groups; must divide n_routed_experts"},
    {.name = "topk_group", .key = "topk_group", .member = &C::topk_group, .range = ints(1, 65536),
     .check = FieldCheck::positive, .hf = hf_optional("topk_group"),
     .doc = "groups kept by the group limit; <= n_group"},
    required_positive("routed_scaling_factor", &C::routed_scaling_factor, reals(1e-6, 1e6), "routed_scaling_factor",
                      "scale of the normalised routing weights"),
    {.name = "swiglu_limit", .key = "swiglu_limit", .member = &C::swiglu_limit, .required = true,
     .range = reals(0.0, 1e9), .check = FieldCheck::non_negative, .check_note = " (0 disables the clamp)",
     .hf = {HfRead::null_is_zero, "swiglu_limit", nullptr, "the SwiGLU clamp; null for none"},
     .doc = "L of the clamped SwiGLU; 0 disables the clamp"},
    // ---- context: a preset's max_seq_len is the requested length; the usable one is derived
    {.name = "max_seq_len_requested", .key = "max_seq_len", .member = &C::max_seq_len_requested,
     .range = ints(1, int64_t{1} << 26), .absent = 4096.0, .in_identity = false,
     .hf = hf_derived("max_position_embeddings", "min(4096, it): the capacity is mtplab's own setting"),
     .doc = "requested context rows"},
    {.name = "max_seq_len", .key = nullptr, .member = &C::max_seq_len, .check = FieldCheck::positive,
     .hf = hf_none("set_max_seq_len of the requested length"),
     .doc = "usable context rows: the requested length rounded down to whole pools"},
    {.name = "block_size", .key = "block_size", .member = &C::block_size, .range = ints(1, 1 << 16),
     .check = FieldCheck::positive, .hf = hf_none("mtplab's own setting"),
     .doc = "rows per block of the paged latent KV cache"},
    // ---- the target's trunk (docs/target.md): not in the identity, a replay point does not run it
    {.name = "num_hidden_layers", .key = "num_hidden_layers", .member = &C::num_hidden_layers,
     .range = ints(0, 1 << 20), .in_identity = false, .check = FieldCheck::non_negative,
     .hf = hf_derived("num_hidden_layers", "the field that places the MTP layer after the trunk"),
     .doc = "the trunk's layers (0: not given); a target may run fewer"},
    {.name = "first_k_dense_replace", .key = "first_k_dense_replace", .member = &C::first_k_dense_replace,
     .range = ints(0, 1 << 20), .in_identity = false, .check = FieldCheck::non_negative,
     .hf = hf_derived("first_k_dense_replace", "or the leading \"dense\" entries of mlp_layer_types"),
     .doc = "trunk layers 0 .. first_k_dense_replace - 1 have a dense MLP instead of routed experts"},
    {.name = "intermediate_size", .key = "intermediate_size", .member = &C::intermediate_size,
     .range = ints(0, kMaxDim), .in_identity = false, .check = FieldCheck::non_negative,
     .hf = hf_optional("intermediate_size"),
     .doc = "the dense MLP's intermediate width; > 0 when first_k_dense_replace > 0"},
    // ---- checkpoint names (a preset's `checkpoint:` mapping)
    {.name = "mtp_layer_index", .key = "checkpoint.mtp_layer_index", .member = &C::mtp_layer_index,
     .range = ints(0, 1 << 20),
     .hf = hf_derived("num_hidden_layers", "the MTP layer follows the trunk's layers"),
     .doc = "index of the MTP layer in the checkpoint; -1 when mtp_prefix names no numbered layer"},
    {.name = "embed_tokens_name", .key = "checkpoint.embed_tokens", .member = &C::embed_tokens_name,
     .hf = hf_derived("architectures", "the layout of the architecture's tensor names"),
     .doc = "the trunk's embedding"},
    {.name = "lm_head_name", .key = "checkpoint.lm_head", .member = &C::lm_head_name,
     .hf = hf_derived("tie_word_embeddings", "the embedding when tied, else lm_head.weight"),
     .doc = "the trunk's head"},
    {.name = "mtp_prefix", .key = "checkpoint.mtp_prefix", .member = &C::mtp_prefix,
     .hf = hf_derived("architectures", "the layout's layers.<mtp_layer_index>."),
     .doc = "prefix of the MTP layer's tensors; ends with '.'"},
    {.name = "layers_prefix", .key = "checkpoint.layers_prefix", .member = &C::layers_prefix, .in_identity = false,
     .hf = hf_derived("architectures", "the layout's layers."),
     .doc = "prefix of the trunk's layers: layer i's tensors are under layers_prefix + i + '.'"},
    {.name = "final_norm_name", .key = "checkpoint.final_norm", .member = &C::final_norm_name, .in_identity = false,
     .hf = hf_derived("architectures", "the layout's norm.weight"), .doc = "the trunk's final RMSNorm"},
};
// clang-format on

}  // namespace

std::span<const ModelField> model_fields() { return kFields; }

const ModelField& model_field(const std::string& name) {
  for (const ModelField& f : kFields)
    if (name == f.name) return f;
  MTP_FAIL("ModelConfig has no field \"", name, "\"");
}

}  // namespace mtplab::model
