// The CUDA backend's kernel policy (Backend::set_kernel_policy): each choice reaches its launcher
// through the backend, a change while a graph is being recorded is refused, and a graph refuses to
// launch under another policy than the one it was recorded under (then launches again once the
// policy is back). Tolerances: gpu_test_util.hpp (BF16: 2 ulps + 1/4096 of the largest |reference|,
// 90% bit-identical).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "gpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

TEST(GpuKernelPolicy, DecodeChoicesReachTheLaunchers) {
  // 64 heads (4 head tiles), kv_lora 512, 1024 selected rows (64 chunks of 16) of a 4096-row cache.
  const int nh = 64, L = 512, rows = 4096, block_size = 64, width = 1024;
  Rng rng(41);
  const int num_blocks = rows / block_size;
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  std::iota(table.begin(), table.end(), 0);
  for (size_t i = table.size() - 1; i > 0; --i) std::swap(table[i], table[rng.next() % (i + 1)]);
  std::vector<int32_t> all(rows);
  std::iota(all.begin(), all.end(), 0);
  for (size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[rng.next() % (i + 1)]);
  Twin<int32_t> sel(std::vector<int32_t>(all.begin(), all.begin() + width));
  Twin<int32_t> tab(table);
  Twin<bf16> data(rng.bf16s(static_cast<size_t>(rows) * L, -1.0f, 1.0f));
  Twin<bf16> q(rng.bf16s(static_cast<size_t>(nh) * L, -2.0f, 2.0f));
  const KvCache cc{data.c.data(), KvDtype::bf16, 1.0f, num_blocks, block_size, L};
  const KvCache gc{data.g.data(), KvDtype::bf16, 1.0f, num_blocks, block_size, L};
  const float scale = 1.0f / std::sqrt(static_cast<float>(L));
  auto ref = out_twin<bf16>(static_cast<size_t>(nh) * L);
  mtplab::ops::OneRow(cpu()).mla_decode(q.c.data(), sel.c.data(), width, tab.c.data(), cc, ref.c.data(), nh,
                                        scale);
  const std::vector<bf16> want = ref.from_cpu();

  struct Case {
    MlaDecode decode;
    int splits;         // mla_batch_splits (0: chosen per shape)
    uint64_t launches;  // decode (+ combine)
  };
  // One row of a BF16 cache (the batched decode's tiles rule): v1 unless a forced split count takes
  // v2. v2 with 8 splits is one cluster per head tile, merged in the cluster, which writes o_lat
  // itself: one launch; 16 splits are two clusters and need the combine; v1 (forced or by the rule)
  // splits 64 chunks over several blocks: decode + combine.
  for (const Case& c : {Case{MlaDecode::v2, 8, 1}, Case{MlaDecode::v2, 16, 2}, Case{MlaDecode::v2, 0, 2},
                        Case{MlaDecode::v1, 0, 2}}) {
    const std::string what =
        std::string("mla_decode ") + to_string(c.decode) + " mla_batch_splits " + std::to_string(c.splits);
    SCOPED_TRACE(what);
    const PolicyScope scope([&](KernelPolicy& p) {
      p.mla_decode = c.decode;
      p.mla_batch_splits = c.splits;
    });
    auto out = out_twin<bf16>(static_cast<size_t>(nh) * L);
    mtplab::ops::OneRow one(gpu());
    const uint64_t before = gpu().kernels_enqueued();
    one.mla_decode(q.g.data(), sel.g.data(), width, tab.g.data(), gc, out.g.data(), nh, scale);
    EXPECT_EQ(gpu().kernels_enqueued() - before, c.launches);
    expect_bf16_close(out.from_gpu(), want, what);
  }
}

TEST(GpuKernelPolicy, ForcedSplitReachesLinearAndLinearGroupAlike) {
  // Rows of 4096 that the automatic split leaves whole (16384 outputs) or splits 8 ways (128): under
  // each forced split, linear_group's outputs must be the bits of the separate linears, so both
  // launchers read the same split from the policy (a different split sums in another order).
  Rng rng(42);
  const int k = 4096;
  const int ns[] = {16384, 128};
  Twin<bf16> x(rng.bf16s(k, -1.0f, 1.0f));
  std::vector<Twin<bf16>> W;
  std::vector<Twin<bf16>> y_group, y_sep;
  for (int n : ns) {
    W.emplace_back(rng.bf16s(static_cast<size_t>(n) * k, -1.0f, 1.0f));
    y_group.push_back(out_twin<bf16>(n));
    y_sep.push_back(out_twin<bf16>(n));
  }
  std::vector<std::vector<bf16>> want;
  for (size_t i = 0; i < W.size(); ++i) {
    auto r = out_twin<bf16>(ns[i]);
    cpu().linear(W[i].c.data(), x.c.data(), r.c.data(), 1, ns[i], k);
    want.push_back(r.from_cpu());
  }
  std::vector<LinearOut> outs;
  for (size_t i = 0; i < W.size(); ++i)
    outs.push_back({W[i].g.data(), y_group[i].g.data(), ns[i], false, 1.0f});
  for (int split : {1, 2, 4, 8}) {
    SCOPED_TRACE("gemv_split " + std::to_string(split));
    const PolicyScope scope([split](KernelPolicy& p) { p.gemv_split = split; });
    for (auto& y : y_group) y.poison(0xFF);
    mtplab::ops::OneRow(gpu()).linear_group(outs, x.g.data(), k);
    for (size_t i = 0; i < W.size(); ++i) {
      y_sep[i].poison(0xFF);
      gpu().linear(W[i].g.data(), x.g.data(), y_sep[i].g.data(), 1, ns[i], k);
      const std::vector<bf16> sep = y_sep[i].from_gpu();
      expect_bf16_close(sep, want[i], "linear n " + std::to_string(ns[i]));
      expect_bytes_equal(y_group[i].from_gpu(), sep,
                         "linear_group output " + std::to_string(i) + " vs its linear");
    }
  }
}

TEST(GpuKernelPolicy, AChangeWhileRecordingIsRefused) {
  ASSERT_TRUE(gpu().supports_graphs());
  Array<int32_t> a(gpu(), 1), b(gpu(), 1);
  const int32_t zero = 0;
  gpu().upload(a.data(), &zero, sizeof zero);
  const KernelPolicy before = gpu().kernel_policy();
  KernelPolicy other = before;
  other.pdl = !other.pdl;
  gpu().begin_capture();
  gpu().add_i32(a.data(), 5, b.data());
  std::string msg;
  try {
    gpu().set_kernel_policy(other);
  } catch (const Error& e) {
    msg = e.message();
  }
  auto graph = gpu().end_capture();
  EXPECT_NE(msg.find("set_kernel_policy while a graph is being captured"), std::string::npos) << msg;
  EXPECT_EQ(gpu().kernel_policy(), before) << "a refused change must leave the policy as it was";
  graph->launch();
  int32_t got = 0;
  gpu().download(&got, b.data(), sizeof got);
  EXPECT_EQ(got, 5);
}

TEST(GpuKernelPolicy, AGraphLaunchesOnlyUnderThePolicyItWasRecordedWith) {
  Rng rng(43);
  const int n = 4096, k = 1024;
  Twin<bf16> W(rng.bf16s(static_cast<size_t>(n) * k, -1.0f, 1.0f));
  Twin<bf16> x(rng.bf16s(k, -1.0f, 1.0f));
  auto eager = out_twin<bf16>(n);
  auto replayed = out_twin<bf16>(n);
  const PolicyScope scope([](KernelPolicy& p) { p.gemv_variant = GemvVariant::v1; });
  gpu().linear(W.g.data(), x.g.data(), eager.g.data(), 1, n, k);
  gpu().begin_capture();
  gpu().linear(W.g.data(), x.g.data(), replayed.g.data(), 1, n, k);
  auto graph = gpu().end_capture();
  graph->launch();
  expect_bytes_equal(replayed.from_gpu(), eager.from_gpu(), "graph replay vs eager");

  const KernelPolicy recorded = gpu().kernel_policy();
  for (const auto& [field, text] : std::vector<std::pair<std::string, std::string>>{
           {"gemv_variant", "rows4"},
           {"gemv_split", "2"},
           {"pdl", recorded.pdl ? "off" : "on"},
           {"nccl_blocking", recorded.nccl_blocking ? "off" : "on"}}) {
    SCOPED_TRACE(field + " = " + text);
    KernelPolicy changed = recorded;
    parse_field(changed, field, text);
    gpu().set_kernel_policy(changed);
    replayed.poison(0xFF);
    std::string msg;
    try {
      graph->launch();
    } catch (const Error& e) {
      msg = e.message();
    }
    EXPECT_NE(msg.find("recorded under the kernel policy " + to_string(recorded)), std::string::npos) << msg;
    EXPECT_NE(msg.find("launched under " + to_string(changed)), std::string::npos) << msg;
    gpu().set_kernel_policy(recorded);
    graph->launch();
    expect_bytes_equal(replayed.from_gpu(), eager.from_gpu(), "graph replay after the policy is back");
  }
}

// Backend::kernels_chosen: every launcher notes the kernel its dispatch rule (or the policy) chose,
// per op, from the last reset; the texts follow the policy that forced them.
TEST(GpuKernelPolicy, TheRecordNamesTheKernelEachOpRan) {
  Rng rng(44);
  const int n = 65536, k = 1024, rows = 2;
  Twin<bf16> W(rng.bf16s(static_cast<size_t>(n) * k, -1.0f, 1.0f));
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(rows) * k, -1.0f, 1.0f));
  auto y = out_twin<bf16>(static_cast<size_t>(rows) * n);
  Twin<int32_t> slot(std::vector<int32_t>{0, 1});
  auto out = out_twin<ArgMax>(rows);
  struct Case {
    std::string field, value, op, kernel;
    std::function<void()> run;
  };
  auto linear1 = [&] { gpu().linear(W.g.data(), x.g.data(), y.g.data(), 1, n, k); };
  auto linear2 = [&] { gpu().linear(W.g.data(), x.g.data(), y.g.data(), rows, 128, k, RowsMode::batched); };
  auto head2 = [&] {
    gpu().head_argmax_batch(W.g.data(), nullptr, nullptr, x.g.data(), RowBatch{slot.g.data(), nullptr, rows},
                            n, k, 0, nullptr, n, out.g.data());
  };
  const std::vector<Case> cases = {
      {"gemv_variant", "v1", "gemv_bf16", "v1 split 2", linear1},
      {"gemv_variant", "rows4", "gemv_bf16", "rows4 split 1", linear1},
      {"rows_linear", "gemv", "linear", "rows_gemv", linear2},
      {"rows_linear", "cublaslt", "linear", "cublaslt", linear2},
      {"head_gemm", "mma", "head_argmax_batch", "mma", head2},
      {"head_gemm", "cublaslt", "head_argmax_batch", "cublaslt", head2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field + " = " + c.value);
    const PolicyScope scope([&](KernelPolicy& p) {
      parse_field(p, c.field, c.value);
      p.gemv_split = c.value == "v1" ? 2 : c.value == "rows4" ? 1 : 0;
    });
    gpu().reset_kernels_chosen();
    c.run();
    gpu().synchronize();
    const auto named = gpu().kernels_chosen().named();
    EXPECT_EQ(named, (std::vector<std::pair<std::string, std::string>>{{c.op, c.kernel}}))
        << gpu().kernels_chosen().text();
  }
  // A second kernel of the same op is listed after the first; a reset empties the record.
  {
    const PolicyScope mma([](KernelPolicy& p) { p.head_gemm = HeadGemm::mma; });
    gpu().reset_kernels_chosen();
    head2();
  }
  {
    const PolicyScope lt([](KernelPolicy& p) { p.head_gemm = HeadGemm::cublaslt; });
    head2();
  }
  gpu().synchronize();
  EXPECT_EQ(gpu().kernels_chosen().text(), "head_argmax_batch=mma,cublaslt");
  gpu().reset_kernels_chosen();
  EXPECT_TRUE(gpu().kernels_chosen().empty());
}

}  // namespace
}  // namespace mtplab::ops::gputest
