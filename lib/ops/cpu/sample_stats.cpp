// CPU reference: the sampling statistics of logit rows (logit_stats_batch, logit_stats_combine).
//
// Invariants:
// - A row is summarised through a histogram of its 16-bit logit keys (ops::logit_key), so the
//   thresholds are exact: top-k is the key at which the count from the top reaches k, top-p the
//   key at which the mass from the top (inside the top-k set) reaches top_p of the top-k mass.
//   Every entry of one key has the same logit, so ties at a threshold are kept by construction.
// - Mass is exp((l - max) / T) in fp64, summed per key (count * exp of the key's value); the
//   result is rounded to fp32 once (LogitStats::sum).
// - The temperature, top_k and top_p are read from backend memory at call time and checked.
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_math.hpp"

namespace mtplab::ops::cpu {
namespace {

constexpr int kKeys = 1 << 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float key_value(int key) { return to_float(bf16{logit_of_key(static_cast<uint16_t>(key))}); }

void check_params(const char* op, const SampleParams* p) {
  require_ptr(op, "params", p);
  MTP_REQUIRE(std::isfinite(p->temperature) && p->temperature > 0.0f, "ops::", op, ": temperature ",
              p->temperature, " must be finite and > 0");
  MTP_REQUIRE(p->top_k >= 0, "ops::", op, ": top_k ", p->top_k, " must be >= 0 (0: off)");
  MTP_REQUIRE(p->top_p > 0.0f && p->top_p <= 1.0f, "ops::", op, ": top_p ", p->top_p,
              " must be in (0, 1] (1: off)");
}

/// The entry of global token `token` in row b of `v`, or null when the row does not hold it.
const bf16* find_entry(const LogitRows& v, int b, int64_t token) {
  if (v.segments == 1) {
    const int64_t i = token - v.index_base;
    if (i < 0 || i >= v.n) return nullptr;
    return v.data + static_cast<size_t>(b) * v.ld + i;
  }
  if (token < 0 || token >= v.vocab) return nullptr;
  for (int s = 0; s < v.segments; ++s) {
    const VocabSegment seg = vocab_segment(v.vocab, v.segments, s);
    if (token < seg.begin + seg.count)
      return v.data + static_cast<size_t>(s) * v.seg_stride + static_cast<size_t>(b) * v.ld +
             (token - seg.begin);
  }
  return nullptr;
}

}  // namespace

void CpuBackend::logit_stats_batch(const LogitRows& v, const int32_t* requested, const SampleParams* params,
                                   LogitStats* out) {
  const char* op = "logit_stats_batch";
  require_size(op, "rows", v.rows);
  require_ptr(op, "logits", v.data);
  require_ptr(op, "out", out);
  require_size(op, "segments", v.segments);
  if (v.segments == 1) {
    require_size(op, "n", v.n);
    require_size(op, "ld", v.ld, v.n);
  } else {
    MTP_REQUIRE(v.vocab >= v.segments, "ops::", op, ": vocab ", v.vocab, " has fewer tokens than its ",
                v.segments, " segments");
    require_size(op, "ld", v.ld, vocab_segment(v.vocab, v.segments, 0).count);
    require_size(op, "seg_stride", v.seg_stride, static_cast<int64_t>(v.rows) * v.ld);
  }
  check_params(op, params);
  const double T = params->temperature;
  std::vector<uint32_t> count(kKeys);
  std::vector<double> mass(kKeys);
  for (int b = 0; b < v.rows; ++b) {
    std::fill(count.begin(), count.end(), 0u);
    uint64_t total = 0;
    auto tally = [&](const bf16* x, int64_t n) {
      for (int64_t i = 0; i < n; ++i) ++count[logit_key(x[i].bits)];
      total += static_cast<uint64_t>(n);
    };
    if (v.segments == 1) {
      tally(v.data + static_cast<size_t>(b) * v.ld, v.n);
    } else {
      for (int s = 0; s < v.segments; ++s)
        tally(v.data + static_cast<size_t>(s) * v.seg_stride + static_cast<size_t>(b) * v.ld,
              vocab_segment(v.vocab, v.segments, s).count);
    }
    int top = kKeys - 1;
    while (count[top] == 0) --top;
    int low = 0;
    while (count[low] == 0) ++low;
    LogitStats st{};
    st.max = key_value(top);
    if (count[top] >= 2) {
      st.second = st.max;
    } else {
      int k2 = top - 1;
      while (k2 >= low && count[k2] == 0) --k2;
      st.second = k2 >= low ? key_value(k2) : kNegInf;
    }
    // The support is {key >= tau}: all of the row, then top-k, then top-p inside it.
    int tau = low;
    if (params->top_k > 0 && static_cast<uint64_t>(params->top_k) < total) {
      uint64_t cum = 0;
      for (int key = top; key >= low; --key) {
        cum += count[key];
        if (cum >= static_cast<uint64_t>(params->top_k)) {
          tau = key;
          break;
        }
      }
    }
    for (int key = low; key <= top; ++key)
      mass[key] =
          count[key] ? count[key] * std::exp((static_cast<double>(key_value(key)) - st.max) / T) : 0.0;
    if (params->top_p < 1.0f) {
      double kept = 0;
      for (int key = tau; key <= top; ++key) kept += mass[key];
      const double target = static_cast<double>(params->top_p) * kept;
      double cum = 0;
      for (int key = top; key >= tau; --key) {
        cum += mass[key];
        if (cum >= target) {
          tau = key;
          break;
        }
      }
    }
    double sum = 0;
    for (int key = tau; key <= top; ++key) sum += mass[key];
    st.sum = static_cast<float>(sum);
    st.requested = kNegInf;
    if (requested) {
      const bf16* e = find_entry(v, b, requested[b]);
      if (e && logit_key(e->bits) >= tau) st.requested = to_float(*e);
    }
    out[b] = st;
  }
}

void CpuBackend::logit_stats_combine(const LogitStats* parts, int n, int rows, const SampleParams* params,
                                     TokenStats* out) {
  const char* op = "logit_stats_combine";
  require_size(op, "n", n);
  require_size(op, "rows", rows);
  require_ptr(op, "parts", parts);
  require_ptr(op, "out", out);
  check_params(op, params);
  const double T = params->temperature;
  for (int b = 0; b < rows; ++b) {
    // The top two of the union of every part's top two are the row's top two.
    float first = kNegInf, second = kNegInf, req = kNegInf;
    for (int i = 0; i < n; ++i) {
      const LogitStats& p = parts[static_cast<size_t>(i) * rows + b];
      for (float x : {p.max, p.second}) {
        if (x > first) {
          second = first;
          first = x;
        } else if (x > second) {
          second = x;
        }
      }
      if (p.requested > req) req = p.requested;
    }
    double Z = 0;
    for (int i = 0; i < n; ++i) {
      const LogitStats& p = parts[static_cast<size_t>(i) * rows + b];
      Z += static_cast<double>(p.sum) * std::exp((static_cast<double>(p.max) - first) / T);
    }
    const double log_z = std::log(Z);
    TokenStats& o = out[b];
    o.margin = first - second;
    o.logprob = static_cast<float>(-log_z);
    o.req_logprob =
        req == kNegInf ? kNegInf : static_cast<float>((static_cast<double>(req) - first) / T - log_z);
  }
}

}  // namespace mtplab::ops::cpu
