// The run loop: backend and communicator set-up, trace and weight caches, the measured replay of
// each point, the per-point reduction over ranks and the hand-off to the results writer.
#include "harness/runner.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/stop_signals.hpp"
#include "dist/world_ops.hpp"
#include "drafter/factory.hpp"
#include "drafter/target.hpp"
#include "harness/check.hpp"
#include "harness/online.hpp"
#include "harness/point_inputs.hpp"
#include "harness/progress.hpp"
#include "harness/replay_teacher.hpp"
#include "harness/results.hpp"
#include "harness/step_recorder.hpp"
#include "harness/timer.hpp"
#include "harness/uncertainty.hpp"
#include "io/output.hpp"
#include "io/trace.hpp"
#include "model/weights.hpp"
#include "provenance/versions.hpp"

namespace mtplab::harness {
namespace {
std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
// The summary of the points run, one aligned row each, on stdout (rank 0).
void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::printf("\n");
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) line += r[c] + std::string(width[c] - r[c].size() + 2, ' ');
    std::printf("%s\n", line.c_str());
  }
  std::printf("step latency: max over ranks per step, warm-up excluded; spread = (p90 - p10) / median\n");
  if (std::find(rows[0].begin(), rows[0].end(), "E[tau]") != rows[0].end())
    std::printf(
        "E[tau] (verify sampling): 1 + the mean over steps of each step's expected accepted count, "
        "sum_i prod_{j<=i} a_j; tau is the realised figure (docs/acceptance.md)\n");
  if (std::find(rows[0].begin(), rows[0].end(), "tok/s/seq") != rows[0].end())
    std::printf(
        "tok/s/seq, tok/s/GPU (online points): tokens emitted per second per sequence and per GPU over the "
        "measured steps (docs/results-schema.md)\n");
  if (rows[0].back() == "qidx sel differ")
    std::printf(
        "qidx sel differ (batch_qidx): context rows whose selection from the batched q_idx differs, as a "
        "set, from the per-row one: differ / checked (rate)\n");
  std::fflush(stdout);
}
}  // namespace
namespace {

using Clock = std::chrono::steady_clock;

// What changes when a file is written: a commit renames a new file into place (another inode), and
// its size and modification time change.
struct FileVersion {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = -1;
  int64_t mtime_ns = 0;
  friend bool operator==(const FileVersion&, const FileVersion&) = default;
};
FileVersion version_of(const std::string& path) {
  struct stat st {};
  FileVersion v;
  if (::stat(path.c_str(), &st) != 0) return v;
  v.dev = st.st_dev;
  v.ino = st.st_ino;
  v.size = st.st_size;
  v.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return v;
}

// What an online point's target is built from: the model, the weights, the online settings, the
// head sharding and exchange, the positions a sequence may hold and the communicator (a
// reconnected communicator needs a new target).
struct OnlineTargetKey {
  model::ModelConfig model;
  WeightsSpec weights;
  OnlineOptions online;
  model::HeadSharding head_sharding = model::HeadSharding::none;
  drafter::Exchange exchange = drafter::Exchange::packed_u64;
  int positions = 0;
  const dist::Communicator* comm = nullptr;
  friend bool operator==(const OnlineTargetKey&, const OnlineTargetKey&) = default;
};

// Everything a point run needs that outlives the point.
struct Context {
  dist::Runtime& rt;
  ops::Backend& be;
  dist::Group& world_group;            ///< the run loop's host collectives go over it (dist/world_ops.hpp)
  dist::Communicator* comm = nullptr;  ///< the drafter's; reconnected when nccl_blocking changes
  dist::NcclMode comm_mode = dist::NcclMode::blocking;
  int rank = 0;
  int world = 1;
  PointInputs inputs;
  /// The online points' target, kept across points that build the same one (online_target).
  std::unique_ptr<drafter::Target> target;
  std::optional<OnlineTargetKey> target_key;
};

// The online point's target (harness/online.hpp): synthetic layers behind the point's embedding
// and head, or a checkpoint's trunk; the caches sized for the longest prompt + max_new_tokens.
// Its caches are BF16 (the synthetic trace's target's); kv_cache_dtype is the drafter's.
drafter::Target& online_target(Context& c, const PointConfig& p, model::MtpWeights& w, int positions) {
  OnlineTargetKey key{p.model,   p.weights, p.online, p.arms.drafter.head_sharding, p.arms.drafter.exchange,
                      positions, c.comm};
  if (c.target && c.target_key && *c.target_key == key) return *c.target;
  c.target.reset();
  c.target_key.reset();
  drafter::TargetOptions o;
  o.head_sharding = p.arms.drafter.head_sharding;
  o.exchange = p.arms.drafter.exchange;
  o.max_positions = positions;
  const auto t0 = Clock::now();
  if (p.online.target == TargetSource::checkpoint)
    c.target = drafter::load_target(c.be, c.comm, p.model, p.online.target_layers, p.weights.checkpoint, o);
  else
    c.target = drafter::make_target_behind(c.be, c.comm, p.model, w, p.online.target_layers,
                                           static_cast<uint64_t>(p.online.target_seed), o);
  if (c.rank == 0)
    log_info("online target: ", p.online.target_layers, " ", to_string(p.online.target), " layer(s)",
             p.online.target == TargetSource::synthetic ? str(" (seed ", p.online.target_seed, ")")
                                                        : std::string(),
             ", caches of ", c.target->capacity(), " positions, in ",
             format_duration(std::chrono::duration<double>(Clock::now() - t0).count()));
  c.target_key = std::move(key);
  return *c.target;
}

// Whether any rank saw a stop signal, and which (collective over the world; dist/stop_signals.hpp).
int agreed_stop(const dist::Group& world) { return dist::agreed_stop_signal(world); }

// The backend and the communicator under the point's kernel policy. The NCCL mode is fixed when a
// communicator is created, so a point with another nccl_blocking gets a new one (collective).
void apply_kernel_policy(Context& c, const PointConfig& p) {
  c.be.set_kernel_policy(p.arms.kernels);
  const dist::NcclMode mode =
      p.arms.kernels.nccl_blocking ? dist::NcclMode::blocking : dist::NcclMode::non_blocking;
  if (c.comm && mode == c.comm_mode) return;
  c.comm = &c.world_group.connect(dist::transport_for_backend(ops::to_string(c.be.kind())),
                                  c.be.native_stream(), mode);
  c.comm_mode = mode;
}

// Every rank took the same steps (the collectives inside the drafter keep them in lockstep):
// check it, record whether the ranks drafted alike, then reduce the timings to their max over
// ranks at rank 0 (per step and per column: what the step cost the job).
void reduce_over_ranks(const Context& c, const PointConfig& p, PointResult& r) {
  const auto rows = dist::min_max(c.world_group, static_cast<int64_t>(r.rows()));
  MTP_REQUIRE(rows.agree(), p.name(), ": ranks replayed different step counts (", rows.min, " to ", rows.max,
              ")");
  r.ranks_agree = dist::all_agree(c.world_group, fnv1a64_words(r.drafts));
  if (!r.ranks_agree && c.rank == 0)
    log_warn(p.name(), ": the ranks' drafts differ (recorded as ranks_agree = 0)");
  std::vector<std::vector<double>*> columns;
  for (auto& col : r.timing) columns.push_back(&col);
  for (auto* v : {&r.block_ms, &r.head_ms, &r.exchange_ms, &r.seq_prefill_ms, &r.draft_ms, &r.verify_ms})
    columns.push_back(v);
  std::vector<double> packed;
  for (const auto* col : columns) packed.insert(packed.end(), col->begin(), col->end());
  dist::reduce_max_to_root(c.world_group, packed);
  if (c.rank != 0) return;
  size_t off = 0;
  for (auto* col : columns) {
    std::copy(packed.begin() + static_cast<std::ptrdiff_t>(off),
              packed.begin() + static_cast<std::ptrdiff_t>(off + col->size()), col->begin());
    off += col->size();
  }
}

// The point's kernel record at rank 0: every rank's record of the kernel each op ran since the
// point began (collective), joined by kernel_record_entries; the other ranks get an empty list.
std::vector<std::string> kernels_over_ranks(const Context& c) {
  std::string mine;  // "op\tkernels\n" per op: neither text holds a tab or a newline
  for (const auto& [op, kernels] : c.be.kernels_chosen().named()) mine += str(op, "\t", kernels, "\n");
  const std::vector<std::string> all = c.rt.gather_strings(mine);
  if (c.rank != 0) return {};
  std::vector<KernelRecordEntries> per_rank;
  for (const std::string& text : all) {
    KernelRecordEntries& entries = per_rank.emplace_back();
    for (const std::string& line : split(text, '\n')) {
      if (line.empty()) continue;
      const size_t tab = line.find('\t');
      entries.emplace_back(line.substr(0, tab),
                           tab == std::string::npos ? std::string() : line.substr(tab + 1));
    }
  }
  return kernel_record_entries(per_rank);
}

// A measured point's last, collective, step: its figures reduced over the ranks, the kernel record,
// the finish time and the wall time since wall0.
void finish_point(const Context& c, const PointConfig& p, PointResult& r, Clock::time_point wall0) {
  reduce_over_ranks(c, p, r);
  r.kernels = kernels_over_ranks(c);
  r.finished_at = utc_now();
  r.wall_s = std::chrono::duration<double>(Clock::now() - wall0).count();
}

// Measures one online point (harness/online.hpp). Returns false when a stop signal interrupted it.
bool run_online_point(Context& c, const PointConfig& p, Progress& progress, PointResult& r) {
  const auto wall0 = Clock::now();
  const int k = p.arms.drafter.draft_len;
  const std::vector<Prompt> prompts = c.inputs.prompts(p);
  int longest = 0;
  for (const Prompt& pr : prompts) longest = std::max(longest, static_cast<int>(pr.tokens.size()));
  model::MtpWeights& w = c.inputs.weights(p);
  apply_kernel_policy(c, p);
  c.be.reset_kernels_chosen();  // the point's record: what its target and drafter run from here
  drafter::Target& target = online_target(c, p, w, longest + p.online.max_new_tokens);
  std::unique_ptr<drafter::MtpDrafter> drafter;
  if (k > 0) drafter = drafter::make_drafter(c.be, c.comm, p.model, w, p.arms.drafter);
  const bool sampling = p.arms.replay.verify == Verify::sampling;
  const SamplingVerify verify = sampling_verify(p.arms.replay);
  EventPhaseTimer timer(c.be, k);
  if (drafter) drafter->set_timer(&timer);

  std::vector<RecordedSequence> shapes;
  for (const Prompt& pr : prompts)
    shapes.push_back(RecordedSequence{pr.index, static_cast<int32_t>(pr.tokens.size()),
                                      static_cast<int64_t>(pr.tokens.size()) + p.online.max_new_tokens});
  StepRecorder rec(c.be, timer, p, std::move(shapes), r);
  if (drafter) rec.count_experts([&drafter](int rows) { return drafter->last_distinct_experts(rows); });
  bool stopped = false;
  OnlineRun run;
  run.draft_len = k;
  run.batch_size = p.arms.replay.batch_size;
  run.max_new_tokens = p.online.max_new_tokens;
  run.sampling = sampling ? &verify : nullptr;
  for (int rep = 0; rep < p.measure.repeats && !stopped; ++rep) {
    rec.begin_repeat(rep);
    OnlineHooks hooks;
    hooks.timer = &timer;
    hooks.draft_stats = k > 0 && records_draft_stats(p);
    hooks.after_prefill = [&](int i) { rec.after_prefill(i); };
    hooks.before_step = [&] { rec.before_step(); };
    hooks.after_step = [&](const std::vector<StepRecord>& rows) {
      rec.after_step(rows);
      progress.update(rec.progress(), static_cast<long>(rec.steps()));
      if (agreed_stop(c.world_group) != 0) return !(stopped = true);
      return !(p.measure.max_steps > 0 && rec.steps_in_repeat() >= p.measure.max_steps);
    };
    hooks.after_sequence = [&](int i, const OnlineSequence& s) {
      rec.after_sequence(i, s.steps, static_cast<int64_t>(s.tokens.size()));
    };
    run_online(target, drafter.get(), prompts, run, hooks);
    rec.end_repeat();
  }
  drafter.reset();
  if (stopped) return false;
  finish_point(c, p, r, wall0);
  return true;
}

// Measures one point. Returns false when a stop signal interrupted it (the result is then partial).
bool run_point(Context& c, const PointConfig& p, Progress& progress, PointResult& r) {
  const auto wall0 = Clock::now();
  r = PointResult{};
  r.started_at = utc_now();
  if (p.mode == RunMode::online) return run_online_point(c, p, progress, r);
  const int k = p.arms.drafter.draft_len;
  // batch_qidx batches the indexer queries of context rows that run the full block; cache_only
  // context rows compute no query, so there it has nothing to act on.
  if (p.arms.drafter.batch_qidx && p.arms.drafter.context_rows == drafter::ContextRows::cache_only) {
    r.arms_not_applied.push_back("batch_qidx");
    if (c.rank == 0)
      log_warn(p.name(),
               ": batch_qidx recorded but not applied: context_rows cache_only writes the context "
               "rows' caches only (no indexer query, no selection), so there are no query rows to batch; it "
               "applies with context_rows full (results attribute arms_not_applied)");
  }

  const auto& seqs = c.inputs.trace(p);
  model::MtpWeights& w = c.inputs.weights(p);
  apply_kernel_policy(c, p);
  c.be.reset_kernels_chosen();  // the point's record: what its drafter and steps run from here
  auto drafter = drafter::make_drafter(c.be, c.comm, p.model, w, p.arms.drafter);
  // Sampling verification: the target's log p of every trace token, before any timer is attached.
  const bool sampling = p.arms.replay.verify == Verify::sampling;
  const SamplingVerify verify = sampling_verify(p.arms.replay);
  const std::vector<std::vector<float>> no_logprobs;
  const auto& target_logp = sampling ? c.inputs.target_logprobs(p, *drafter) : no_logprobs;
  EventPhaseTimer timer(c.be, k);
  drafter->set_timer(&timer);
  drafter->reset_selection_check();  // a fresh drafter per point; counters are the point's own

  StepRecorder rec(c.be, timer, p, recorded_sequences(seqs), r);
  rec.count_experts([&drafter](int rows) { return drafter->last_distinct_experts(rows); });
  bool stopped = false, limit = false;
  // After each (batched) step: progress, an agreed stop, the step limit.
  auto go_on = [&]() {
    progress.update(rec.progress(), static_cast<long>(rec.steps()));
    if (agreed_stop(c.world_group) != 0) return !(stopped = true);
    if (p.measure.max_steps > 0 && rec.steps_in_repeat() >= p.measure.max_steps) return !(limit = true);
    return true;
  };
  const int batch = p.arms.replay.batch_size;
  const bool teacher_forced = p.arms.replay.replay == ReplayMode::teacher_forced;
  for (int rep = 0; rep < p.measure.repeats && !stopped; ++rep) {
    rec.begin_repeat(rep);
    limit = false;
    // Every batch size, 1 included, is the same continuous-batch loop.
    BatchReplayHooks hooks;
    hooks.after_prefill = [&](int i) { rec.after_prefill(i); };
    hooks.before_step = [&] { rec.before_step(); };
    hooks.after_step = [&](const std::vector<StepRecord>& rows) {
      rec.after_step(rows);
      return go_on();
    };
    hooks.after_sequence = [&](int i, int steps) { rec.after_sequence(i, steps); };
    hooks.draft_stats = records_draft_stats(p);
    if (teacher_forced)
      replay_teacher_forced_batched(*drafter, seqs, batch, k, p.model.hidden, hooks);
    else
      replay_batched(*drafter, seqs, batch, k, p.model.hidden, hooks, sampling ? &verify : nullptr,
                     target_logp);
    rec.end_repeat();
  }
  r.selection_checked = drafter->checks_selection();
  r.selection_check = drafter->selection_check();
  drafter.reset();
  if (stopped) return false;
  finish_point(c, p, r, wall0);
  return true;
}

std::string describe_device(dist::Runtime& rt, const std::string& backend) {
  if (backend != "cuda") return "cpu";
  const auto& d = rt.device();
  return str(d.device, ": ", d.name, " (", d.pci_bus_id, ")");
}

}  // namespace

void install_stop_handlers() { dist::install_stop_handlers("the results file keeps every completed point"); }

int stop_signal() { return dist::stop_signal(); }

int run_experiment(dist::Runtime& rt, const Preflight& pre, const RunOptions& options) {
  const Experiment& ex = pre.ex;
  MTP_REQUIRE(ex.world == rt.world(), ex.file, ": expanded for ", ex.world, " rank(s) but the job has ",
              rt.world());
  const int rank = rt.rank();
  dist::install_stop_handlers(str(pre.output, " keeps every completed point"));

  // The backend: `auto` decides alike on every rank (the MIN of the visible GPUs). Whether every
  // point can run on it is the input check's (below), as for `mtplab check`.
  const std::string backend = resolve_backend(rt, ex);
  dist::Group world = rt.world_group();
  // Inputs refused: the check's report, then one line with the `mtplab check` that repeats it
  // (rank 0), and exit 2 on every rank, nothing written.
  auto refuse = [&](const CheckReport& report) {
    if (rank == 0) {
      std::fputs(report.text().c_str(), stderr);
      log_error(ex.file, ": ", report.total_problems, " problem(s) with the inputs (above); nothing ran and ",
                report.resume.exists ? str(pre.output, " is unchanged") : str("no results file was created"),
                ". `", options.check_command, "` repeats these checks without running");
    }
    dist::barrier(world);
    return 2;
  };
  // A GPU that a rank cannot use (no CUDA in this build, no driver or device) is an input problem
  // like the others, found by the same check as `mtplab check`, before any device is bound.
  if (backend == "cuda" && rt.min_visible_gpus() == 0)
    return refuse(check_inputs(rt, ex, run_check_options(pre, backend)));
  std::unique_ptr<ops::Backend> be;
  if (backend == "cuda") {
    const auto& bound = rt.bind_device();
    be = ops::make_cuda_backend(bound.device);
  } else {
    be = ops::make_cpu_backend();
  }
  RunProvenance prov;
  prov.argv = options.argv;
  prov.world = rt.world();
  prov.backend = backend;
  prov.hosts = rt.gather_strings(rt.host());
  prov.devices = rt.gather_strings(describe_device(rt, backend));
  prov.started_at = utc_now();
  if (rank == 0) {
    const provenance::LibraryVersions v = provenance::library_versions();
    // MPI_Get_library_version's text may carry its terminating NUL inside the string.
    auto clean = [](const std::string& s) { return s.substr(0, s.find('\0')); };
    prov.versions = {{"cuda_runtime", clean(v.cuda_runtime)},
                     {"cuda_driver", clean(v.cuda_driver)},
                     {"nccl", clean(v.nccl)},
                     {"mpi", clean(v.mpi)},
                     {"hdf5", clean(v.hdf5)},
                     {"yaml_cpp", clean(v.yaml_cpp)}};
    prov.environment = provenance_environment();
  }

  const int n = static_cast<int>(ex.points.size());
  const std::vector<int>& todo = pre.todo;

  Context c{rt,
            *be,
            world,
            nullptr,
            dist::NcclMode::blocking,
            rank,
            rt.world(),
            PointInputs(*be, world, rank, rt.world()),
            nullptr,
            std::nullopt};

  // Every input checked before the output exists (harness/check.hpp): a run that fails on its
  // inputs leaves no results file behind. The first checkpoint shard loads into the run's cache,
  // so the check's load is the run's own.
  CheckOptions check = run_check_options(pre, backend);
  bool cached_once = false;
  check.load_weights = [&](const PointConfig& p) {
    if (!cached_once) {
      cached_once = true;
      (void)c.inputs.weights(p);
      return;
    }
    const auto plan = model::make_shard_plan(p.model, rank, rt.world(), p.arms.drafter.head_sharding);
    (void)model::load_mtp_weights(p.model, plan, p.weights.checkpoint);
  };
  const CheckReport report = check_inputs(rt, ex, check);
  if (report.total_problems > 0) return refuse(report);
  if (rank == 0) {
    for (const auto& in : report.inputs) {
      log_info("input ", in.label, ": ", in.summary);
      for (const auto& w : in.warnings) log_warn(in.label, ": ", w);
    }
  }
  prov.identity_inputs = report.identity;
  if (const int sig = agreed_stop(world); sig != 0) {  // a stop asked during the start-up: nothing written
    if (rank == 0)
      log_error("interrupted by ", dist::describe_stop_signal(sig), " before the first point; ",
                report.resume.exists ? str(pre.output, " is unchanged") : str("no results file was created"));
    return 128 + sig;
  }

  std::vector<char> done(static_cast<size_t>(n), 0);
  // Rank 0 claims the output for the whole run (io::OutputLock): a second run into it is refused
  // before it computes anything. What the file holds is read under the claim.
  io::OutputLock claim;
  FileVersion written;    // rank 0: the output as this run last left it
  dist::run_agreed([&] {  // a refusal of the file (another configuration in it) ends every rank cleanly
    if (rank != 0) return;
    const auto parent = std::filesystem::path(pre.output).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    std::vector<std::string> words;
    for (const auto& a : options.argv) words.push_back(shell_quote(a));
    claim = io::OutputLock(pre.output, join(words, " "));
    for (int i : prepare_results_file(pre.output, ex, prov)) done[static_cast<size_t>(i)] = 1;
    written = version_of(pre.output);
  });
  dist::broadcast(world, std::span<char>(done));

  int to_run = 0;
  for (int i : todo) to_run += done[static_cast<size_t>(i)] ? 0 : 1;
  if (rank == 0)
    log_info(
        ex.file, ": ", n, " point(s); running ", to_run,
        (to_run == static_cast<int>(todo.size()) ? ""
                                                 : str(" (", todo.size() - to_run, " already in the file)")),
        " on ", rt.world(), " rank(s), backend ", backend, ", output ", pre.output);

  Progress progress(rank == 0, to_run);
  std::vector<std::vector<std::string>> table = {
      {"point", "arms", "accept", "tau", "step med ms", "p90 ms", "95% CI of median", "spread"}};
  // batch_qidx points: context rows whose batched selection differs from the per-row one.
  std::vector<std::string> qidx_column = {"qidx sel differ"};
  bool any_qidx = false;
  // Sampling points: the expected tau beside the realised one (docs/acceptance.md).
  std::vector<std::string> expected_column = {"E[tau]"};
  bool any_sampling = false;
  bool any_not_meaningful = false;
  // Online points: tokens per second per sequence and per GPU (uncertainty.hpp, online_throughput).
  std::vector<std::string> per_sequence_column = {"tok/s/seq"}, per_gpu_column = {"tok/s/GPU"};
  bool any_online = false;
  int ordinal = 0, completed = 0, interrupted = 0;
  for (int i : todo) {
    const PointConfig& p = ex.points[static_cast<size_t>(i)];
    if (done[static_cast<size_t>(i)]) {
      progress.skipped(i, p.label());
      continue;
    }
    if ((interrupted = agreed_stop(c.world_group)) != 0) break;
    progress.point_begin(ordinal++, i, p.label());
    PointResult r;
    if (!run_point(c, p, progress, r)) {
      interrupted = agreed_stop(c.world_group);
      if (interrupted == 0) interrupted = SIGTERM;  // a rank saw it; the flag may have been read late
      break;
    }
    if (rank == 0) {
      // A writer that holds no claim (a file system without locks) is found here: the file changed
      // since this run last wrote it. Nothing is written over its points.
      MTP_REQUIRE(version_of(pre.output) == written, pre.output,
                  ": changed by another writer since this run last wrote it (a second run into the same "
                  "output); this run stops without writing ",
                  p.name(), " (the file keeps every point written so far: rerun to add what is missing)");
      append_point(pre.output, ex, p, r, prov);
      written = version_of(pre.output);
    }
    {
      // Rank 0 writes (a copy of the file, then a rename): the others wait for it without the
      // collective timeout, which bounds waits for peers, not for a large file.
      std::optional<dist::PatientWait> patient;
      if (rank != 0) patient.emplace("rank 0 writes the point to the results file");
      dist::barrier(c.world_group);
    }
    ++completed;
    std::vector<double> measured;
    for (size_t row = 0; row < r.warmup.size(); ++row)  // each (batched) step once, as the file's summary
      if (!r.warmup[row] && (row == 0 || r.batch_step[row] != r.batch_step[row - 1]))
        measured.push_back(r.timing[0][row]);
    const Summary s = summarize(measured, 1, 200);
    // Acceptance of synthetic weights is chance, not a finding: marked (results.hpp, acceptance_meaning).
    const AcceptanceMeaning meaning = acceptance_meaning(p.weights);
    const std::string mark = meaning.meaningful ? "" : "*";
    any_not_meaningful = any_not_meaningful || !meaning.meaningful;
    progress.point_end(str("acceptance ", r.acceptance.rate(), ", tau ", r.acceptance.tau(),
                           meaning.meaningful ? "" : " (not meaningful: synthetic weights)", ", step median ",
                           s.median, " ms (", r.acceptance.steps, " steps)"));
    table.push_back({str("p", i), p.label(), fixed(r.acceptance.rate(), 3) + mark,
                     fixed(r.acceptance.tau(), 3) + mark, fixed(s.median, 4), fixed(s.p90, 4),
                     str("[", fixed(s.ci95_lo, 4), ", ", fixed(s.ci95_hi, 4), "]"), fixed(s.rel_spread, 3)});
    qidx_column.push_back(r.selection_checked
                              ? str(r.selection_check.rows_differ, "/", r.selection_check.rows_checked, " (",
                                    fixed(r.selection_check.differ_rate(), 4), ")")
                              : "-");
    any_qidx = any_qidx || r.selection_checked;
    expected_column.push_back(fixed(r.acceptance.expected_tau(), 3));
    if (r.online) {
      const Throughput t = online_throughput(r.sequence, r.accepted, r.warmup, r.timing[0], r.batch_rows,
                                             rt.world(), acceptance_bootstrap_seed(p.index));
      per_sequence_column.push_back(fixed(t.per_sequence, 1));
      per_gpu_column.push_back(fixed(t.per_gpu, 1));
      any_online = true;
    } else {
      per_sequence_column.push_back("-");
      per_gpu_column.push_back("-");
    }
    any_sampling = any_sampling || p.arms.replay.verify == Verify::sampling;
  }
  if (any_sampling)
    for (size_t row = 0; row < table.size(); ++row)
      table[row].insert(table[row].begin() + 4, expected_column[row]);
  if (any_online)
    for (size_t row = 0; row < table.size(); ++row) {
      table[row].insert(table[row].begin() + 4, per_gpu_column[row]);
      table[row].insert(table[row].begin() + 4, per_sequence_column[row]);
    }
  if (any_qidx)
    for (size_t row = 0; row < table.size(); ++row) table[row].push_back(qidx_column[row]);
  progress.finish_line();
  dist::barrier(c.world_group);
  if (interrupted != 0) {
    if (rank == 0)
      log_error("interrupted by ", dist::describe_stop_signal(interrupted), " after ", completed,
                " point(s) this run; ", pre.output,
                " holds every completed point. Rerun the same command to resume.");
    return 128 + interrupted;
  }
  if (rank == 0) {
    if (table.size() > 1) print_table(table);
    if (any_not_meaningful) {
      std::printf(
          "* acceptance and tau not meaningful: synthetic weights, a random drafter unrelated to the target "
          "that made the trace (acceptance_note in the results file)\n");
      std::fflush(stdout);
    }
    log_info("done: ", completed, " point(s) written to ", pre.output);
  }
  return 0;
}

}  // namespace mtplab::harness
