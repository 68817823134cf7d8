// The trained model a test_trained_model*.cpp executable checks: its data folder, config and trace
// names come from compile definitions (tests/drafter/CMakeLists.txt builds one executable per
// folder: data/trained-tiny/, data/trained-mini/), and the oracle's figures from its meta.json.
//
//   MTPLAB_TRAINED_DIR      folder under the source tree ("data/trained-tiny")
//   MTPLAB_TRAINED_CONFIG   model config in that folder ("trained-tiny.yaml")
//   MTPLAB_TRAINED_TRACES   greedy traces, comma-separated ("trace.h5" or "trace-code.h5,...")
//   MTPLAB_TRAINED_SAMPLED  sampled traces, comma-separated ("trace-T0.7.h5,trace-T1.0.h5")
//   MTPLAB_TRAINED_SUBSET   0: replay every sequence; 1: only the first n, where n is what the
//                           oracle recorded figures for separately (meta.json
//                           oracle.traces.<trace>.subset.sequences, a sampled trace's
//                           oracle.subset.sequences attribute), against those figures: keeps a
//                           larger model's CPU test to seconds
//   MTPLAB_TRAINED_MAX_K    the greedy oracle's largest k (3)
#pragma once

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/yaml.hpp"
#include "io/hdf5.hpp"
#include "io/trace.hpp"
#include "model/config.hpp"

#ifndef MTPLAB_TRAINED_DIR
#error "tests/drafter/CMakeLists.txt defines MTPLAB_TRAINED_DIR and the other MTPLAB_TRAINED_* values"
#endif

namespace mtplab::trained {

inline std::string data_dir() {
  const char* src = std::getenv("MTPLAB_SOURCE_DIR");
  return std::string(src ? src : ".") + "/" + MTPLAB_TRAINED_DIR;
}
inline std::string config_path() { return data_dir() + "/" + MTPLAB_TRAINED_CONFIG; }
inline bool use_subset() { return MTPLAB_TRAINED_SUBSET != 0; }
inline int max_k() { return MTPLAB_TRAINED_MAX_K; }

inline std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}
inline std::vector<std::string> greedy_traces() { return split_list(MTPLAB_TRAINED_TRACES); }
inline std::vector<std::string> sampled_traces() { return split_list(MTPLAB_TRAINED_SAMPLED); }

/// A gtest parameter name from a file name: "trace-code.h5" -> "trace_code_h5".
inline std::string param_name(const std::string& file) {
  std::string s = file;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

/// The first `limit` sequences of a trace (all when limit <= 0).
inline std::vector<io::TraceSequence> read_sequences(const std::string& path, const model::ModelConfig& cfg,
                                                     int limit) {
  io::TraceReader trace(path, cfg.hidden, cfg.vocab);
  std::vector<io::TraceSequence> seqs;
  const int64_t n = limit > 0 ? std::min<int64_t>(limit, trace.num_sequences()) : trace.num_sequences();
  for (int64_t s = 0; s < n; ++s) seqs.push_back(trace.sequence(s));
  return seqs;
}

/// The value under `key` of a mapping, or an error naming the file and the key path.
inline YamlNode child(const YamlNode& node, const std::string& key) {
  MTP_REQUIRE(node.is_map(), node.where(), ": expected a mapping holding '", key, "'");
  for (const auto& [k, v] : node.entries())
    if (k == key) return v;
  node.fail("no key '" + key + "'");
}
inline bool has_child(const YamlNode& node, const std::string& key) {
  if (!node.is_map()) return false;
  for (const auto& [k, v] : node.entries())
    if (k == key) return true;
  return false;
}

/// The greedy oracle's figures of one trace in meta.json, as the C++ replay must see them, and
/// how many sequences they cover (0: all). A model of one trace keeps them flat under oracle
/// (oracle.k1 ...), a model of several under oracle.traces.<trace>; with use_subset() they are
/// those of the first n sequences (<...>.subset.k1 ..., n = <...>.subset.sequences).
struct OracleFigures {
  YamlNode figures;
  int sequences = 0;
};
inline OracleFigures oracle_figures(const std::string& trace) {
  const YamlNode meta = YamlNode::load_file(data_dir() + "/meta.json");
  const YamlNode oracle = child(meta, "oracle");
  OracleFigures out{has_child(oracle, "traces") ? child(child(oracle, "traces"), trace) : oracle, 0};
  if (use_subset()) {
    out.figures = child(out.figures, "subset");
    out.sequences = static_cast<int>(child(out.figures, "sequences").as_int(1, 1 << 20));
  }
  return out;
}

/// The number of sequences a sampled trace's oracle.subset.* figures cover (0: all, without
/// use_subset()).
inline int sampled_subset(const std::string& path) {
  if (!use_subset()) return 0;
  const int64_t n = io::H5File::open_read(path).attr_int("oracle.subset.sequences");
  MTP_REQUIRE(n >= 1, path, ": oracle.subset.sequences is ", n);
  return static_cast<int>(n);
}

inline std::vector<double> doubles(const YamlNode& seq) {
  std::vector<double> out;
  for (const auto& v : seq.items()) out.push_back(v.as_double());
  return out;
}

}  // namespace mtplab::trained
