// ModelConfig: strict YAML (errors name file:line:col and key), invariants, presets.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "model/config.hpp"

using namespace mtplab;
using namespace mtplab::model;

namespace {

using mtplab::test::error_of;

/// The directory holding configs/ (MTPLAB_SOURCE_DIR, else the tree the library was built from).
std::string source_dir() {
  const std::string d = presets_dir();
  return d.substr(0, d.size() - std::string("/configs").size());
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tiny_text() {
  const std::string t = read_text(source_dir() + "/configs/tiny.yaml");
  EXPECT_FALSE(t.empty()) << "configs/tiny.yaml not found under " << source_dir();
  return t;
}

/// Replaces the one line that starts with `key:` by `replacement` (or deletes it when empty).
std::string replace_line(const std::string& text, const std::string& key, const std::string& replacement) {
  std::istringstream in(text);
  std::string out, line;
  int hits = 0;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      ++hits;
      if (!replacement.empty()) out += replacement + "\n";
    } else {
      out += line + "\n";
    }
  }
  EXPECT_EQ(hits, 1) << "key " << key;
  return out;
}

/// 1-based line of the first line starting with `prefix`.
int line_of(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.rfind(prefix, 0) == 0) return n;
  return -1;
}

ModelConfig parse_text(const std::string& text, const std::string& name = "t.yaml") {
  return parse_model_config(YamlNode::load_string(text, name));
}

using mtplab::test::expect_has;

}  // namespace

TEST(ModelConfig, TypoKeyNamesLineColumnAndSuggestion) {
  const std::string text = replace_line(tiny_text(), "block_size", "blok_size: 64");
  const std::string msg = error_of([&] { parse_text(text); });
  expect_has(msg, str("t.yaml:", line_of(text, "blok_size"), ":1: blok_size: unknown key \"blok_size\""));
  expect_has(msg, "did you mean \"block_size\"");
}

TEST(ModelConfig, TypoInsideCheckpointNamesTheKeyPath) {
  const std::string text = tiny_text() + "  lm_haed: x\n";
  const std::string msg = error_of([&] { parse_text(text); });
  expect_has(msg, str("t.yaml:", line_of(text, "  lm_haed"), ":3: checkpoint.lm_haed: unknown key"));
  expect_has(msg, "did you mean \"lm_head\"");
}

TEST(ModelConfig, MissingRequiredKey) {
  const std::string text = replace_line(tiny_text(), "vocab", "");
  expect_has(error_of([&] { parse_text(text); }), "missing required key \"vocab\"");
}

TEST(ModelConfig, WrongType) {
  const std::string text = replace_line(tiny_text(), "hidden", "hidden: 12x");
  expect_has(error_of([&] { parse_text(text); }),
             str("t.yaml:", line_of(text, "hidden"), ":9: hidden: expected an integer, got \"12x\""));
  const std::string text2 = replace_line(tiny_text(), "rms_norm_eps", "rms_norm_eps: [1]");
  expect_has(error_of([&] { parse_text(text2); }),
             str(":", line_of(text2, "rms_norm_eps"), ":15: rms_norm_eps: expected a number"));
}

TEST(ModelConfig, OutOfRange) {
  const std::string text = replace_line(tiny_text(), "n_heads", "n_heads: 0");
  expect_has(error_of([&] { parse_text(text); }),
             str("t.yaml:", line_of(text, "n_heads"), ":10: n_heads: value 0 is out of range"));
  const std::string text2 = replace_line(tiny_text(), "swiglu_limit", "swiglu_limit: -1");
  expect_has(error_of([&] { parse_text(text2); }), "swiglu_limit: value -1 is out of range");
}

TEST(ModelConfig, InvariantViolationsNameTheLine) {
  {
    const std::string text = replace_line(tiny_text(), "index_topk", "index_topk: 18");
    expect_has(error_of([&] { parse_text(text); }), str("t.yaml:", line_of(text, "index_topk"),
                                                        ":13: index_topk: index_topk 18 is not a multiple of "
                                                        "index_kpool 4"));
  }
  {
    const std::string text = replace_line(tiny_text(), "n_group", "n_group: 3");
    expect_has(error_of([&] { parse_text(text); }),
               str("t.yaml:", line_of(text, "n_group"),
                   ":10: n_group: n_group 3 does not divide n_routed_experts 8"));
  }
  {
    const std::string text = replace_line(tiny_text(), "topk_group", "topk_group: 2");
    expect_has(error_of([&] { parse_text(text); }), "topk_group: topk_group 2 exceeds n_group 1");
  }
  {
    // 4 groups of 2 experts, keep 1 group: only 2 experts survive, top-k 2 fits; top-k 3 does not.
    std::string text = replace_line(tiny_text(), "n_group", "n_group: 4");
    text = replace_line(text, "num_experts_per_tok", "num_experts_per_tok: 3");
    expect_has(error_of([&] { parse_text(text); }),
               "num_experts_per_tok: num_experts_per_tok 3 exceeds the 2 experts that the group limit keeps");
  }
  {
    const std::string text = replace_line(tiny_text(), "num_experts_per_tok", "num_experts_per_tok: 9");
    expect_has(error_of([&] { parse_text(text); }), "num_experts_per_tok 9 exceeds n_routed_experts 8");
  }
  {
    const std::string text = replace_line(tiny_text(), "qk_rope_head_dim", "qk_rope_head_dim: 64");
    expect_has(error_of([&] { parse_text(text); }), str("t.yaml:", line_of(text, "qk_rope_head_dim"),
                                                        ":19: qk_rope_head_dim: qk_rope_head_dim 64 is not "
                                                        "supported"));
  }
  {
    const std::string text = replace_line(tiny_text(), "max_seq_len", "max_seq_len: 3");
    expect_has(error_of([&] { parse_text(text); }),
               "max_seq_len 3 holds no complete pool of index_kpool = 4 rows");
  }
}

TEST(ModelConfig, MaxSeqLenRoundsDownToWholePools) {
  const ModelConfig c = parse_text(replace_line(tiny_text(), "max_seq_len", "max_seq_len: 4099"));
  EXPECT_EQ(c.max_seq_len_requested, 4099);
  EXPECT_EQ(c.max_seq_len, 4096);
  EXPECT_EQ(c.max_pools(), 1024);
  EXPECT_EQ(c.kv_blocks(), 64);
}

TEST(ModelConfig, OptionalKeysTakeTheirDefaults) {
  std::string text = tiny_text();
  for (const char* key :
       {"qk_rope_head_dim", "index_norm_eps", "n_group", "topk_group", "max_seq_len", "block_size"})
    text = replace_line(text, key, "");
  // Drop the whole checkpoint mapping as well.
  text = text.substr(0, text.find("checkpoint:"));
  const ModelConfig c = parse_text(text, "mine.yaml");
  EXPECT_EQ(c.qk_rope_head_dim, 0);
  EXPECT_FLOAT_EQ(c.index_norm_eps, 1e-6f);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.max_seq_len, 4096);
  EXPECT_EQ(c.block_size, 64);
  EXPECT_EQ(c.mtp_layer_index, 45);
  EXPECT_EQ(c.mtp_prefix, "model.language_model.layers.45.");
  EXPECT_EQ(c.embed_tokens_name, "model.language_model.embed_tokens.weight");
  EXPECT_EQ(c.lm_head_name, "lm_head.weight");
}

TEST(ModelConfig, PrefixFollowsTheLayerIndexUnlessGiven) {
  std::string text = tiny_text();
  text = text.substr(0, text.find("checkpoint:")) + "checkpoint:\n  mtp_layer_index: 7\n";
  EXPECT_EQ(parse_text(text).mtp_prefix, "model.language_model.layers.7.");
  const std::string bad = text + "  mtp_prefix: mtp\n";
  expect_has(error_of([&] { parse_text(bad); }),
             "checkpoint.mtp_prefix: mtp_prefix \"mtp\" must end with '.'");
}

TEST(ModelConfig, InlinedMappingReportsTheFullKeyPath) {
  std::string body;
  std::istringstream in(tiny_text());
  std::string line;
  while (std::getline(in, line)) body += (line.empty() || line[0] == '#' ? line : "  " + line) + "\n";
  const std::string text = "model:\n" + replace_line(body, "  hidden", "  hidden: -5");
  auto doc = YamlNode::load_string(text, "exp.yaml");
  MapReader top(doc);
  const std::string msg = error_of([&] { parse_model_config(top.req("model")); });
  expect_has(msg, str("exp.yaml:", line_of(text, "  hidden"), ":11: model.hidden: value -5 is out of range"));
}

TEST(ModelConfig, ValidateByRankCounts) {
  const ModelConfig c = load_model_preset("tiny");
  c.validate(1, 1);
  c.validate(2, 2);
  c.validate(4, 4);
  c.validate(8, 8);
  // Heads must divide: 8 heads over 3 ranks is refused, naming the key and its line.
  const std::string msg = error_of([&] { c.validate(3, 3); });
  expect_has(msg, "tiny.yaml:");
  expect_has(msg, "n_heads: n_heads 8 does not divide over tp = 3 ranks");
  // Experts may split unevenly (8 over 3 ranks) ...
  c.validate(1, 3);
  c.validate(2, 5);
  // ... but every rank needs one.
  expect_has(error_of([&] { c.validate(1, 9); }),
             "8 routed experts cannot give each of ep = 9 ranks at least one");
  expect_has(error_of([&] { c.validate(0, 1); }), "tp must be >= 1");
}

TEST(ModelConfig, CodeBuiltConfigValidatesWithoutAFile) {
  ModelConfig c = load_model_preset("tiny");
  c.key_locations.clear();
  c.source.clear();
  c.index_topk = 10;
  expect_has(error_of([&] { c.validate(1, 1); }),
             "model config 'tiny': index_topk: index_topk 10 is not a multiple");
  c.index_topk = 16;
  c.set_max_seq_len(103);
  EXPECT_EQ(c.max_seq_len, 100);
  c.validate(1, 1);
  c.max_seq_len = 101;
  expect_has(error_of([&] { c.validate(1, 1); }), "is not a whole number of pools");
}

TEST(ModelConfig, PresetsMatchModelMd) {
  const ModelConfig t = load_model_preset("tiny");
  EXPECT_EQ(t.name, "tiny");
  EXPECT_EQ(t.hidden, 128);
  EXPECT_EQ(t.vocab, 4096);
  EXPECT_EQ(t.n_heads, 8);
  EXPECT_EQ(t.qk_nope_head_dim, 32);
  EXPECT_EQ(t.v_head_dim, 32);
  EXPECT_EQ(t.q_lora_rank, 64);
  EXPECT_EQ(t.kv_lora_rank, 64);
  EXPECT_EQ(t.index_n_heads, 4);
  EXPECT_EQ(t.index_head_dim, 32);
  EXPECT_EQ(t.index_topk, 16);
  EXPECT_EQ(t.index_kpool, 4);
  EXPECT_EQ(t.n_routed_experts, 8);
  EXPECT_EQ(t.num_experts_per_tok, 2);
  EXPECT_EQ(t.n_shared_experts, 1);
  EXPECT_EQ(t.moe_intermediate_size, 64);
  EXPECT_EQ(t.max_seq_len, 4096);

  const ModelConfig s = load_model_preset("small");
  EXPECT_EQ(s.hidden, 1024);
  EXPECT_EQ(s.vocab, 38912);
  EXPECT_EQ(s.n_heads, 16);
  EXPECT_EQ(s.qk_head_dim(), 128);
  EXPECT_EQ(s.q_lora_rank, 384);
  EXPECT_EQ(s.kv_lora_rank, 256);
  EXPECT_EQ(s.index_n_heads, 8);
  EXPECT_EQ(s.index_head_dim, 128);
  EXPECT_EQ(s.index_topk, 512);
  EXPECT_EQ(s.n_routed_experts, 64);
  EXPECT_EQ(s.num_experts_per_tok, 4);
  EXPECT_EQ(s.moe_intermediate_size, 512);
  s.validate(2, 2);
  s.validate(4, 4);

  const ModelConfig f = load_model_preset("glm5.3-flash");
  EXPECT_EQ(f.hidden, 4096);
  EXPECT_EQ(f.vocab, 154880);
  EXPECT_EQ(f.n_heads, 64);
  EXPECT_EQ(f.qk_nope_head_dim, 256);
  EXPECT_EQ(f.qk_rope_head_dim, 0);
  EXPECT_EQ(f.v_head_dim, 256);
  EXPECT_EQ(f.q_lora_rank, 1536);
  EXPECT_EQ(f.kv_lora_rank, 512);
  EXPECT_EQ(f.index_n_heads, 32);
  EXPECT_EQ(f.index_head_dim, 128);
  EXPECT_EQ(f.index_topk, 2048);
  EXPECT_EQ(f.index_kpool, 4);
  EXPECT_EQ(f.n_routed_experts, 288);
  EXPECT_EQ(f.num_experts_per_tok, 8);
  EXPECT_EQ(f.n_shared_experts, 1);
  EXPECT_EQ(f.moe_intermediate_size, 2048);
  EXPECT_FLOAT_EQ(f.routed_scaling_factor, 2.5f);
  EXPECT_FLOAT_EQ(f.swiglu_limit, 10.0f);
  EXPECT_FLOAT_EQ(f.rms_norm_eps, 1e-5f);
  EXPECT_EQ(f.max_seq_len, 65536);
  EXPECT_EQ(f.block_size, 64);
  EXPECT_EQ(f.mtp_layer_index, 45);
  EXPECT_EQ(f.mtp_prefix, "model.language_model.layers.45.");
  EXPECT_EQ(f.selection_width(), 2051);
  for (int w : {1, 2, 4, 8}) f.validate(w, w);
}

TEST(ModelConfig, PresetByPathAndUnknownName) {
  const ModelConfig c = load_model_preset(source_dir() + "/configs/small.yaml");
  EXPECT_EQ(c.name, "small");
  EXPECT_NE(c.source.find("configs/small.yaml"), std::string::npos);
  const std::string msg = error_of([] { load_model_preset("tinny"); });
  expect_has(msg, "unknown model preset 'tinny'");
  expect_has(msg, "glm5.3-flash, mini, small, tiny");
  expect_has(error_of([] { load_model_preset("/nonexistent/m.yaml"); }), "/nonexistent/m.yaml: cannot open");
}

// ---- the target's trunk (docs/target.md) -----------------------------------------------------------

TEST(ModelConfig, TrunkKeysReadAndDefault) {
  const ModelConfig tiny = parse_text(tiny_text());
  EXPECT_EQ(tiny.num_hidden_layers, 45);
  EXPECT_EQ(tiny.first_k_dense_replace, 0);
  EXPECT_EQ(tiny.intermediate_size, 256);
  EXPECT_EQ(tiny.layers_prefix, "model.language_model.layers.");
  EXPECT_EQ(tiny.final_norm_name, "model.language_model.norm.weight");
  EXPECT_EQ(tiny.layer_prefix(3), "model.language_model.layers.3.");
  // Dense layers.
  std::string text = replace_line(tiny_text(), "first_k_dense_replace", "first_k_dense_replace: 3");
  const ModelConfig dense = parse_text(text);
  EXPECT_TRUE(dense.dense_layer(0) && dense.dense_layer(2));
  EXPECT_FALSE(dense.dense_layer(3));
  // Left out: no trunk given, no dense layer; the names follow the MTP prefix's layout.
  text = replace_line(
      replace_line(replace_line(tiny_text(), "num_hidden_layers", ""), "first_k_dense_replace", ""),
      "intermediate_size", "");
  text = replace_line(replace_line(text, "  layers_prefix", ""), "  final_norm", "");
  text = replace_line(text, "  mtp_prefix", "  mtp_prefix: model.layers.45.");
  const ModelConfig bare = parse_text(text);
  EXPECT_EQ(bare.num_hidden_layers, 0);
  EXPECT_EQ(bare.first_k_dense_replace, 0);
  EXPECT_EQ(bare.intermediate_size, 0);
  EXPECT_EQ(bare.layers_prefix, "model.layers.");
  EXPECT_EQ(bare.final_norm_name, "model.norm.weight");
}

TEST(ModelConfig, TrunkErrorsNameTheKey) {
  // Dense layers need the dense MLP's width.
  std::string text =
      replace_line(replace_line(tiny_text(), "first_k_dense_replace", "first_k_dense_replace: 3"),
                   "intermediate_size", "intermediate_size: 0");
  std::string msg = error_of([&] { parse_text(text); });
  expect_has(msg, str("t.yaml:", line_of(text, "intermediate_size"),
                      ":20: intermediate_size: intermediate_size must "
                      "be positive when first_k_dense_replace is 3"));
  // More dense layers than the trunk has.
  text = replace_line(tiny_text(), "first_k_dense_replace", "first_k_dense_replace: 46");
  msg = error_of([&] { parse_text(text); });
  expect_has(msg, str("t.yaml:", line_of(text, "first_k_dense_replace"),
                      ":24: first_k_dense_replace: "
                      "first_k_dense_replace 46 exceeds "
                      "num_hidden_layers 45"));
  // Out of range, and of the wrong type.
  text = replace_line(tiny_text(), "num_hidden_layers", "num_hidden_layers: -1");
  expect_has(error_of([&] { parse_text(text); }), str("t.yaml:", line_of(text, "num_hidden_layers"),
                                                      ":20: "
                                                      "num_hidden_layers"));
  text = replace_line(tiny_text(), "intermediate_size", "intermediate_size: 2.5");
  expect_has(error_of([&] { parse_text(text); }), "intermediate_size: expected an integer");
  // The checkpoint names.
  text = replace_line(tiny_text(), "  layers_prefix", "  layers_prefix: model.layers");
  expect_has(error_of([&] { parse_text(text); }),
             "checkpoint.layers_prefix: layers_prefix \"model.layers\" must end with '.'");
  text = replace_line(tiny_text(), "  final_norm", "  final_norm: \"\"");
  expect_has(error_of([&] { parse_text(text); }), "checkpoint.final_norm: final_norm name is empty");
  // A typo.
  text = replace_line(tiny_text(), "first_k_dense_replace", "first_k_dense: 3");
  expect_has(error_of([&] { parse_text(text); }), "did you mean \"first_k_dense_replace\"");
}
