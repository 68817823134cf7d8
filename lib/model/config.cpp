// ModelConfig parsing, validation and the preset writer, each walking the field table
// (model/fields.hpp). Ranges are checked as the keys are read (so the error points at the value);
// invariants that tie keys together are checked in validate(), which names the key it blames
// through the locations recorded while reading.
#include "model/config.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <vector>

#include "model/fields.hpp"

#ifndef MTPLAB_SOURCE_DIR_DEFAULT
#define MTPLAB_SOURCE_DIR_DEFAULT ""
#endif

namespace mtplab::model {
namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string stem_of(const std::string& path) {
  std::string base = std::filesystem::path(path).filename().string();
  for (const char* ext : {".yaml", ".yml"}) {
    const std::string e = ext;
    if (base.size() > e.size() && base.compare(base.size() - e.size(), e.size(), e) == 0)
      return base.substr(0, base.size() - e.size());
  }
  return base;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || ends_with(s, ".yaml") || ends_with(s, ".yml") ||
         ends_with(s, ".json");
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

/// N when `prefix` ends with "layers.N." (N decimal), else -1.
int prefix_layer_index(const std::string& prefix) {
  const std::string tail = "layers.";
  if (prefix.size() < tail.size() + 2 || prefix.back() != '.') return -1;
  size_t digits_end = prefix.size() - 1, digits_begin = digits_end;
  while (digits_begin > 0 && std::isdigit(static_cast<unsigned char>(prefix[digits_begin - 1])))
    --digits_begin;
  if (digits_begin == digits_end || digits_end - digits_begin > 7 || digits_begin < tail.size()) return -1;
  if (prefix.compare(digits_begin - tail.size(), tail.size(), tail) != 0) return -1;
  return std::stoi(prefix.substr(digits_begin, digits_end - digits_begin));
}

/// Reads, in table order, the fields whose preset key is `prefix` followed by a key of `map`, and
/// records where each value came from. An optional key left out keeps the member's default (or
/// the row's `absent` value).
void read_fields(MapReader& map, ModelConfig& c, const std::string& prefix) {
  for (const ModelField& f : model_fields()) {
    if (!f.key) continue;
    const std::string key = f.key;
    if (key.compare(0, prefix.size(), prefix) != 0 || key.find('.', prefix.size()) != std::string::npos)
      continue;
    const std::string sub = key.substr(prefix.size());
    const std::optional<YamlNode> n = f.required ? std::optional<YamlNode>(map.req(sub)) : map.opt(sub);
    if (!n) {
      if (f.absent) {
        if (f.type() == FieldType::integer) field_ref<int>(c, f.member) = static_cast<int>(*f.absent);
        if (f.type() == FieldType::real) field_ref<float>(c, f.member) = static_cast<float>(*f.absent);
      }
      continue;
    }
    read_field(c, f.member, f.range, *n);
    c.key_locations[key] = n->where();
  }
}

/// The trunk's names when the checkpoint mapping does not give them: the layers under the MTP
/// layer's "...layers." (the default layout when the prefix names no numbered layer), and the
/// final norm beside them ("...norm.weight").
void derive_trunk_names(ModelConfig& c) {
  if (!c.key_locations.count("checkpoint.layers_prefix") && prefix_layer_index(c.mtp_prefix) >= 0) {
    const std::string body = c.mtp_prefix.substr(0, c.mtp_prefix.size() - 1);  // without the last '.'
    c.layers_prefix = body.substr(0, body.rfind('.') + 1);
  }
  const std::string tail = "layers.";
  if (!c.key_locations.count("checkpoint.final_norm") && c.layers_prefix.size() >= tail.size() &&
      c.layers_prefix.compare(c.layers_prefix.size() - tail.size(), tail.size(), tail) == 0)
    c.final_norm_name = c.layers_prefix.substr(0, c.layers_prefix.size() - tail.size()) + "norm.weight";
}

}  // namespace

float ModelConfig::softmax_scale() const { return 1.0f / std::sqrt(static_cast<float>(qk_head_dim())); }

void ModelConfig::set_max_seq_len(int requested) {
  MTP_REQUIRE(index_kpool > 0, where("index_kpool"), ": index_kpool must be set before max_seq_len");
  max_seq_len_requested = requested;
  max_seq_len = requested / index_kpool * index_kpool;
  MTP_REQUIRE(max_seq_len > 0, where("max_seq_len"), ": max_seq_len ", requested,
              " holds no complete pool of index_kpool = ", index_kpool, " rows");
}

std::string ModelConfig::where(const std::string& key) const {
  auto it = key_locations.find(key);
  if (it != key_locations.end()) return it->second;
  if (!source.empty()) return str(source, ": ", key);
  return str("model config '", name, "': ", key);
}

void ModelConfig::validate(int tp, int ep) const {
  MTP_REQUIRE(tp >= 1, "model config '", name, "': tp must be >= 1, got ", tp);
  MTP_REQUIRE(ep >= 1, "model config '", name, "': ep must be >= 1, got ", ep);

  // Each field by itself, as its row says: the positive integers, the non-negative ones, the reals,
  // then the fields that must be zero (the first failure is the one reported).
  const auto note = [](const ModelField& f) { return f.check_note ? f.check_note : ""; };
  for (const ModelField& f : model_fields())
    if (f.type() == FieldType::integer && f.check == FieldCheck::positive) {
      const int v = field_ref<int>(*this, f.member);
      MTP_REQUIRE(v > 0, where(f.label()), ": ", f.label(), " must be positive, got ", v);
    }
  for (const ModelField& f : model_fields())
    if (f.type() == FieldType::integer && f.check == FieldCheck::non_negative) {
      const int v = field_ref<int>(*this, f.member);
      MTP_REQUIRE(v >= 0, where(f.label()), ": ", f.label(), " must be >= 0, got ", v);
    }
  for (const ModelField& f : model_fields())
    if (f.type() == FieldType::real) {
      const float v = field_ref<float>(*this, f.member);
      if (f.check == FieldCheck::positive)
        MTP_REQUIRE(v > 0, where(f.label()), ": ", f.label(), " must be positive", note(f));
      if (f.check == FieldCheck::non_negative)
        MTP_REQUIRE(v >= 0, where(f.label()), ": ", f.label(), " must be >= 0", note(f));
    }
  for (const ModelField& f : model_fields())
    if (f.type() == FieldType::integer && f.check == FieldCheck::zero) {
      const int v = field_ref<int>(*this, f.member);
      MTP_REQUIRE(v == 0, where(f.label()), ": ", f.label(), " ", v, " is not supported: ", note(f));
    }

  MTP_REQUIRE(index_topk % index_kpool == 0, where("index_topk"), ": index_topk ", index_topk,
              " is not a multiple of index_kpool ", index_kpool, " (the indexer selects whole pools)");
  MTP_REQUIRE(max_seq_len % index_kpool == 0, where("max_seq_len"), ": usable max_seq_len ", max_seq_len,
              " is not a whole number of pools of index_kpool ", index_kpool,
              " rows (use set_max_seq_len to round it)");
  MTP_REQUIRE(max_seq_len_requested == 0 || max_seq_len <= max_seq_len_requested, where("max_seq_len"),
              ": usable max_seq_len ", max_seq_len, " exceeds the requested ", max_seq_len_requested);

  MTP_REQUIRE(n_heads % tp == 0, where("n_heads"), ": n_heads ", n_heads, " does not divide over tp = ", tp,
              " ranks (every rank must run the same number of attention heads)");
  MTP_REQUIRE(ep <= n_routed_experts, where("n_routed_experts"), ": ", n_routed_experts,
              " routed experts cannot give each of ep = ", ep, " ranks at least one");

  MTP_REQUIRE(num_experts_per_tok <= n_routed_experts, where("num_experts_per_tok"), ": num_experts_per_tok ",
              num_experts_per_tok, " exceeds n_routed_experts ", n_routed_experts);
  MTP_REQUIRE(n_routed_experts % n_group == 0, where("n_group"), ": n_group ", n_group,
              " does not divide n_routed_experts ", n_routed_experts);
  MTP_REQUIRE(topk_group <= n_group, where("topk_group"), ": topk_group ", topk_group, " exceeds n_group ",
              n_group);
  const int per_group = n_routed_experts / n_group;
  MTP_REQUIRE(n_group == 1 || per_group >= 2, where("n_group"), ": with n_group ", n_group,
              " each group holds ", per_group,
              " expert(s); group scores sum the top 2 of a group, so it needs at least 2");
  MTP_REQUIRE(num_experts_per_tok <= topk_group * per_group, where("num_experts_per_tok"),
              ": num_experts_per_tok ", num_experts_per_tok, " exceeds the ", topk_group * per_group,
              " experts that the group limit keeps (topk_group ", topk_group, " x ", per_group,
              " per group)");

  MTP_REQUIRE(mtp_prefix.empty() || mtp_prefix.back() == '.', where("checkpoint.mtp_prefix"),
              ": mtp_prefix \"", mtp_prefix, "\" must end with '.'");
  MTP_REQUIRE(!embed_tokens_name.empty(), where("checkpoint.embed_tokens"), ": embed_tokens name is empty");
  MTP_REQUIRE(!lm_head_name.empty(), where("checkpoint.lm_head"), ": lm_head name is empty");

  // The target's trunk.
  MTP_REQUIRE(num_hidden_layers == 0 || first_k_dense_replace <= num_hidden_layers,
              where("first_k_dense_replace"), ": first_k_dense_replace ", first_k_dense_replace,
              " exceeds num_hidden_layers ", num_hidden_layers);
  MTP_REQUIRE(first_k_dense_replace == 0 || intermediate_size > 0, where("intermediate_size"),
              ": intermediate_size must be positive when first_k_dense_replace is ", first_k_dense_replace,
              " (it is the width of the dense MLP of trunk layers 0 .. ", first_k_dense_replace - 1, ")");
  MTP_REQUIRE(layers_prefix.empty() || layers_prefix.back() == '.', where("checkpoint.layers_prefix"),
              ": layers_prefix \"", layers_prefix, "\" must end with '.'");
  MTP_REQUIRE(!final_norm_name.empty(), where("checkpoint.final_norm"), ": final_norm name is empty");

  // Element counts that index 32-bit device code must fit.
  const int64_t embed = static_cast<int64_t>(vocab) * hidden;
  MTP_REQUIRE(embed < (int64_t{1} << 40), where("vocab"), ": vocab x hidden is implausibly large");
}

std::string ModelConfig::summary() const {
  return str(name, ": H ", hidden, ", V ", vocab, ", heads ", n_heads, " x ", qk_head_dim(), "/", v_head_dim,
             ", q_lora ", q_lora_rank, ", kv_lora ", kv_lora_rank, ", indexer ", index_n_heads, " x ",
             index_head_dim, " top ", index_topk, " pool ", index_kpool, ", experts ", n_routed_experts,
             " top ", num_experts_per_tok, " + ", n_shared_experts, " shared, I ", moe_intermediate_size,
             ", max_seq_len ", max_seq_len);
}

ModelConfig parse_model_config(const YamlNode& node) {
  ModelConfig c;
  c.source = node.file();
  c.name = stem_of(node.file());  // unless the preset names itself
  MapReader r(node);
  read_fields(r, c, "");
  c.set_max_seq_len(c.max_seq_len_requested);

  if (auto ck = r.opt("checkpoint")) {
    MapReader cr(*ck);
    read_fields(cr, c, "checkpoint.");
    cr.finish();
    const bool has_index = c.key_locations.count("checkpoint.mtp_layer_index") > 0;
    const bool has_prefix = c.key_locations.count("checkpoint.mtp_prefix") > 0;
    if (!has_prefix) {
      c.mtp_prefix = str("model.language_model.layers.", c.mtp_layer_index, ".");
    } else {
      const int named = prefix_layer_index(c.mtp_prefix);
      const bool well_formed = c.mtp_prefix.empty() || c.mtp_prefix.back() == '.';  // else validate() says so
      if (has_index && well_formed) {
        MTP_REQUIRE(named == c.mtp_layer_index, c.where("checkpoint.mtp_prefix"), ": mtp_prefix \"",
                    c.mtp_prefix, "\" and mtp_layer_index ", c.mtp_layer_index, " (",
                    c.where("checkpoint.mtp_layer_index"), ") disagree: the prefix must end with \"layers.",
                    c.mtp_layer_index, ".\" (or give only one of the two)");
      } else if (!has_index) {
        c.mtp_layer_index = named;  // -1: the prefix names no numbered layer
      }
    }
  } else {
    c.mtp_prefix = str("model.language_model.layers.", c.mtp_layer_index, ".");
  }
  derive_trunk_names(c);
  r.finish();
  c.validate(1, 1);
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  return parse_model_config(YamlNode::load_file(path));
}

std::string presets_dir() {
  if (const char* env = std::getenv("MTPLAB_SOURCE_DIR"); env && *env) return str(env, "/configs");
  return str(MTPLAB_SOURCE_DIR_DEFAULT, "/configs");
}

ModelConfig load_model_preset(const std::string& name_or_path) {
  MTP_REQUIRE(!name_or_path.empty(), "model preset: empty name");
  if (looks_like_path(name_or_path)) {
    if (is_directory(name_or_path) || ends_with(name_or_path, ".json")) return load_hf_config(name_or_path);
    return load_model_config(name_or_path);
  }

  std::vector<std::string> dirs;
  if (const char* env = std::getenv("MTPLAB_SOURCE_DIR"); env && *env) dirs.push_back(str(env, "/configs"));
  if (*MTPLAB_SOURCE_DIR_DEFAULT) dirs.push_back(str(MTPLAB_SOURCE_DIR_DEFAULT, "/configs"));
  dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
  for (const auto& d : dirs) {
    const std::string file = str(d, "/", name_or_path, ".yaml");
    if (is_file(file)) return load_model_config(file);
  }
  std::vector<std::string> known;
  for (const auto& d : dirs) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(d, ec))
      if (entry.path().extension() == ".yaml") known.push_back(entry.path().stem().string());
  }
  if (is_directory(name_or_path)) return load_hf_config(name_or_path);
  std::sort(known.begin(), known.end());
  known.erase(std::unique(known.begin(), known.end()), known.end());
  MTP_FAIL("unknown model preset '", name_or_path, "': no ", name_or_path, ".yaml in {", join(dirs, ", "),
           "}; presets there: {", join(known, ", "),
           "} (or give a path to a .yaml file, or a checkpoint directory with a config.json)");
}

YAML::Node to_preset_yaml(const ModelConfig& cfg) {
  ModelConfig c = cfg;
  if (c.max_seq_len_requested <= 0) c.max_seq_len_requested = c.max_seq_len;  // set directly in code
  YAML::Node n(YAML::NodeType::Map);
  YAML::Node ck(YAML::NodeType::Map);
  const std::string sub = "checkpoint.";
  for (const ModelField& f : model_fields()) {
    if (!f.key) continue;
    const std::string key = f.key;
    // Reals with max_digits10: the text reads back as the same float.
    const std::string text = field_text(c, f.member, std::numeric_limits<float>::max_digits10);
    if (key.compare(0, sub.size(), sub) != 0) {
      n[key] = text;
      continue;
    }
    // The index only where the prefix does not say it (an override of either key alone then
    // follows the rules of a preset file: the two must agree when both are given).
    if (f.member == FieldMember<ModelConfig>(&ModelConfig::mtp_layer_index) &&
        !(prefix_layer_index(c.mtp_prefix) < 0 && c.mtp_layer_index >= 0))
      continue;
    ck[key.substr(sub.size())] = text;
  }
  n["checkpoint"] = ck;
  return n;
}

}  // namespace mtplab::model
