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

// Columns: name, preset key, member, required, range, absent, in_identity, check, check_note,
// Hugging Face field, doc.
const ModelField kFields[] = {
    {"name", "name", &C::name, false, {}, std::nullopt, true, FieldCheck::none, nullptr,
     hf_none("the checkpoint directory's name"), "preset name, recorded with results; the file's stem when not given"},
    // ---- trunk
    {"hidden", "hidden", &C::hidden, true, ints(1, kMaxDim), std::nullopt, true, FieldCheck::positive, nullptr,
     hf_required("hidden_size"), "H, the model width"},
    {"vocab", "vocab", &C::vocab, true, ints(1, int64_t{1} << 26), std::nullopt, true, FieldCheck::positive,
     nullptr, hf_required("vocab_size"), "V, rows of embed_tokens and lm_head"},
    {"rms_norm_eps", "rms_norm_eps", &C::rms_norm_eps, true, reals(1e-12, 0.1), std::nullopt, true,
     FieldCheck::positive, nullptr, hf_required("rms_norm_eps"), "eps of every RMSNorm"},
    // ---- MLA attention
    {"n_heads", "n_heads", &C::n_heads, true, ints(1, 4096), std::nullopt, true, FieldCheck::positive, nullptr,
     hf_required("num_attention_heads"), "attention heads n_h"},
    {"qk_nope_head_dim", "qk_nope_head_dim", &C::qk_nope_head_dim, true, ints(1, 4096), std::nullopt, true,
     FieldCheck::positive, nullptr, hf_required("qk_nope_head_dim"), "per-head query/key width without RoPE"},
    {"qk_rope_head_dim", "qk_rope_head_dim", &C::qk_rope_head_dim, false, ints(0, 4096), std::nullopt, true,
     FieldCheck::zero, "RoPE is not implemented (GLM-5.3-Flash has none), set it to 0",
     HfField{HfRead::default_only, "qk_rope_head_dim", nullptr,
             "RoPE is not implemented (GLM-5.3-Flash has none); the MTP layer's queries and keys have no "
             "rotary part in mtplab"},
     "per-head RoPE width; must be 0 (the key exists for a GLM-5 preset)"},
    {"v_head_dim", "v_head_dim", &C::v_head_dim, true, ints(1, 4096), std::nullopt, true, FieldCheck::positive,
     nullptr, hf_required("v_head_dim"), "per-head value width"},
    {"q_lora_rank", "q_lora_rank", &C::q_lora_rank, true, ints(1, kMaxDim), std::nullopt, true,
     FieldCheck::positive, nullptr, hf_required("q_lora_rank"), "query latent width"},
    {"kv_lora_rank", "kv_lora_rank", &C::kv_lora_rank, true, ints(1, kMaxDim), std::nullopt, true,
     FieldCheck::positive, nullptr, hf_required("kv_lora_rank"), "KV latent width (one cached row per position)"},
    // ---- pooled lightning indexer
    {"index_n_heads", "index_n_heads", &C::index_n_heads, true, ints(1, 4096), std::nullopt, true,
     FieldCheck::positive, nullptr, hf_required("index_n_heads"), "indexer heads n_I"},
    {"index_head_dim", "index_head_dim", &C::index_head_dim, true, ints(1, 4096), std::nullopt, true,
     FieldCheck::positive, nullptr, hf_required("index_head_dim"), "indexer width D"},
    {"index_topk", "index_topk", &C::index_topk, true, ints(1, kMaxDim), std::nullopt, true, FieldCheck::positive,
     nullptr, hf_required("index_topk"), "K, rows selected per query; a multiple of index_kpool"},
    {"index_kpool", "index_kpool", &C::index_kpool, true, ints(1, 1024), std::nullopt, true, FieldCheck::positive,
     nullptr, hf_required("index_kpool"), "P, rows per pool"},
    {"index_norm_eps", "index_norm_eps", &C::index_norm_eps, false, reals(1e-12, 0.1), std::nullopt, true,
     FieldCheck::positive, nullptr, hf_none("transformers' indexer k_norm hard-codes LayerNorm(eps=1e-6), the default"),
     "eps of the indexer's k_norm LayerNorm"},
    // ---- MoE
    {"n_routed_experts", "n_routed_experts", &C::n_routed_experts, true, ints(1, 65536), std::nullopt, true,
     FieldCheck::positive, nullptr, HfField{HfRead::required, "n_routed_experts", "num_local_experts", nullptr},
     "E"},
    {"num_experts_per_tok", "num_experts_per_tok", &C::num_experts_per_tok, true, ints(1, 1024), std::nullopt, true,
     FieldCheck::positive, nullptr, hf_required("num_experts_per_tok"), "top-k experts per token"},
    {"n_shared_experts", "n_shared_experts", &C::n_shared_experts, true, ints(0, 64), std::nullopt, true,
     FieldCheck::non_negative, nullptr, hf_required("n_shared_experts"),
     "shared experts, fused into one MLP of n_shared_experts * moe_intermediate_size"},
    {"moe_intermediate_size", "moe_intermediate_size", &C::moe_intermediate_size, true, ints(1, kMaxDim),
     std::nullopt, true, FieldCheck::positive, nullptr, hf_required("moe_intermediate_size"),
     "I, each expert's intermediate width"},
    {"n_group", "n_group", &C::n_group, false, ints(1, 65536), std::nullopt, true, FieldCheck::positive, nullptr,
     hf_optional("n_group"), "router groups; must divide n_routed_experts"},
    {"topk_group", "topk_group", &C::topk_group, false, ints(1, 65536), std::nullopt, true, FieldCheck::positive,
     nullptr, hf_optional("topk_group"), "groups kept by the group limit; <= n_group"},
    {"routed_scaling_factor", "routed_scaling_factor", &C::routed_scaling_factor, true, reals(1e-6, 1e6),
     std::nullopt, true, FieldCheck::positive, nullptr, hf_required("routed_scaling_factor"),
     "scale of the normalised routing weights"},
    {"swiglu_limit", "swiglu_limit", &C::swiglu_limit, true, reals(0.0, 1e9), std::nullopt, true,
     FieldCheck::non_negative, " (0 disables the clamp)",
     HfField{HfRead::null_is_zero, "swiglu_limit", nullptr, "the SwiGLU clamp; null for none"},
     "L of the clamped SwiGLU; 0 disables the clamp"},
    // ---- context: the preset's max_seq_len is the requested length; the usable one is derived
    {"max_seq_len_requested", "max_seq_len", &C::max_seq_len_requested, false, ints(1, int64_t{1} << 26), 4096.0,
     false, FieldCheck::none, nullptr,
     hf_derived("max_position_embeddings", "min(4096, max_position_embeddings): mtplab's capacity is its own"),
     "requested context rows"},
    {"max_seq_len", nullptr, &C::max_seq_len, false, {}, std::nullopt, true, FieldCheck::positive, nullptr,
     hf_none("set_max_seq_len of the requested length"),
     "usable context rows: the requested length rounded down to whole pools"},
    {"block_size", "block_size", &C::block_size, false, ints(1, 1 << 16), std::nullopt, true, FieldCheck::positive,
     nullptr, hf_none("mtplab's own setting"), "rows per block of the paged latent KV cache"},
    // ---- checkpoint names (the `checkpoint:` mapping of a preset)
    {"mtp_layer_index", "checkpoint.mtp_layer_index", &C::mtp_layer_index, false, ints(0, 1 << 20), std::nullopt,
     true, FieldCheck::none, nullptr, hf_derived("num_hidden_layers", "the MTP layer follows the trunk's layers"),
     "index of the MTP layer in the checkpoint; -1 when mtp_prefix names no numbered layer"},
    {"embed_tokens_name", "checkpoint.embed_tokens", &C::embed_tokens_name, false, {}, std::nullopt, true,
     FieldCheck::none, nullptr, hf_derived("architectures", "the layout of the architecture's tensor names"),
     "the trunk's embedding"},
    {"lm_head_name", "checkpoint.lm_head", &C::lm_head_name, false, {}, std::nullopt, true, FieldCheck::none,
     nullptr, hf_derived("tie_word_embeddings", "the embedding when tied, else lm_head.weight"), "the trunk's head"},
    {"mtp_prefix", "checkpoint.mtp_prefix", &C::mtp_prefix, false, {}, std::nullopt, true, FieldCheck::none,
     nullptr, hf_derived("architectures", "the layout's layers.<mtp_layer_index>."),
     "prefix of the MTP layer's tensors; ends with '.'"},
};

}  // namespace

std::span<const ModelField> model_fields() { return kFields; }

const ModelField& model_field(const std::string& name) {
  for (const ModelField& f : kFields)
    if (name == f.name) return f;
  MTP_FAIL("ModelConfig has no field \"", name, "\"");
}

}  // namespace mtplab::model
