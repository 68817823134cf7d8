// mtplab_doc_tables CONFIGS_DIR: prints the generated tables of docs/kernels.md, each after a line
// "@@ NAME" (scripts/gen-docs.py puts each between the markers of that name). Every table is
// computed: the kernel policy's fields from kernel_policy_settings(), and the choice of each
// dispatch rule (lib/ops/cuda/dispatch.hpp) under the default (automatic) policy, evaluated for
// the shapes of every model preset in CONFIGS_DIR (one rank), 1 .. 640 rows, and 132
// multiprocessors (H100 SXM and H200 alike). Rows where a choice stays the same are one range.
// Nothing runs on a GPU.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/str.hpp"
#include "model/config.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/moe.hpp"
#include "ops/kernel_policy.hpp"

namespace {

using mtplab::str;
using mtplab::model::ModelConfig;
namespace ops = mtplab::ops;
namespace cuda = mtplab::ops::cuda;

constexpr int kNumSms = 132;  // H100 SXM and H200
constexpr int kMaxRows = 640;

std::string code(const std::string& s) { return "`" + s + "`"; }

std::string row_range(int lo, int hi) { return lo == hi ? std::to_string(lo) : str(lo, " .. ", hi); }

/// "a (1 .. 3), b (4 .. 640)": the values of f over rows lo .. hi, one entry per run.
std::string runs(int lo, int hi, const std::function<std::string(int)>& f) {
  std::string out;
  int start = lo;
  std::string cur = f(lo);
  for (int r = lo + 1; r <= hi + 1; ++r) {
    const std::string v = r <= hi ? f(r) : std::string();
    if (r <= hi && v == cur) continue;
    out += str(out.empty() ? "" : ", ", cur, " (", row_range(start, r - 1), ")");
    start = r;
    cur = v;
  }
  return out;
}

/// A markdown table's head: the first column's name, then `heads`.
void table_head(const std::string& first, const std::vector<std::string>& heads) {
  std::cout << "| " << first << " |";
  for (const auto& h : heads) std::cout << " " << h << " |";
  std::cout << "\n|---|";
  for (size_t i = 0; i < heads.size(); ++i) std::cout << "---|";
  std::cout << "\n";
}

/// A table whose lines are the ranges of rows over which every column's cell is the same.
void range_table(const std::string& first, const std::vector<std::string>& heads, int lo, int hi,
                 const std::function<std::string(int col, int rows)>& cell) {
  table_head(first, heads);
  auto line = [&](int r) {
    std::vector<std::string> cells;
    for (size_t c = 0; c < heads.size(); ++c) cells.push_back(cell(static_cast<int>(c), r));
    return cells;
  };
  int start = lo;
  std::vector<std::string> cur = line(lo);
  for (int r = lo + 1; r <= hi + 1; ++r) {
    std::vector<std::string> v;
    if (r <= hi) v = line(r);
    if (r <= hi && v == cur) continue;
    std::cout << "| " << row_range(start, r - 1) << " |";
    for (const auto& c : cur) std::cout << " " << c << " |";
    std::cout << "\n";
    start = r;
    cur = v;
  }
}

/// "a" where both texts agree, else "a (b where <why>)".
std::string either(const std::string& a, const std::string& b, const char* why) {
  return a == b ? a : str(a, " (", b, " where ", why, ")");
}

// ---- the kernel policy ------------------------------------------------------------------------------

void policy_table() {
  std::cout << "| field | values | default | variable | in the results' identity |\n|---|---|---|---|---|\n";
  for (const auto& s : ops::kernel_policy_settings()) {
    std::string values;
    if (s.type == mtplab::SettingType::text) {
      values = s.text_values;
    } else {
      for (const auto& c : s.choices) values += (values.empty() ? "" : ", ") + code(c);
    }
    std::cout << "| " << code(s.name) << " | " << values << " | " << code(s.default_value()) << " | "
              << code(ops::kernel_policy_env(s.name)) << " | " << (s.record.identity_input ? "yes" : "no")
              << " |\n";
  }
}

// ---- the shapes of a preset ---------------------------------------------------------------------------

struct Linear {
  const char* name;
  int64_t n;
  int k;
  bool f32_out = false;
  bool argmax = false;
  int rows_per_group = 0;  ///< 0: n (a plain GEMV)
};

std::vector<Linear> linears(const ModelConfig& c) {
  return {
      {"eh_proj", c.hidden, 2 * c.hidden},
      {"q_a", c.q_lora_rank, c.hidden},
      {"q_b", static_cast<int64_t>(c.n_heads) * c.qk_head_dim(), c.q_lora_rank},
      {"kv_a", c.kv_a_rows(), c.hidden},
      {"kv_b", static_cast<int64_t>(c.n_heads) * c.kv_b_head_rows(), c.kv_lora_rank},
      {"o_proj", c.hidden, c.n_heads * c.v_head_dim},
      {"indexer.wq_b", static_cast<int64_t>(c.index_n_heads) * c.index_head_dim, c.q_lora_rank},
      {"indexer.wk", c.index_head_dim, c.hidden},
      {"indexer.gate", c.index_n_heads, c.hidden, true},
      {"router", c.n_routed_experts, c.hidden, true},
      {"mla_out_v", static_cast<int64_t>(c.n_heads) * c.v_head_dim, c.kv_lora_rank, false, false,
       c.v_head_dim},
      {"head", c.vocab, c.hidden, false, true},
  };
}

cuda::LaunchCtx launch_ctx() {
  cuda::LaunchCtx ctx;
  ctx.num_sms = kNumSms;
  return ctx;
}

std::vector<std::string> preset_heads(const std::vector<ModelConfig>& presets) {
  std::vector<std::string> heads;
  for (const auto& c : presets) heads.push_back(code(c.name));
  return heads;
}

/// A range table over 1 .. kMaxRows with a column per (preset, part), cell(preset, part, rows); one
/// column per part ("every preset") where the presets agree at every row count.
void preset_range_table(const std::vector<ModelConfig>& presets, const std::vector<std::string>& parts,
                        const std::function<std::string(const ModelConfig&, int part, int rows)>& cell) {
  bool same = true;
  for (int rows = 1; rows <= kMaxRows && same; ++rows)
    for (size_t part = 0; part < parts.size() && same; ++part)
      for (const auto& c : presets)
        same = same &&
               cell(c, static_cast<int>(part), rows) == cell(presets.front(), static_cast<int>(part), rows);
  const size_t n_presets = same ? 1 : presets.size();
  std::vector<std::string> heads;
  for (size_t i = 0; i < n_presets; ++i)
    for (const auto& part : parts)
      heads.push_back(str(same ? "every preset" : code(presets[i].name), part.empty() ? "" : " ", part));
  range_table("rows", heads, 1, kMaxRows, [&](int col, int rows) {
    const int n_parts = static_cast<int>(parts.size());
    return cell(presets[static_cast<size_t>(col / n_parts)], col % n_parts, rows);
  });
}

// ---- the rules ----------------------------------------------------------------------------------------

/// A line per linear of the presets (the head and mla_out_v too where `all`), a column per preset.
void linear_table(const std::vector<ModelConfig>& presets, bool all,
                  const std::function<std::string(const Linear&)>& cell) {
  table_head("linear", preset_heads(presets));
  const size_t n_lin = linears(presets.front()).size();
  for (size_t i = 0; i < n_lin; ++i) {
    const Linear first = linears(presets.front())[i];
    if (!all && (first.argmax || first.rows_per_group > 0)) continue;
    std::cout << "| " << first.name << " |";
    for (const auto& c : presets) std::cout << " " << cell(linears(c)[i]) << " |";
    std::cout << "\n";
  }
}

void gemv_table(const std::vector<ModelConfig>& presets) {
  const cuda::LaunchCtx ctx = launch_ctx();
  linear_table(presets, true, [&](const Linear& l) {
    const int group = l.rows_per_group > 0 ? l.rows_per_group : static_cast<int>(l.n);
    auto plan = [&](bool fp8) {
      return cuda::kernel_text(cuda::gemv_plan(ctx, fp8, l.argmax, l.f32_out, l.n, l.k, group));
    };
    return str(l.n, " x ", l.k, ": ", plan(false), l.f32_out ? "" : str("; FP8 ", plan(true)));
  });
}

std::string head_cell(const ModelConfig& c, bool fp8, int rows) {
  const ops::KernelPolicy policy;
  const auto lt = [&](bool plans) {
    return cuda::head_on_cublaslt(policy, fp8, rows, [plans] { return plans; });
  };
  const std::string fused = cuda::kernel_text(cuda::head_fused_kernel(policy, fp8, rows, c.hidden, true));
  const std::string lt_text = str("cublaslt, launches of up to ", cuda::head_lt_launch_rows(rows), " rows");
  const std::string with_plans = lt(true) ? lt_text : fused;
  const std::string without = lt(false) ? lt_text : fused;
  return either(with_plans, without, "cuBLASLt has no FP8 algorithm");
}

void head_table(const std::vector<ModelConfig>& presets) {
  preset_range_table(presets, {"BF16", "FP8"},
                     [](const ModelConfig& c, int part, int rows) { return head_cell(c, part == 1, rows); });
}

void rows_linear_table(const std::vector<ModelConfig>& presets) {
  // The head and mla_out_v have their own batched ops.
  linear_table(presets, false, [](const Linear& l) {
    return runs(2, kMaxRows, [&](int rows) {
      return cuda::rows_linear_on_gemv(ops::KernelPolicy{}, rows, l.n, l.k, true) ? "gemv" : "cublaslt";
    });
  });
}

void mla_table() {
  const ops::KernelPolicy policy;
  range_table("rows", {"BF16 cache", "FP8 cache"}, 1, kMaxRows, [&](int col, int rows) {
    return std::string(cuda::kernel_text(cuda::mla_batch_kernel(policy, col == 1, rows)));
  });
}

void mla_splits_table(const std::vector<ModelConfig>& presets) {
  const cuda::LaunchCtx ctx = launch_ctx();
  const int sample[] = {1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 640};
  std::vector<std::string> heads;
  for (const auto& h : preset_heads(presets)) heads.push_back(h + " BF16 / FP8");
  table_head("rows", heads);
  for (const int rows : sample) {
    std::cout << "| " << rows << " |";
    for (const auto& c : presets) {
      const int width = c.selection_width();
      std::cout << " " << cuda::mla_batch_splits(ctx, width, c.n_heads, rows, false) << " / "
                << cuda::mla_batch_splits(ctx, width, c.n_heads, rows, true) << " |";
    }
    std::cout << "\n";
  }
}

std::string moe_cell(const ModelConfig& c, int rows) {
  const ops::KernelPolicy policy;
  const int launch = cuda::kMaxMoeLaunchRows;
  const int in_launch = std::min(rows, launch);
  const bool slots = cuda::moe_slots_fit(in_launch, c.num_experts_per_tok, c.n_shared_experts > 0);
  const std::string fits = cuda::kernel_text(cuda::moe_grouped_plan(policy, in_launch, slots, true));
  const std::string not_fits = cuda::kernel_text(cuda::moe_grouped_plan(policy, in_launch, slots, false));
  std::string text = either(fits, not_fits, "the rings do not fit shared memory");
  if (rows > launch) text += str(", launches of ", launch);
  return text;
}

void moe_table(const std::vector<ModelConfig>& presets) {
  preset_range_table(presets, {""}, [](const ModelConfig& c, int, int rows) { return moe_cell(c, rows); });
}

void indexer_table(const std::vector<ModelConfig>& presets) {
  preset_range_table(presets, {""}, [](const ModelConfig& c, int, int rows) {
    const ops::KernelPolicy policy;
    return std::string(
        cuda::indexer_scores_tiled(policy, rows, c.index_n_heads, c.index_head_dim) ? "tiled" : "pools4");
  });
}

struct Block {
  const char* name;
  std::function<void(const std::vector<ModelConfig>&)> print;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: mtplab_doc_tables CONFIGS_DIR\n";
    return 2;
  }
  try {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(argv[1]))
      if (e.path().extension() == ".yaml") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    std::vector<ModelConfig> presets;
    for (const auto& f : files) presets.push_back(mtplab::model::load_model_preset(f));
    MTP_REQUIRE(!presets.empty(), "mtplab_doc_tables: no *.yaml preset in ", argv[1]);
    const Block blocks[] = {
        {"kernel-policy", [](const auto&) { policy_table(); }},
        {"gemv", gemv_table},
        {"head", head_table},
        {"rows-linear", rows_linear_table},
        {"mla-batch", [](const auto&) { mla_table(); }},
        {"mla-batch-splits", mla_splits_table},
        {"moe-grouped", moe_table},
        {"indexer-scores", indexer_table},
    };
    for (const Block& b : blocks) {
      std::cout << "@@ " << b.name << "\n";
      b.print(presets);
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
