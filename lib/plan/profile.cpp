// Acceptance profiles: derived figures, the JSON writer and the strict reader (profile.hpp).
#include "plan/profile.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "core/json.hpp"
#include "core/str.hpp"

namespace mtplab::plan {

int AcceptanceProfile::k_max() const {
  return static_cast<int>(std::max(accepted_length.size(), marginal_rates.size()));
}

std::vector<double> AcceptanceProfile::marginal() const {
  if (!marginal_rates.empty()) return marginal_rates;
  std::vector<double> r;
  double prev = 1;
  for (double t : accepted_length) {
    r.push_back(t - prev);
    prev = t;
  }
  return r;
}

double AcceptanceProfile::tau(int k) const {
  MTP_REQUIRE(k >= 0 && k <= k_max(), "acceptance profile: no accepted length at k = ", k,
              " (it describes k = 1..", k_max(), ")");
  if (k == 0) return 1;
  if (static_cast<size_t>(k) <= accepted_length.size()) return accepted_length[static_cast<size_t>(k) - 1];
  double t = 1;
  for (int i = 0; i < k; ++i) t += marginal_rates[static_cast<size_t>(i)];
  return t;
}

std::vector<double> AcceptanceProfile::chain_marginal() const {
  std::vector<double> r = marginal();
  for (size_t i = 1; i < r.size(); ++i) r[i] = std::min(r[i], r[i - 1]);
  return r;
}

std::vector<std::string> AcceptanceProfile::monotonicity_notes() const {
  const std::vector<double> r = marginal(), c = chain_marginal();
  std::vector<std::string> out;
  for (size_t i = 0; i < r.size(); ++i)
    if (c[i] != r[i])
      out.push_back(str(
          "marginal rate at position ", i + 1, " (", r[i], ") is above the rate at position ", i, " (",
          r[i - 1], "): not one chain's (",
          accepted_length.empty() ? "as given" : "the accepted lengths were measured at each k separately",
          "); the conditional rates, the histogram and the vLLM list use ", c[i],
          " there (the running minimum)"));
  return out;
}

namespace {
// f(r_{i-1}, r_i) for i = 1 .. n over a chain's marginal rates, r_0 = 1.
template <typename F>
std::vector<double> over_neighbours(const std::vector<double>& r, F f) {
  std::vector<double> out;
  double prev = 1;
  for (double v : r) {
    out.push_back(f(prev, v));
    prev = v;
  }
  return out;
}
}  // namespace

std::vector<double> AcceptanceProfile::conditional() const {
  return over_neighbours(chain_marginal(), [](double prev, double v) { return prev > 0 ? v / prev : 0.0; });
}

std::vector<double> AcceptanceProfile::histogram() const {
  const std::vector<double> r = chain_marginal();
  std::vector<double> h = over_neighbours(r, [](double prev, double v) { return prev - v; });
  h.push_back(r.empty() ? 1.0 : r.back());
  return h;
}

void AcceptanceProfile::validate(const std::string& where) const {
  MTP_REQUIRE(k_max() >= 1, where, ": the profile holds neither accepted_length nor marginal_rates");
  double prev = 1;
  for (size_t i = 0; i < accepted_length.size(); ++i) {
    const double t = accepted_length[i];
    MTP_REQUIRE(std::isfinite(t) && t >= 1 && t <= static_cast<double>(i) + 2, where, ": accepted_length[", i,
                "] = ", t, " at k = ", i + 1, " is outside [1, ", i + 2, "]");
    MTP_REQUIRE(t >= prev - 1e-12, where, ": accepted_length[", i, "] = ", t,
                " is below the length at k = ", i, " (", prev,
                "): a longer draft never shortens the accepted length");
    prev = t;
  }
  for (size_t i = 0; i < marginal_rates.size(); ++i)
    MTP_REQUIRE(std::isfinite(marginal_rates[i]) && marginal_rates[i] >= 0 && marginal_rates[i] <= 1, where,
                ": marginal_rates[", i, "] = ", marginal_rates[i], " is outside [0, 1]");
  if (marginal_rates.empty())
    for (size_t i = 0; i < accepted_length.size(); ++i) {
      const double r = accepted_length[i] - (i ? accepted_length[i - 1] : 1.0);
      MTP_REQUIRE(r <= 1 + 1e-12, where, ": accepted_length rises by ", r, " from k = ", i, " to k = ", i + 1,
                  ": more than one token per draft");
    }
  MTP_REQUIRE(accepted_length_ci.empty() || accepted_length_ci.size() == accepted_length.size(), where,
              ": accepted_length_ci has ", accepted_length_ci.size(), " intervals for ",
              accepted_length.size(), " lengths");
  MTP_REQUIRE(marginal_rates_ci.empty() || marginal_rates_ci.size() == marginal_rates.size(), where,
              ": marginal_rates_ci has ", marginal_rates_ci.size(), " intervals for ", marginal_rates.size(),
              " rates");
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

namespace {

std::string number_list(const std::vector<double>& v) {
  std::vector<std::string> parts;
  for (double x : v) parts.push_back(json_number(x));
  return "[" + join(parts, ", ") + "]";
}

// Derived figures (differences and ratios of the primary ones) at 12 decimals: 0.84, not the
// 0.8400000000000001 that 1.84 - 1 leaves; far inside the reader's 1e-9 check.
std::string derived_list(std::vector<double> v) {
  for (double& x : v) x = std::round(x * 1e12) / 1e12;
  return number_list(v);
}

std::string interval_list(const std::vector<std::array<double, 2>>& v) {
  std::vector<std::string> parts;
  for (const auto& i : v) parts.push_back("[" + json_number(i[0]) + ", " + json_number(i[1]) + "]");
  return "[" + join(parts, ", ") + "]";
}

std::string string_list(const std::vector<std::string>& v) {
  std::vector<std::string> parts;
  for (const auto& s : v) parts.push_back("    " + json_string(s));
  return parts.empty() ? "[]" : "[\n" + join(parts, ",\n") + "\n  ]";
}

const json::Value* member(const json::Value& o, const std::string& key) {
  for (const auto& [k, v] : o.members)
    if (k == key) return &v;
  return nullptr;
}

double as_number(const json::Value& v, const std::string& where) {
  MTP_REQUIRE(v.kind == json::Value::Kind::number, where, ": expected a number, got ", v.kind_name());
  const auto d = parse_double(v.text);
  MTP_REQUIRE(d, where, ": \"", v.text, "\" is not a finite number");
  return *d;
}

std::string as_string(const json::Value& v, const std::string& where) {
  MTP_REQUIRE(v.kind == json::Value::Kind::string, where, ": expected a string, got ", v.kind_name());
  return v.text;
}

std::vector<double> as_numbers(const json::Value& v, const std::string& where) {
  MTP_REQUIRE(v.kind == json::Value::Kind::array, where, ": expected an array of numbers, got ",
              v.kind_name());
  std::vector<double> out;
  for (size_t i = 0; i < v.items.size(); ++i) out.push_back(as_number(v.items[i], str(where, "[", i, "]")));
  return out;
}

std::vector<std::array<double, 2>> as_intervals(const json::Value& v, const std::string& where) {
  MTP_REQUIRE(v.kind == json::Value::Kind::array, where, ": expected an array of [lo, hi] pairs, got ",
              v.kind_name());
  std::vector<std::array<double, 2>> out;
  for (size_t i = 0; i < v.items.size(); ++i) {
    const std::vector<double> pair = as_numbers(v.items[i], str(where, "[", i, "]"));
    MTP_REQUIRE(pair.size() == 2 && pair[0] <= pair[1], where, "[", i, "]: expected [lo, hi] with lo <= hi");
    out.push_back({pair[0], pair[1]});
  }
  return out;
}

// A derived key present in the file must equal the figure recomputed from the primary keys.
void check_derived(const json::Value& root, const std::string& key, const std::vector<double>& expected,
                   const std::string& name) {
  const json::Value* v = member(root, key);
  if (!v) return;
  const std::string where = str(name, ":", v->line, ":", v->column, ": ", key);
  const std::vector<double> got = as_numbers(*v, where);
  MTP_REQUIRE(got.size() == expected.size(), where, ": ", got.size(),
              " values, but the profile's rates give ", expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    MTP_REQUIRE(std::fabs(got[i] - expected[i]) <= 1e-9, where, "[", i, "] = ", got[i],
                " disagrees with the value the profile's primary figures give (", expected[i],
                "): a derived key is recomputed on reading; remove it or fix the primary figures");
}

}  // namespace

std::string profile_json(const AcceptanceProfile& p) {
  p.validate("profile");
  std::string s = "{\n";
  s += str("  \"schema\": ", json_string(kProfileSchema), ",\n");
  s += str("  \"schema_version\": ", kProfileSchemaVersion, ",\n");
  s += str("  \"description\": ", json_string(p.description), ",\n");
  s += str("  \"source\": ", json_string(p.source), ",\n");
  s += str("  \"units\": ", json_string(p.units), ",\n");
  s += str("  \"k_max\": ", p.k_max(), ",\n");
  if (!p.accepted_length.empty()) s += str("  \"accepted_length\": ", number_list(p.accepted_length), ",\n");
  if (!p.accepted_length_ci.empty())
    s += str("  \"accepted_length_ci\": ", interval_list(p.accepted_length_ci), ",\n");
  s += str("  \"marginal_rates\": ",
           p.marginal_rates.empty() ? derived_list(p.marginal()) : number_list(p.marginal_rates), ",\n");
  if (!p.marginal_rates_ci.empty())
    s += str("  \"marginal_rates_ci\": ", interval_list(p.marginal_rates_ci), ",\n");
  s += str("  \"conditional_rates\": ", derived_list(p.conditional()), ",\n");
  s += str("  \"accepted_length_histogram\": ", derived_list(p.histogram()), ",\n");
  s += str("  \"vllm_synthetic_acceptance_rates\": ", derived_list(p.chain_marginal()), ",\n");
  std::vector<std::string> notes = p.notes;
  for (const auto& n : p.monotonicity_notes())
    if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
  s += str("  \"notes\": ", string_list(notes), "\n");
  return s + "}\n";
}

AcceptanceProfile parse_profile(const std::string& text, const std::string& name) {
  const json::Value root = json::parse(text, name);
  MTP_REQUIRE(root.kind == json::Value::Kind::object, name, ": an acceptance profile is a JSON object, got ",
              root.kind_name());
  static const std::vector<std::string> known = {"schema",
                                                 "schema_version",
                                                 "description",
                                                 "source",
                                                 "units",
                                                 "k_max",
                                                 "accepted_length",
                                                 "accepted_length_ci",
                                                 "marginal_rates",
                                                 "marginal_rates_ci",
                                                 "conditional_rates",
                                                 "accepted_length_histogram",
                                                 "vllm_synthetic_acceptance_rates",
                                                 "notes"};
  for (const auto& [k, v] : root.members)
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      const std::string near = closest_match(k, known);
      MTP_FAIL(name, ":", v.line, ":", v.column, ": unknown key \"", k, "\" in an acceptance profile",
               near.empty() ? std::string() : str(" (did you mean \"", near, "\"?)"));
    }
  auto where = [&](const std::string& key) {
    const json::Value* v = member(root, key);
    return v ? str(name, ":", v->line, ":", v->column, ": ", key) : str(name, ": ", key);
  };
  const json::Value* schema = member(root, "schema");
  MTP_REQUIRE(schema && as_string(*schema, where("schema")) == kProfileSchema, name,
              ": not an acceptance profile: the key \"schema\" must be \"", kProfileSchema, "\"");
  const json::Value* version = member(root, "schema_version");
  MTP_REQUIRE(version, name, ": no schema_version");
  const double v = as_number(*version, where("schema_version"));
  MTP_REQUIRE(v == kProfileSchemaVersion, where("schema_version"), ": ", v, "; this mtplab reads version ",
              kProfileSchemaVersion);
  AcceptanceProfile p;
  if (const auto* d = member(root, "description")) p.description = as_string(*d, where("description"));
  if (const auto* d = member(root, "source")) p.source = as_string(*d, where("source"));
  if (const auto* d = member(root, "units")) p.units = as_string(*d, where("units"));
  if (const auto* d = member(root, "accepted_length"))
    p.accepted_length = as_numbers(*d, where("accepted_length"));
  if (const auto* d = member(root, "accepted_length_ci"))
    p.accepted_length_ci = as_intervals(*d, where("accepted_length_ci"));
  if (const auto* d = member(root, "marginal_rates"))
    p.marginal_rates = as_numbers(*d, where("marginal_rates"));
  if (const auto* d = member(root, "marginal_rates_ci"))
    p.marginal_rates_ci = as_intervals(*d, where("marginal_rates_ci"));
  if (const auto* d = member(root, "notes")) {
    MTP_REQUIRE(d->kind == json::Value::Kind::array, where("notes"), ": expected an array of strings");
    for (size_t i = 0; i < d->items.size(); ++i)
      p.notes.push_back(as_string(d->items[i], str(where("notes"), "[", i, "]")));
  }
  p.validate(name);
  if (const auto* d = member(root, "k_max")) {
    const double k = as_number(*d, where("k_max"));
    MTP_REQUIRE(k == p.k_max(), where("k_max"), ": ", k, ", but the profile's figures describe k = 1..",
                p.k_max());
  }
  check_derived(root, "conditional_rates", p.conditional(), name);
  check_derived(root, "accepted_length_histogram", p.histogram(), name);
  check_derived(root, "vllm_synthetic_acceptance_rates", p.chain_marginal(), name);
  // The notes on rising rates are derived too: kept once, whichever way the file came.
  return p;
}

AcceptanceProfile read_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MTP_REQUIRE(in, path, ": cannot read the acceptance profile (",
              (errno ? std::strerror(errno) : "unknown error"), ")");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_profile(text.str(), path);
}

}  // namespace mtplab::plan
