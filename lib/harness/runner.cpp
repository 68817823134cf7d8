// The run loop: backend and communicator set-up, trace and weight caches, the measured replay of
// each point, the per-point reduction over ranks and the hand-off to the results writer.
#include "harness/runner.hpp"

#include <chrono>
#include <csignal>
#include <cstring>
#include <map>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "dist/collectives.hpp"
#include "dist/world_ops.hpp"
#include "drafter/factory.hpp"
#include "drafter/target.hpp"
#include "harness/progress.hpp"
#include "harness/results.hpp"
#include "harness/timer.hpp"
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
  if (rows[0].back() == "qidx sel differ")
    std::printf(
        "qidx sel differ (batch_qidx): context rows whose selection from the batched q_idx differs, as a "
        "set, from the per-row one: differ / checked (rate)\n");
  std::fflush(stdout);
}
}  // namespace
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal == 0) g_stop_signal = sig;
}

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Everything a point run needs that outlives the point.
struct Context {
  dist::Runtime& rt;
  ops::Backend& be;
  dist::Communicator& comm;
  const dist::Group& world_group;  ///< the run loop's host collectives go over it (dist/world_ops.hpp)
  int rank = 0;
  int world = 1;
  // One cached trace and one cached weight set: consecutive points usually share them.
  std::string trace_key;
  std::vector<io::TraceSequence> trace;
  std::string weights_key;
  model::MtpWeights weights;
};

// Whether any rank saw a stop signal (collective over the world).
int agreed_stop(const dist::Group& world) {
  return dist::all_reduce(world, static_cast<int>(g_stop_signal), dist::ReduceOp::max);
}

// The model part of a point's canonical text: the key of the caches.
std::string model_key(const PointConfig& p) {
  const auto cut = p.canonical.find("\nweights:");
  return p.canonical.substr(0, cut);
}

void broadcast_trace(std::vector<io::TraceSequence>& seqs, int hidden, const dist::Group& world, int rank) {
  int64_t count = static_cast<int64_t>(seqs.size());
  dist::broadcast(world, count);
  if (rank != 0) seqs.assign(static_cast<size_t>(count), io::TraceSequence{});
  for (auto& s : seqs) {
    int64_t meta[3] = {s.index, s.prompt_length, s.length()};
    dist::broadcast(world, std::span<int64_t>(meta));
    if (rank != 0) {
      s.index = meta[0];
      s.prompt_length = static_cast<int32_t>(meta[1]);
      s.hidden = hidden;
      s.tokens.resize(static_cast<size_t>(meta[2]));
      s.hiddens.resize(static_cast<size_t>(meta[2]) * static_cast<size_t>(hidden));
    }
    dist::broadcast(world, std::span<int32_t>(s.tokens));
    dist::broadcast(world, std::span<bf16>(s.hiddens));  // split below MPI's int counts by dist
  }
}

// The trace of a point: its sequences (the first measure.sequences of them), identical on every
// rank. A synthetic trace is generated on rank 0 and broadcast, so the ranks cannot disagree.
const std::vector<io::TraceSequence>& trace_for(Context& c, const PointConfig& p) {
  const int want = p.measure.sequences;
  std::string key = model_key(p) + "\n";
  if (p.trace.synthetic) {
    key += str("synthetic ", p.trace.sequences, " ", p.trace.prompt_len, " ", p.trace.new_tokens, " ",
               p.trace.seed, " ", p.trace.layers, " weights ", p.weights.seed, " take ", want);
  } else {
    key += str("path ", p.trace.path, " take ", want);
  }
  if (key == c.trace_key) return c.trace;
  c.trace.clear();
  c.trace_key.clear();
  const model::ModelConfig& cfg = p.model;
  if (p.trace.synthetic) {
    const int count = want > 0 ? std::min(want, p.trace.sequences) : p.trace.sequences;
    if (c.rank == 0) {
      const auto t0 = Clock::now();
      drafter::SyntheticTarget target(c.be, cfg, p.trace.layers, p.weights.seed, p.trace.seed);
      c.trace = drafter::synthetic_trace(target, cfg.vocab, count, p.trace.prompt_len, p.trace.new_tokens,
                                         p.trace.seed);
      log_info("synthetic trace: ", count, " sequence(s) of ", p.trace.prompt_len, " + ", p.trace.new_tokens,
               " tokens from a ", p.trace.layers, "-layer target in ",
               format_duration(ms_between(t0, Clock::now()) / 1000));
    }
    broadcast_trace(c.trace, cfg.hidden, c.world_group, c.rank);
  } else {
    io::TraceReader reader(p.trace.path, cfg.hidden, cfg.vocab);
    const int64_t n = want > 0 ? std::min<int64_t>(want, reader.num_sequences()) : reader.num_sequences();
    for (int64_t s = 0; s < n; ++s) {
      MTP_REQUIRE(reader.sequence_length(s) <= cfg.max_seq_len, p.trace.path, ": sequence ", s, " has ",
                  reader.sequence_length(s), " positions, more than model.max_seq_len ", cfg.max_seq_len);
      c.trace.push_back(reader.sequence(s));
    }
  }
  c.trace_key = key;
  return c.trace;
}

model::MtpWeights& weights_for(Context& c, const PointConfig& p) {
  const std::string key =
      str(model_key(p), "\n", p.weights.synthetic ? str("seed ", p.weights.seed) : p.weights.checkpoint, "\n",
          model::to_string(p.arms.drafter.head_sharding));
  if (key == c.weights_key) return c.weights;
  c.weights_key.clear();
  c.weights = model::MtpWeights{};
  const auto plan = model::make_shard_plan(p.model, c.rank, c.world, p.arms.drafter.head_sharding);
  c.weights = p.weights.synthetic ? model::synthesize_mtp_weights(p.model, plan, p.weights.seed)
                                  : model::load_mtp_weights(p.model, plan, p.weights.checkpoint);
  c.weights_key = key;
  return c.weights;
}

uint64_t fnv_ints(const std::vector<int32_t>& v) { return fnv1a64_words_mtplab_v1(v); }

// Measures one point. Returns false when a stop signal interrupted it (the result is then partial).
bool run_point(Context& c, const PointConfig& p, Progress& progress, PointResult& r) {
  const auto wall0 = Clock::now();
  r = PointResult{};
  r.started_at = utc_now();
  const int k = p.arms.drafter.draft_len;
  r.k = k;
  r.timing.assign(timing_columns().size(), {});
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

  const auto& seqs = trace_for(c, p);
  model::MtpWeights& w = weights_for(c, p);
  auto drafter =
      drafter::make_drafter(c.be, &c.comm, p.model, w, p.arms.drafter);
  EventPhaseTimer timer(c.be, k);
  drafter->set_timer(&timer);
  drafter->reset_selection_check();  // a fresh drafter per point; counters are the point's own

  int64_t total_positions = 0;
  for (const auto& s : seqs) total_positions += std::max<int64_t>(1, s.length() - 1 - s.prompt_length);
  std::map<std::pair<int32_t, int32_t>, size_t> repeat0_row;  // (sequence, position) -> row
  int64_t global_step = 0;
  bool stopped = false;
  for (int rep = 0; rep < p.measure.repeats && !stopped; ++rep) {
    int64_t steps_in_repeat = 0;
    int64_t positions_done = 0;
    bool limit = false;
    for (const auto& seq : seqs) {
      if (limit || stopped) break;
      const int si = static_cast<int>(seq.index);
      bool first_step = true;
      double prefill_ms = 0;
      int32_t seq_steps = 0;
      Clock::time_point t0;
      AcceptanceStats scratch;
      harness::ReplayHooks hooks;
      hooks.before_step = [&] {
        const PhaseTimes before = timer.collect();
        if (first_step) prefill_ms = before.prefill;
        first_step = false;
        t0 = Clock::now();
      };
      hooks.after_step = [&](const StepRecord& rec) {
        c.be.synchronize();
        const auto t1 = Clock::now();
        const PhaseTimes ph = timer.collect();
        const size_t row = r.sequence.size();
        r.repeat.push_back(rep);
        r.sequence.push_back(rec.sequence);
        r.position.push_back(rec.position);
        r.accepted.push_back(rec.accepted);
        r.warmup.push_back(global_step < p.measure.warmup_steps ? 1 : 0);
        const double cols[] = {ms_between(t0, t1),  ph.propose,      ph.block_total(), ph.head_total(),
                               ph.exchange_total(), ph.after_verify, ph.catch_up};
        for (size_t col = 0; col < r.timing.size(); ++col) r.timing[col].push_back(cols[col]);
        for (int i = 0; i < k; ++i) {
          r.block_ms.push_back(ph.block[static_cast<size_t>(i)]);
          r.head_ms.push_back(ph.head[static_cast<size_t>(i)]);
          r.exchange_ms.push_back(ph.exchange[static_cast<size_t>(i)]);
        }
        r.drafts.insert(r.drafts.end(), rec.drafts.begin(), rec.drafts.end());
        r.targets.insert(r.targets.end(), rec.targets.begin(), rec.targets.end());
        if (rep == 0) {
          r.acceptance.add(k, rec.accepted);
          repeat0_row[{rec.sequence, rec.position}] = row;
        } else {
          auto it = repeat0_row.find({rec.sequence, rec.position});
          if (it == repeat0_row.end() ||
              !std::equal(rec.drafts.begin(), rec.drafts.end(),
                          r.drafts.begin() + static_cast<std::ptrdiff_t>(it->second * k)))
            ++r.repeat_mismatches;
        }
        ++seq_steps;
        ++global_step;
        ++steps_in_repeat;
        const int64_t advanced = rec.position + rec.accepted + 1 - seq.prompt_length;
        double frac = static_cast<double>(positions_done + advanced) / static_cast<double>(total_positions);
        if (p.measure.max_steps > 0)
          frac = std::max(frac, static_cast<double>(steps_in_repeat) / p.measure.max_steps);
        progress.update((rep + std::min(frac, 1.0)) / p.measure.repeats, static_cast<long>(global_step));
        if (agreed_stop(c.world_group) != 0) {
          stopped = true;
          return false;
        }
        if (p.measure.max_steps > 0 && steps_in_repeat >= p.measure.max_steps) {
          limit = true;
          return false;
        }
        return true;
      };
      harness::replay_sequence(*drafter, seq, si, k, p.model.hidden, scratch, hooks);
      if (first_step) prefill_ms = timer.collect().prefill;  // a sequence too short for any step
      positions_done += std::max<int64_t>(1, seq.length() - 1 - seq.prompt_length);
      if (rep == 0) {
        r.seq_index.push_back(si);
        r.seq_prompt_len.push_back(seq.prompt_length);
        r.seq_length.push_back(static_cast<int32_t>(seq.length()));
        r.seq_steps.push_back(seq_steps);
        r.seq_prefill_ms.push_back(prefill_ms);
      }
    }
  }
  r.selection_checked = drafter->checks_selection();
  r.selection_check = drafter->selection_check();
  drafter.reset();
  if (stopped) return false;

  // Every rank took the same steps (the collectives inside the drafter keep them in lockstep);
  // check it, then reduce the timings to their max over ranks at rank 0.
  const auto rows = dist::min_max(c.world_group, static_cast<int64_t>(r.rows()));
  MTP_REQUIRE(rows.agree(), p.name(), ": ranks replayed different step counts (", rows.min, " to ", rows.max,
              ")");
  r.ranks_agree = dist::all_agree(c.world_group, fnv_ints(r.drafts));
  if (!r.ranks_agree && c.rank == 0)
    log_warn(p.name(), ": the ranks' drafts differ (recorded as ranks_agree = 0)");

  std::vector<double> packed;
  for (const auto& col : r.timing) packed.insert(packed.end(), col.begin(), col.end());
  packed.insert(packed.end(), r.block_ms.begin(), r.block_ms.end());
  packed.insert(packed.end(), r.head_ms.begin(), r.head_ms.end());
  packed.insert(packed.end(), r.exchange_ms.begin(), r.exchange_ms.end());
  packed.insert(packed.end(), r.seq_prefill_ms.begin(), r.seq_prefill_ms.end());
  dist::reduce_max_to_root(c.world_group, packed);
  const std::vector<double>& reduced = packed;
  if (c.rank == 0) {
    size_t off = 0;
    auto take = [&](std::vector<double>& v) {
      std::copy(reduced.begin() + static_cast<std::ptrdiff_t>(off),
                reduced.begin() + static_cast<std::ptrdiff_t>(off + v.size()), v.begin());
      off += v.size();
    };
    for (auto& col : r.timing) take(col);
    take(r.block_ms);
    take(r.head_ms);
    take(r.exchange_ms);
    take(r.seq_prefill_ms);
  }
  r.finished_at = utc_now();
  r.wall_s = std::chrono::duration<double>(Clock::now() - wall0).count();
  return true;
}

std::string describe_device(dist::Runtime& rt, const std::string& backend) {
  if (backend != "cuda") return "cpu";
  const auto& d = rt.device();
  return str(d.device, ": ", d.name, " (", d.pci_bus_id, ")");
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  MTP_REQUIRE(sigaction(SIGTERM, &sa, nullptr) == 0 && sigaction(SIGINT, &sa, nullptr) == 0,
              "cannot install the SIGTERM / SIGINT handlers: ", std::strerror(errno));
}

int stop_signal() { return static_cast<int>(g_stop_signal); }

int run_experiment(dist::Runtime& rt, const Experiment& ex, const RunOptions& options) {
  MTP_REQUIRE(ex.world == rt.world(), ex.file, ": expanded for ", ex.world, " rank(s) but the job has ",
              rt.world());
  const int rank = rt.rank();
  install_stop_handlers();

  // The backend: `auto` decides alike on every rank (the MIN of the visible GPUs).
  std::string backend = ex.points.front().backend;
  if (backend == "auto")
    backend = ops::cuda_backend_available() && rt.min_visible_gpus() > 0 ? "cuda" : "cpu";
  {
    std::vector<std::string> problems;
    for (const auto& p : ex.points) {
      try {
        check_point_runnable(p, rt.world(), backend);
      } catch (const Error& e) {
        problems.push_back(str("  ", p.name(), " {", p.label(), "}: ", e.message()));
      }
    }
    MTP_REQUIRE(problems.empty(), ex.file, ": ", problems.size(), " point(s) cannot run on the ", backend,
                " backend:\n", join(problems, "\n"));
  }
  std::unique_ptr<ops::Backend> be;
  if (backend == "cuda") {
    const auto& bound = rt.bind_device();
    be = ops::make_cuda_backend(bound.device);
  } else {
    be = ops::make_cpu_backend();
  }
  dist::Group world = rt.world_group();
  dist::Communicator& comm =
      world.connect(dist::transport_for_backend(ops::to_string(be->kind())), be->native_stream());

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
  MTP_REQUIRE(options.point < n, ex.file, ": --point ", options.point,
              " is out of range: the experiment has ", n, " point(s), 0..", n - 1);
  std::vector<char> done(static_cast<size_t>(n), 0);
  if (rank == 0)
    for (int i : prepare_results_file(options.output, ex, prov)) done[static_cast<size_t>(i)] = 1;
  dist::broadcast(world, std::span<char>(done));

  std::vector<int> todo;
  for (int i = 0; i < n; ++i)
    if (options.point < 0 || options.point == i) todo.push_back(i);
  int to_run = 0;
  for (int i : todo) to_run += done[static_cast<size_t>(i)] ? 0 : 1;
  if (rank == 0)
    log_info(
        ex.file, ": ", n, " point(s); running ", to_run,
        (to_run == static_cast<int>(todo.size()) ? ""
                                                 : str(" (", todo.size() - to_run, " already in the file)")),
        " on ", rt.world(), " rank(s), backend ", backend, ", output ", options.output);

  Context c{rt, *be, comm, world, rank, rt.world(), {}, {}, {}, {}};
  Progress progress(rank == 0, to_run);
  std::vector<std::vector<std::string>> table = {
      {"point", "arms", "accept", "tau", "step med ms", "p90 ms", "95% CI of median", "spread"}};
  // batch_qidx points: context rows whose batched selection differs from the per-row one.
  std::vector<std::string> qidx_column = {"qidx sel differ"};
  bool any_qidx = false;
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
    if (rank == 0) append_point(options.output, ex, p, r, prov);
    ++completed;
    std::vector<double> measured;
    for (size_t row = 0; row < r.warmup.size(); ++row)
      if (!r.warmup[row]) measured.push_back(r.timing[0][row]);
    const Summary s = summarize(measured, 1, 200);
    progress.point_end(str("acceptance ", r.acceptance.rate(), ", tau ", r.acceptance.tau(), ", step median ",
                           s.median, " ms (", r.acceptance.steps, " steps)"));
    table.push_back({str("p", i), p.label(), fixed(r.acceptance.rate(), 3), fixed(r.acceptance.tau(), 3),
                     fixed(s.median, 4), fixed(s.p90, 4), str("[", fixed(s.ci95_lo, 4), ", ", fixed(s.ci95_hi, 4), "]"),
                     fixed(s.rel_spread, 3)});
    qidx_column.push_back(r.selection_checked
                              ? str(r.selection_check.rows_differ, "/", r.selection_check.rows_checked, " (",
                                    fixed(r.selection_check.differ_rate(), 4), ")")
                              : "-");
    any_qidx = any_qidx || r.selection_checked;
  }
  if (any_qidx)
    for (size_t row = 0; row < table.size(); ++row) table[row].push_back(qidx_column[row]);
  progress.finish_line();
  dist::barrier(c.world_group);
  if (interrupted != 0) {
    if (rank == 0)
      log_error("interrupted by signal ", interrupted, " (", strsignal(interrupted), ") after ", completed,
                " point(s) this run; ", options.output,
                " holds every completed point. Rerun the same command to resume.");
    return 128 + interrupted;
  }
  if (rank == 0) {
    if (table.size() > 1) print_table(table);
    log_info("done: ", completed, " point(s) written to ", options.output);
  }
  return 0;
}

}  // namespace mtplab::harness
