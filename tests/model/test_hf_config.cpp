// Hugging Face config.json (glm5_next) -> ModelConfig: the hand-written tiny fixture gives exactly
// configs/tiny.yaml's config, the nested and the flat layouts agree, every unsupported field is an
// error naming the field and its value, the tensor names follow the architecture, the
// mtp_layer_index / mtp_prefix agreement of YAML presets, and a checkpoint directory (config.json
// plus safetensors) loads the weights that were exported into it. The fixtures are in
// tests/data/hf/ (README.md there says where each came from).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/weights.hpp"
#include "weights_compare.hpp"

using namespace mtplab;
using namespace mtplab::model;
namespace fs = std::filesystem;

namespace {

using mtplab::test::error_of;
using mtplab::test::expect_has;

std::string source_dir() {
  const std::string d = presets_dir();
  return d.substr(0, d.size() - std::string("/configs").size());
}
std::string fixture(const std::string& name) { return source_dir() + "/tests/data/hf/" + name; }

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("mtplab-hf") {}
};

/// The fields that say what the model is, without where it was read from.
ModelConfig sizes_and_names(ModelConfig c) {
  c.name.clear();
  c.source.clear();
  c.source_format.clear();
  c.key_locations.clear();
  return c;
}

// ---- a minimal JSON writer for configs edited in the tests -------------------------------------

bool plain_json_scalar(const std::string& s) {
  if (s == "true" || s == "false" || s == "null") return true;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && *end == '\0';
}

void write_json(std::ostream& out, const YAML::Node& n) {
  if (!n || n.IsNull()) {
    out << "null";
  } else if (n.IsScalar()) {
    // A scalar written quoted in the source (yaml-cpp tags it "!") stays a string.
    if (n.Tag() != "!" && plain_json_scalar(n.Scalar()))
      out << n.Scalar();
    else
      out << '"' << n.Scalar() << '"';
  } else if (n.IsSequence()) {
    out << '[';
    for (size_t i = 0; i < n.size(); ++i) {
      if (i) out << ", ";
      write_json(out, n[i]);
    }
    out << ']';
  } else {
    out << "{\n";
    bool first = true;
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!first) out << ",\n";
      first = false;
      out << '"' << it->first.Scalar() << "\": ";
      write_json(out, it->second);
    }
    out << "\n}";
  }
}

/// The tiny fixture as a YAML tree, to edit.
YAML::Node tiny_tree() { return YAML::LoadFile(fixture("glm5_next-tiny/config.json")); }

/// Writes `tree` as DIR/config.json and returns DIR.
std::string write_config(const TempDir& tmp, const std::string& dir_name, const YAML::Node& tree) {
  const std::string dir = tmp / dir_name;
  fs::create_directories(dir);
  std::ofstream out(dir + "/config.json");
  write_json(out, tree);
  out << "\n";
  return dir;
}

/// The tiny fixture with text_config.<field> set to `json_value` (a JSON / YAML literal).
std::string tiny_with(const TempDir& tmp, const std::string& field, const std::string& json_value) {
  YAML::Node t = tiny_tree();
  t["text_config"][field] = YAML::Load(json_value);
  return write_config(tmp, "with-" + field, t);
}

// ---- the fixture is the tiny preset ---------------------------------------------------------------

TEST(HfConfig, TinyFixtureIsTheTinyPreset) {
  const ModelConfig preset = load_model_preset("tiny");
  for (const std::string& spec : {fixture("glm5_next-tiny"), fixture("glm5_next-tiny/config.json")}) {
    SCOPED_TRACE(spec);
    const ModelConfig hf = load_model_preset(spec);
    EXPECT_EQ(sizes_and_names(hf), sizes_and_names(preset));
    EXPECT_EQ(hf.name, "glm5_next-tiny");
    EXPECT_EQ(hf.source_format, "hf");
    EXPECT_EQ(hf.source, fixture("glm5_next-tiny/config.json"));
  }
  const ModelConfig hf = load_hf_config(fixture("glm5_next-tiny"));
  // max_position_embeddings (1048576) caps the capacity; mtplab's own default (4096) is smaller.
  EXPECT_EQ(hf.max_seq_len, 4096);
  EXPECT_EQ(hf.mtp_layer_index, 45);
  EXPECT_EQ(hf.mtp_prefix, "model.language_model.layers.45.");
  EXPECT_EQ(hf.embed_tokens_name, "model.language_model.embed_tokens.weight");
  EXPECT_EQ(hf.lm_head_name, "lm_head.weight");
  // validate() blames the config.json field: the location of num_attention_heads.
  expect_has(error_of([&] { hf.validate(3, 3); }), "config.json:");
  expect_has(error_of([&] { hf.validate(3, 3); }),
             "text_config.num_attention_heads: n_heads 8 does not divide");
}

TEST(HfConfig, NestedFlatAndTextOnlyLayouts) {
  TempDir tmp;
  const ModelConfig nested = load_hf_config(fixture("glm5_next-tiny"));

  // Flat glm5_next: the text fields at the top level (transformers forwards them to text_config).
  YAML::Node flat = tiny_tree();
  YAML::Node text = flat["text_config"];
  for (auto it = text.begin(); it != text.end(); ++it)
    if (it->first.Scalar() != "model_type") flat[it->first.Scalar()] = it->second;
  flat.remove("text_config");
  const ModelConfig f = load_hf_config(write_config(tmp, "flat", flat));
  EXPECT_EQ(sizes_and_names(f), sizes_and_names(nested));

  // Without architectures the model type decides the layout: glm5_next -> model.language_model.*
  YAML::Node no_arch = tiny_tree();
  no_arch.remove("architectures");
  EXPECT_EQ(sizes_and_names(load_hf_config(write_config(tmp, "no-arch", no_arch))), sizes_and_names(nested));

  // A text-only config (a causal LM over the text model): model.* names.
  YAML::Node text_only = YAML::Clone(tiny_tree()["text_config"]);
  text_only["architectures"] = YAML::Load("[\"Glm5NextForCausalLM\"]");
  const ModelConfig t = load_hf_config(write_config(tmp, "text-only", text_only));
  EXPECT_EQ(t.embed_tokens_name, "model.embed_tokens.weight");
  EXPECT_EQ(t.mtp_prefix, "model.layers.45.");
  EXPECT_EQ(t.lm_head_name, "lm_head.weight");
  text_only.remove("architectures");
  EXPECT_EQ(load_hf_config(write_config(tmp, "text-only-no-arch", text_only)).mtp_prefix, "model.layers.45.");
  // ... which has no vision tower to ignore.
  text_only["vision_config"] = YAML::Load("{\"depth\": 1}");
  expect_has(
      error_of([&] { load_hf_config(write_config(tmp, "text-only-vision", text_only)); }),
      "vision_config: field \"vision_config\" (value {...}) is not known to mtplab's glm5_next_text reader");
}

TEST(HfConfig, DerivedNamesAndValues) {
  TempDir tmp;
  // The MTP layer follows the trunk's layers.
  const ModelConfig three = load_hf_config(tiny_with(tmp, "num_hidden_layers", "3"));
  EXPECT_EQ(three.mtp_layer_index, 3);
  EXPECT_EQ(three.mtp_prefix, "model.language_model.layers.3.");
  // Tied embeddings: the head is the embedding tensor.
  YAML::Node tied = tiny_tree();
  tied["tie_word_embeddings"] = true;
  const ModelConfig t = load_hf_config(write_config(tmp, "tied", tied));
  EXPECT_EQ(t.lm_head_name, "model.language_model.embed_tokens.weight");
  tied["text_config"]["tie_word_embeddings"] = false;
  expect_has(error_of([&] { load_hf_config(write_config(tmp, "tied-disagree", tied)); }),
             "tie_word_embeddings differs between the top level and text_config");
  // A null swiglu_limit is no clamp; a smaller context than mtplab's default is taken.
  EXPECT_EQ(load_hf_config(tiny_with(tmp, "swiglu_limit", "null")).swiglu_limit, 0.0f);
  const ModelConfig short_ctx = load_hf_config(tiny_with(tmp, "max_position_embeddings", "1002"));
  EXPECT_EQ(short_ctx.max_seq_len_requested, 1002);
  EXPECT_EQ(short_ctx.max_seq_len, 1000);  // whole pools of 4
  // Router groups are implemented.
  YAML::Node groups = tiny_tree();
  groups["text_config"]["n_group"] = 2;
  groups["text_config"]["topk_group"] = 1;
  const ModelConfig g = load_hf_config(write_config(tmp, "groups", groups));
  EXPECT_EQ(g.n_group, 2);
  EXPECT_EQ(g.topk_group, 1);
  // The alias num_local_experts; FP8 block quantisation of the release format.
  EXPECT_EQ(load_hf_config(tiny_with(tmp, "num_local_experts", "8")).n_routed_experts, 8);
  YAML::Node fp8 = tiny_tree();
  fp8["quantization_config"] = YAML::Load(
      "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", "
      "\"weight_block_size\": [128, 128]}");
  EXPECT_EQ(sizes_and_names(load_hf_config(write_config(tmp, "fp8", fp8))),
            sizes_and_names(load_hf_config(fixture("glm5_next-tiny"))));
  EXPECT_EQ(load_hf_config(tiny_with(tmp, "num_nextn_predict_layers", "1")).mtp_layer_index, 45);
}

// ---- every unsupported field is an error naming it and its value ----------------------------------

struct Refusal {
  const char* field;
  const char* value;
  const char* expected;  ///< part of the message after "text_config.<field>: "
};

TEST(HfConfig, UnsupportedFieldsAreRefusedByName) {
  const Refusal cases[] = {
      {"qk_rope_head_dim", "64", "value \"64\" is not supported: RoPE is not implemented"},
      {"hidden_act", "\"gelu\"", "value \"gelu\" is not supported: the experts' SwiGLU uses SiLU"},
      {"num_key_value_heads", "4", "value \"4\" is not supported: MLA gives every one of the 8 heads"},
      {"norm_topk_prob", "false", "value \"false\" is not supported: mtplab normalises the top-k"},
      {"index_kpool_always_select_tail", "false",
       "value \"false\" is not supported: mtplab's selection always"},
      {"attention_bias", "true", "value \"true\" is not supported: the MLA projections have no biases"},
      {"num_nextn_predict_layers", "2", "value \"2\" is not supported: mtplab drafts with one MTP layer"},
      {"num_nextn_predict_layers", "0",
       "value \"0\" is not supported: mtplab drafts with one MTP layer (layer 45), chained; this checkpoint "
       "has none"},
      {"n_group", "3", "n_group 3 does not divide n_routed_experts 8"},
      {"index_topk", "18", "index_topk 18 is not a multiple of index_kpool 4"},
      {"qk_head_dim", "40", "value \"40\" disagrees with qk_nope_head_dim + qk_rope_head_dim = 32"},
      {"q_lora_rank", "null", "is null; mtplab needs a value"},
      {"scoring_func", "\"softmax\"",
       "value \"softmax\" is not supported: the router scores experts with a sigmoid"},
      {"topk_method", "\"greedy\"", "value \"greedy\" is not supported"},
      {"num_local_experts", "16", "value \"16\" disagrees with n_routed_experts 8"},
      {"hidden_size", "128.5", "expected an integer, got \"128.5\""},
      {"rms_norm_eps", "0.5", "value 0.5 is out of range"},
      {"model_type", "\"glm5_next\"",
       "value \"glm5_next\" is not supported: a glm5_next config's text_config"},
      {"foo_bar", "3",
       "field \"foo_bar\" (value \"3\") is not known to mtplab's glm5_next text_config reader"},
  };
  TempDir tmp;
  for (const Refusal& r : cases) {
    SCOPED_TRACE(str(r.field, " = ", r.value));
    const std::string msg = error_of([&] { load_hf_config(tiny_with(tmp, r.field, r.value)); });
    expect_has(msg, str("config.json:"));
    expect_has(msg, str("text_config.", r.field, ": ", r.expected));
  }
  // Missing fields that transformers would default.
  for (const char* field :
       {"index_kpool", "index_topk", "swiglu_limit", "num_hidden_layers", "n_routed_experts"}) {
    SCOPED_TRACE(field);
    YAML::Node t = tiny_tree();
    t["text_config"].remove(field);
    expect_has(error_of([&] { load_hf_config(write_config(tmp, str("without-", field), t)); }),
               str("text_config: missing field \"", field, "\""));
  }
  // Top-level fields.
  YAML::Node t = tiny_tree();
  t["model_type"] = "glm_moe_dsa";
  expect_has(error_of([&] { load_hf_config(write_config(tmp, "other-type", t)); }),
             "model_type: value \"glm_moe_dsa\" is not supported: mtplab reads the GLM-5.x MTP layer");
  t = tiny_tree();
  t["architectures"] = YAML::Load("[\"Glm5NextModel\"]");
  expect_has(
      error_of([&] { load_hf_config(write_config(tmp, "other-arch", t)); }),
      "architectures[0]: architecture \"Glm5NextModel\" is not supported: mtplab knows the tensor names of "
      "Glm5NextForConditionalGeneration (model.language_model.*)");
  t = tiny_tree();
  t["quantization_config"] = YAML::Load("{\"quant_method\": \"awq\", \"bits\": 4}");
  expect_has(error_of([&] { load_hf_config(write_config(tmp, "awq", t)); }),
             "quantization_config.quant_method: value \"awq\" is not supported");
  t["quantization_config"] = YAML::Load("{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}");
  expect_has(error_of([&] { load_hf_config(write_config(tmp, "fp8-64", t)); }),
             "quantization_config.weight_block_size: value [64, 64] is not supported");
  t = tiny_tree();
  t["rope_everywhere"] = true;
  expect_has(error_of([&] { load_hf_config(write_config(tmp, "top-unknown", t)); }),
             "rope_everywhere: field \"rope_everywhere\" (value \"true\") is not known to mtplab's glm5_next "
             "reader");
  // Not a checkpoint directory; a duplicate field.
  expect_has(error_of([&] { load_hf_config(tmp / "nowhere"); }), "nowhere: no such file");
  const std::string dup = tmp / "dup";
  fs::create_directories(dup);
  std::ofstream(dup + "/config.json") << "{\"model_type\": \"glm5_next\", \"model_type\": \"glm5_next\"}\n";
  expect_has(error_of([&] { load_hf_config(dup); }), "model_type: duplicate key");
}

// ---- YAML presets: mtp_layer_index and mtp_prefix ------------------------------------------------

TEST(HfConfig, LayerIndexAndPrefixMustAgree) {
  const std::string base = [] {
    std::ifstream in(source_dir() + "/configs/tiny.yaml");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    return text.substr(0, text.find("checkpoint:"));
  }();
  auto parse = [&](const std::string& checkpoint) {
    return parse_model_config(YamlNode::load_string(base + "checkpoint:\n" + checkpoint, "tiny-edit.yaml"));
  };
  const std::string msg =
      error_of([&] { parse("  mtp_layer_index: 7\n  mtp_prefix: model.language_model.layers.45.\n"); });
  expect_has(msg, "tiny-edit.yaml:");
  expect_has(msg,
             "checkpoint.mtp_prefix: mtp_prefix \"model.language_model.layers.45.\" and mtp_layer_index 7");
  expect_has(msg, "disagree: the prefix must end with \"layers.7.\"");
  EXPECT_EQ(parse("  mtp_layer_index: 7\n  mtp_prefix: model.layers.7.\n").mtp_prefix, "model.layers.7.");
  EXPECT_EQ(parse("  mtp_prefix: model.layers.12.\n").mtp_layer_index, 12);
  EXPECT_EQ(parse("  mtp_prefix: model.mtp.\n").mtp_layer_index, -1);
  EXPECT_EQ(parse("  mtp_layer_index: 3\n").mtp_prefix, "model.language_model.layers.3.");
  expect_has(error_of([&] { parse("  mtp_layer_index: 3\n  mtp_prefix: model.mtp.\n"); }), "disagree");
}

TEST(HfConfig, PresetYamlRoundTrips) {
  std::vector<ModelConfig> configs = {load_hf_config(fixture("glm5_next-tiny")), load_model_preset("tiny"),
                                      load_model_preset("glm5.3-flash")};
  TempDir tmp;
  configs.push_back(load_hf_config(tiny_with(tmp, "max_position_embeddings", "1002")));
  YAML::Node text_only = YAML::Clone(tiny_tree()["text_config"]);
  configs.push_back(load_hf_config(write_config(tmp, "text-only", text_only)));
  for (const ModelConfig& c : configs) {
    SCOPED_TRACE(c.source);
    const YAML::Node y = to_preset_yaml(c);
    const ModelConfig back =
        parse_model_config(YamlNode(y, std::make_shared<const std::string>("generated"), ""));
    EXPECT_EQ(sizes_and_names(back), sizes_and_names(c));
    EXPECT_EQ(back.name, c.name);
  }
}

// ---- the config written by transformers' save_pretrained (tools/record_trace/selftest.sh) --------

TEST(HfConfig, SavePretrainedConfigOfTheSelftest) {
  const ModelConfig c = load_hf_config(fixture("glm5_next-selftest"));
  EXPECT_EQ(c.hidden, 128);
  EXPECT_EQ(c.vocab, 4096);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.index_topk, 16);
  EXPECT_EQ(c.index_kpool, 4);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.mtp_layer_index, 3);
  EXPECT_EQ(c.mtp_prefix.substr(c.mtp_prefix.size() - 9), "layers.3.");
}

// ---- a checkpoint directory: config.json and safetensors ------------------------------------------

TEST(HfConfig, CheckpointDirectoryLoadsItsWeights) {
  TempDir tmp;
  const std::string dir = tmp / "ckpt";
  fs::create_directories(dir);
  fs::copy_file(fixture("glm5_next-tiny/config.json"), dir + "/config.json");
  const ModelConfig cfg = load_model_preset(dir);
  const MtpWeights whole = synthesize_mtp_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::vocab), 5);
  // One file, then a sharded directory with model.safetensors.index.json beside config.json.
  export_mtp_weights(cfg, whole, dir + "/model.safetensors");
  const std::string sharded = tmp / "sharded";
  export_mtp_weights(cfg, whole, sharded, 192 << 10);
  fs::copy_file(fixture("glm5_next-tiny/config.json"), sharded + "/config.json");
  ASSERT_TRUE(fs::exists(sharded + "/model.safetensors.index.json"));
  for (const std::string& src : {dir, sharded}) {
    const ModelConfig c = load_model_preset(src);
    for (int world : {1, 2}) {
      const ShardPlan p = make_shard_plan(c, world - 1, world, HeadSharding::vocab);
      SCOPED_TRACE(str(src, " rank ", world - 1, "/", world));
      test_util::expect_same_weights(load_mtp_weights(c, p, src), synthesize_mtp_weights(c, p, 5));
    }
  }

  // A config naming another MTP layer: the error lists the layer prefixes the checkpoint holds and
  // the same tensor under its own prefix.
  YAML::Node t = tiny_tree();
  t["text_config"]["num_hidden_layers"] = 3;
  const ModelConfig wrong = load_hf_config(write_config(tmp, "wrong", t));
  const std::string msg =
      error_of([&] { load_mtp_weights(wrong, make_shard_plan(wrong, 0, 1, HeadSharding::none), dir); });
  expect_has(msg, "tensor \"model.language_model.layers.3.enorm.weight\" not found");
  expect_has(msg, "layer prefixes it holds: model.language_model.layers.45.");
  expect_has(msg, "outside layers: lm_head.weight, model.language_model.embed_tokens.weight");
  expect_has(msg, "the same name under another prefix: model.language_model.layers.45.enorm.weight");
}

TEST(HfConfig, MissingTensorListsEveryLayerPrefix) {
  // Names of a trunk with layers 0-2 and 5 under one prefix, a vision tower, and an MTP layer
  // under another: the ranges are compressed per prefix.
  TempDir tmp;
  std::vector<std::string> names = {"model.visual.blocks.0.attn.qkv.weight", "lm_head.weight"};
  for (int l : {0, 1, 2, 5})
    names.push_back(str("model.language_model.layers.", l, ".input_layernorm.weight"));
  names.push_back("mtp.layers.7.hnorm.weight");
  std::vector<bf16> one(4, to_bf16(1.0f));
  std::vector<TensorView> views;
  for (const auto& n : names)
    views.push_back(TensorView{n, DType::bf16, {4}, one.data(), one.size() * sizeof(bf16)});
  write_safetensors(tmp / "m.safetensors", views);
  const Checkpoint ck(tmp / "m.safetensors");
  const std::string msg = error_of([&] { (void)ck.info("model.language_model.layers.45.hnorm.weight"); });
  expect_has(msg, "layer prefixes it holds: model.language_model.layers.{0-2, 5}., mtp.layers.7.");
  expect_has(msg, "outside layers: lm_head.weight, model.visual.blocks.0.attn.qkv.weight");
  expect_has(msg, "the same name under another prefix: mtp.layers.7.hnorm.weight");
}

}  // namespace

// ---- the target's trunk: depth, dense layers, names ------------------------------------------------

namespace {

/// The tiny fixture with its first `dense` layers marked dense in mlp_layer_types.
YAML::Node tiny_dense_tree(int dense) {
  YAML::Node t = tiny_tree();
  for (int i = 0; i < dense; ++i) t["text_config"]["mlp_layer_types"][i] = "dense";
  return t;
}

}  // namespace

TEST(HfConfig, TrunkDepthDenseLayersAndNames) {
  TempDir tmp;
  const ModelConfig tiny = load_hf_config(fixture("glm5_next-tiny"));
  EXPECT_EQ(tiny.num_hidden_layers, 45);
  EXPECT_EQ(tiny.first_k_dense_replace, 0);
  EXPECT_EQ(tiny.intermediate_size, 256);
  EXPECT_EQ(tiny.layers_prefix, "model.language_model.layers.");
  EXPECT_EQ(tiny.final_norm_name, "model.language_model.norm.weight");
  // The leading dense entries of mlp_layer_types, the field first_k_dense_replace, or both agreeing.
  const ModelConfig three = load_hf_config(write_config(tmp, "dense3", tiny_dense_tree(3)));
  EXPECT_EQ(three.first_k_dense_replace, 3);
  EXPECT_TRUE(three.dense_layer(2));
  EXPECT_FALSE(three.dense_layer(3));
  YAML::Node field_only = tiny_tree();
  field_only["text_config"].remove("mlp_layer_types");
  field_only["text_config"]["first_k_dense_replace"] = 2;
  EXPECT_EQ(load_hf_config(write_config(tmp, "field-only", field_only)).first_k_dense_replace, 2);
  YAML::Node both = tiny_dense_tree(3);
  both["text_config"]["first_k_dense_replace"] = 3;
  EXPECT_EQ(load_hf_config(write_config(tmp, "both", both)).first_k_dense_replace, 3);
  EXPECT_EQ(load_hf_config(tiny_with(tmp, "moe_layer_freq", "1")).first_k_dense_replace, 0);
  // The CausalLM layout: the trunk under model.layers., the final norm model.norm.weight.
  YAML::Node causal = tiny_tree();
  causal["architectures"] = YAML::Load("[\"Glm5NextForCausalLM\"]");
  const ModelConfig c = load_hf_config(write_config(tmp, "causal", causal));
  EXPECT_EQ(c.layers_prefix, "model.layers.");
  EXPECT_EQ(c.final_norm_name, "model.norm.weight");
  EXPECT_EQ(c.layer_prefix(0), "model.layers.0.");
  // The trunk's fields written as a preset read back.
  const ModelConfig back = parse_model_config(
      YamlNode(to_preset_yaml(three), std::make_shared<const std::string>("generated"), ""));
  EXPECT_EQ(sizes_and_names(back), sizes_and_names(three));
}

TEST(HfConfig, TrunkScheduleErrorsNameTheField) {
  TempDir tmp;
  // A dense layer after a sparse one.
  YAML::Node t = tiny_dense_tree(2);
  t["text_config"]["mlp_layer_types"][5] = "dense";
  std::string msg = error_of([&] { load_hf_config(write_config(tmp, "late-dense", t)); });
  expect_has(msg, "config.json:");
  expect_has(msg,
             "text_config.mlp_layer_types[5]: value \"dense\" after a \"sparse\" layer is not supported");
  // An unknown kind.
  t = tiny_tree();
  t["text_config"]["mlp_layer_types"][0] = "hybrid";
  expect_has(
      error_of([&] { load_hf_config(write_config(tmp, "hybrid", t)); }),
      "text_config.mlp_layer_types[0]: value \"hybrid\" is not supported: a trunk layer's MLP is \"dense\"");
  // The two fields disagree.
  t = tiny_dense_tree(3);
  t["text_config"]["first_k_dense_replace"] = 1;
  expect_has(error_of([&] { load_hf_config(write_config(tmp, "disagree", t)); }),
             "text_config.mlp_layer_types: has 3 leading \"dense\" layer(s) but first_k_dense_replace is 1");
  // MoE every other layer.
  expect_has(error_of([&] { load_hf_config(tiny_with(tmp, "moe_layer_freq", "2")); }),
             "text_config.moe_layer_freq: value \"2\" is not supported");
  // Dense layers without intermediate_size; more dense layers than the trunk has.
  t = tiny_dense_tree(3);
  t["text_config"].remove("intermediate_size");
  expect_has(error_of([&] { load_hf_config(write_config(tmp, "no-inter", t)); }),
             "intermediate_size: intermediate_size must be positive when first_k_dense_replace is 3");
  t = tiny_tree();
  t["text_config"]["first_k_dense_replace"] = 50;
  t["text_config"].remove("mlp_layer_types");
  msg = error_of([&] { load_hf_config(write_config(tmp, "too-many", t)); });
  expect_has(msg, "text_config.first_k_dense_replace: first_k_dense_replace 50 exceeds num_hidden_layers 45");
}
