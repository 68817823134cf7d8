// Helpers of the transformers reference tests: reading data/reference/tiny (fixtures.safetensors,
// meta.json), the distance measures of tests/reference/check_fixtures.py, and the per-piece table
// printed to stdout so CI logs carry the measured errors.
//
// Invariants:
// - Distances are those of check_fixtures.py, so the C++ and Python numbers compare directly:
//   an element's error in BF16 ulps is |got - ref| / ulp(max(|got|, |ref|, RMS(ref))) (the RMS
//   floor keeps an element near zero after a cancellation from reading as hundreds of ulps), and
//   the relative RMS is RMS(got - ref) / RMS(ref).
// - A NaN anywhere (a poisoned output that was never written) is an infinite error: it fails
//   every tolerance.
// - A fixture tensor is read only with the dtype and shape the caller expects; anything else is an
//   Error naming the tensor and the file.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/numeric.hpp"
#include "core/str.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"

namespace mtplab::reftest {

/// The source tree (the parent of the configs/ directory load_model_preset searches).
inline std::string source_dir() {
  const std::string d = model::presets_dir();
  return d.substr(0, d.size() - std::string("/configs").size());
}
inline std::string fixture_dir() { return source_dir() + "/data/reference/tiny"; }

/// fixtures.safetensors, read tensor by tensor with the expected dtype and shape.
class FixtureFile {
 public:
  explicit FixtureFile(const std::string& path) : file_(path) {}
  const std::string& path() const { return file_.path(); }

  /// A BF16 tensor, bit for bit.
  std::vector<bf16> bf16s(const std::string& name, const std::vector<int64_t>& shape) const {
    const model::TensorInfo& t = get(name, model::DType::bf16, shape);
    std::vector<bf16> out(static_cast<size_t>(t.numel()));
    std::memcpy(out.data(), file_.bytes(t), t.nbytes);
    return out;
  }
  /// A BF16 or F32 tensor as floats (exact: BF16 widens without rounding).
  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) const {
    const model::TensorInfo* t = file_.find(name);
    MTP_REQUIRE(t, path(), ": fixture tensor ", name, " is missing");
    if (t->dtype == model::DType::bf16) {
      const std::vector<bf16> b = bf16s(name, shape);
      std::vector<float> out(b.size());
      for (size_t i = 0; i < b.size(); ++i) out[i] = to_float(b[i]);
      return out;
    }
    const model::TensorInfo& f = get(name, model::DType::f32, shape);
    std::vector<float> out(static_cast<size_t>(f.numel()));
    std::memcpy(out.data(), file_.bytes(f), f.nbytes);
    return out;
  }
  std::vector<int32_t> ints(const std::string& name, const std::vector<int64_t>& shape) const {
    const model::TensorInfo& t = get(name, model::DType::i32, shape);
    std::vector<int32_t> out(static_cast<size_t>(t.numel()));
    std::memcpy(out.data(), file_.bytes(t), t.nbytes);
    return out;
  }

 private:
  const model::TensorInfo& get(const std::string& name, model::DType dtype,
                               const std::vector<int64_t>& shape) const {
    const model::TensorInfo* t = file_.find(name);
    MTP_REQUIRE(t, path(), ": fixture tensor ", name, " is missing");
    MTP_REQUIRE(t->dtype == dtype, path(), ": fixture tensor ", name, " is ", model::dtype_name(t->dtype),
                ", expected ", model::dtype_name(dtype));
    MTP_REQUIRE(t->shape == shape, path(), ": fixture tensor ", name, " has shape ",
                model::shape_str(t->shape), ", expected ", model::shape_str(shape));
    return *t;
  }
  model::SafetensorsFile file_;
};

inline std::vector<float> widen(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_float(x[i]);
  return out;
}

/// A buffer whose every byte is 0xFF (NaN for floats, -1 for integers), for outputs an op must
/// overwrite.
template <typename T>
std::vector<T> poisoned(size_t n) {
  std::vector<T> v(n);
  std::memset(static_cast<void*>(v.data()), 0xFF, n * sizeof(T));
  return v;
}

/// A number in 3 significant digits, for the table.
inline std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

struct Distance {
  double max_ulp = 0;  ///< largest error in BF16 ulps (of max(|got|, |ref|, RMS(ref)))
  double rel_rms = 0;  ///< RMS(got - ref) / RMS(ref)
  double max_abs = 0;  ///< largest |got - ref|
};

inline Distance distance(const std::vector<float>& got, const std::vector<float>& ref) {
  MTP_REQUIRE(got.size() == ref.size(), "distance: ", got.size(), " values against ", ref.size());
  constexpr double inf = std::numeric_limits<double>::infinity();
  double ref_ss = 0, diff_ss = 0;
  for (float r : ref) ref_ss += static_cast<double>(r) * r;
  const double ref_rms = std::max(std::sqrt(ref_ss / std::max<size_t>(ref.size(), 1)), 1e-30);
  Distance d;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (!std::isfinite(g) || !std::isfinite(r)) {
      d.max_ulp = d.max_abs = d.rel_rms = inf;
      return d;
    }
    const double diff = std::fabs(g - r);
    const double mag = std::max({std::fabs(g), std::fabs(r), ref_rms});
    const double ulp = std::exp2(std::floor(std::log2(mag)) - 7);
    d.max_ulp = std::max(d.max_ulp, diff / ulp);
    d.max_abs = std::max(d.max_abs, diff);
    diff_ss += diff * diff;
  }
  d.rel_rms = std::sqrt(diff_ss / std::max<size_t>(got.size(), 1)) / ref_rms;
  return d;
}

/// The per-piece table: one row per comparison, printed together so a CI log shows every
/// measured error, then failures() lists the rows past their tolerance.
class PieceTable {
 public:
  explicit PieceTable(std::string title) : title_(std::move(title)) {}

  /// Element-wise: every element within `tol_ulp` BF16 ulps, and the relative RMS within
  /// `tol_rel` (a few elements may be a rounding further apart; a systematic shift of every
  /// element by a fraction of an ulp, such as a missing eps, may not).
  Distance ulps(const std::string& name, const std::vector<float>& got, const std::vector<float>& ref,
                double tol_ulp, double tol_rel, const std::string& why) {
    const Distance d = distance(got, ref);
    add(d.max_ulp <= tol_ulp && d.rel_rms <= tol_rel, name, d,
        str("ulp <= ", tol_ulp, ", rel-rms <= ", num(tol_rel)), why);
    return d;
  }
  /// Whole tensor: relative RMS within `tol_rel`, and (when given) every element within
  /// `tol_ulp` ulps, for pieces where the two sides round at different points inside.
  Distance rms(const std::string& name, const std::vector<float>& got, const std::vector<float>& ref,
               double tol_rel, const std::string& why,
               double tol_ulp = std::numeric_limits<double>::infinity()) {
    const Distance d = distance(got, ref);
    const bool ok = d.rel_rms <= tol_rel && d.max_ulp <= tol_ulp;
    add(ok, name, d,
        std::isinf(tol_ulp) ? str("rel-rms <= ", num(tol_rel))
                            : str("ulp <= ", tol_ulp, ", rel-rms <= ", num(tol_rel)),
        why);
    return d;
  }
  /// Exact agreement of `agree` out of `total` items that must agree.
  void count(const std::string& name, int agree, int total, const std::string& why) {
    Row r;
    r.ok = agree == total;
    r.name = name;
    r.metric = str(agree, "/", total, " agree");
    r.tol = "all";
    r.why = why;
    rows_.push_back(r);
  }
  /// A check that is not a distance (a must-differ check, a sanity property).
  void check(const std::string& name, bool ok, const std::string& metric, const std::string& tol,
             const std::string& why) {
    rows_.push_back(Row{ok, name, metric, tol, why});
  }
  /// An information line (no pass/fail).
  void note(const std::string& text) { rows_.push_back(Row{true, "", text, "", ""}); }

  void print() const {
    std::printf("\n== %s ==\n", title_.c_str());
    std::printf("%-4s %-46s %-44s %-24s %s\n", "", "piece", "measured", "tolerance", "why");
    for (const Row& r : rows_) {
      if (r.name.empty()) {
        std::printf("     %s\n", r.metric.c_str());
        continue;
      }
      std::printf("%-4s %-46s %-44s %-24s %s\n", r.ok ? "ok" : "BAD", r.name.c_str(), r.metric.c_str(),
                  r.tol.c_str(), r.why.c_str());
    }
    std::fflush(stdout);
  }
  std::string failures() const {
    std::string out;
    for (const Row& r : rows_)
      if (!r.ok) out += str("  ", r.name, ": ", r.metric, " (tolerance ", r.tol, ")\n");
    return out;
  }

 private:
  struct Row {
    bool ok = true;
    std::string name, metric, tol, why;
  };
  void add(bool ok, const std::string& name, const Distance& d, const std::string& tol,
           const std::string& why) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "max %6.2f ulp  rel-rms %.1e  max|d| %.2e", d.max_ulp, d.rel_rms,
                  d.max_abs);
    rows_.push_back(Row{ok, name, buf, tol, why});
  }
  std::string title_;
  std::vector<Row> rows_;
};

}  // namespace mtplab::reftest
