// The field table of ModelConfig (lib/model/fields.hpp): it covers every member once, its rows
// drive the readers and writers (a value set through a row is the member of that name), every
// shipped model file reads back from its preset text unchanged, and the preset text of the tiny
// preset is pinned (its bytes feed the identities of experiments on Hugging Face configs).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/fields.hpp"

using namespace mtplab;
using namespace mtplab::model;
namespace fs = std::filesystem;

namespace {

// ---- the number of members of an aggregate ------------------------------------------------------

struct AnyValue {
  template <class T>
  operator T() const;  // declared only: used in unevaluated braced initialisers
};

/// The number of members of the aggregate T: the longest list of values it can be braced from.
template <class T, class... Values>
constexpr size_t member_count() {
  if constexpr (requires { T{Values{}..., AnyValue{}}; })
    return member_count<T, Values..., AnyValue>();
  else
    return sizeof...(Values);
}

// source, source_format and key_locations say where a config came from: they have no row.
constexpr size_t kBookkeepingMembers = 3;
static_assert(member_count<ModelConfig>() == 38,
              "ModelConfig gained or lost a member: give it a row in lib/model/fields.cpp (or count it "
              "among the bookkeeping members), then update this count");

std::string source_dir() {
  const std::string d = presets_dir();
  return d.substr(0, d.size() - std::string("/configs").size());
}

std::string emit(const YAML::Node& n) {
  YAML::Emitter e;
  e << n;
  return e.c_str();
}

/// The fields that say what the model is, without where it was read from.
ModelConfig sizes_and_names(ModelConfig c) {
  c.source.clear();
  c.source_format.clear();
  c.key_locations.clear();
  return c;
}

}  // namespace

TEST(ModelFields, EveryMemberHasOneRow) {
  const auto fields = model_fields();
  EXPECT_EQ(fields.size() + kBookkeepingMembers, member_count<ModelConfig>());
  std::set<std::string> names, keys;
  for (const ModelField& f : fields) {
    SCOPED_TRACE(f.name);
    EXPECT_TRUE(names.insert(f.name).second) << "two rows name " << f.name;
    if (f.key) {
      EXPECT_TRUE(keys.insert(f.key).second) << "two rows read key " << f.key;
    }
    for (const ModelField& g : fields) {
      if (&g != &f) {
        EXPECT_FALSE(g.member == f.member) << f.name << " and " << g.name << " share a member";
      }
    }
    EXPECT_NE(std::string(f.doc), "");
    EXPECT_EQ(&model_field(f.name), &f);
    // Required preset keys have no fallback; the hf column names a field unless none is read.
    if (f.required) {
      EXPECT_FALSE(f.absent.has_value());
    }
    EXPECT_EQ(f.hf.key == nullptr, f.hf.read == HfRead::none);
  }
  // The sub-mapping's rows come last (the preset writer and reader rely on it).
  bool in_checkpoint = false;
  for (const ModelField& f : fields) {
    const bool sub = f.key && std::string(f.key).rfind("checkpoint.", 0) == 0;
    EXPECT_FALSE(in_checkpoint && !sub) << f.name << " follows the checkpoint rows";
    in_checkpoint = in_checkpoint || sub;
  }
}

// A value set through each row lands in the member of that name: the rows' member pointers
// against a config built by hand, member by member.
TEST(ModelFields, RowsSetTheMembersTheyName) {
  ModelConfig walked;
  int next = 101;
  for (const ModelField& f : model_fields()) {
    switch (f.type()) {
      case FieldType::integer:
        field_ref<int>(walked, f.member) = next;
        break;
      case FieldType::real:
        field_ref<float>(walked, f.member) = static_cast<float>(next) + 0.5f;
        break;
      case FieldType::text:
        field_ref<std::string>(walked, f.member) = std::string("text-") + f.name;
        break;
    }
    ++next;
  }
  ModelConfig hand;
  hand.name = "text-name";
  hand.hidden = 102;
  hand.vocab = 103;
  hand.rms_norm_eps = 104.5f;
  hand.n_heads = 105;
  hand.qk_nope_head_dim = 106;
  hand.qk_rope_head_dim = 107;
  hand.v_head_dim = 108;
  hand.q_lora_rank = 109;
  hand.kv_lora_rank = 110;
  hand.index_n_heads = 111;
  hand.index_head_dim = 112;
  hand.index_topk = 113;
  hand.index_kpool = 114;
  hand.index_norm_eps = 115.5f;
  hand.n_routed_experts = 116;
  hand.num_experts_per_tok = 117;
  hand.n_shared_experts = 118;
  hand.moe_intermediate_size = 119;
  hand.n_group = 120;
  hand.topk_group = 121;
  hand.routed_scaling_factor = 122.5f;
  hand.swiglu_limit = 123.5f;
  hand.max_seq_len_requested = 124;
  hand.max_seq_len = 125;
  hand.block_size = 126;
  hand.num_hidden_layers = 127;
  hand.first_k_dense_replace = 128;
  hand.intermediate_size = 129;
  hand.mtp_layer_index = 130;
  hand.embed_tokens_name = "text-embed_tokens_name";
  hand.lm_head_name = "text-lm_head_name";
  hand.mtp_prefix = "text-mtp_prefix";
  hand.layers_prefix = "text-layers_prefix";
  hand.final_norm_name = "text-final_norm_name";
  EXPECT_EQ(walked, hand);
}

// Every shipped model file (the presets, the trained models' files, the reference fixtures'
// model and the Hugging Face fixtures) read, written as a preset and read again gives the same
// config, and the written text is a fixed point.
TEST(ModelFields, ShippedModelFilesRoundTrip) {
  const std::string src = source_dir();
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(src + "/configs"))
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  for (const auto& d : fs::directory_iterator(src + "/data"))
    if (d.is_directory())
      for (const auto& e : fs::directory_iterator(d.path()))
        if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  files.push_back(src + "/tests/reference/tiny_fixtures.yaml");
  for (const auto& d : fs::directory_iterator(src + "/tests/data/hf"))
    if (fs::exists(d.path() / "config.json")) files.push_back(d.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 9u);  // 4 presets, 2 trained models, the fixtures' model, 2 HF configs

  for (const std::string& file : files) {
    SCOPED_TRACE(file);
    const ModelConfig read = load_model_preset(file);
    const std::string text = emit(to_preset_yaml(read));
    const ModelConfig again = parse_model_config(YamlNode::load_string(text, file + " (written)"));
    EXPECT_EQ(sizes_and_names(again), sizes_and_names(read));
    EXPECT_EQ(emit(to_preset_yaml(again)), text);
    // Every preset key is written (the index only where the prefix does not name it).
    for (const ModelField& f : model_fields()) {
      if (!f.key || std::string(f.name) == "mtp_layer_index") continue;
      EXPECT_NE(text.find(std::string(f.key).substr(std::string(f.key).rfind('.') + 1) + ":"),
                std::string::npos)
          << f.key;
    }
  }
}

// The bytes of the preset text (an experiment on a Hugging Face config merges its overrides into
// it): field order and number format are part of the results identities.
TEST(ModelFields, TinyPresetTextIsPinned) {
  ModelConfig tiny = load_model_preset("tiny");
  tiny.rms_norm_eps = 1e-5f;  // as in the file; written with max_digits10
  EXPECT_EQ(emit(to_preset_yaml(tiny)),
            "name: tiny\n"
            "hidden: 128\n"
            "vocab: 4096\n"
            "rms_norm_eps: 9.99999975e-06\n"
            "n_heads: 8\n"
            "qk_nope_head_dim: 32\n"
            "qk_rope_head_dim: 0\n"
            "v_head_dim: 32\n"
            "q_lora_rank: 64\n"
            "kv_lora_rank: 64\n"
            "index_n_heads: 4\n"
            "index_head_dim: 32\n"
            "index_topk: 16\n"
            "index_kpool: 4\n"
            "index_norm_eps: 9.99999997e-07\n"
            "n_routed_experts: 8\n"
            "num_experts_per_tok: 2\n"
            "n_shared_experts: 1\n"
            "moe_intermediate_size: 64\n"
            "n_group: 1\n"
            "topk_group: 1\n"
            "routed_scaling_factor: 2.5\n"
            "swiglu_limit: 10\n"
            "max_seq_len: 4096\n"
            "block_size: 64\n"
            "num_hidden_layers: 45\n"
            "first_k_dense_replace: 0\n"
            "intermediate_size: 256\n"
            "checkpoint:\n"
            "  embed_tokens: model.language_model.embed_tokens.weight\n"
            "  lm_head: lm_head.weight\n"
            "  mtp_prefix: model.language_model.layers.45.\n"
            "  layers_prefix: model.language_model.layers.\n"
            "  final_norm: model.language_model.norm.weight");
  // The index is written where the prefix names no numbered layer.
  tiny.mtp_prefix = "mtp.";
  tiny.mtp_layer_index = 7;
  const std::string text = emit(to_preset_yaml(tiny));
  EXPECT_NE(text.find("checkpoint:\n  mtp_layer_index: 7\n  embed_tokens:"), std::string::npos) << text;
}
