// ModelConfig parsing and validation. Ranges are checked as the keys are read (so the error
// points at the value); invariants that tie keys together are checked in validate(), which
// names the key it blames through the locations recorded while reading.
#include "model/config.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <sstream>
#include <type_traits>
#include <vector>

#ifndef MTPLAB_SOURCE_DIR_DEFAULT
#define MTPLAB_SOURCE_DIR_DEFAULT ""
#endif

namespace mtplab::model {
namespace {

constexpr int64_t kMaxDim = 1 << 20;

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

/// Reads keys of one mapping into a config and records where each came from.
class Reader {
 public:
  Reader(const YamlNode& node, ModelConfig& cfg, std::string prefix)
      : map_(node), cfg_(cfg), prefix_(std::move(prefix)) {}

  void req_int(const std::string& key, int& dst, int64_t lo, int64_t hi) {
    take(key, map_.req(key), dst, lo, hi);
  }
  void opt_int(const std::string& key, int& dst, int64_t lo, int64_t hi) {
    if (auto n = map_.opt(key)) take(key, *n, dst, lo, hi);
  }
  void req_float(const std::string& key, float& dst, double lo, double hi) {
    take(key, map_.req(key), dst, lo, hi);
  }
  void opt_float(const std::string& key, float& dst, double lo, double hi) {
    if (auto n = map_.opt(key)) take(key, *n, dst, lo, hi);
  }
  bool opt_string(const std::string& key, std::string& dst) {
    if (auto n = map_.opt(key)) {
      dst = n->as_string();
      note(key, *n);
      return true;
    }
    return false;
  }
  std::optional<YamlNode> opt(const std::string& key) { return map_.opt(key); }
  void finish() { map_.finish(); }

 private:
  void note(const std::string& key, const YamlNode& n) { cfg_.key_locations[prefix_ + key] = n.where(); }
  void take(const std::string& key, const YamlNode& n, int& dst, int64_t lo, int64_t hi) {
    dst = static_cast<int>(n.as_int(lo, hi));
    note(key, n);
  }
  void take(const std::string& key, const YamlNode& n, float& dst, double lo, double hi) {
    dst = static_cast<float>(n.as_double(lo, hi));
    note(key, n);
  }

  MapReader map_;
  ModelConfig& cfg_;
  std::string prefix_;
};

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

  const std::pair<const char*, int> positive[] = {
      {"hidden", hidden},
      {"vocab", vocab},
      {"n_heads", n_heads},
      {"qk_nope_head_dim", qk_nope_head_dim},
      {"v_head_dim", v_head_dim},
      {"q_lora_rank", q_lora_rank},
      {"kv_lora_rank", kv_lora_rank},
      {"index_n_heads", index_n_heads},
      {"index_head_dim", index_head_dim},
      {"index_topk", index_topk},
      {"index_kpool", index_kpool},
      {"n_routed_experts", n_routed_experts},
      {"num_experts_per_tok", num_experts_per_tok},
      {"moe_intermediate_size", moe_intermediate_size},
      {"n_group", n_group},
      {"topk_group", topk_group},
      {"max_seq_len", max_seq_len},
      {"block_size", block_size},
  };
  for (const auto& [key, value] : positive)
    MTP_REQUIRE(value > 0, where(key), ": ", key, " must be positive, got ", value);
  MTP_REQUIRE(n_shared_experts >= 0, where("n_shared_experts"), ": n_shared_experts must be >= 0, got ",
              n_shared_experts);
  MTP_REQUIRE(rms_norm_eps > 0, where("rms_norm_eps"), ": rms_norm_eps must be positive");
  MTP_REQUIRE(index_norm_eps > 0, where("index_norm_eps"), ": index_norm_eps must be positive");
  MTP_REQUIRE(routed_scaling_factor > 0, where("routed_scaling_factor"),
              ": routed_scaling_factor must be positive");
  MTP_REQUIRE(swiglu_limit >= 0, where("swiglu_limit"), ": swiglu_limit must be >= 0 (0 disables the clamp)");

  MTP_REQUIRE(qk_rope_head_dim == 0, where("qk_rope_head_dim"), ": qk_rope_head_dim ", qk_rope_head_dim,
              " is not supported: RoPE is not implemented (GLM-5.3-Flash has none), set it to 0");

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
  Reader r(node, c, "");
  if (!r.opt_string("name", c.name)) c.name = stem_of(node.file());

  r.req_int("hidden", c.hidden, 1, kMaxDim);
  r.req_int("vocab", c.vocab, 1, int64_t{1} << 26);
  r.req_float("rms_norm_eps", c.rms_norm_eps, 1e-12, 0.1);

  r.req_int("n_heads", c.n_heads, 1, 4096);
  r.req_int("qk_nope_head_dim", c.qk_nope_head_dim, 1, 4096);
  r.opt_int("qk_rope_head_dim", c.qk_rope_head_dim, 0, 4096);
  r.req_int("v_head_dim", c.v_head_dim, 1, 4096);
  r.req_int("q_lora_rank", c.q_lora_rank, 1, kMaxDim);
  r.req_int("kv_lora_rank", c.kv_lora_rank, 1, kMaxDim);

  r.req_int("index_n_heads", c.index_n_heads, 1, 4096);
  r.req_int("index_head_dim", c.index_head_dim, 1, 4096);
  r.req_int("index_topk", c.index_topk, 1, kMaxDim);
  r.req_int("index_kpool", c.index_kpool, 1, 1024);
  r.opt_float("index_norm_eps", c.index_norm_eps, 1e-12, 0.1);

  r.req_int("n_routed_experts", c.n_routed_experts, 1, 65536);
  r.req_int("num_experts_per_tok", c.num_experts_per_tok, 1, 1024);
  r.req_int("n_shared_experts", c.n_shared_experts, 0, 64);
  r.req_int("moe_intermediate_size", c.moe_intermediate_size, 1, kMaxDim);
  r.opt_int("n_group", c.n_group, 1, 65536);
  r.opt_int("topk_group", c.topk_group, 1, 65536);
  r.req_float("routed_scaling_factor", c.routed_scaling_factor, 1e-6, 1e6);
  r.req_float("swiglu_limit", c.swiglu_limit, 0.0, 1e9);

  int requested = 4096;
  r.opt_int("max_seq_len", requested, 1, int64_t{1} << 26);
  r.opt_int("block_size", c.block_size, 1, 1 << 16);
  c.set_max_seq_len(requested);

  if (auto ck = r.opt("checkpoint")) {
    Reader cr(*ck, c, "checkpoint.");
    const bool has_index = cr.opt("mtp_layer_index").has_value();
    cr.opt_int("mtp_layer_index", c.mtp_layer_index, 0, 1 << 20);
    cr.opt_string("embed_tokens", c.embed_tokens_name);
    cr.opt_string("lm_head", c.lm_head_name);
    const bool has_prefix = cr.opt_string("mtp_prefix", c.mtp_prefix);
    cr.finish();
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

YAML::Node to_preset_yaml(const ModelConfig& c) {
  YAML::Node n(YAML::NodeType::Map);
  auto put = [&](const char* key, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, float>) {
      std::ostringstream os;  // max_digits10: the text reads back as the same float
      os << std::setprecision(std::numeric_limits<float>::max_digits10) << value;
      n[key] = os.str();
    } else {
      n[key] = str(value);
    }
  };
  put("name", c.name);
  put("hidden", c.hidden);
  put("vocab", c.vocab);
  put("rms_norm_eps", c.rms_norm_eps);
  put("n_heads", c.n_heads);
  put("qk_nope_head_dim", c.qk_nope_head_dim);
  put("qk_rope_head_dim", c.qk_rope_head_dim);
  put("v_head_dim", c.v_head_dim);
  put("q_lora_rank", c.q_lora_rank);
  put("kv_lora_rank", c.kv_lora_rank);
  put("index_n_heads", c.index_n_heads);
  put("index_head_dim", c.index_head_dim);
  put("index_topk", c.index_topk);
  put("index_kpool", c.index_kpool);
  put("index_norm_eps", c.index_norm_eps);
  put("n_routed_experts", c.n_routed_experts);
  put("num_experts_per_tok", c.num_experts_per_tok);
  put("n_shared_experts", c.n_shared_experts);
  put("moe_intermediate_size", c.moe_intermediate_size);
  put("n_group", c.n_group);
  put("topk_group", c.topk_group);
  put("routed_scaling_factor", c.routed_scaling_factor);
  put("swiglu_limit", c.swiglu_limit);
  put("max_seq_len", c.max_seq_len_requested > 0 ? c.max_seq_len_requested : c.max_seq_len);
  put("block_size", c.block_size);
  YAML::Node ck(YAML::NodeType::Map);
  // The index only where the prefix does not say it (an override of either key alone then
  // follows the rules of a preset file: the two must agree when both are given).
  if (prefix_layer_index(c.mtp_prefix) < 0 && c.mtp_layer_index >= 0)
    ck["mtp_layer_index"] = str(c.mtp_layer_index);
  ck["embed_tokens"] = c.embed_tokens_name;
  ck["lm_head"] = c.lm_head_name;
  ck["mtp_prefix"] = c.mtp_prefix;
  n["checkpoint"] = ck;
  return n;
}

}  // namespace mtplab::model
