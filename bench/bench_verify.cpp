// mtplab_bench_verify: one target layer over the verification shape, B sequences x R new rows each
// (the last accepted token and R - 1 drafts), as one ragged forward (drafter::Block::forward), and
// the head over the B x R rows, on one GPU at a model preset's shape (default glm5.3-flash) with
// synthetic weights, against the byte floor.
//
//   mtplab_bench_verify [--preset NAME] [--batch 1,2,4,8,16,32,64,128] [--rows 1,2,3,4,5]
//                       [--context 4096] [--reps N] [--warmup N] [--heads bf16,fp8] [--out DIR]
//                       [--device D] [--router-bias-scale S] [--routing TRACE.h5] [--profile]
//
// Each of the B sequences holds --context rows (one prefill, copied into every slot); its R rows sit
// at positions context .. context + R - 1, so every row writes its cache rows, scores the complete
// pools of its own sequence, selects, attends causally (a row sees its sequence's earlier new rows)
// and routes on its own. The layer is recorded as one CUDA graph per (B, R) and replayed --reps
// times after --warmup replays, each on fresh random input rows (uploaded before the start event);
// the same positions are rewritten every replay, as a rolled-back verification rewrites them.
//
// --routing TRACE.h5 routes the rows as a recorded model did (docs/trace-format.md, "Routing"; the
// preset's top_k and expert count must be the trace's): each replay's B x R rows take the recorded
// experts of B distinct (sequence, start) places of R consecutive generated rows at one routed
// layer (io::RoutingBatches; a new draw of places and layer per input set, seeded), copied over the
// router's ids after the router has run (drafter::Block::Options::routed_experts), so the layer
// reads the routed experts a trained model's verify batch reads. The distinct experts then reported
// are those of the recorded routing.
//
// Byte floor of the layer (the PyTorch peer, ../shared/bench/torch_graph_peer_verify.py, counts
// the same): the layer's dense weights once (q_a, q_b, kv_a, kv_b, o_proj, the indexer's wq_b, wk,
// gate and weights_proj, the router, the shared expert), the distinct routed experts of all rows
// (counted from the router's choice of the last replay), and per sequence the union of the latent
// rows its rows selected, its pool keys and the cache rows its rows write; at the device-to-device
// copy bandwidth measured in the same run (bytes read + written). The head's floor is its weights
// (BF16, or E4M3 with a scale per row); its compute floor, the logits GEMM at the BF16 tensor rate
// measured in the same run (cuBLASLt, 8192^3), binds past about 128 rows. Prints two tables;
// writes DIR/bench_verify.csv. --profile turns the CUDA profiler on (cudaProfilerStart) around
// each shape's eager forward only, so `ncu --profile-from-start off` sees one layer's kernels per
// shape and nothing of the prefill or the replays.
#include <cuda_profiler_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "bench_util.hpp"
#include "core/build_info.hpp"
#include "core/cli.hpp"
#include "core/error.hpp"
#include "core/stats.hpp"
#include "core/str.hpp"
#include "drafter/block.hpp"
#include "drafter/drafter.hpp"
#include "drafter/factory.hpp"
#include "io/routing.hpp"
#include "io/trace.hpp"
#include "model/weights.hpp"
#include "ops/kernel_policy.hpp"

using namespace mtplab;

namespace {

using bench::copy_bandwidth;
using bench::pair_of;

struct Options {
  std::string preset = "glm5.3-flash";
  std::vector<int> batches = {1, 2, 4, 8, 16, 32, 64, 128};
  std::vector<int> rows = {1, 2, 3, 4, 5};
  int context = 4096;
  int reps = 20;
  int warmup = 3;
  std::array<bool, 2> heads{true, true};  // bf16, fp8
  std::string out = "bench-out";
  int device = 0;
  double router_bias_scale = 1.0;
  std::string routing;  // a trace with recorded routing ("": the synthetic router)
  bool profile = false;
};

struct Timing {
  double median = 0, p10 = 0, p90 = 0;
};

/// Records `body` as a graph (after one eager run that sizes the backend's scratch, under the CUDA
/// profiler when `profile`), then replays it warmup + reps times, `before(i)` ahead of each replay,
/// outside the timed events.
template <typename Before, typename Body>
Timing time_graph(ops::Backend& be, int warmup, int reps, bool profile, Before&& before, Body&& body) {
  before(0);
  be.synchronize();
  if (profile) cudaProfilerStart();
  body();
  be.synchronize();
  if (profile) cudaProfilerStop();
  be.begin_capture();
  body();
  std::unique_ptr<ops::Graph> graph = be.end_capture();
  auto e0 = be.make_event(), e1 = be.make_event();
  std::vector<double> us;
  for (int i = 0; i < warmup + reps; ++i) {
    before(i);
    e0->record();
    graph->launch();
    e1->record();
    const double ms = be.elapsed_ms(*e0, *e1);
    if (i >= warmup) us.push_back(ms * 1e3);
  }
  return Timing{quantile(us, 0.5), quantile(us, 0.1), quantile(us, 0.9)};
}

/// The layer's dense bytes (every weight but the routed experts), and one routed expert's.
struct LayerBytes {
  double dense = 0, expert = 0;
};

LayerBytes layer_bytes(const model::ModelConfig& c) {
  const double H = c.hidden, b = 2.0, nh = c.n_heads, qk = c.qk_nope_head_dim, v = c.v_head_dim;
  LayerBytes l;
  l.dense = b * (c.q_lora_rank * H + nh * qk * c.q_lora_rank                   // q_a, q_b
                 + c.kv_lora_rank * H + nh * (qk + v) * c.kv_lora_rank         // kv_a, kv_b
                 + H * nh * v                                                  // o_proj
                 + double(c.index_n_heads) * c.index_head_dim * c.q_lora_rank  // indexer wq_b
                 + 2.0 * c.index_head_dim * H + double(c.index_n_heads) * H    // wk, gate, weights_proj
                 + double(c.n_routed_experts) * H                              // router
                 + 3.0 * c.shared_intermediate() * H);                         // shared expert
  l.expert = b * 3.0 * c.moe_intermediate_size * H;
  return l;
}

int run(const Options& opt) {
  model::ModelConfig cfg = model::load_model_preset(opt.preset);
  const int max_r = *std::max_element(opt.rows.begin(), opt.rows.end());
  const int P = cfg.index_kpool;
  cfg.set_max_seq_len((opt.context + max_r + P - 1) / P * P + P);
  auto be_owner = ops::make_cuda_backend(opt.device);
  ops::Backend& be = *be_owner;
  std::vector<std::string> overridden;
  be.set_kernel_policy(ops::env_overrides(ops::KernelPolicy{}, &overridden));
  std::printf("mtplab_bench_verify on %s (git %s%s): %s, context %d rows, %d timed replays per point\n",
              be.device_name().c_str(), git_sha(), git_dirty() ? "-dirty" : "", opt.preset.c_str(),
              opt.context, opt.reps);
  std::printf("kernel policy %s%s%s\n", ops::to_string(be.kernel_policy()).c_str(),
              overridden.empty() ? "" : "; from the environment: ", join(overridden, ", ").c_str());
  const double copy_gbps = copy_bandwidth(be);
  std::printf("copy_d2d %.0f GB/s (bytes read + written)\n", copy_gbps);
  const double tflops = bench::gemm_tflops(be);
  std::printf("gemm_bf16 %.0f TFLOP/s (cuBLASLt, 8192^3)\n", tflops);

  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  model::MtpWeights w = model::synthesize_mtp_weights(cfg, plan, 11);
  if (opt.router_bias_scale != 1.0)
    for (float& v : w.moe.e_score_correction_bias.data) v = static_cast<float>(v * opt.router_bias_scale);
  if (opt.heads[1]) model::quantize_head_fp8(w);
  drafter::BlockDims dims = drafter::block_dims(cfg, 1, 0, ops::KvDtype::bf16);
  drafter::Block block(be, nullptr, dims, drafter::upload_block_weights(be, w));
  const ops::Array<bf16> final_norm = drafter::upload(be, w.shared_head_norm);
  const ops::Array<bf16> lm_head = drafter::upload(be, w.lm_head);
  ops::Array<fp8e4m3> lm_fp8;
  ops::Array<float> lm_scale;
  if (opt.heads[1]) {
    lm_fp8 = drafter::upload(be, w.lm_head_fp8.weight);
    lm_scale = drafter::upload(be, w.lm_head_fp8.scale);
  }
  const int H = cfg.hidden, width = dims.selection_width(), top_k = dims.top_k;
  const int max_b = *std::max_element(opt.batches.begin(), opt.batches.end());
  const int max_n = max_b * max_r;
  block.reserve(std::max(max_n, 256));
  std::mt19937_64 rng(20261207);
  std::normal_distribution<float> nrm(0.0f, 1.0f);
  auto random_rows = [&](int n) {
    std::vector<bf16> v(static_cast<size_t>(n) * H);
    for (auto& x : v) x = to_bf16(nrm(rng));
    return v;
  };
  // Input rows for every replay: a few sets, cycled (fresh routes each replay, no host work timed).
  constexpr int kInputSets = 4;
  std::vector<std::vector<bf16>> inputs;
  for (int i = 0; i < kInputSets; ++i) inputs.push_back(random_rows(max_n));
  ops::Array<bf16> x(be, static_cast<size_t>(max_n) * H), y(be, static_cast<size_t>(max_n) * H);
  ops::Array<int32_t> slot(be, static_cast<size_t>(max_n)), pos(be, static_cast<size_t>(max_n));

  // The context of every slot: one cache-only prefill of slot 0, copied into the others.
  drafter::SlotCaches caches(be, dims, max_b);
  {
    drafter::Block::Options ctx;
    ctx.cache_only = true;
    const int chunk = 256;
    for (int c0 = 0; c0 < opt.context; c0 += chunk) {
      const int m = std::min(chunk, opt.context - c0);
      const auto xs = random_rows(m);
      std::vector<int32_t> s(static_cast<size_t>(m), 0), p(static_cast<size_t>(m));
      for (int r = 0; r < m; ++r) p[static_cast<size_t>(r)] = c0 + r;
      be.upload(x.data(), xs.data(), xs.size() * sizeof(bf16));
      be.upload(slot.data(), s.data(), s.size() * sizeof(int32_t));
      be.upload(pos.data(), p.data(), p.size() * sizeof(int32_t));
      block.forward(ops::RowBatch{slot.data(), pos.data(), m, m}, x.data(), caches, y.data(), ctx);
    }
    for (int b = 1; b < max_b; ++b) caches.copy_slot(be, 0, b, opt.context);
    be.synchronize();
  }

  const LayerBytes lb = layer_bytes(cfg);
  const double pool_key_bytes = 4.0 * (opt.context / P) * cfg.index_head_dim;
  const double row_write_bytes = 2.0 * (cfg.kv_lora_rank + cfg.index_head_dim);
  std::filesystem::create_directories(opt.out);
  std::ofstream csv(opt.out + "/bench_verify.csv");
  MTP_REQUIRE(csv, "cannot write ", opt.out, "/bench_verify.csv");
  csv << "# mtplab_bench_verify git " << git_sha() << (git_dirty() ? "-dirty" : "") << " device "
      << be.device_name() << " preset " << opt.preset << " context " << opt.context << " copy_GBps "
      << copy_gbps << " gemm_TFLOPs " << tflops << " router_bias_scale " << opt.router_bias_scale
      << " kernel_policy " << ops::to_string(be.kernel_policy()) << " routing "
      << (opt.routing.empty() ? "synthetic" : opt.routing) << "\n";
  csv << "part,head,B,R,rows,reps,median_us,p10_us,p90_us,distinct_experts,selected_rows_per_seq,floor_bytes,"
         "floor_us,x_floor,tensor_us,x_roofline\n";
  // The recorded routing, when given: its shape must be the preset's.
  std::unique_ptr<io::RoutingBatches> recorded;
  if (!opt.routing.empty()) {
    const io::TraceReader trace(opt.routing);
    recorded = std::make_unique<io::RoutingBatches>(trace);  // refuses a trace without routing
    const io::TraceRouting& rs = recorded->shape();
    MTP_REQUIRE(rs.top_k == top_k && rs.experts == cfg.n_routed_experts, opt.routing, ": routing of top_k ",
                rs.top_k, " of ", rs.experts, " experts; the preset ", opt.preset, " routes top_k ", top_k,
                " of ", cfg.n_routed_experts);
    std::printf("routing: recorded, %s (%lld sequences, %lld layers)\n", opt.routing.c_str(),
                static_cast<long long>(trace.num_sequences()), static_cast<long long>(rs.layers));
  }
  ops::Array<int32_t> forced(be, static_cast<size_t>(max_n) * top_k);
  std::printf("\none target layer, B sequences x R new rows (one ragged forward, one CUDA graph)\n");
  std::printf("%4s %2s %5s %9s %8s %8s %8s %12s %9s %8s\n", "B", "R", "rows", "layer_us", "p10", "p90",
              "experts", "sel_rows/seq", "floor_us", "x_floor");
  for (int B : opt.batches) {
    for (int R : opt.rows) {
      const int n = B * R;
      std::vector<int32_t> s(static_cast<size_t>(n)), p(static_cast<size_t>(n));
      for (int b = 0; b < B; ++b)
        for (int r = 0; r < R; ++r) {
          s[static_cast<size_t>(b * R + r)] = b;
          p[static_cast<size_t>(b * R + r)] = opt.context + r;
        }
      be.upload(slot.data(), s.data(), s.size() * sizeof(int32_t));
      be.upload(pos.data(), p.data(), p.size() * sizeof(int32_t));
      const ops::RowBatch rb{slot.data(), pos.data(), n, R};
      // Per input set, the recorded routing of a fresh draw of B places at one routed layer.
      std::vector<std::vector<int32_t>> routed;
      if (recorded) {
        std::mt19937_64 rrng(static_cast<uint64_t>(B) * 1000 + static_cast<uint64_t>(R));
        const auto& layers = recorded->routed_layers();
        for (int i = 0; i < kInputSets; ++i) {
          const auto places = recorded->draw(B, R, rrng);
          routed.push_back(recorded->ids(places, R, layers[static_cast<size_t>(i) % layers.size()]));
        }
      }
      drafter::Block::Options fo;
      if (recorded) fo.routed_experts = forced.data();
      const Timing t = time_graph(
          be, opt.warmup, opt.reps, opt.profile,
          [&](int i) {
            be.upload(x.data(), inputs[static_cast<size_t>(i % kInputSets)].data(),
                      static_cast<size_t>(n) * H * sizeof(bf16));
            if (recorded) {
              const std::vector<int32_t>& ids = routed[static_cast<size_t>(i % kInputSets)];
              be.upload(forced.data(), ids.data(), ids.size() * sizeof(int32_t));
            }
          },
          [&] { block.forward(rb, x.data(), caches, y.data(), fo); });
      // The last replay's routes and selections, for the floor.
      std::vector<int32_t> experts(static_cast<size_t>(n) * top_k), sel(static_cast<size_t>(n) * width);
      be.download(experts.data(), block.experts(), experts.size() * sizeof(int32_t));
      be.download(sel.data(), block.selection(), sel.size() * sizeof(int32_t));
      const double distinct = static_cast<double>(std::set<int32_t>(experts.begin(), experts.end()).size());
      double union_rows = 0;
      for (int b = 0; b < B; ++b) {
        std::set<int32_t> rows_of_b;
        for (int r = 0; r < R; ++r)
          for (int j = 0; j < width; ++j) {
            const int32_t v = sel[static_cast<size_t>((b * R + r) * width + j)];
            if (v >= 0) rows_of_b.insert(v);
          }
        union_rows += static_cast<double>(rows_of_b.size());
      }
      const double floor_bytes = lb.dense + distinct * lb.expert + union_rows * 2.0 * cfg.kv_lora_rank +
                                 B * (pool_key_bytes + R * row_write_bytes);
      const double floor_us = floor_bytes / (copy_gbps * 1e9) * 1e6;
      std::printf("%4d %2d %5d %9.1f %8.1f %8.1f %8.0f %12.0f %9.1f %8.2f\n", B, R, n, t.median, t.p10, t.p90,
                  distinct, union_rows / B, floor_us, t.median / floor_us);
      csv << "layer,," << B << ',' << R << ',' << n << ',' << opt.reps << ',' << t.median << ',' << t.p10
          << ',' << t.p90 << ',' << distinct << ',' << union_rows / B << ',' << floor_bytes << ',' << floor_us
          << ',' << t.median / floor_us << ",,\n";
      std::fflush(stdout);
    }
  }

  // The head over the B x R rows: the final norm, the logits and each row's argmax.
  std::set<int> row_counts;
  for (int B : opt.batches)
    for (int R : opt.rows) row_counts.insert(B * R);
  std::vector<int32_t> zeros(static_cast<size_t>(max_n), 0);
  be.upload(slot.data(), zeros.data(), zeros.size() * sizeof(int32_t));
  ops::Array<ops::ArgMax> arg(be, static_cast<size_t>(max_n));
  // The head's logits are a [rows, H] x [H, V] GEMM: past about 128 rows its tensor-core work, not
  // W's bytes, bounds it. tensor_us is that work at the measured BF16 rate (the FP8 head's cuBLASLt
  // path multiplies two E4M3 parts a row at about twice the rate: the same time); x_roofline is
  // the time against the larger of the two floors.
  std::printf(
      "\nthe head over B x R rows (final norm, logits, argmax per row); floor: its weights; tensor: "
      "its GEMM at the measured rate\n");
  std::printf("%-5s %5s %9s %8s %8s %9s %8s %9s %10s\n", "head", "rows", "head_us", "p10", "p90", "floor_us",
              "x_floor", "tensor_us", "x_roofline");
  for (bool fp8 : {false, true}) {
    if (!opt.heads[fp8 ? 1 : 0]) continue;
    const double floor_bytes =
        fp8 ? static_cast<double>(cfg.vocab) * H + 4.0 * cfg.vocab : 2.0 * static_cast<double>(cfg.vocab) * H;
    const double floor_us = floor_bytes / (copy_gbps * 1e9) * 1e6;
    for (int n : row_counts) {
      const Timing t = time_graph(
          be, opt.warmup, opt.reps, opt.profile,
          [&](int i) {
            be.upload(x.data(), inputs[static_cast<size_t>(i % kInputSets)].data(),
                      static_cast<size_t>(n) * H * sizeof(bf16));
          },
          [&] {
            be.rmsnorm(x.data(), final_norm.data(), y.data(), n, H, cfg.rms_norm_eps);
            be.head_argmax_batch(lm_head.data(), fp8 ? lm_fp8.data() : nullptr,
                                 fp8 ? lm_scale.data() : nullptr, y.data(),
                                 ops::RowBatch{slot.data(), nullptr, n, 1}, static_cast<int>(cfg.vocab), H, 0,
                                 nullptr, 0, arg.data());
          });
      const double tensor_us = 2.0 * n * static_cast<double>(cfg.vocab) * H / (tflops * 1e12) * 1e6;
      const double x_roof = t.median / std::max(floor_us, tensor_us);
      std::printf("%-5s %5d %9.1f %8.1f %8.1f %9.1f %8.2f %9.1f %10.2f\n", fp8 ? "fp8" : "bf16", n, t.median,
                  t.p10, t.p90, floor_us, t.median / floor_us, tensor_us, x_roof);
      csv << "head," << (fp8 ? "fp8" : "bf16") << ",,," << n << ',' << opt.reps << ',' << t.median << ','
          << t.p10 << ',' << t.p90 << ",,," << floor_bytes << ',' << floor_us << ',' << t.median / floor_us
          << ',' << tensor_us << ',' << x_roof << "\n";
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  cli::Parser p(
      "mtplab_bench_verify",
      "mtplab_bench_verify [--preset NAME] [--batch 1,2,4,...,128] [--rows 1,...,5] [--context 4096] "
      "[--reps N] [--warmup N] [--heads bf16,fp8] [--out DIR] [--device D] [--router-bias-scale S]");
  p.about(
       "One target layer at B sequences x R new rows (the verification forward) and the head over them, "
       "against "
       "their byte floors.\n")
      .text("preset", "NAME", "model preset or config file (default glm5.3-flash)")
      .integer_list("batch", "1,2,4", "sequences (default 1,2,4,8,16,32,64,128)", 1, 128)
      .integer_list("rows", "1,2,3", "new rows per sequence, k + 1 (default 1,2,3,4,5)", 1, 16)
      .integer("context", "ROWS", "context rows each sequence holds (default 4096)", 1, 1 << 20)
      .integer("reps", "N", "timed replays per point (default 20)", 1, 1000000)
      .integer("warmup", "N", "untimed replays first (default 3)", 0, 1000000)
      .choice_list("heads", {"bf16", "fp8"}, "head variants (default both)")
      .text("out", "DIR", "where bench_verify.csv goes (default bench-out)")
      .integer("device", "D", "CUDA device (default 0)", 0, 1023)
      .number("router-bias-scale", "S",
              "the synthetic router bias (e_score_correction_bias, std 0.05) times S (default 1; 0.2 routes "
              "as the PyTorch peer's std 0.01)",
              0, 100)
      .text(
          "routing", "TRACE.h5",
          "route the rows as the trace's recorded routing says (its top_k and experts must be the preset's)")
      .flag("profile",
            "CUDA profiler on around each shape's eager forward only (for ncu --profile-from-start off)");
  p.run_main(argc, argv, [&](const cli::Args& a) {
    opt.preset = a.text("preset", opt.preset);
    opt.batches.clear();
    for (const int64_t b : a.integers("batch", {1, 2, 4, 8, 16, 32, 64, 128}))
      opt.batches.push_back(static_cast<int>(b));
    opt.rows.clear();
    for (const int64_t r : a.integers("rows", {1, 2, 3, 4, 5})) opt.rows.push_back(static_cast<int>(r));
    opt.context = static_cast<int>(a.integer("context", opt.context));
    opt.reps = static_cast<int>(a.integer("reps", opt.reps));
    opt.warmup = static_cast<int>(a.integer("warmup", opt.warmup));
    opt.heads = pair_of(a.choices("heads", {"bf16", "fp8"}), "bf16", "fp8");
    opt.out = a.text("out", opt.out);
    opt.device = static_cast<int>(a.integer("device", opt.device));
    opt.router_bias_scale = a.number("router-bias-scale", opt.router_bias_scale);
    opt.routing = a.text("routing", "");
    opt.profile = a.flag("profile");
  });
  return bench::guarded_main([&] {
    if (!ops::cuda_backend_available()) {
      std::printf("SKIPPED: no CUDA device is visible\n");
      return 77;
    }
    return run(opt);
  });
}
