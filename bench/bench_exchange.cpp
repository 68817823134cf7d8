// mtplab_bench_exchange: the latency of the four draft-token exchange protocols on 2+ GPUs
// (mpirun -np 2, NCCL on the CUDA backend's stream), next to a bare 8-byte ncclAllReduce (u64 MAX)
// and a bare 8-byte ncclAllGather on a plain NCCL communicator.
//
//   mpirun -np 2 mtplab_bench_exchange [--vocab V] [--iters N] [--reps R] [--warmup W] [--out DIR]
//
// Method:
// - A protocol row is drafter::exchange_pick, the very function MtpDrafter::head_pick calls: the
//   ops::Backend pack / pick ops plus the collective through dist::NcclCommunicator (its checked,
//   non-blocking issue path), from a rank's local (max, index) or its padded BF16 logits shard
//   (allgather_logits). head_argmax itself is not included. bf16_lanes includes its host
//   synchronisations (download, upload, wait) and cannot be captured in a CUDA graph.
// - packed_u64_head_key is packed_u64 as the drafter runs it: the head already wrote the key
//   (ops::HeadExtras), so the row is the all-reduce and the unpack; the target compares this row.
// - A bare row is one raw 8-byte NCCL call on a blocking communicator of its own (nccl-tests
//   style), the floor the protocols are compared with.
// - "host": N iterations issued back to back from the host between two CUDA events; "graph": the
//   same N iterations captured once into a CUDA graph, one replay between two events. A rep's
//   figure is elapsed / N; a rep starts after an MPI barrier; the figure kept for a rep is the
//   largest over the ranks (the slower rank decides when the draft is known everywhere). Median,
//   p10 and p90 over R reps after W warm-up reps. host_enqueue_us is the host's time to issue one
//   iteration (steady clock around the issuing loop): when it is close to the median, the row is
//   bound by the host, not the link.
// - Every row is checked: the logits shards are random BF16 (coarse, so the global maximum is
//   often tied, across ranks too) drawn from (seed, global token id), and every rank knows the
//   expected token (largest logit, lowest id on ties); each protocol is checked on several seeds
//   before timing and again after it. `wrong` counts mismatches over all ranks; any makes the
//   exit status 1.
// - The backend and the protocols' communicator run the default kernel policy with the MTPLAB_*
//   overrides of the environment applied (ops::env_overrides): MTPLAB_NCCL_BLOCKING=0 creates that
//   communicator non-blocking (dist::NcclMode), printed in the first line.
// Invariant: every graph executable is destroyed before either NCCL communicator.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/build_info.hpp"
#include "core/cli.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/numeric.hpp"
#include "core/stats.hpp"
#include "core/str.hpp"
#include "dist/check.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "dist/world_ops.hpp"
#include "drafter/exchange.hpp"
#include "model/sharding.hpp"
#include "ops/ops.hpp"
#include "provenance/versions.hpp"

using namespace mtplab;

namespace {

struct Options {
  int64_t vocab = 154880;  // glm5.3-flash
  int iters = 50;
  int reps = 300;
  int warmup = 20;
  std::string out = "bench-out";
};

/// splitmix64 from state z: one well-mixed 64-bit value per input (core/hash.hpp).
uint64_t mix64(uint64_t z) { return splitmix64_mix(z + kSplitmix64Gamma); }

/// Logit of global token `id` under `seed`: uniform in [-8, 8) rounded to BF16. BF16 has 8 bits
/// of mantissa, so among 154880 draws the maximum is usually shared by several ids.
bf16 logit_of(uint64_t seed, int64_t id) {
  const double u =
      static_cast<double>(mix64(seed * 0x100000001b3ull ^ static_cast<uint64_t>(id)) >> 11) * 0x1p-53;
  return to_bf16(static_cast<float>(-8.0 + 16.0 * u));
}

/// Largest logit, lowest id on ties, over the whole vocab.
int32_t expected_token(uint64_t seed, int64_t vocab) {
  int32_t best = 0;
  float best_v = to_float(logit_of(seed, 0));
  for (int64_t id = 1; id < vocab; ++id) {
    const float v = to_float(logit_of(seed, id));
    if (v > best_v) {
      best_v = v;
      best = static_cast<int32_t>(id);
    }
  }
  return best;
}

/// A plain blocking NCCL communicator for the bare rows (no timeout machinery, as nccl-tests).
class RawNccl {
 public:
  explicit RawNccl(MPI_Comm comm) {
    int rank = 0, size = 1;
    MTP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MTP_MPI_CHECK(MPI_Comm_size(comm, &size));
    ncclUniqueId id{};
    if (rank == 0) MTP_NCCL_CHECK(ncclGetUniqueId(&id));
    MTP_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm));
    MTP_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
  }
  ~RawNccl() {
    if (comm_) ncclCommDestroy(comm_);
  }
  RawNccl(const RawNccl&) = delete;
  RawNccl& operator=(const RawNccl&) = delete;
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

struct Result {
  std::string name;
  std::string mode;  // host | graph
  std::vector<double> us;
  double enqueue_us = 0;
  long wrong = 0;
  std::string note;
};

/// One exchange under test: `issue` enqueues one iteration; `check` returns the mismatches of
/// the last iteration's output on this rank (downloads, so never while capturing).
struct Case {
  std::string name;
  bool capturable = true;
  std::string not_capturable_why;
  std::function<void()> issue;
  std::function<long()> check;
  std::function<void(uint64_t seed)> set_inputs;  // null: inputs are fixed
};

class Bench {
 public:
  Bench(ops::Backend& be, dist::Communicator& comm, const dist::Group& world, const Options& opt)
      : be_(be), comm_(comm), world_(world), opt_(opt) {}

  /// Per-rep microseconds per iteration (largest over ranks) and the host's issue time.
  Result time(const Case& c, bool graph) {
    Result r;
    r.name = c.name;
    r.mode = graph ? "graph" : "host";
    auto e0 = be_.make_event();
    auto e1 = be_.make_event();
    std::unique_ptr<ops::Graph> exec;
    if (graph) {
      c.issue();  // sizes any scratch outside the capture
      comm_.wait();
      be_.begin_capture();
      for (int i = 0; i < opt_.iters; ++i) c.issue();
      exec = be_.end_capture();
    }
    std::vector<double> us;
    std::vector<double> enqueue;
    for (int rep = 0; rep < opt_.warmup + opt_.reps; ++rep) {
      dist::barrier(world_);
      e0->record();
      const auto t0 = std::chrono::steady_clock::now();
      if (graph) {
        exec->launch();
      } else {
        for (int i = 0; i < opt_.iters; ++i) c.issue();
      }
      const double issue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      e1->record();
      comm_.wait();
      const double ms = be_.elapsed_ms(*e0, *e1);
      if (rep >= opt_.warmup) {
        us.push_back(ms * 1e3 / opt_.iters);
        enqueue.push_back(issue_s * 1e6 / opt_.iters);
      }
    }
    exec.reset();  // before any communicator goes
    // The slower rank decides when the token is known everywhere.
    dist::all_reduce(world_, std::span<double>(us), dist::ReduceOp::max);
    r.us = std::move(us);
    r.enqueue_us = quantile(enqueue, 0.5);
    r.wrong = dist::all_reduce(world_, c.check(), dist::ReduceOp::sum);
    return r;
  }

 private:
  ops::Backend& be_;
  dist::Communicator& comm_;
  const dist::Group& world_;
  const Options& opt_;
};

int run(int argc, char** argv, const Options& opt) {
  dist::Runtime rt(&argc, &argv);
  const int world = rt.world();
  const int rank = rt.rank();
  MTP_REQUIRE(world >= 2,
              "mtplab_bench_exchange measures a cross-rank exchange: run it under mpirun -np 2 (world is ",
              world, ")");
  const auto& bound = rt.bind_device();
  auto be = ops::make_cuda_backend(bound.device);
  std::vector<std::string> overridden;
  be->set_kernel_policy(ops::env_overrides(ops::KernelPolicy{}, &overridden));
  const dist::NcclMode nccl_mode =
      be->kernel_policy().nccl_blocking ? dist::NcclMode::blocking : dist::NcclMode::non_blocking;
  auto group = rt.world_group();
  auto& comm = group.connect(dist::Transport::nccl, be->native_stream(), nccl_mode);
  auto raw = std::make_unique<RawNccl>(MPI_COMM_WORLD);
  auto stream = static_cast<cudaStream_t>(be->native_stream());

  const int64_t V = opt.vocab;
  const model::Range mine = model::split_range(V, rank, world);
  const int64_t stride = (V + world - 1) / world;  // the drafter's padding: the largest shard
  MTP_REQUIRE(mine.count > 0, "rank ", rank, " holds no vocab rows of ", V);

  const auto versions = provenance::library_versions();
  if (rank == 0)
    std::printf(
        "mtplab_bench_exchange (git %s%s): world %d, %s, NCCL %s (%s communicator), CUDA %s; vocab %lld "
        "split %lld per rank (padded), %d iterations per rep, %d reps after %d warm-up; kernel policy "
        "%s%s%s\n",
        git_sha(), git_dirty() ? "-dirty" : "", world, bound.name.c_str(), versions.nccl.c_str(),
        dist::to_string(nccl_mode), versions.cuda_runtime.c_str(), static_cast<long long>(V),
        static_cast<long long>(stride), opt.iters, opt.reps, opt.warmup,
        ops::to_string(be->kernel_policy()).c_str(),
        overridden.empty() ? "" : "; from the environment: ", join(overridden, ", ").c_str());

  // ---- buffers, as MtpDrafter allocates them ------------------------------------------------------
  // The drafter's own exchange buffers and code (drafter/exchange.hpp): what is timed is what runs.
  drafter::ExchangeBuffers xb(*be, world, stride, /*with_logits=*/true);
  ops::Array<int32_t> token(*be, 1);
  ops::Array<uint64_t> bare_send(*be, 1), bare_recv(*be, 1), bare_gather(*be, world);

  uint64_t seed = 0;
  int32_t want = -1;
  auto set_logits = [&](uint64_t s) {
    seed = s;
    std::vector<bf16> host(stride, bf16{0xFF80});  // -inf padding past the shard
    for (int64_t i = 0; i < mine.count; ++i) host[i] = logit_of(s, mine.begin + i);
    be->upload(xb.logits.data(), host.data(), host.size() * sizeof(bf16));
    be->argmax(xb.logits.data(), static_cast<int>(mine.count), mine.begin, xb.local_max.data());
    be->synchronize();
    want = expected_token(s, V);
  };
  auto token_wrong = [&]() -> long {
    int32_t got = -1;
    comm.wait();
    be->download(&got, token.data(), sizeof got);
    if (got != want && rank == 0)
      std::fprintf(stderr, "seed %llu: token %d, expected %d\n", static_cast<unsigned long long>(seed), got,
                   want);
    return got == want ? 0 : 1;
  };

  // ---- the cases ------------------------------------------------------------------------------------
  std::vector<Case> cases;
  {
    Case c;
    c.name = "bare_allreduce_u64_max";
    const uint64_t value = mix64(1000 + rank);
    be->upload(bare_send.data(), &value, sizeof value);
    uint64_t want_max = 0;
    for (int r = 0; r < world; ++r) want_max = std::max(want_max, mix64(1000 + r));
    c.issue = [&, stream] {
      MTP_NCCL_CHECK(
          ncclAllReduce(bare_send.data(), bare_recv.data(), 1, ncclUint64, ncclMax, raw->get(), stream));
    };
    c.check = [&, want_max]() -> long {
      uint64_t got = 0;
      be->download(&got, bare_recv.data(), sizeof got);
      return got == want_max ? 0 : 1;
    };
    cases.push_back(std::move(c));
  }
  {
    Case c;
    c.name = "bare_allgather_8B";
    c.issue = [&, stream] {
      MTP_NCCL_CHECK(ncclAllGather(bare_send.data(), bare_gather.data(), 8, ncclUint8, raw->get(), stream));
    };
    c.check = [&]() -> long {
      std::vector<uint64_t> got(world);
      be->download(got.data(), bare_gather.data(), got.size() * sizeof(uint64_t));
      long bad = 0;
      for (int r = 0; r < world; ++r) bad += got[r] != mix64(1000 + r);
      return bad;
    };
    cases.push_back(std::move(c));
  }
  // A protocol row: drafter::exchange_pick on set_logits' shard, checked against the expected token.
  auto protocol = [&](drafter::Exchange ex) {
    Case c;
    c.name = drafter::to_string(ex);
    c.issue = [&, ex] { drafter::exchange_pick(*be, comm, ex, V, xb, token.data()); };
    c.check = token_wrong;
    c.set_inputs = set_logits;
    return c;
  };
  cases.push_back(protocol(drafter::Exchange::packed_u64));
  {
    // What the drafter runs: the head wrote the key (ops::HeadExtras), so only the all-reduce and
    // the unpack follow it. The key is packed once per input here, outside the timed loop.
    Case c = protocol(drafter::Exchange::packed_u64);
    c.name = "packed_u64_head_key";
    c.issue = [&] {
      drafter::exchange_pick(*be, comm, drafter::Exchange::packed_u64, V, xb, token.data(),
                             /*key_from_head=*/true);
    };
    c.check = [&]() -> long {
      const long wrong = token_wrong();
      be->argmax_pack_key(xb.local_max.data(), xb.key.data());  // the all-reduce overwrote it
      return wrong;
    };
    c.set_inputs = [&](uint64_t s) {
      set_logits(s);
      be->argmax_pack_key(xb.local_max.data(), xb.key.data());
      be->synchronize();
    };
    cases.push_back(std::move(c));
  }
  cases.push_back(protocol(drafter::Exchange::allgather_pairs));
  cases.push_back(protocol(drafter::Exchange::allgather_logits));
  if (world == 2) {
    Case c = protocol(drafter::Exchange::bf16_lanes);
    c.capturable = false;
    c.not_capturable_why = "host synchronisations inside (download, upload): cannot be captured";
    cases.push_back(std::move(c));
  }

  // ---- correctness before timing: several seeds per protocol -----------------------------------------
  const uint64_t seeds[] = {1, 2, 3, 4, 5, 6};
  std::vector<long> pre_wrong(cases.size(), 0);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    for (uint64_t s : c.set_inputs ? std::vector<uint64_t>(std::begin(seeds), std::end(seeds))
                                   : std::vector<uint64_t>{0}) {
      if (c.set_inputs) c.set_inputs(s);
      c.issue();
      pre_wrong[i] += c.check();
    }
  }
  dist::all_reduce(group, std::span<long>(pre_wrong), dist::ReduceOp::sum);

  // ---- timing -------------------------------------------------------------------------------------
  Bench bench(*be, comm, group, opt);
  std::vector<Result> results;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (c.set_inputs) c.set_inputs(7);
    for (bool graph : {false, true}) {
      if (graph && !c.capturable) {
        Result r;
        r.name = c.name;
        r.mode = "graph";
        r.note = c.not_capturable_why;
        results.push_back(r);
        continue;
      }
      Result r = bench.time(c, graph);
      r.wrong += pre_wrong[i];
      pre_wrong[i] = 0;
      results.push_back(std::move(r));
    }
  }

  // ---- report (rank 0) ------------------------------------------------------------------------------
  long total_wrong = 0;
  for (const Result& r : results) total_wrong += r.wrong;
  if (rank == 0) {
    std::printf("\n%-24s %-6s %10s %8s %8s %12s %6s  %s\n", "case", "mode", "median_us", "p10_us", "p90_us",
                "enqueue_us", "wrong", "note");
    for (const Result& r : results) {
      if (r.us.empty()) {
        std::printf("%-24s %-6s %10s %8s %8s %12s %6s  %s\n", r.name.c_str(), r.mode.c_str(), "-", "-", "-",
                    "-", "-", r.note.c_str());
        continue;
      }
      std::printf("%-24s %-6s %10.2f %8.2f %8.2f %12.2f %6ld  %s\n", r.name.c_str(), r.mode.c_str(),
                  quantile(r.us, 0.5), quantile(r.us, 0.1), quantile(r.us, 0.9), r.enqueue_us, r.wrong,
                  r.note.c_str());
    }
    auto median_of = [&](const std::string& name, const std::string& mode) {
      for (const Result& r : results)
        if (r.name == name && r.mode == mode && !r.us.empty()) return quantile(r.us, 0.5);
      return -1.0;
    };
    // The target is on the drafter's path (the head writes the key); the row with its own pack
    // launch is printed for comparison.
    for (const char* mode : {"host", "graph"}) {
      const double bare = median_of("bare_allreduce_u64_max", mode);
      const double packed = median_of("packed_u64", mode), head_key = median_of("packed_u64_head_key", mode);
      std::printf(
          "packed_u64 - bare all-reduce (%s): %+.2f us with the key from the head, the drafter's path "
          "(target <= 5 us: %s); %+.2f us with its own pack launch\n",
          mode, head_key - bare, head_key - bare <= 5.0 ? "met" : "MISSED", packed - bare);
    }
    std::printf("wrong tokens over all rows and ranks: %ld\n", total_wrong);

    std::filesystem::create_directories(opt.out);
    const std::string path = opt.out + "/bench_exchange.csv";
    std::ofstream csv(path);
    MTP_REQUIRE(csv, "cannot write ", path);
    csv << "# mtplab_bench_exchange git " << git_sha() << (git_dirty() ? "-dirty" : "") << " world " << world
        << " device " << bound.name << " nccl " << versions.nccl << " cuda " << versions.cuda_runtime
        << " vocab " << V << " iters " << opt.iters << " reps " << opt.reps << " warmup " << opt.warmup
        << "\n";
    csv << "case,mode,iters,reps,median_us,p10_us,p90_us,enqueue_us,wrong,note\n";
    for (const Result& r : results) {
      csv << r.name << ',' << r.mode << ',' << opt.iters << ',' << r.us.size() << ',';
      if (r.us.empty()) {
        csv << ",,,,";
      } else {
        csv << quantile(r.us, 0.5) << ',' << quantile(r.us, 0.1) << ',' << quantile(r.us, 0.9) << ','
            << r.enqueue_us << ',' << r.wrong;
      }
      csv << ',' << r.note << "\n";
    }
    std::printf("wrote %s\n", path.c_str());
  }
  // Graph executables are gone (Bench::time); the raw communicator, then the group's.
  MTP_CUDA_CHECK(cudaStreamSynchronize(stream));
  raw.reset();
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  cli::Parser p(
      "mtplab_bench_exchange",
      "mpirun -np 2 mtplab_bench_exchange [--vocab V] [--iters N] [--reps R] [--warmup W] [--out DIR]");
  p.about("The draft-token exchange protocols against bare 8-byte NCCL calls, host-issued and in a graph.\n")
      // bf16_lanes carries a token id in 3 base-256 digits.
      .integer("vocab", "V", "vocab rows split over the ranks (default 154880, glm5.3-flash)", 2,
               int64_t{1} << 24)
      .integer("iters", "N", "iterations per rep (default 50)", 1, 1000000)
      .integer("reps", "R", "timed reps (default 300)", 1, 1000000)
      .integer("warmup", "W", "untimed reps first (default 20)", 0, 1000000)
      .text("out", "DIR", "where bench_exchange.csv goes (default bench-out)");
  p.run_main(argc, argv, [&](const cli::Args& a) {
    opt.vocab = a.integer("vocab", opt.vocab);
    opt.iters = static_cast<int>(a.integer("iters", opt.iters));
    opt.reps = static_cast<int>(a.integer("reps", opt.reps));
    opt.warmup = static_cast<int>(a.integer("warmup", opt.warmup));
    opt.out = a.text("out", opt.out);
  });
  return dist::run_guarded([&] { return run(argc, argv, opt); });
}
