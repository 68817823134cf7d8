// A checkpoint's Hugging Face config.json (transformers' glm5_next family) read into a
// ModelConfig. JSON is read by the strict YAML reader (JSON is YAML's flow style), so every
// message names the file, line, column and the field's path (`text_config.hidden_act`).
//
// Invariants (docs/model-config.md, "Hugging Face configs"):
// - every field is read, checked against what mtplab implements, or listed below as ignored on
//   purpose (it does not change the MTP layer); any other field is an error naming it and its
//   value, so a new field is never silently dropped;
// - a field that changes the MTP layer and that transformers would fill with a default (which has
//   changed between releases) is required;
// - the tensor names follow the architecture (architectures[0], else model_type), the MTP layer is
//   the layer after the trunk's num_hidden_layers, and every value's location is recorded so that
//   validate() blames the config.json field.
#include <algorithm>
#include <filesystem>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "core/json.hpp"
#include "model/config.hpp"

namespace mtplab::model {
namespace {

namespace fs = std::filesystem;

// The layout of the trunk's tensor names, by architecture (the class save_pretrained records).
struct Layout {
  const char* architecture;
  const char* prefix;  ///< before embed_tokens.weight and layers.<i>.
};
constexpr Layout kLayouts[] = {
    {"Glm5NextForConditionalGeneration", "model.language_model."},
    {"Glm5NextForCausalLM", "model."},
    {"Glm5NextTextForCausalLM", "model."},
};

// Fields of the text config that do not change the MTP layer (why: docs/model-config.md).
const std::set<std::string>& ignored_text_fields() {
  static const std::set<std::string> s = {
      // the trunk's per-layer schedules and its other layer kinds (the MTP layer is one DSA + MoE
      // layer with its own indexer, no hyper-connections)
      "layer_types", "mlp_layer_types", "indexer_types", "index_topk_pattern", "index_topk_freq",
      "index_skip_topk_offset", "first_k_dense_replace", "moe_layer_freq", "linear_head_dim",
      "linear_num_heads", "linear_conv_kernel_dim", "linear_lower_bound", "linear_attn_config", "hc_mult",
      "hc_eps", "hc_sinkhorn_iters", "intermediate_size",
      // derived by transformers from qk_rope_head_dim (it replaces any value given)
      "head_dim",
      // RoPE settings: no RoPE while qk_rope_head_dim is 0 (anything else is refused)
      "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "rope_interleave",
      // training, cache and engine settings
      "initializer_range", "use_cache", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha",
      "seq_aux", "attention_dropout", "ep_size", "pad_token_id", "bos_token_id", "eos_token_id",
      "sep_token_id", "decoder_start_token_id"};
  return s;
}

// transformers' PreTrainedConfig fields, at any level: bookkeeping, output switches, dtype (the
// loader converts each tensor from the dtype its file records) and legacy generation defaults.
const std::set<std::string>& ignored_generic_fields() {
  static const std::set<std::string> s = {"transformers_version",
                                          "_name_or_path",
                                          "_commit_hash",
                                          "auto_map",
                                          "dtype",
                                          "torch_dtype",
                                          "use_bfloat16",
                                          "return_dict",
                                          "output_hidden_states",
                                          "output_attentions",
                                          "torchscript",
                                          "tf_legacy_loss",
                                          "pruned_heads",
                                          "chunk_size_feed_forward",
                                          "is_encoder_decoder",
                                          "is_decoder",
                                          "cross_attention_hidden_size",
                                          "add_cross_attention",
                                          "tie_encoder_decoder",
                                          "finetuning_task",
                                          "id2label",
                                          "label2id",
                                          "num_labels",
                                          "task_specific_params",
                                          "problem_type",
                                          "tokenizer_class",
                                          "prefix",
                                          "_attn_implementation",
                                          "_experts_implementation",
                                          "_attn_implementation_autoset",
                                          "max_length",
                                          "min_length",
                                          "do_sample",
                                          "early_stopping",
                                          "num_beams",
                                          "num_beam_groups",
                                          "diversity_penalty",
                                          "temperature",
                                          "top_k",
                                          "top_p",
                                          "typical_p",
                                          "repetition_penalty",
                                          "length_penalty",
                                          "no_repeat_ngram_size",
                                          "encoder_no_repeat_ngram_size",
                                          "bad_words_ids",
                                          "num_return_sequences",
                                          "output_scores",
                                          "return_dict_in_generate",
                                          "forced_bos_token_id",
                                          "forced_eos_token_id",
                                          "remove_invalid_values",
                                          "exponential_decay_length_penalty",
                                          "suppress_tokens",
                                          "begin_suppress_tokens"};
  return s;
}

// Fields of the composite (multimodal) config outside text_config: the vision tower and its
// special tokens.
const std::set<std::string>& ignored_composite_fields() {
  static const std::set<std::string> s = {
      "vision_config",        "image_token_id",     "video_token_id",
      "image_start_token_id", "image_end_token_id", "video_start_token_id",
      "video_end_token_id",   "image_token_index",  "video_token_index"};
  return s;
}

std::string value_text(const YamlNode& n) {
  if (n.is_null()) return "null";
  if (n.is_scalar()) return str("\"", n.raw().Scalar(), "\"");
  if (n.is_sequence()) {
    std::vector<std::string> items;
    for (const YamlNode& item : n.items()) {
      if (items.size() == 4) {
        items.push_back("...");
        break;
      }
      items.push_back(item.is_scalar() ? item.raw().Scalar() : "...");
    }
    return str("[", join(items, ", "), "]");
  }
  return "{...}";
}

/// Reads the fields of one JSON object: typed reads record where each value came from; finish()
/// refuses every field nobody read and nobody listed as ignored.
class Fields {
 public:
  Fields(const YamlNode& node, ModelConfig& cfg) : node_(node), cfg_(cfg) {
    MapReader check(node);  // duplicate keys are refused here
    (void)check;
  }

  /// The field, null included (nullopt only when absent); marks it read.
  std::optional<YamlNode> get(const std::string& key) {
    read_.insert(key);
    for (const auto& [k, v] : node_.entries())
      if (k == key) return v;
    return std::nullopt;
  }
  bool has(const std::string& key) const {
    for (const auto& [k, v] : node_.entries())
      if (k == key) return true;
    return false;
  }
  YamlNode req(const std::string& key, const char* why = nullptr) {
    auto n = get(key);
    if (!n)
      node_.fail(
          str("missing field \"", key, "\"",
              why ? str(" (", why, ")")
                  : std::string(" (mtplab needs it; transformers would fill in a default that has changed "
                                "between releases, so it must be written)")));
    if (n->is_null()) n->fail(str("is null; mtplab needs a value"));
    return *n;
  }
  int req_int(const std::string& key, const char* member, int64_t lo, int64_t hi) {
    const YamlNode n = req(key);
    note(member, n);
    return static_cast<int>(n.as_int(lo, hi));
  }
  float req_float(const std::string& key, const char* member, double lo, double hi) {
    const YamlNode n = req(key);
    note(member, n);
    return static_cast<float>(n.as_double(lo, hi));
  }
  /// An optional integer; when present (not null) read into dst.
  bool opt_int(const std::string& key, const char* member, int& dst, int64_t lo, int64_t hi) {
    auto n = get(key);
    if (!n || n->is_null()) return false;
    note(member, *n);
    dst = static_cast<int>(n->as_int(lo, hi));
    return true;
  }
  /// An optional boolean that mtplab implements only at `supported` (its default).
  void opt_bool_must_be(const std::string& key, bool supported, const char* why) {
    auto n = get(key);
    if (!n || n->is_null()) return;
    if (n->as_bool() != supported) n->fail(str("value ", value_text(*n), " is not supported: ", why));
  }
  /// An optional string that mtplab implements only as `supported` (its default).
  void opt_string_must_be(const std::string& key, const std::string& supported, const char* why) {
    auto n = get(key);
    if (!n || n->is_null()) return;
    if (n->as_string() != supported) n->fail(str("value ", value_text(*n), " is not supported: ", why));
  }
  void ignore(const std::set<std::string>& keys) {
    for (const auto& k : keys) read_.insert(k);
  }
  void note(const char* member, const YamlNode& n) { cfg_.key_locations[member] = n.where(); }

  /// Refuses every field not read and not ignored, naming it and its value.
  void finish(const char* what) const {
    for (const auto& [k, v] : node_.entries()) {
      if (read_.count(k)) continue;
      v.fail(str("field \"", k, "\" (value ", value_text(v), ") is not known to mtplab's ", what,
                 " reader: it is neither read nor ignored on purpose (docs/model-config.md, \"Hugging Face "
                 "configs\", lists both); a field that does not change the MTP layer belongs in the ignored "
                 "lists of lib/model/hf_config.cpp (until then, remove it from a copy of the config)"));
    }
  }

  const YamlNode& node() const { return node_; }

 private:
  YamlNode node_;
  ModelConfig& cfg_;
  std::set<std::string> read_;
};

/// quantization_config: the FP8 block format the loader dequantises (E4M3, 128 x 128 scales).
void check_quantization(const YamlNode& q) {
  if (q.is_null()) return;
  ModelConfig scratch;
  Fields f(q, scratch);
  const YamlNode method = f.req("quant_method", "which quantisation the checkpoint uses");
  if (method.as_string() != "fp8")
    method.fail(str("value ", value_text(method),
                    " is not supported: the loader reads BF16 / F16 / F32 tensors and FP8 (E4M3) with "
                    "128 x 128 block scales (quant_method \"fp8\")"));
  if (auto b = f.get("weight_block_size"); b && !b->is_null()) {
    const auto items = b->items();
    if (items.size() != 2 || items[0].as_int() != 128 || items[1].as_int() != 128)
      b->fail(
          str("value ", value_text(*b), " is not supported: the loader's FP8 block scales are 128 x 128"));
  }
  f.opt_string_must_be("fmt", "e4m3", "the loader reads FP8 E4M3 weights");
  // activation_scheme: the drafter runs activations in BF16 whatever the engine quantised them to;
  // modules_to_not_convert: each tensor is read in the dtype its file records.
  f.ignore({"activation_scheme", "modules_to_not_convert", "ignored_layers"});
  f.finish("quantization_config");
}

}  // namespace

ModelConfig load_hf_config(const std::string& path) {
  std::error_code ec;
  const bool dir = fs::is_directory(path, ec);
  const std::string file = dir ? (fs::path(path) / "config.json").string() : path;
  MTP_REQUIRE(fs::is_regular_file(file, ec), file, ": no such file",
              dir ? " (a checkpoint directory needs the config.json of its Hugging Face release)" : "");
  const YamlNode root = json::load_as_yaml(file);  // strict JSON (core/json.hpp), read as YAML
  MTP_REQUIRE(root.is_map(), file, ": a Hugging Face config is a JSON object");

  ModelConfig c;
  c.source = file;
  c.source_format = "hf";
  {
    const fs::path parent = fs::absolute(fs::path(file), ec).parent_path();
    c.name = parent.filename().string();
    if (c.name.empty()) c.name = "hf-config";
  }

  Fields top(root, c);
  const YamlNode model_type = top.req("model_type", "which transformers model the config describes");
  const std::string type = model_type.as_string();
  if (type != "glm5_next" && type != "glm5_next_text")
    model_type.fail(
        str("value ", value_text(model_type),
            " is not supported: mtplab reads the GLM-5.x MTP layer of glm5_next (or glm5_next_text) "
            "configs, the pooled-indexer DSA attention with MoE"));

  // The text fields: nested under text_config, or at the top (a flat glm5_next or a text config).
  std::optional<YamlNode> nested;
  if (type == "glm5_next") {
    if (auto t = top.get("text_config"); t && !t->is_null()) nested = *t;
  }
  Fields text_nested = nested ? Fields(*nested, c) : Fields(root, c);
  Fields& text = nested ? text_nested : top;
  if (nested) {
    text.opt_string_must_be("model_type", "glm5_next_text",
                            "a glm5_next config's text_config is glm5_next_text");
    top.ignore(ignored_composite_fields());
  } else if (type == "glm5_next") {
    top.ignore(ignored_composite_fields());  // a flat glm5_next may still describe its vision tower
  }

  // Sizes.
  c.vocab = text.req_int("vocab_size", "vocab", 1, int64_t{1} << 26);
  c.hidden = text.req_int("hidden_size", "hidden", 1, 1 << 20);
  c.rms_norm_eps = text.req_float("rms_norm_eps", "rms_norm_eps", 1e-12, 0.1);
  c.n_heads = text.req_int("num_attention_heads", "n_heads", 1, 4096);
  if (auto kv = text.get("num_key_value_heads"); kv && !kv->is_null()) {
    if (kv->as_int() != c.n_heads)
      kv->fail(str("value ", value_text(*kv), " is not supported: MLA gives every one of the ", c.n_heads,
                   " heads its own key and value from the latent, so num_key_value_heads must equal "
                   "num_attention_heads"));
  }
  c.qk_nope_head_dim = text.req_int("qk_nope_head_dim", "qk_nope_head_dim", 1, 4096);
  if (auto rope = text.get("qk_rope_head_dim"); rope && !rope->is_null()) {
    text.note("qk_rope_head_dim", *rope);
    if (rope->as_int(0, 4096) != 0)
      rope->fail(str("value ", value_text(*rope),
                     " is not supported: RoPE is not implemented (GLM-5.3-Flash has none); the MTP layer's "
                     "queries and keys have no rotary part in mtplab"));
  }
  c.v_head_dim = text.req_int("v_head_dim", "v_head_dim", 1, 4096);
  if (auto q = text.get("qk_head_dim"); q && !q->is_null()) {
    if (q->as_int() != c.qk_head_dim())
      q->fail(str("value ", value_text(*q),
                  " disagrees with qk_nope_head_dim + qk_rope_head_dim = ", c.qk_head_dim()));
  }
  c.q_lora_rank = text.req_int("q_lora_rank", "q_lora_rank", 1, 1 << 20);
  c.kv_lora_rank = text.req_int("kv_lora_rank", "kv_lora_rank", 1, 1 << 20);
  text.opt_bool_must_be("attention_bias", false, "the MLA projections have no biases in mtplab");

  c.index_n_heads = text.req_int("index_n_heads", "index_n_heads", 1, 4096);
  c.index_head_dim = text.req_int("index_head_dim", "index_head_dim", 1, 4096);
  c.index_topk = text.req_int("index_topk", "index_topk", 1, 1 << 20);
  c.index_kpool = text.req_int("index_kpool", "index_kpool", 1, 1024);
  text.opt_bool_must_be("index_kpool_always_select_tail", true,
                        "mtplab's selection always appends the query's incomplete pool (the tail)");
  c.index_norm_eps = 1e-6f;  // transformers' indexer k_norm hard-codes LayerNorm(eps=1e-6)

  // MoE: n_routed_experts, or its alias num_local_experts.
  {
    auto routed = text.get("n_routed_experts");
    auto local = text.get("num_local_experts");
    if (routed && !routed->is_null()) {
      text.note("n_routed_experts", *routed);
      c.n_routed_experts = static_cast<int>(routed->as_int(1, 65536));
      if (local && !local->is_null() && local->as_int() != c.n_routed_experts)
        local->fail(
            str("value ", value_text(*local), " disagrees with n_routed_experts ", c.n_routed_experts));
    } else if (local && !local->is_null()) {
      text.note("n_routed_experts", *local);
      c.n_routed_experts = static_cast<int>(local->as_int(1, 65536));
    } else {
      text.req("n_routed_experts");  // the missing-field error
    }
  }
  c.num_experts_per_tok = text.req_int("num_experts_per_tok", "num_experts_per_tok", 1, 1024);
  c.n_shared_experts = text.req_int("n_shared_experts", "n_shared_experts", 0, 64);
  c.moe_intermediate_size = text.req_int("moe_intermediate_size", "moe_intermediate_size", 1, 1 << 20);
  text.opt_int("n_group", "n_group", c.n_group, 1, 65536);
  text.opt_int("topk_group", "topk_group", c.topk_group, 1, 65536);
  c.routed_scaling_factor = text.req_float("routed_scaling_factor", "routed_scaling_factor", 1e-6, 1e6);
  {
    auto n = text.get("swiglu_limit");
    if (!n) text.req("swiglu_limit", "the SwiGLU clamp; null for none");
    text.note("swiglu_limit", *n);
    c.swiglu_limit = n->is_null() ? 0.0f : static_cast<float>(n->as_double(0.0, 1e9));
  }
  text.opt_bool_must_be("norm_topk_prob", true, "mtplab normalises the top-k routing weights");
  text.opt_string_must_be("hidden_act", "silu", "the experts' SwiGLU uses SiLU");
  text.opt_string_must_be("scoring_func", "sigmoid", "the router scores experts with a sigmoid");
  text.opt_string_must_be("topk_method", "noaux_tc",
                          "the router picks the top-k of sigmoid + e_score_correction_bias");

  // The MTP layer follows the trunk's layers; one MTP layer.
  const YamlNode layers = text.req("num_hidden_layers");
  c.mtp_layer_index = static_cast<int>(layers.as_int(0, 1 << 20));
  text.note("checkpoint.mtp_layer_index", layers);
  text.note("checkpoint.mtp_prefix", layers);
  if (auto n = text.get("num_nextn_predict_layers"); n && !n->is_null()) {
    const int64_t v = n->as_int();
    if (v != 1)
      n->fail(str("value ", value_text(*n), " is not supported: mtplab drafts with one MTP layer (layer ",
                  c.mtp_layer_index, "), chained; ",
                  v == 0 ? "this checkpoint has none" : "a checkpoint with several is not implemented"));
  }

  // Context: mtplab's capacity is its own setting (the caches are allocated whole), at most the
  // model's; override it with {preset: DIR, max_seq_len: N}.
  int requested = 4096;
  if (auto n = text.get("max_position_embeddings"); n && !n->is_null()) {
    requested = static_cast<int>(std::min<int64_t>(requested, n->as_int(1, INT64_MAX)));
    text.note("max_seq_len", *n);
  }
  c.set_max_seq_len(requested);

  // Tensor names.
  std::string layout;
  std::string layout_where;
  if (auto arch = top.get("architectures"); arch && !arch->is_null()) {
    const auto items = arch->items();
    if (items.empty()) arch->fail("is empty");
    const std::string a = items[0].as_string();
    for (const Layout& l : kLayouts)
      if (a == l.architecture) layout = l.prefix;
    if (layout.empty()) {
      std::vector<std::string> known;
      for (const Layout& l : kLayouts) known.push_back(str(l.architecture, " (", l.prefix, "*)"));
      items[0].fail(str("architecture \"", a, "\" is not supported: mtplab knows the tensor names of ",
                        join(known, ", ")));
    }
    layout_where = items[0].where();
  } else {
    layout = type == "glm5_next" ? "model.language_model." : "model.";
    layout_where = model_type.where();
  }
  bool tied = false;
  {
    std::optional<bool> at_top, in_text;
    if (auto n = top.get("tie_word_embeddings"); n && !n->is_null()) at_top = n->as_bool();
    if (nested)
      if (auto n = text.get("tie_word_embeddings"); n && !n->is_null()) in_text = n->as_bool();
    if (at_top && in_text && *at_top != *in_text)
      top.node().fail("tie_word_embeddings differs between the top level and text_config");
    tied = at_top.value_or(in_text.value_or(false));
  }
  c.embed_tokens_name = layout + "embed_tokens.weight";
  c.lm_head_name = tied ? c.embed_tokens_name : "lm_head.weight";
  c.mtp_prefix = str(layout, "layers.", c.mtp_layer_index, ".");
  c.key_locations["checkpoint.embed_tokens"] = layout_where;
  c.key_locations["checkpoint.lm_head"] = layout_where;

  if (auto q = top.get("quantization_config")) check_quantization(*q);
  if (nested)
    if (auto q = text.get("quantization_config")) check_quantization(*q);

  text.ignore(ignored_text_fields());
  text.ignore(ignored_generic_fields());
  if (nested) text.ignore({"architectures"});  // a sub-config's own (null); the top level's decides
  if (nested) {
    top.ignore(ignored_generic_fields());
    top.finish("glm5_next");
    text.finish("glm5_next text_config");
  } else {
    top.finish(type.c_str());
  }
  c.validate(1, 1);
  return c;
}

}  // namespace mtplab::model
