// Cost points from benchmark CSVs and the terms of a step's time (costs.hpp).
#include "plan/costs.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.hpp"
#include "core/stats.hpp"
#include "core/str.hpp"

namespace mtplab::plan {

namespace {

// The columns that describe a measurement's result rather than what was measured: two rows that
// differ only in these are the same configuration measured twice.
const std::set<std::string> kMeasured = {"reps",
                                         "median_us",
                                         "p10_us",
                                         "p90_us",
                                         "per_seq_us",
                                         "distinct_experts",
                                         "floor_bytes",
                                         "floor_us",
                                         "x_floor",
                                         "launches_per_draft",
                                         "selected_rows_per_seq",
                                         "tensor_us",
                                         "x_roofline"};

void require_columns(const BenchCsv& c, const std::vector<std::string>& cols, const std::string& key) {
  for (const auto& col : cols)
    MTP_REQUIRE(c.has_column(col), key, ": ", c.path(), " has no column \"", col,
                "\" (its columns: ", join(c.columns(), ", "), ")");
}

CostPoint point_of(const BenchCsv& c, const BenchCsv::Row& r, std::string label) {
  CostPoint p;
  p.label = std::move(label);
  p.where = c.where(r);
  p.median_us = c.number(r, "median_us");
  MTP_REQUIRE(p.median_us > 0, p.where, ": median_us ", p.median_us, " is not positive");
  p.p10_us = c.optional_number(r, "p10_us");
  p.p90_us = c.optional_number(r, "p90_us");
  MTP_REQUIRE(p.p10_us.has_value() == p.p90_us.has_value(), p.where,
              ": give both p10_us and p90_us, or neither (a point without its spread)");
  if (p.has_spread())
    MTP_REQUIRE(*p.p10_us <= *p.p90_us, p.where, ": p10_us ", *p.p10_us, " above p90_us ", *p.p90_us);
  return p;
}

// The columns in which two rows of (possibly different) files differ, measurements left out.
std::string differing_columns(const BenchCsv& a, const BenchCsv::Row& ra, const BenchCsv& b,
                              const BenchCsv::Row& rb) {
  std::vector<std::string> out;
  for (const auto& col : a.columns()) {
    if (kMeasured.count(col) || !b.has_column(col)) continue;
    if (a.field(ra, col) != b.field(rb, col))
      out.push_back(str(col, " (", a.field(ra, col), " vs ", b.field(rb, col), ")"));
  }
  return out.empty() ? "none but the measurement: the same point measured twice" : join(out, ", ");
}

std::string files_of(const std::vector<BenchCsv>& files) {
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.path());
  return names.empty() ? std::string("(none given)") : join(names, ", ");
}

}  // namespace

int CostBook::add(CostPoint p) {
  points_.push_back(std::move(p));
  return static_cast<int>(points_.size()) - 1;
}

std::string CostBook::step_names() const { return files_of(step_csv_); }
std::string CostBook::verify_names() const { return files_of(verify_csv_); }

CostBook CostBook::load(const CostOptions& opt) {
  CostBook b;
  b.opt_ = opt;
  const bool online = !opt.online.files.empty();
  if (opt.online_all) {
    MTP_REQUIRE(online, "costs.online_terms: all takes every cost from online points: give costs.online");
    MTP_REQUIRE(opt.step_files.empty() && opt.verify_files.empty(),
                "costs.online_terms: all takes the draft and verify costs from the online points of ",
                join(opt.online.files, ", "), ": give no costs.step / costs.verify (or online_terms: fixed)");
  } else {
    MTP_REQUIRE(!opt.step_files.empty(),
                "costs.step: no bench_step_batch file given (the draft step's costs)");
    MTP_REQUIRE(!opt.verify_files.empty(),
                "costs.verify: no bench_verify file given (the target layer's and head's costs)");
  }
  for (const auto& f : opt.step_files) b.step_csv_.push_back(BenchCsv::read(f));
  for (const auto& f : opt.verify_files) b.verify_csv_.push_back(BenchCsv::read(f));

  // The draft step: (B, k) -> one row after the selection.
  std::map<std::pair<int, int>, std::pair<size_t, size_t>> seen;  // key -> (file, row)
  for (size_t fi = 0; fi < b.step_csv_.size(); ++fi) {
    const BenchCsv& c = b.step_csv_[fi];
    require_columns(c, {"B", "k", "median_us", "p10_us", "p90_us"}, "costs.step");
    for (const auto& [col, value] : opt.step_select) {
      (void)value;
      require_columns(c, {col}, "costs.step_select");
    }
    for (size_t ri = 0; ri < c.rows().size(); ++ri) {
      const auto& r = c.rows()[ri];
      if (c.has_column("head") && c.field(r, "head") != opt.draft_head) continue;
      bool match = true;
      for (const auto& [col, value] : opt.step_select) match = match && c.field(r, col) == value;
      if (!match) continue;
      const int64_t B = c.integer(r, "B"), k = c.integer(r, "k");
      MTP_REQUIRE(B >= 1 && k >= 1, c.where(r), ": B ", B, " and k ", k, " must be >= 1");
      const auto key = std::make_pair(static_cast<int>(B), static_cast<int>(k));
      if (const auto it = seen.find(key); it != seen.end()) {
        const BenchCsv& o = b.step_csv_[it->second.first];
        const auto& orow = o.rows()[it->second.second];
        MTP_FAIL("costs.step: two rows for the draft step at (B = ", B, ", k = ", k, "): ", o.where(orow),
                 " and ", c.where(r), "; they differ in: ", differing_columns(o, orow, c, r),
                 ". Select one with costs.step_select (column: value) or costs.draft_head");
      }
      seen[key] = {fi, ri};
      b.draft_[key] = b.add(point_of(c, r, str("draft(B=", B, ", k=", k, ", ", opt.draft_head, " head)")));
      ++b.rows_used_[c.path()];
    }
  }
  MTP_REQUIRE(opt.online_all || !b.draft_.empty(), "costs.step: no row of ", b.step_names(),
              " is left after the selection (head ", opt.draft_head,
              opt.step_select.empty() ? "" : ", costs.step_select", ")");

  // The target: layer / dense_layer (B, R), head (rows), fixed (B).
  std::map<std::string, std::pair<size_t, size_t>> vseen;
  for (size_t fi = 0; fi < b.verify_csv_.size(); ++fi) {
    const BenchCsv& c = b.verify_csv_[fi];
    require_columns(c, {"part", "B", "median_us", "p10_us", "p90_us"}, "costs.verify");
    for (size_t ri = 0; ri < c.rows().size(); ++ri) {
      const auto& r = c.rows()[ri];
      const std::string part = c.field(r, "part");
      std::string key, label;
      int slot = -1;
      if (part == "layer" || part == "dense_layer") {
        require_columns(c, {"R"}, "costs.verify");
        const int64_t B = c.integer(r, "B"), R = c.integer(r, "R");
        MTP_REQUIRE(B >= 1 && R >= 1, c.where(r), ": B ", B, " and R ", R, " must be >= 1");
        key = str(part, " B=", B, " R=", R);
        label = str(part, "(B=", B, ", R=", R, ")");
        auto& table = part == "layer" ? b.layer_ : b.dense_;
        if (!vseen.count(key))
          slot = table[{static_cast<int>(B), static_cast<int>(R)}] = static_cast<int>(b.points_.size());
      } else if (part == "head") {
        require_columns(c, {"head", "rows"}, "costs.verify");
        if (c.field(r, "head") != opt.target_head) continue;
        const int64_t n = c.integer(r, "rows");
        MTP_REQUIRE(n >= 1, c.where(r), ": rows ", n, " must be >= 1");
        key = str("head rows=", n);
        label = str("head(", n, " rows, ", opt.target_head, ")");
        if (!vseen.count(key)) slot = b.head_[static_cast<int>(n)] = static_cast<int>(b.points_.size());
      } else if (part == "fixed") {
        const int64_t B = c.integer(r, "B");
        MTP_REQUIRE(B >= 1, c.where(r), ": B ", B, " must be >= 1");
        key = str("fixed B=", B);
        label = str("fixed(B=", B, ")");
        if (!vseen.count(key)) slot = b.fixed_[static_cast<int>(B)] = static_cast<int>(b.points_.size());
      } else {
        MTP_FAIL(c.where(r), ": part \"", part, "\" is none of layer, dense_layer, head, fixed");
      }
      if (slot < 0) {
        const auto [of, orow] = vseen[key];
        const BenchCsv& o = b.verify_csv_[of];
        MTP_FAIL("costs.verify: two rows for ", label, ": ", o.where(o.rows()[orow]), " and ", c.where(r),
                 "; they differ in: ", differing_columns(o, o.rows()[orow], c, r),
                 ". Give one file per point");
      }
      vseen[key] = {fi, ri};
      b.add(point_of(c, r, label));
      ++b.rows_used_[c.path()];
    }
  }
  MTP_REQUIRE(!(opt.fixed_us && !b.fixed_.empty()), "costs.fixed_us is given and ", b.verify_names(),
              " hold rows of part fixed: give the fixed cost one way");
  if (online) {
    MTP_REQUIRE(!opt.fixed_us && b.fixed_.empty(), "costs.online gives the fixed cost c(B) and ",
                opt.fixed_us ? std::string("costs.fixed_us is given")
                             : str(b.verify_names(), " hold rows of part fixed"),
                ": give the fixed cost one way");
    b.load_online();
  } else if (b.fixed_.empty()) {
    CostPoint p;
    p.label = "fixed";
    p.median_us = opt.fixed_us.value_or(0.0);
    MTP_REQUIRE(p.median_us >= 0, "costs.fixed_us: ", p.median_us, " is negative");
    p.where = opt.fixed_us ? "costs.fixed_us" : "costs.fixed_us not given";
    b.fixed_constant_ = b.add(p);
    b.fixed_origin_ = opt.fixed_us
                          ? str("costs.fixed_us: ", p.median_us, " us per step at every B (no spread)")
                          : "not given: 0 us per step (costs.fixed_us, or rows of part fixed)";
  } else {
    b.fixed_origin_ = str("rows of part fixed in ", b.verify_names());
  }
  return b;
}

std::string CostBook::online_names() const { return join(opt_.online.files, ", "); }

namespace {

// A cost point of per-row values over `steps` steps: their mean, its standard error with the
// steps as units (the rows' standard deviation / sqrt(steps)), and the rows' p10 / p90.
CostPoint row_point(std::string label, std::string where, std::vector<double> values, double steps) {
  CostPoint p;
  p.label = std::move(label);
  p.where = std::move(where);
  p.median_us = mean_of(values);
  double ss = 0;
  for (const double v : values) ss += (v - p.median_us) * (v - p.median_us);
  const double n = static_cast<double>(values.size());
  p.standard_error_us = n > 1 && steps > 1 ? std::sqrt(ss / (n - 1)) / std::sqrt(steps) : 0.0;
  std::sort(values.begin(), values.end());
  p.p10_us = quantile_sorted(values, 0.1);
  p.p90_us = quantile_sorted(values, 0.9);
  return p;
}

}  // namespace

void CostBook::load_online() {
  online_ = read_online_points(opt_.online);
  const bool all = opt_.online_all;
  std::map<int, std::vector<double>> fixed;        // B -> per measured row: step - draft - verify
  std::map<int, std::vector<std::string>> pooled;  // B -> the points it pools
  std::map<int, double> steps;                     // B -> their measured steps
  for (const OnlinePoint& p : online_) {
    const std::string where = str(p.file, ": point ", p.name, " (", p.rows, " measured rows)");
    if (all) {
      if (p.k > 0)
        draft_[{p.batch, p.k}] =
            add(row_point(str("online draft(B=", p.batch, ", k=", p.k, ")"), where, p.draft_us, p.steps));
      verify_[{p.batch, p.k}] =
          add(row_point(str("online verify(B=", p.batch, ", R=", p.k + 1, ")"), where, p.verify_us, p.steps));
    }
    const std::vector<double>& draft = all ? p.draft_us : p.propose_us;
    auto& c = fixed[p.batch];
    for (size_t i = 0; i < p.step_us.size(); ++i) c.push_back(p.step_us[i] - draft[i] - p.verify_us[i]);
    pooled[p.batch].push_back(str(p.name, " (k = ", p.k, ")"));
    steps[p.batch] += p.steps;
    if (p.full_rows < p.rows)
      notes_.push_back(
          str("online point ", p.name, " of ", p.file, " (B = ", p.batch, ", k = ", p.k,
              "): ", p.rows - p.full_rows, " of its ", p.rows,
              " measured rows are of steps with fewer than B live sequences (its batch drains at "
              "the end); its costs and its measured tokens/s include them"));
  }
  for (auto& [B, values] : fixed) {
    const std::string where = str(online_names(), ": points ", join(pooled[B], ", "));
    fixed_[B] = add(row_point(str("fixed(B=", B, ")"), where, std::move(values), steps[B]));
    if (points_[static_cast<size_t>(fixed_[B])].median_us < 0)
      notes_.push_back(str("c(B = ", B, ") from the online points is negative (",
                           points_[static_cast<size_t>(fixed_[B])].median_us,
                           " us): their timed phases sum to more than the steps' wall time"));
  }
  fixed_origin_ =
      str("online points of ", online_names(), ": c(B) = the mean over their measured rows at B of ",
          all ? "step_ms - draft_ms - verify_ms" : "step_ms - propose_ms - verify_ms",
          " (every selected point at B, whatever its k)");
}

std::vector<CostTerm> CostBook::step_terms(int B, int k, const ModelShape& model) const {
  std::vector<CostTerm> t;
  const std::string need = str(" (needed for k = ", k, " at B = ", B, ")");
  if (k > 0) {
    if (const auto it = draft_.find({B, k}); it != draft_.end()) {
      t.push_back({"draft", it->second, 1});
    } else if (opt_.online_all) {
      MTP_FAIL("costs.online (", online_names(), "): no online point at (B = ", B, ", k = ", k, ")", need,
               "; lower k_max, leave B = ", B, " out of batch, or run the point");
    } else if (const auto one = draft_.find({B, 1}); one != draft_.end()) {
      t.push_back({"draft", one->second, static_cast<double>(k)});
    } else {
      MTP_FAIL("costs.step (", step_names(), "): no draft step row at (B = ", B, ", k = ", k, ")",
               k > 1 ? str(" nor at (B = ", B, ", k = 1)") : std::string(), need, " with head ",
               opt_.draft_head, "; add the row or leave B = ", B, " out of batch");
    }
  }
  const int R = k + 1;
  if (opt_.online_all) {
    const auto v = verify_.find({B, k});
    MTP_REQUIRE(v != verify_.end(), "costs.online (", online_names(), "): no online point at (B = ", B,
                ", k = ", k, ")", need, "; lower k_max, leave B = ", B, " out of batch, or run the point");
    t.push_back({"verify", v->second, 1});
    const auto f = fixed_.find(B);
    t.push_back({"fixed", f->second, 1});  // every online point's B has its c(B)
    return t;
  }
  const int moe = model.layers - model.dense_layers;
  if (moe > 0) {
    const auto it = layer_.find({B, R});
    MTP_REQUIRE(it != layer_.end(), "costs.verify (", verify_names(), "): no layer row at (B = ", B,
                ", R = ", R, ")", need, "; lower k_max, leave B = ", B, " out of batch, or add the row");
    t.push_back({"layer", it->second, static_cast<double>(moe)});
  }
  if (model.dense_layers > 0) {
    if (const auto it = dense_.find({B, R}); it != dense_.end()) {
      t.push_back({"dense_layer", it->second, static_cast<double>(model.dense_layers)});
    } else {
      const auto moe_row = layer_.find({B, R});
      MTP_REQUIRE(opt_.dense_as_moe && moe_row != layer_.end(), "costs.verify (", verify_names(),
                  "): the model's first ", model.dense_layers,
                  " layer(s) have a dense MLP and no dense_layer row is at (B = ", B, ", R = ", R, ")", need,
                  "; add rows of part dense_layer, or set costs.dense_layers: as_moe to count them "
                  "at the MoE layer's cost");
      t.push_back({"dense_layer", moe_row->second, static_cast<double>(model.dense_layers)});
    }
  }
  const int rows = B * R;
  const auto h = head_.find(rows);
  MTP_REQUIRE(h != head_.end(), "costs.verify (", verify_names(), "): no head row of ", rows, " rows (",
              opt_.target_head, " head; B x (k + 1) = ", B, " x ", R, ")", need,
              "; add the row or lower k_max");
  t.push_back({"head", h->second, 1});
  if (fixed_constant_ >= 0) {
    t.push_back({"fixed", fixed_constant_, 1});
  } else {
    const auto f = fixed_.find(B);
    MTP_REQUIRE(f != fixed_.end(),
                online_.empty() ? str("costs.verify (", verify_names(), "): no row of part fixed at B = ", B,
                                      " (the rows of part fixed give c per B)")
                                : str("costs.online (", online_names(), "): no online point at B = ", B,
                                      " (the online points give c per B)"));
    t.push_back({"fixed", f->second, 1});
  }
  return t;
}

bool CostBook::covers(int B, int k, const ModelShape& model) const {
  try {
    step_terms(B, k, model);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::vector<int> CostBook::batches() const {
  std::set<int> out;
  if (opt_.online_all) {  // a point at k = 0 and one at some k >= 1
    for (const auto& [key, p] : verify_) {
      (void)p;
      if (key.second == 0 && draft_.lower_bound({key.first, 1}) != draft_.end() &&
          draft_.lower_bound({key.first, 1})->first.first == key.first)
        out.insert(key.first);
    }
    return {out.begin(), out.end()};
  }
  for (const auto& [key, p] : layer_) {
    (void)p;
    if (key.second != 1) continue;
    bool draft = false;
    for (const auto& [dk, dp] : draft_) {
      (void)dp;
      draft = draft || dk.first == key.first;
    }
    if (draft) out.insert(key.first);
  }
  return {out.begin(), out.end()};
}

std::vector<std::string> CostBook::inputs() const {
  std::vector<std::string> out;
  auto describe = [&](const std::string& key, const BenchCsv& c) {
    const BenchProvenance& p = c.provenance();
    const auto used = rows_used_.count(c.path()) ? rows_used_.at(c.path()) : 0;
    std::string s =
        str(key, " ", c.path(), ": ", p.tool, ", git ", p.git.empty() ? "?" : p.git, ", device ",
            p.device.empty() ? "?" : p.device, ", preset ", p.preset.empty() ? "?" : p.preset, ", context ",
            p.context.empty() ? "?" : p.context, "; ", used, " of ", c.rows().size(), " row(s) used");
    for (const auto& n : p.notes) s += str(" (", n, ")");
    out.push_back(s);
  };
  std::vector<std::string> sel = {str("head ", opt_.draft_head)};
  for (const auto& [col, v] : opt_.step_select) sel.push_back(str(col, " ", v));
  for (const auto& c : step_csv_) describe(str("costs.step [", join(sel, ", "), "]"), c);
  for (const auto& c : verify_csv_) describe(str("costs.verify [head rows ", opt_.target_head, "]"), c);
  for (const auto& file : opt_.online.files) {
    std::vector<std::string> pts;
    const OnlinePoint* any = nullptr;
    std::set<std::string> models;
    for (const OnlinePoint& p : online_) {
      if (p.file != file) continue;
      any = &p;
      models.insert(str(p.model, " (target of ", p.target_layers, " layer(s))"));
      pts.push_back(str(p.name, " (B ", p.batch, ", k ", p.k, p.verify.empty() ? "" : str(", ", p.verify),
                        ", ", p.rows, " measured rows)"));
    }
    out.push_back(str("costs.online [", opt_.online_all ? "draft, verify, fixed" : "fixed", "] ", file, ": ",
                      any ? str("git ", any->git.empty() ? "?" : any->git, ", backend ", any->backend,
                                ", device ", any->device.empty() ? "?" : any->device, ", model ",
                                join(std::vector<std::string>(models.begin(), models.end()), ", "),
                                "; points ", join(pts, ", "))
                          : std::string("no online point selected")));
  }
  out.push_back(str("costs.fixed: ", fixed_origin_));
  return out;
}

std::vector<std::string> CostBook::disagreements(const ModelShape& model) const {
  std::vector<std::string> out;
  // Every cost source with what it ran at: the benchmark files' comment lines, the online files'
  // points.
  struct Source {
    std::string path, preset, device, git;
  };
  std::vector<Source> all;
  for (const auto* files : {&step_csv_, &verify_csv_})
    for (const auto& c : *files)
      all.push_back({c.path(), c.provenance().preset, c.provenance().device, c.provenance().git});
  for (const OnlinePoint& p : online_) all.push_back({p.file, p.model, p.device, p.git});
  auto check = [&](const std::string& what, auto get) {
    std::map<std::string, std::vector<std::string>> by;
    for (const Source& c : all) {
      const std::string v = get(c);
      if (v.empty()) continue;
      auto& files = by[v];
      if (std::find(files.begin(), files.end(), c.path) == files.end()) files.push_back(c.path);
    }
    if (by.size() < 2) return;
    std::vector<std::string> parts;
    for (const auto& [v, files] : by) parts.push_back(str(v, " (", join(files, ", "), ")"));
    out.push_back(str("the cost files disagree on the ", what, ": ", join(parts, " vs ")));
  };
  check("model preset", [](const Source& c) { return c.preset; });
  check("GPU", [](const Source& c) { return c.device; });
  // A commit as its first 7 hex digits ("-dirty" kept): a transcribed file names it so, a
  // benchmark or a results file in full.
  check("git commit", [](const Source& c) {
    const bool dirty = c.git.ends_with("-dirty");
    const std::string sha = dirty ? c.git.substr(0, c.git.size() - 6) : c.git;
    return sha.empty() ? sha : sha.substr(0, 7) + (dirty ? "-dirty" : "");
  });
  // The plan's model against the presets the cost sources ran at.
  std::set<std::string> presets;
  for (const Source& c : all)
    if (!c.preset.empty()) presets.insert(c.preset);
  if (!presets.empty() && !presets.count(model.name) && !presets.count(model.config))
    out.push_back(
        str("the plan's model is ", model.name, " but the cost files ran at preset ", join(presets, ", ")));
  // The online points' target against the plan's layer count.
  std::set<int> layers;
  for (const OnlinePoint& p : online_) layers.insert(p.target_layers);
  if (!layers.empty() && (layers.size() > 1 || !layers.count(model.layers)))
    out.push_back(str("the online points ran a target of ",
                      join(std::vector<int>(layers.begin(), layers.end()), ", "),
                      " layer(s) but the plan's model has ", model.layers));
  // The context the draft rows were measured at against the verify files'.
  std::set<std::string> step_ctx, verify_ctx;
  for (const auto& c : step_csv_)
    if (c.has_column("context"))
      for (const auto& r : c.rows()) {
        if (c.has_column("head") && c.field(r, "head") != opt_.draft_head) continue;
        bool match = true;
        for (const auto& [col, value] : opt_.step_select) match = match && c.field(r, col) == value;
        if (match) step_ctx.insert(c.field(r, "context"));
      }
  for (const auto& c : verify_csv_)
    if (!c.provenance().context.empty()) verify_ctx.insert(c.provenance().context);
  if (!step_ctx.empty() && !verify_ctx.empty() && step_ctx != verify_ctx)
    out.push_back(str("the draft rows ran at context ", join(step_ctx, ", "),
                      " but the verify files at context ", join(verify_ctx, ", ")));
  return out;
}

}  // namespace mtplab::plan
