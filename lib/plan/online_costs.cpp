// Online points as step costs (online_costs.hpp).
#include "plan/online_costs.hpp"

#include <filesystem>
#include <map>
#include <set>

#include "core/error.hpp"
#include "core/str.hpp"
#include "harness/results_format.hpp"
#include "io/hdf5.hpp"
#include "plan/acceptance.hpp"

namespace mtplab::plan {

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

std::string device_kind(const std::string& described) {
  std::string d = trim(described);
  if (const size_t colon = d.find(": ");
      colon != std::string::npos && colon > 0 && parse_int64(d.substr(0, colon)).has_value())
    d = d.substr(colon + 2);
  if (!d.empty() && d.back() == ')')
    if (const size_t open = d.rfind(" ("); open != std::string::npos) d = d.substr(0, open);
  return d;
}

std::vector<OnlinePoint> read_online_points(const OnlineSelection& sel) {
  MTP_REQUIRE(!sel.files.empty(), "costs.online: no results file given");
  std::set<int64_t> wanted;
  for (const auto& p : sel.points) wanted.insert(parse_point_index(p, "costs.online_points"));
  std::set<int64_t> found;
  std::vector<OnlinePoint> out;
  std::map<std::pair<int, int>, size_t> at;  // (B, k) -> index into out
  for (const std::string& path : sel.files) {
    MTP_REQUIRE(std::filesystem::exists(path), "costs.online: ", path, ": no such file");
    const io::H5File f = io::H5File::open_read(path);
    if (const std::string problem = harness::results_format::schema_problem(f, path, "mtplab plan");
        !problem.empty())
      MTP_FAIL("costs.online: ", problem);
    std::string git = f.has_attr("git_sha") ? f.attr_string("git_sha") : "";
    if (!git.empty() && f.has_attr("git_dirty") && f.attr_int("git_dirty")) git += "-dirty";
    std::set<std::string> kinds;
    if (f.has_attr("devices"))
      for (const auto& d : f.attr_strings("devices")) kinds.insert(device_kind(d));
    const std::string device = join(std::vector<std::string>(kinds.begin(), kinds.end()), ", ");
    const std::string backend = f.has_attr("backend") ? f.attr_string("backend") : "";
    const io::Group points = f.open_group("points");
    for (const auto& name : points.children()) {
      const io::Group g = points.open_group(name);
      const int64_t index = g.attr_int("index");
      if (!wanted.empty() && !wanted.count(index)) continue;
      const std::string where = str(path, ": point ", name);
      const bool online = g.has_attr("mode") && g.attr_string("mode") == "online";
      if (!online) {
        MTP_REQUIRE(wanted.empty(), "costs.online_points: ", where, " (", g.attr_string("label"),
                    ") is not an online point (mode ", g.has_attr("mode") ? g.attr_string("mode") : "replay",
                    "): only online points time a whole serving step");
        continue;
      }
      found.insert(index);
      MTP_REQUIRE(g.attr_string("status") == "ok", where, ": status \"", g.attr_string("status"),
                  "\", not ok");
      OnlinePoint p;
      p.file = path;
      p.name = name;
      p.label = g.attr_string("label");
      p.batch = static_cast<int>(g.attr_int("batch_size"));
      p.k = static_cast<int>(g.attr_int("draft_len"));
      p.model = g.attr_string("model");
      p.target_layers = static_cast<int>(g.attr_int("online.target_layers"));
      p.verify = g.has_attr("verify") ? g.attr_string("verify") : "";
      p.git = git;
      p.device = device;
      p.backend = backend;
      p.tokens_per_s_per_sequence = g.attr_double("tokens_per_s_per_sequence");
      const std::vector<double> ci = g.attr_doubles("tokens_per_s_per_sequence_ci");
      MTP_REQUIRE(ci.size() == 2, where, ": tokens_per_s_per_sequence_ci holds ", ci.size(), " values");
      p.tokens_per_s_per_sequence_lo = ci[0];
      p.tokens_per_s_per_sequence_hi = ci[1];
      const io::Group steps = g.open_group("steps");
      const auto warmup = steps.open_dataset("warmup").read<uint8_t>();
      const auto rows = steps.open_dataset("batch_rows").read<int32_t>();
      const auto accepted = steps.open_dataset("accepted").read<int32_t>();
      const auto step = steps.open_dataset("step_ms").read<double>();
      const auto propose = steps.open_dataset("propose_ms").read<double>();
      const auto draft = steps.open_dataset("draft_ms").read<double>();
      const auto verify = steps.open_dataset("verify_ms").read<double>();
      const size_t n = warmup.size();
      MTP_REQUIRE(rows.size() == n && accepted.size() == n && step.size() == n && propose.size() == n &&
                      draft.size() == n && verify.size() == n,
                  where, ": the steps table's columns differ in length");
      double tokens = 0;
      for (size_t i = 0; i < n; ++i) {
        if (warmup[i]) continue;
        ++p.rows;
        if (rows[i] == p.batch) ++p.full_rows;
        MTP_REQUIRE(rows[i] >= 1, where, ": steps/batch_rows ", rows[i], " at row ", i);
        p.steps += 1.0 / rows[i];
        tokens += accepted[i] + 1;
        p.step_us.push_back(step[i] * 1000);
        p.propose_us.push_back(propose[i] * 1000);
        p.draft_us.push_back(draft[i] * 1000);
        p.verify_us.push_back(verify[i] * 1000);
      }
      MTP_REQUIRE(p.rows > 0, where, ": no measured step (every step is warm-up)");
      p.tokens_per_row = tokens / static_cast<double>(p.rows);
      const auto key = std::make_pair(p.batch, p.k);
      if (const auto it = at.find(key); it != at.end()) {
        const OnlinePoint& o = out[it->second];
        MTP_FAIL("costs.online: two online points at batch_size ", p.batch, ", draft_len ", p.k, ": ", o.name,
                 " of ", o.file, " (", o.label, ") and ", name, " of ", path, " (", p.label,
                 "); select one per (batch_size, draft_len) with costs.online_points");
      }
      at[key] = out.size();
      out.push_back(std::move(p));
    }
  }
  for (const int64_t w : wanted)
    MTP_REQUIRE(found.count(w), "costs.online_points: ", point_name(w), " is in none of ",
                join(sel.files, ", "));
  MTP_REQUIRE(!out.empty(), "costs.online: no online point in ", join(sel.files, ", "));
  return out;
}

}  // namespace mtplab::plan
