// mtplab_bench_step: the whole draft step of the MtpDrafter on one GPU at a model preset's shape
// (default glm5.3-flash) with synthetic weights and a context of --context rows, op by op and as
// one CUDA graph, BF16 and FP8 heads, against the step's byte floor.
//
//   mtplab_bench_step [--preset NAME] [--context ROWS] [--reps N] [--warmup N] [--k 1,4]
//                     [--heads bf16,fp8] [--graphs off,on] [--index-share off,on] [--profile]
//                     [--context-gemm] [--out DIR] [--device D] [--batch 1,2,4,8,16,32,64,128]
//                     [--router-bias-scale S]
//
// --index-share off,on: drafters with the index_share arm off and / or on (default off): drafts
// 2..k of a step reuse draft 1's indexer selection, so their floor leaves out the indexer query
// weights (wq_b, weights_proj) and the pool keys. Both arms replay the same random inputs.
//
// --context R1,R2,...: each drafter prefills and steps at each context in turn (one weight
// synthesis for all). --batch B1,B2,...: the batched step instead (MtpDrafter::propose_batch) at
// each B (--with-single: after the single-sequence step, on the same weights): B sequences
// of each context's rows (one prefill, forked into every slot), per-step and per-sequence time,
// and the byte floor at B: the dense weights, the distinct routed experts of the step (counted
// from the router's choice of the step's last draft, outside the timed phase), the shared expert,
// the head, and B x (selected latent rows + pool keys). Writes DIR/bench_step_batch.csv.
// --router-bias-scale S multiplies the synthetic router bias (std 0.05) by S: the bias's spread
// sets how many distinct experts a batch routes to (0.2, std 0.01, routes as the PyTorch peer
// does: docs/performance.md, "Method"). The CSV's first line records S.
//
// --heads / --graphs pick a subset of the four drafters. --profile turns the CUDA profiler on
// (cudaProfilerStart) only around the timed steps, so `ncu --profile-from-start off` sees the
// drafts' kernels and none of the weight upload or the context prefill. --context-gemm prefills
// the context with the context_gemm arm (one GEMM per projection and chunk of 256 rows): the
// prefill time printed per drafter is then the batched one.
//
// Method: the byte floor of one draft is every weight the draft must read once
// (eh_proj, q_a, q_b, kv_a, kv_b, o_proj, the indexer, the router, top_k routed experts and the
// shared expert, the head) plus the selected latent rows and the candidate pool keys; its time is
// bytes / the device-to-device copy bandwidth measured in the same run (bytes read + written, as
// mtplab_bench_kernels counts it). A step is timed between the drafter's Phase::propose events
// (after the uploads of token, hidden and position, before the download of the drafts), so it
// covers exactly the k drafts. Each step then rejects every draft (after_verify(0)): the context
// grows by one row per step and the hidden and token are fresh random values, so the routed
// experts change from step to step and the 18 GB of weights never sit in the 60 MB L2. Warm-up
// steps (the first records the graph) are not timed. Prints a table; writes DIR/bench_step.csv.
// The backend runs the default kernel policy with the MTPLAB_* overrides of the environment applied
// (ops::env_overrides, e.g. MTPLAB_CUDA_PDL=0), printed first and in the CSV's first line.
#include <cuda_profiler_api.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_main.hpp"
#include "bench_util.hpp"
#include "core/build_info.hpp"
#include "core/cli.hpp"
#include "core/error.hpp"
#include "core/stats.hpp"
#include "core/str.hpp"
#include "drafter/factory.hpp"
#include "model/weights.hpp"
#include "ops/kernel_policy.hpp"

using namespace mtplab;

namespace {

using bench::copy_bandwidth;
using bench::pair_of;

struct Options {
  std::string preset = "glm5.3-flash";
  std::vector<int> contexts = {4096};  ///< --context: each drafter runs at every one
  int reps = 40;
  int warmup = 4;
  std::vector<int> ks = {1, 4};
  std::array<bool, 2> heads{true, true};         // bf16, fp8
  std::array<bool, 2> graphs{true, true};        // off, on
  std::array<bool, 2> index_share{true, false};  // off, on
  std::string out = "bench-out";
  int device = 0;
  bool profile = false;
  bool context_gemm = false;
  std::vector<int> batches;        ///< --batch: the batched step at these B
  bool with_single = false;        ///< --with-single: with --batch, the single-sequence step too
  double router_bias_scale = 1.0;  ///< --router-bias-scale: the synthetic router bias times this
};

/// Records the Phase::propose events of each step.
class StepTimer final : public drafter::PhaseTimer {
 public:
  explicit StepTimer(ops::Backend& be) : be_(be), start_(be.make_event()), end_(be.make_event()) {}
  void begin(drafter::Phase p, int) override {
    if (p == drafter::Phase::propose) start_->record();
  }
  void end(drafter::Phase p, int) override {
    if (p == drafter::Phase::propose) end_->record();
  }
  double last_ms() { return be_.elapsed_ms(*start_, *end_); }

 private:
  ops::Backend& be_;
  std::unique_ptr<ops::Event> start_, end_;
};

/// The fewest bytes one draft must read (docs/model.md shapes; world 1).
struct Floor {
  double weights_no_head = 0, head_bf16 = 0, head_fp8 = 0, kv_rows = 0, pool_keys = 0;
  double indexer_query = 0;  ///< wq_b and weights_proj: what a draft sharing draft 1's selection skips
  double total(bool fp8) const {
    return weights_no_head + (fp8 ? head_fp8 : head_bf16) + kv_rows + pool_keys;
  }
  /// The floor of a step of k drafts; with index_share drafts 2..k read neither the indexer query
  /// weights nor the pool keys.
  double step(bool fp8, int k, bool share) const {
    return k * total(fp8) - (share ? (k - 1) * (indexer_query + pool_keys) : 0.0);
  }
};

Floor byte_floor(const model::ModelConfig& c, int context) {
  const double H = c.hidden, b = 2.0;
  const double nh = c.n_heads, qk = c.qk_nope_head_dim, v = c.v_head_dim;
  Floor f;
  f.weights_no_head =
      b * (H * 2 * H                                                     // eh_proj
           + c.q_lora_rank * H + nh * qk * c.q_lora_rank                 // q_a, q_b
           + c.kv_lora_rank * H + nh * (qk + v) * c.kv_lora_rank         // kv_a, kv_b
           + H * nh * v                                                  // o_proj
           + double(c.index_n_heads) * c.index_head_dim * c.q_lora_rank  // indexer wq_b
           + 2.0 * c.index_head_dim * H + double(c.index_n_heads) * H    // wk, gate, weights_proj
           + double(c.n_routed_experts) * H                              // router
           + 3.0 * c.num_experts_per_tok * c.moe_intermediate_size * H   // routed experts
           + 3.0 * c.shared_intermediate() * H                           // shared expert
           + 8.0 * H);                                                   // norms, embedding row
  f.indexer_query =
      b * (double(c.index_n_heads) * c.index_head_dim * c.q_lora_rank + double(c.index_n_heads) * H);
  f.head_bf16 = b * double(c.vocab) * H;
  f.head_fp8 = double(c.vocab) * H + 4.0 * c.vocab;
  const int pools = context / c.index_kpool;
  f.kv_rows = b * std::min<double>(c.selection_width(), context) * c.kv_lora_rank;
  f.pool_keys = 4.0 * pools * c.index_head_dim;
  return f;
}

struct Row {
  std::string head;
  bool graph = false;
  bool share = false;  ///< index_share
  int context = 0;
  int k = 0;
  std::vector<double> us;  // per step
  double floor_bytes = 0;
  double launches_per_draft = 0;  // kernels one propose(k) enqueues / k (eager run; a graph replays the same)
};

/// What every run of the process shares: the backend, the model (its context sized for every
/// run), the weights (synthesised once), the copy bandwidth, and the context rows.
struct Setup {
  model::ModelConfig cfg;
  std::unique_ptr<ops::Backend> be;
  model::MtpWeights w;
  double copy_gbps = 0;
  std::vector<int32_t> ctx_tokens;  ///< the longest context's tokens (a shorter one is a prefix)
  std::vector<bf16> ctx_hiddens;
};

Setup make_setup(const Options& opt) {
  Setup s;
  s.cfg = model::load_model_preset(opt.preset);
  const int max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end());
  const int max_k = *std::max_element(opt.ks.begin(), opt.ks.end());
  // Each timed step leaves one row (after_verify(0)); the batched run grows by k + 1 at most.
  const int steps =
      static_cast<int>(opt.ks.size() * std::max<size_t>(1, opt.batches.size())) * (opt.reps + opt.warmup);
  s.cfg.set_max_seq_len(max_ctx + steps * (max_k + 1) + 64);
  s.be = ops::make_cuda_backend(opt.device);
  std::vector<std::string> overridden;
  s.be->set_kernel_policy(ops::env_overrides(ops::KernelPolicy{}, &overridden));
  std::printf("mtplab_bench_step on %s (git %s%s): %s, contexts %s rows, %d timed steps per point\n",
              s.be->device_name().c_str(), git_sha(), git_dirty() ? "-dirty" : "", opt.preset.c_str(),
              join(opt.contexts, ",").c_str(), opt.reps);
  std::printf("kernel policy %s%s%s\n", ops::to_string(s.be->kernel_policy()).c_str(),
              overridden.empty() ? "" : "; from the environment: ", join(overridden, ", ").c_str());
  s.copy_gbps = copy_bandwidth(*s.be);
  std::printf("copy_d2d %.0f GB/s (bytes read + written)\n", s.copy_gbps);
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  const auto plan = model::make_shard_plan(s.cfg, 0, 1, model::HeadSharding::none);
  s.w = model::synthesize_mtp_weights(s.cfg, plan, 11);
  const double synth_s = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  if (opt.heads[1]) model::quantize_head_fp8(s.w);
  const double quant_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (opt.router_bias_scale != 1.0) {
    // The bias shifts which experts win; its spread sets how many distinct experts a batch touches.
    for (float& v : s.w.moe.e_score_correction_bias.data) v = static_cast<float>(v * opt.router_bias_scale);
    std::printf("router bias scaled by %g\n", opt.router_bias_scale);
  }
  std::printf("synthesize_mtp_weights: %.2f GB in %.1f s (%u threads); quantize_head_fp8 %.1f s\n",
              s.w.bytes() / 1e9, synth_s, std::thread::hardware_concurrency(), quant_s);
  // Context: random tokens and hiddens (target-like scale: post-norm hiddens are O(1)).
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(s.cfg.vocab - 1));
  std::normal_distribution<float> nrm(0.0f, 1.0f);
  s.ctx_tokens.resize(static_cast<size_t>(max_ctx));
  for (auto& t : s.ctx_tokens) t = tok(rng);
  s.ctx_hiddens.resize(static_cast<size_t>(max_ctx) * s.cfg.hidden);
  for (auto& x : s.ctx_hiddens) x = to_bf16(nrm(rng));
  return s;
}

/// The step inputs of one drafter: the same sequence of random tokens and hiddens for every
/// drafter of the run (its own generator and distributions), so the arms see the same steps.
struct StepInputs {
  explicit StepInputs(const model::ModelConfig& cfg)
      : hidden(cfg.hidden), tok(0, static_cast<int32_t>(cfg.vocab - 1)), nrm(0.0f, 1.0f) {}
  int32_t token() { return tok(rng); }
  std::vector<bf16> hiddens(int rows) {
    std::vector<bf16> h(static_cast<size_t>(rows) * hidden);
    for (auto& x : h) x = to_bf16(nrm(rng));
    return h;
  }
  int hidden;
  std::mt19937_64 rng{4321};
  std::uniform_int_distribution<int32_t> tok;
  std::normal_distribution<float> nrm;
};

drafter::DrafterOptions drafter_options(const Options& opt, bool fp8, bool graph, bool share) {
  drafter::DrafterOptions d;
  d.draft_len = *std::max_element(opt.ks.begin(), opt.ks.end());
  d.head_fp8 = fp8;
  d.cuda_graph = graph;
  d.context_gemm = opt.context_gemm;
  d.index_share = share;
  return d;
}

/// Calls f(fp8, graph, share) for every drafter the options pick.
template <typename F>
void for_each_drafter(const Options& opt, F&& f) {
  for (bool fp8 : {false, true})
    for (bool graph : {false, true})
      for (bool share : {false, true})
        if (opt.heads[fp8 ? 1 : 0] && opt.graphs[graph ? 1 : 0] && opt.index_share[share ? 1 : 0])
          f(fp8, graph, share);
}

/// The batched step at each B of opt.batches (see the file comment).
int run_batched(const Options& opt, Setup& s) {
  ops::Backend& be = *s.be;
  const model::ModelConfig& cfg = s.cfg;
  const int max_b = *std::max_element(opt.batches.begin(), opt.batches.end());
  const int H = cfg.hidden;
  const double expert_bytes = 2.0 * 3.0 * cfg.moe_intermediate_size * H;
  const double routed_top_k = cfg.num_experts_per_tok * expert_bytes;
  std::filesystem::create_directories(opt.out);
  std::ofstream csv(opt.out + "/bench_step_batch.csv");
  MTP_REQUIRE(csv, "cannot write ", opt.out, "/bench_step_batch.csv");
  csv << "# mtplab_bench_step --batch git " << git_sha() << (git_dirty() ? "-dirty" : "") << " device "
      << be.device_name() << " preset " << opt.preset << " contexts " << join(opt.contexts, ",")
      << " copy_GBps " << s.copy_gbps << " router_bias_scale " << opt.router_bias_scale << " kernel_policy "
      << ops::to_string(be.kernel_policy()) << "\n";
  csv << "head,cuda_graph,index_share,context,k,B,reps,median_us,p10_us,p90_us,per_seq_us,distinct_experts,"
         "floor_bytes,floor_us,x_floor,launches_per_draft\n";
  std::printf("\nbatched step (propose_batch), B sequences of the context each\n");
  std::printf("%-5s %-6s %-5s %7s %2s %4s %11s %9s %9s %10s %8s %10s %8s %9s\n", "head", "graph", "share",
              "context", "k", "B", "step_med_us", "p10_us", "p90_us", "per_seq_us", "experts", "floor_us",
              "x_floor", "launches");
  for_each_drafter(opt, [&](bool fp8, bool graph, bool share) {
    StepInputs in(cfg);
    auto d = drafter::make_drafter(be, nullptr, cfg, s.w, drafter_options(opt, fp8, graph, share));
    StepTimer timer(be);
    d->set_timer(&timer);
    for (int context : opt.contexts) {
      const Floor floor = byte_floor(cfg, context);
      auto batch = d->new_batch(max_b);
      const int first = d->new_sequence(*batch);
      d->append_rows(*batch, first, s.ctx_tokens.data(), s.ctx_hiddens.data(), context, 0);
      for (int b = 1; b < max_b; ++b) d->fork_sequence(*batch, first);
      // Graph on, the kernels are enqueued only while a bucket's graph is recorded: a later batch
      // size of the same bucket (3 after 4) replays it, and takes the count of the recording.
      std::map<std::pair<unsigned, int>, double> bucket_launches;
      for (int B : opt.batches) {
        for (int k : opt.ks) {
          std::vector<double> us, experts;
          double launches_per_draft = 0;
          for (int i = 0; i < opt.warmup + opt.reps; ++i) {
            const std::vector<bf16> h = in.hiddens(B);
            std::vector<drafter::BatchRow> rows(static_cast<size_t>(B));
            for (int b = 0; b < B; ++b)
              rows[static_cast<size_t>(b)] = {b, in.token(), h.data() + static_cast<size_t>(b) * H};
            if (opt.profile && i == opt.warmup) cudaProfilerStart();
            const uint64_t before = be.kernels_enqueued();
            d->propose_batch(*batch, rows, k);
            // Graph on: the drafter's first call at a bucket runs op by op (sizing the scratch) and its
            // second records the graph, each enqueueing the step's kernels once; replays enqueue none.
            launches_per_draft =
                std::max(launches_per_draft, static_cast<double>(be.kernels_enqueued() - before) / k);
            if (i >= opt.warmup) {
              us.push_back(timer.last_ms() * 1e3);
              experts.push_back(d->last_distinct_experts(B));
            }
            for (int b = 0; b < B; ++b) d->after_verify(*batch, b, 0);
          }
          if (opt.profile) cudaProfilerStop();
          const auto bucket = std::make_pair(std::bit_ceil(static_cast<unsigned>(B)), k);
          if (launches_per_draft > 0) {
            bucket_launches.try_emplace(bucket, launches_per_draft);
          } else if (auto it = bucket_launches.find(bucket); it != bucket_launches.end()) {
            launches_per_draft = it->second;
          }
          const double med = quantile(us, 0.5), p10 = quantile(us, 0.1), p90 = quantile(us, 0.9);
          const double distinct = quantile(experts, 0.5);
          const double per_draft_bytes = floor.weights_no_head - routed_top_k + distinct * expert_bytes +
                                         (fp8 ? floor.head_fp8 : floor.head_bf16) +
                                         B * (floor.kv_rows + floor.pool_keys);
          // index_share: drafts 2..k read neither the indexer query weights nor B rows' pool keys.
          const double floor_bytes =
              k * per_draft_bytes - (share ? (k - 1) * (floor.indexer_query + B * floor.pool_keys) : 0.0);
          const double floor_us = floor_bytes / (s.copy_gbps * 1e9) * 1e6;
          std::printf("%-5s %-6s %-5s %7d %2d %4d %11.1f %9.1f %9.1f %10.1f %8.1f %10.1f %8.2f %9.1f\n",
                      fp8 ? "fp8" : "bf16", graph ? "on" : "off", share ? "on" : "off", context, k, B, med,
                      p10, p90, med / B, distinct, floor_us, med / floor_us, launches_per_draft);
          csv << (fp8 ? "fp8" : "bf16") << ',' << (graph ? "on" : "off") << ',' << (share ? "on" : "off")
              << ',' << context << ',' << k << ',' << B << ',' << us.size() << ',' << med << ',' << p10 << ','
              << p90 << ',' << med / B << ',' << distinct << ',' << floor_bytes << ',' << floor_us << ','
              << med / floor_us << ',' << launches_per_draft << "\n";
        }
      }
    }
  });
  std::printf(
      "graph on: launches as the eager run of the same point enqueues them; experts: distinct routed "
      "experts of the step's last draft (median over steps), counted into the floor\n");
  return 0;
}

/// The single-sequence step (MtpDrafter::propose) at every context and k.
int run(const Options& opt, Setup& s) {
  using Clock = std::chrono::steady_clock;
  ops::Backend& be = *s.be;
  const model::ModelConfig& cfg = s.cfg;
  std::vector<Row> rows;
  for_each_drafter(opt, [&](bool fp8, bool graph, bool share) {
    StepInputs in(cfg);
    auto t0 = Clock::now();
    auto d = drafter::make_drafter(be, nullptr, cfg, s.w, drafter_options(opt, fp8, graph, share));
    const double up_s = std::chrono::duration<double>(Clock::now() - t0).count();
    StepTimer timer(be);
    d->set_timer(&timer);
    for (int context : opt.contexts) {
      // The prefill twice, on two sequences: the first includes one-time costs (kernel modules
      // loaded on first use, GEMM plans), the second is the warm figure an engine would see.
      auto prefill = [&] {
        auto st = d->new_sequence();
        const auto start = Clock::now();
        d->append_rows(*st, s.ctx_tokens.data(), s.ctx_hiddens.data(), context, 0);
        be.synchronize();
        return std::make_pair(std::move(st), std::chrono::duration<double>(Clock::now() - start).count());
      };
      const double cold_s = prefill().second;
      auto [st, prefill_s] = prefill();
      std::printf(
          "drafter %s head, cuda_graph %s, index_share %s%s: upload %.1f s, prefill of %d rows %.3f s warm "
          "(%.1f "
          "us per row; first prefill %.3f s)\n",
          fp8 ? "fp8" : "bf16", graph ? "on" : "off", share ? "on" : "off",
          opt.context_gemm ? ", context_gemm" : "", up_s, context, prefill_s, prefill_s * 1e6 / context,
          cold_s);
      const Floor floor = byte_floor(cfg, context);
      for (int k : opt.ks) {
        Row r;
        r.head = fp8 ? "fp8" : "bf16";
        r.graph = graph;
        r.share = share;
        r.context = context;
        r.k = k;
        r.floor_bytes = floor.step(fp8, k, share);
        for (int i = 0; i < opt.warmup + opt.reps; ++i) {
          const std::vector<bf16> h = in.hiddens(1);
          const uint64_t launches_before = be.kernels_enqueued();
          d->propose(*st, in.token(), h.data(), k);
          const uint64_t launches = be.kernels_enqueued() - launches_before;
          if (!graph) r.launches_per_draft = static_cast<double>(launches) / k;
          if (opt.profile && i == opt.warmup) cudaProfilerStart();
          if (i >= opt.warmup) r.us.push_back(timer.last_ms() * 1e3);
          d->after_verify(*st, 0);
        }
        if (opt.profile) cudaProfilerStop();
        if (graph) {  // the graph holds the kernels the eager run of the same point enqueued
          for (const Row& e : rows)
            if (!e.graph && e.head == r.head && e.share == r.share && e.context == r.context && e.k == k)
              r.launches_per_draft = e.launches_per_draft;
        }
        rows.push_back(std::move(r));
      }
    }
  });

  for (int context : opt.contexts) {
    const Floor floor = byte_floor(cfg, context);
    std::printf(
        "\nbyte floor of one draft at context %d: %.1f MB (BF16 head) / %.1f MB (FP8 head); weights without "
        "the head %.1f MB, head %.1f / %.1f MB, latent rows %.2f MB, pool keys %.2f MB, indexer query %.1f "
        "MB\n",
        context, floor.total(false) / 1e6, floor.total(true) / 1e6, floor.weights_no_head / 1e6,
        floor.head_bf16 / 1e6, floor.head_fp8 / 1e6, floor.kv_rows / 1e6, floor.pool_keys / 1e6,
        floor.indexer_query / 1e6);
  }
  std::printf("%-5s %-6s %-5s %7s %3s %12s %10s %10s %10s %10s %12s %8s %9s\n", "head", "graph", "share",
              "context", "k", "step_med_us", "p10_us", "p90_us", "per_draft", "floor_us", "GB/s", "x_floor",
              "launches");
  std::filesystem::create_directories(opt.out);
  std::ofstream csv(opt.out + "/bench_step.csv");
  MTP_REQUIRE(csv, "cannot write ", opt.out, "/bench_step.csv");
  csv << "# mtplab_bench_step git " << git_sha() << (git_dirty() ? "-dirty" : "") << " device "
      << be.device_name() << " preset " << opt.preset << " contexts " << join(opt.contexts, ",")
      << " copy_GBps " << s.copy_gbps << " kernel_policy " << ops::to_string(be.kernel_policy()) << "\n";
  csv << "head,cuda_graph,index_share,context,k,reps,median_us,p10_us,p90_us,floor_bytes,floor_us,x_floor,"
         "per_draft_us,launches_per_draft\n";
  for (const Row& r : rows) {
    const double med = quantile(r.us, 0.5), p10 = quantile(r.us, 0.1), p90 = quantile(r.us, 0.9);
    const double floor_us = r.floor_bytes / (s.copy_gbps * 1e9) * 1e6;
    std::printf("%-5s %-6s %-5s %7d %3d %12.1f %10.1f %10.1f %10.1f %10.1f %12.0f %8.2f %9.1f\n",
                r.head.c_str(), r.graph ? "on" : "off", r.share ? "on" : "off", r.context, r.k, med, p10, p90,
                med / r.k, floor_us, r.floor_bytes / (med * 1e-6) / 1e9, med / floor_us,
                r.launches_per_draft);
    csv << r.head << ',' << (r.graph ? "on" : "off") << ',' << (r.share ? "on" : "off") << ',' << r.context
        << ',' << r.k << ',' << r.us.size() << ',' << med << ',' << p10 << ',' << p90 << ',' << r.floor_bytes
        << ',' << floor_us << ',' << med / floor_us << ',' << med / r.k << ',' << r.launches_per_draft
        << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  cli::Parser p(
      "mtplab_bench_step",
      "mtplab_bench_step [--preset NAME] [--context 4096,16384] [--reps N] [--warmup N] [--k 1,4] "
      "[--heads bf16,fp8] [--graphs off,on] [--index-share off,on] [--profile] [--context-gemm] [--out DIR] "
      "[--device D] [--batch 1,8,64 [--with-single]]");
  p.about("The whole draft step at a preset's shape, op by op and as a CUDA graph, against its byte floor.\n")
      .text("preset", "NAME", "model preset or config file (default glm5.3-flash)")
      .integer_list("context", "4096,16384",
                    "context rows before the timed steps; each drafter runs at each (default 4096)", 1,
                    1 << 30)
      .integer("reps", "N", "timed steps per drafter (default 40)", 1, 1000000)
      .integer("warmup", "N", "untimed steps first (default 4)", 0, 1000000)
      .integer_list("k", "1,4", "draft lengths (default 1,4)", 1, 16)
      .choice_list("heads", {"bf16", "fp8"}, "head variants (default both)")
      .choice_list("graphs", {"off", "on"}, "eager launches and / or one CUDA graph (default both)")
      .choice_list("index-share", {"off", "on"}, "the index_share arm off and / or on (default off)")
      .flag("profile", "CUDA profiler on around the timed steps only")
      .flag("context-gemm", "prefill the context with the context_gemm arm")
      .text("out", "DIR", "where bench_step.csv goes (default bench-out)")
      .integer("device", "D", "CUDA device (default 0)", 0, 1023)
      .integer_list("batch", "1,8,64", "the batched step at these batch sizes (1 .. 128)", 1, 128)
      .flag("with-single", "with --batch: the single-sequence step too, on the same weights")
      .number("router-bias-scale", "S",
              "the synthetic router bias (e_score_correction_bias, std 0.05) times S (default 1; 0.2 routes "
              "as the PyTorch peer's std 0.01)",
              0, 100);
  p.run_main(argc, argv, [&](const cli::Args& a) {
    opt.preset = a.text("preset", opt.preset);
    opt.contexts.clear();
    for (const int64_t c : a.integers("context", {4096})) opt.contexts.push_back(static_cast<int>(c));
    opt.reps = static_cast<int>(a.integer("reps", opt.reps));
    opt.warmup = static_cast<int>(a.integer("warmup", opt.warmup));
    opt.ks.clear();
    for (const int64_t k : a.integers("k", {1, 4})) opt.ks.push_back(static_cast<int>(k));
    opt.heads = pair_of(a.choices("heads", {"bf16", "fp8"}), "bf16", "fp8");
    opt.graphs = pair_of(a.choices("graphs", {"off", "on"}), "off", "on");
    opt.index_share = pair_of(a.choices("index-share", {"off"}), "off", "on");
    opt.profile = a.flag("profile");
    opt.context_gemm = a.flag("context-gemm");
    opt.out = a.text("out", opt.out);
    opt.device = static_cast<int>(a.integer("device", opt.device));
    for (const int64_t b : a.integers("batch", {})) opt.batches.push_back(static_cast<int>(b));
    opt.with_single = a.flag("with-single");
    opt.router_bias_scale = a.number("router-bias-scale", opt.router_bias_scale);
    if (opt.with_single && opt.batches.empty()) MTP_FAIL("--with-single goes with --batch");
  });
  return bench::guarded_main([&] {
    if (!ops::cuda_backend_available()) {
      std::printf("SKIPPED: no CUDA device is visible\n");
      return 77;
    }
    Setup setup = make_setup(opt);
    int rc = 0;
    if (opt.batches.empty() || opt.with_single) rc = run(opt, setup);
    if (rc == 0 && !opt.batches.empty()) rc = run_batched(opt, setup);
    return rc;
  });
}
