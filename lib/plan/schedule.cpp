// Engine schedules: the ranges, the three syntaxes and their readers (schedule.hpp).
#include "plan/schedule.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"
#include "core/json.hpp"
#include "core/str.hpp"
#include "core/yaml.hpp"
#include "plan/profile.hpp"

namespace mtplab::plan {

std::vector<BatchRange> schedule_ranges(const std::vector<ScheduleEntry>& entries, int max_batch) {
  std::vector<BatchRange> out;
  int lo = 1;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ScheduleEntry& e = entries[i];
    MTP_REQUIRE(e.batch >= 1 && e.k >= 0, "schedule: batch ", e.batch, " k ", e.k);
    MTP_REQUIRE(i == 0 || e.batch > entries[i - 1].batch, "schedule: batch sizes not increasing at ",
                e.batch);
    if (!out.empty() && out.back().k == e.k)
      out.back().hi = e.batch;
    else
      out.push_back({lo, e.batch, e.k});
    lo = e.batch + 1;
  }
  if (!entries.empty() && max_batch >= lo) {
    if (!out.empty() && out.back().k == 0)
      out.back().hi = max_batch;
    else
      out.push_back({lo, max_batch, 0});
  }
  return out;
}

int range_k(const std::vector<BatchRange>& ranges, int B) {
  for (const auto& r : ranges)
    if (B >= r.lo && B <= r.hi) return r.k;
  return 0;
}

namespace {

int max_k(const std::vector<ScheduleEntry>& entries) {
  int k = 0;
  for (const auto& e : entries) k = std::max(k, e.k);
  return k;
}

const json::Value* member(const json::Value& o, const std::string& key) {
  for (const auto& [k, v] : o.members)
    if (k == key) return &v;
  return nullptr;
}

int json_int(const json::Value& v, const std::string& where, int min) {
  MTP_REQUIRE(v.kind == json::Value::Kind::number, where, ": expected a whole number, got ", v.kind_name());
  const auto i = parse_int64(v.text);
  MTP_REQUIRE(i && *i >= min && *i <= (1 << 30), where, ": \"", v.text, "\" is not a whole number >= ", min);
  return static_cast<int>(*i);
}

// "lo-hi" -> (lo, hi).
std::pair<int, int> parse_range_key(const std::string& key, const std::string& where) {
  const auto dash = key.find('-');
  MTP_REQUIRE(dash != std::string::npos, where, ": range \"", key, "\" is not \"lo-hi\"");
  const auto lo = parse_int64(key.substr(0, dash)), hi = parse_int64(key.substr(dash + 1));
  MTP_REQUIRE(lo && hi && *lo >= 1 && *hi >= *lo, where, ": range \"", key,
              "\" is not \"lo-hi\" with 1 <= lo <= hi");
  return {static_cast<int>(*lo), static_cast<int>(*hi)};
}

}  // namespace

std::string vllm_schedule_json(const std::vector<ScheduleEntry>& entries, int max_batch) {
  const int kmax = max_k(entries);
  if (kmax == 0) return "null\n";
  std::vector<std::string> parts;
  for (const auto& r : schedule_ranges(entries, max_batch))
    parts.push_back(str("    ", json_string(str(r.lo, "-", r.hi)), ": ", r.k));
  return str("{\n  \"num_speculative_tokens\": ", kmax, ",\n  \"num_speculative_tokens_per_batch_size\": {\n",
             join(parts, ",\n"), "\n  }\n}\n");
}

std::vector<int> vllm_k_per_batch(const std::string& text, const std::string& name, int up_to) {
  const json::Value root = json::parse(text, name);
  std::vector<int> out(static_cast<size_t>(up_to) + 1, 0);
  if (root.kind == json::Value::Kind::null) return out;
  MTP_REQUIRE(root.kind == json::Value::Kind::object, name, ": expected a speculative_config object or null");
  const json::Value* n = member(root, "num_speculative_tokens");
  MTP_REQUIRE(n, name, ": no num_speculative_tokens");
  const int kmax = json_int(*n, name + ": num_speculative_tokens", 1);
  const json::Value* sched = member(root, "num_speculative_tokens_per_batch_size");
  MTP_REQUIRE(sched && sched->kind == json::Value::Kind::object, name,
              ": num_speculative_tokens_per_batch_size is missing or not an object");
  std::vector<BatchRange> ranges;
  for (const auto& [key, v] : sched->members) {
    const std::string where = str(name, ": num_speculative_tokens_per_batch_size.", key);
    const auto [lo, hi] = parse_range_key(key, where);
    ranges.push_back({lo, hi, json_int(v, where, 0)});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const BatchRange& a, const BatchRange& b) { return a.lo < b.lo; });
  for (size_t i = 1; i < ranges.size(); ++i)
    MTP_REQUIRE(ranges[i].lo > ranges[i - 1].hi, name, ": ranges ", ranges[i - 1].lo, "-", ranges[i - 1].hi,
                " and ", ranges[i].lo, "-", ranges[i].hi, " overlap");
  for (int B = 1; B <= up_to; ++B) {
    int k = -1;  // below every range: not defined by the schedule
    for (const auto& r : ranges)
      if (B >= r.lo) k = r.k;  // inside a range, or in the gap after it: that range's k
    out[static_cast<size_t>(B)] = k < 0 ? -1 : std::min(k, kmax);
  }
  return out;
}

std::string trtllm_schedule_yaml(const std::vector<ScheduleEntry>& entries) {
  const int kmax = max_k(entries);
  if (kmax == 0) return "speculative_config: null\n";
  std::vector<BatchRange> ranges = schedule_ranges(entries, 0);
  while (!ranges.empty() && ranges.back().k == 0) ranges.pop_back();  // above the largest key: 0 anyway
  std::string s = str("speculative_config:\n  max_draft_len: ", kmax, "\n  draft_len_schedule:\n");
  for (const auto& r : ranges) s += str("    ", r.hi, ": ", r.k, "\n");
  return s;
}

std::vector<int> trtllm_k_per_batch(const std::string& text, const std::string& name, int up_to) {
  const YamlNode root = YamlNode::load_string(text, name);
  std::vector<int> out(static_cast<size_t>(up_to) + 1, 0);
  if (!root.is_map() || root.entries().size() != 1 || root.entries()[0].first != "speculative_config")
    root.fail("expected one key, speculative_config");
  const YamlNode cfg = root.entries()[0].second;
  if (cfg.is_null()) return out;  // MTP off at every batch size
  MapReader m(cfg);
  const int kmax = static_cast<int>(m.req_int("max_draft_len", 1, 1 << 20));
  const YamlNode sched = m.req("draft_len_schedule");
  m.finish();
  if (!sched.is_map()) sched.fail("expected a mapping {batch upper bound: draft length}");
  std::map<int, int> bound;
  for (const auto& [key, v] : sched.entries()) {
    const auto b = parse_int64(key);
    if (!b || *b < 1) v.fail(str("key \"", key, "\" is not a batch size >= 1"));
    bound[static_cast<int>(*b)] = static_cast<int>(v.as_int(0, kmax));
  }
  for (int B = 1; B <= up_to; ++B) {
    const auto it = bound.lower_bound(B);
    out[static_cast<size_t>(B)] = it == bound.end() ? 0 : it->second;
  }
  return out;
}

std::string sglang_flags(int k) {
  if (k == 0) return "";
  return str("--speculative-algorithm NEXTN --speculative-num-steps ", k,
             " --speculative-eagle-topk 1 --speculative-num-draft-tokens ", k + 1);
}

std::string sglang_flags_json(const std::vector<ScheduleEntry>& entries, int max_batch) {
  std::vector<std::string> parts;
  for (const auto& r : schedule_ranges(entries, max_batch))
    parts.push_back(str("    {\"batch\": ", json_string(str(r.lo, "-", r.hi)), ", \"lo\": ", r.lo,
                        ", \"hi\": ", r.hi, ", \"k\": ", r.k, ", \"flags\": ", json_string(sglang_flags(r.k)),
                        "}"));
  return str(
      "{\n  \"engine\": \"sglang\",\n  \"note\": ",
      json_string("SGLang reads no per-batch schedule: launch the server for a concurrency range with its "
                  "flags (none: MTP off)"),
      ",\n  \"ranges\": [\n", join(parts, ",\n"), "\n  ]\n}\n");
}

std::vector<int> sglang_k_per_batch(const std::string& text, const std::string& name, int up_to) {
  const json::Value root = json::parse(text, name);
  MTP_REQUIRE(root.kind == json::Value::Kind::object, name, ": expected an object");
  const json::Value* ranges = member(root, "ranges");
  MTP_REQUIRE(ranges && ranges->kind == json::Value::Kind::array, name,
              ": ranges is missing or not an array");
  std::vector<int> out(static_cast<size_t>(up_to) + 1, -1);
  out[0] = 0;
  for (size_t i = 0; i < ranges->items.size(); ++i) {
    const json::Value& r = ranges->items[i];
    const std::string where = str(name, ": ranges[", i, "]");
    MTP_REQUIRE(r.kind == json::Value::Kind::object, where, ": expected an object");
    const json::Value *lo = member(r, "lo"), *hi = member(r, "hi"), *k = member(r, "k"),
                      *flags = member(r, "flags");
    MTP_REQUIRE(lo && hi && k && flags && flags->kind == json::Value::Kind::string, where,
                ": needs lo, hi, k and flags");
    const int l = json_int(*lo, where + ".lo", 1), h = json_int(*hi, where + ".hi", l),
              kk = json_int(*k, where + ".k", 0);
    MTP_REQUIRE(flags->text == sglang_flags(kk), where, ".flags: \"", flags->text,
                "\" is not the launch flags of k = ", kk, " (\"", sglang_flags(kk), "\")");
    for (int B = l; B <= std::min(h, up_to); ++B) {
      MTP_REQUIRE(out[static_cast<size_t>(B)] < 0, where, ": batch size ", B, " is in two ranges");
      out[static_cast<size_t>(B)] = kk;
    }
  }
  return out;
}

}  // namespace mtplab::plan
