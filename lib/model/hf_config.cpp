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
#include <limits>
#include <optional>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "core/json.hpp"
#include "model/config.hpp"
#include "model/fields.hpp"

namespace mtplab::model {
namespace {

namespace fs = std::filesystem;

constexpr int kRealDigits = std::numeric_limits<float>::max_digits10;

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
      // the trunk's per-layer attention schedules and its other layer kinds (the MTP layer is one
      // DSA + MoE layer with its own indexer, no hyper-connections; mtplab's target runs every trunk
      // layer as that block, docs/target.md)
      "layer_types", "indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset",
      "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim", "linear_lower_bound",
      "linear_attn_config", "hc_mult", "hc_eps", "hc_sinkhorn_iters",
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
  void note(const std::string& key, const YamlNode& n) { cfg_.key_locations[key] = n.where(); }

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

/// Reads the field of `f`'s row from the text config as its hf column says (HfRead), recording
/// the value's location under the preset key.
void read_hf_field(Fields& text, ModelConfig& c, const ModelField& f) {
  const HfField& h = f.hf;
  switch (h.read) {
    case HfRead::none:
    case HfRead::derived:
      return;
    case HfRead::required: {
      if (h.alias) {
        auto named = text.get(h.key);
        auto alias = text.get(h.alias);
        if (named && !named->is_null()) {
          text.note(f.key, *named);
          read_field(c, f.member, f.range, *named);
          if (alias && !alias->is_null() && alias->as_int() != field_ref<int>(c, f.member))
            alias->fail(str("value ", value_text(*alias), " disagrees with ", h.key, " ",
                            field_ref<int>(c, f.member)));
        } else if (alias && !alias->is_null()) {
          text.note(f.key, *alias);
          read_field(c, f.member, f.range, *alias);
        } else {
          text.req(h.key);  // the missing-field error
        }
        return;
      }
      const YamlNode n = text.req(h.key);
      text.note(f.key, n);
      read_field(c, f.member, f.range, n);
      return;
    }
    case HfRead::optional: {
      auto n = text.get(h.key);
      if (!n || n->is_null()) return;
      text.note(f.key, *n);
      read_field(c, f.member, f.range, *n);
      return;
    }
    case HfRead::null_is_zero: {
      auto n = text.get(h.key);
      if (!n) text.req(h.key, h.note);
      text.note(f.key, *n);
      if (!n->is_null()) {
        read_field(c, f.member, f.range, *n);
      } else if (f.type() == FieldType::integer) {
        field_ref<int>(c, f.member) = 0;
      } else if (f.type() == FieldType::real) {
        field_ref<float>(c, f.member) = 0.0f;
      }
      return;
    }
    case HfRead::default_only: {
      auto n = text.get(h.key);
      if (!n || n->is_null()) return;
      text.note(f.key, *n);
      const ModelConfig defaults;
      ModelConfig given;
      read_field(given, f.member, f.range, *n);
      if (field_text(given, f.member, kRealDigits) != field_text(defaults, f.member, kRealDigits))
        n->fail(str("value ", value_text(*n), " is not supported: ", h.note));
      return;
    }
  }
}

/// Fields of the text config that mtplab does not keep but checks against the field `field` just
/// read, or that it implements at one value only.
void check_companions(Fields& text, const ModelConfig& c, const std::string& field) {
  if (field == "n_heads") {
    if (auto kv = text.get("num_key_value_heads"); kv && !kv->is_null()) {
      if (kv->as_int() != c.n_heads)
        kv->fail(str("value ", value_text(*kv), " is not supported: MLA gives every one of the ", c.n_heads,
                     " heads its own key and value from the latent, so num_key_value_heads must equal "
                     "num_attention_heads"));
    }
  } else if (field == "v_head_dim") {
    if (auto q = text.get("qk_head_dim"); q && !q->is_null()) {
      if (q->as_int() != c.qk_head_dim())
        q->fail(str("value ", value_text(*q),
                    " disagrees with qk_nope_head_dim + qk_rope_head_dim = ", c.qk_head_dim()));
    }
  } else if (field == "kv_lora_rank") {
    text.opt_bool_must_be("attention_bias", false, "the MLA projections have no biases in mtplab");
  } else if (field == "index_kpool") {
    text.opt_bool_must_be("index_kpool_always_select_tail", true,
                          "mtplab's selection always appends the query's incomplete pool (the tail)");
  } else if (field == "swiglu_limit") {
    text.opt_bool_must_be("norm_topk_prob", true, "mtplab normalises the top-k routing weights");
    text.opt_string_must_be("hidden_act", "silu", "the experts' SwiGLU uses SiLU");
    text.opt_string_must_be("scoring_func", "sigmoid", "the router scores experts with a sigmoid");
    text.opt_string_must_be("topk_method", "noaux_tc",
                            "the router picks the top-k of sigmoid + e_score_correction_bias");
  }
}

/// first_k_dense_replace from its field or from mlp_layer_types ("dense" layers first, then
/// "sparse" ones: the only schedule the target runs), and moe_layer_freq (1 or absent: every layer
/// after the dense ones has routed experts).
void read_dense_layers(Fields& text, ModelConfig& c) {
  std::optional<int> dense;
  if (auto n = text.get("first_k_dense_replace"); n && !n->is_null()) {
    dense = static_cast<int>(n->as_int(0, 1 << 20));
    text.note("first_k_dense_replace", *n);
  }
  if (auto types = text.get("mlp_layer_types"); types && !types->is_null()) {
    int leading = 0;
    bool sparse_seen = false;
    for (const YamlNode& item : types->items()) {
      const std::string kind = item.as_string();
      if (kind == "dense") {
        if (sparse_seen)
          item.fail(
              "value \"dense\" after a \"sparse\" layer is not supported: mtplab's target runs its dense-MLP "
              "layers first (first_k_dense_replace), then routed-expert layers");
        ++leading;
      } else if (kind == "sparse") {
        sparse_seen = true;
      } else {
        item.fail(
            str("value ", value_text(item),
                " is not supported: a trunk layer's MLP is \"dense\" (gate / up / down of intermediate_size) "
                "or \"sparse\" (routed experts)"));
      }
    }
    if (dense && *dense != leading)
      types->fail(str("has ", leading, " leading \"dense\" layer(s) but first_k_dense_replace is ", *dense));
    if (!dense) {
      dense = leading;
      text.note("first_k_dense_replace", *types);
    }
  }
  c.first_k_dense_replace = dense.value_or(0);
  if (auto n = text.get("moe_layer_freq"); n && !n->is_null() && n->as_int() != 1)
    n->fail(
        str("value ", value_text(*n),
            " is not supported: every trunk layer after the first first_k_dense_replace has routed experts "
            "(moe_layer_freq 1)"));
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

  // Sizes: the field table's rows that config.json gives directly, in table order but vocab_size
  // first (as transformers writes them; the order decides which of several bad fields is named),
  // each followed by the checks of the fields that go with it.
  const ModelField& vocab = model_field("vocab");
  read_hf_field(text, c, vocab);
  for (const ModelField& f : model_fields()) {
    if (&f != &vocab) read_hf_field(text, c, f);
    check_companions(text, c, f.name);
  }

  // The MTP layer follows the trunk's layers; one MTP layer.
  const YamlNode layers = text.req("num_hidden_layers");
  c.mtp_layer_index = static_cast<int>(layers.as_int(0, 1 << 20));
  text.note("checkpoint.mtp_layer_index", layers);
  text.note("checkpoint.mtp_prefix", layers);
  // The target's trunk: its depth, and its dense-MLP layers (first_k_dense_replace, or the leading
  // "dense" entries of mlp_layer_types; both given, they must agree). intermediate_size is read by
  // its row of the table.
  c.num_hidden_layers = c.mtp_layer_index;
  text.note("num_hidden_layers", layers);
  read_dense_layers(text, c);
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
  c.layers_prefix = layout + "layers.";
  c.final_norm_name = layout + "norm.weight";
  c.key_locations["checkpoint.embed_tokens"] = layout_where;
  c.key_locations["checkpoint.lm_head"] = layout_where;
  c.key_locations["checkpoint.layers_prefix"] = layout_where;
  c.key_locations["checkpoint.final_norm"] = layout_where;

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
