// KernelRecord (kernel_record.hpp).
#include "ops/kernel_record.hpp"

#include <algorithm>
#include <cstring>

namespace mtplab::ops {
namespace {

bool same_text(const char* a, const char* b) { return a == b || std::strcmp(a, b) == 0; }

}  // namespace

void KernelRecord::note(const char* op, const char* kernel) {
  if (ops_.empty() || !same_text(ops_[last_].name, op)) {
    const auto it =
        std::find_if(ops_.begin(), ops_.end(), [&](const Op& x) { return same_text(x.name, op); });
    last_ = static_cast<size_t>(it - ops_.begin());
    if (last_ == ops_.size()) ops_.push_back(Op{op, {}});
  }
  std::vector<const char*>& ks = ops_[last_].kernels;
  if (std::none_of(ks.begin(), ks.end(), [&](const char* k) { return same_text(k, kernel); }))
    ks.push_back(kernel);
}

std::vector<std::pair<std::string, std::string>> KernelRecord::named() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Op& o : ops_) {
    std::string ks;
    for (const char* k : o.kernels) ks += (ks.empty() ? "" : ",") + std::string(k);
    out.emplace_back(o.name, ks);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string KernelRecord::text() const {
  std::string s;
  for (const auto& [op, kernels] : named()) s += (s.empty() ? "" : " ") + op + "=" + kernels;
  return s;
}

}  // namespace mtplab::ops
