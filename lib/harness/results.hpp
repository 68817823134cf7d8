// The results file ("mtplab-results", schema v3; docs/results-schema.md): provenance at the
// root, one group per point, an /index table and a /divergence table. `mtplab upgrade` turns a
// file of an older version into one of this version; nothing else reads older versions.
//
// Invariants:
// - A point is written whole or not at all: each append is H5File::open_append + commit, so a
//   killed run leaves the file as it was after the last completed point.
// - A file holds one experiment on one set of inputs: its root `experiment_identity` (one hash of
//   the configuration, i.e. the resolved experiment without `output` and the world size, and of
//   the identity inputs: the content fingerprints of the traces and checkpoints, the resolved
//   backend, the kernel choices that change bits) must equal the run's, else the run is refused
//   before anything runs, naming the keys that differ. A point already in the file with the same
//   canonical config (every arm at every value) is skipped.
// - `mtplab run` (resume) and `mtplab merge` take files of this schema version only; an older one
//   is refused with the advice to run `mtplab upgrade` on it.
// - A stale `<file>.tmp.<pid>` (a writer killed mid-commit) is removed by the next run into that
//   file, only when no process of that pid is alive on this host.
// - /index and /divergence are derived from the point groups; they are rebuilt whenever points
//   are added (run, merge), so they never disagree with the groups.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/stats.hpp"
#include "harness/experiment.hpp"
#include "harness/replay.hpp"
#include "io/hdf5.hpp"

namespace mtplab::harness {

inline constexpr const char* kResultsSchema = "mtplab-results";
inline constexpr int64_t kResultsSchemaVersion = 3;

/// The inputs part of a results file's identity: (key, value) sorted by key, e.g.
/// ("trace data/t.h5", "fnv1a64 ... (16 sequences, ...)"), ("backend", "cpu"),
/// ("kernels.gemv_split", "auto"). harness/check.hpp computes them.
using IdentityInputs = std::vector<std::pair<std::string, std::string>>;

/// The identity of a results file: the standard FNV-1a 64 (core/hash.hpp) over `configuration`
/// (Experiment::configuration, configuration_text) and, per input in key order, "\n" key "="
/// value; 16 hex digits.
std::string results_identity(const std::string& configuration, const IdentityInputs& inputs);

/// Who ran, where, with what: the root attributes (and per-point copies of argv / hosts).
struct RunProvenance {
  std::vector<std::string> argv;
  std::vector<std::string> hosts;    ///< per rank
  std::vector<std::string> devices;  ///< per rank: "cpu" or "0: NVIDIA H200 (0000:3b:00.0)"
  int world = 1;
  std::string backend;                                        ///< cpu | cuda, as resolved
  std::vector<std::pair<std::string, std::string>> versions;  ///< library -> version
  std::vector<std::string> environment;  ///< "NAME=value" of NCCL_*, SLURM_*, OMPI_*, ...
  std::string started_at;                ///< ISO 8601 UTC
  IdentityInputs identity_inputs;        ///< the inputs part of the file's identity
};

/// Collects the environment variables recorded as provenance (NCCL_*, SLURM_*, OMPI_*, PMIX_RANK,
/// CUDA_VISIBLE_DEVICES, MTPLAB_*), sorted.
std::vector<std::string> provenance_environment();
/// Now, as ISO 8601 UTC.
std::string utc_now();

/// Whether a point's acceptance figures say anything about a drafter. Not with synthetic weights:
/// the drafter is then random and unrelated to the target that made the trace (a synthetic target
/// of other random weights, or a real model), so a draft is accepted by chance only and acceptance
/// 0 / tau 1 is no finding. `reason` says why not ("" when meaningful); the results file records
/// both per point (acceptance_meaningful, acceptance_note), the run's table marks such points, and
/// `mtplab plan` refuses them as an acceptance source.
struct AcceptanceMeaning {
  bool meaningful = true;
  std::string reason;
};
AcceptanceMeaning acceptance_meaning(const WeightsSpec& weights);
/// The same from a point's canonical config (its `weights:` key), for files written before the
/// attribute existed; `where` names the point in a message about an unreadable config.
AcceptanceMeaning acceptance_meaning_of_config(const std::string& config_yaml, const std::string& where);

/// Timing columns of the step table, in order (each max over ranks, milliseconds).
const std::vector<std::string>& timing_columns();

/// Everything measured for one point, as rank 0 writes it. Step rows cover every repeat.
struct PointResult {
  int k = 0;
  std::vector<int32_t> repeat, sequence, position, accepted;
  /// The batched step each row belongs to (0, 1, ... over the point's repeats) and how many
  /// sequences that step drafted for; at batch_size 1 every row is its own step.
  std::vector<int32_t> batch_step, batch_rows;
  /// The distinct routed experts of the last draft of the row's (batched) step (top_k at one row;
  /// 0 under skip: block): what the step's routed-expert bytes scale with.
  std::vector<int32_t> batch_experts;
  std::vector<uint8_t> warmup;
  /// timing[c][row] for c over timing_columns(): the row's batched step's time (every row of a
  /// step carries the same values).
  std::vector<std::vector<double>> timing;
  std::vector<double> block_ms, head_ms, exchange_ms;  ///< [rows, k] per draft, max over ranks
  /// An online point (mode: online): its step table's draft_ms (the drafter's part of the step:
  /// propose, stats pass, trim and catch-up) and verify_ms (the target's verify forward), per row
  /// as the timing columns (the row's step's, max over ranks); empty for a replay point.
  bool online = false;
  std::vector<double> draft_ms, verify_ms;
  std::vector<int32_t> drafts, targets;  ///< [rows, k]
  /// [rows, k] the head's top-1 minus top-2 logit and log q of each draft (drafter::DraftStats),
  /// rank 0's (every rank computes the same); empty when the point did not record them.
  std::vector<float> draft_margin, draft_logprob;
  std::vector<float> accept_prob;         ///< [rows, k] a_i (StepRecord::accept_prob)
  std::vector<double> expected_accepted;  ///< [rows] StepRecord::expected_accepted()
  // Per sequence (repeat 0).
  std::vector<int32_t> seq_index, seq_prompt_len, seq_length, seq_steps;
  std::vector<double> seq_prefill_ms;
  AcceptanceStats acceptance;     ///< repeat 0
  int64_t repeat_mismatches = 0;  ///< steps of repeats > 0 whose drafts differ from repeat 0's
  bool ranks_agree = true;        ///< every rank produced the same drafts
  std::vector<std::string> arms_not_applied;
  /// The kernel each op ran over the point, every rank's (ops::Backend::kernels_chosen, joined by
  /// kernel_record_entries): the point attribute `kernels`. Never empty for a point that ran.
  std::vector<std::string> kernels;
  /// The batch_qidx selection check (drafter::SelectionCheck, rank 0's; the indexer is
  /// replicated): written as qidx_check_* attributes only when `selection_checked`.
  bool selection_checked = false;
  drafter::SelectionCheck selection_check;
  std::string started_at, finished_at;
  double wall_s = 0;
  int64_t rows() const { return static_cast<int64_t>(sequence.size()); }
};

/// The one entry of an upgraded point's `kernels`: "not recorded (results schema version N)".
std::string kernels_not_recorded(int64_t from_version);
/// One rank's kernel record (ops::KernelRecord::named(): (op, "kernel[,kernel...]") in op order).
using KernelRecordEntries = std::vector<std::pair<std::string, std::string>>;
/// The point's `kernels` attribute from every rank's record (index = rank): "op=kernel[,kernel...]"
/// per op in name order where every rank ran the same; else "op=rank 0: K0; rank 1: K1 ..." with
/// "-" for a rank that did not run the op.
std::vector<std::string> kernel_record_entries(const std::vector<KernelRecordEntries>& per_rank);

/// What an existing results file holds against a run of `ex` on `inputs`. Reads only.
struct ResumeState {
  bool exists = false;
  int64_t points_in_file = 0;  ///< point groups in the file
  std::set<int> done;          ///< points already in it with the same configuration
  /// Why the file cannot take this run's points (schema, identity with the keys that differ, a
  /// point of another configuration); empty when it can.
  std::vector<std::string> problems;
};
ResumeState inspect_results_file(const std::string& path, const Experiment& ex, const IdentityInputs& inputs);

/// The `<path>.tmp.<pid>` files beside `path` whose writer is not alive on this host (no process
/// of that pid: a killed writer's leftovers), as paths.
std::vector<std::string> stale_temporaries(const std::string& path);
/// Removes them, with one log line each; returns what was removed.
std::vector<std::string> remove_stale_temporaries(const std::string& path);

/// Removes stale temporaries of `path`, then creates the results file at `path` with the root
/// attributes, or checks an existing one against `ex` and prov.identity_inputs
/// (inspect_results_file; a problem throws) and returns the indices of the points already in it
/// with the same canonical config. Rank 0 only.
std::set<int> prepare_results_file(const std::string& path, const Experiment& ex, const RunProvenance& prov);

/// Appends one point (its group, the rebuilt /index and /divergence) and commits. Rank 0 only.
void append_point(const std::string& path, const Experiment& ex, const PointConfig& point,
                  const PointResult& r, const RunProvenance& prov);

/// Joins per-task results files of one experiment into `out` (created atomically). Points
/// present in several inputs must have the same config (an identical duplicate is kept once);
/// inputs of different experiments or schemas are refused. Returns the number of points.
int merge_results(const std::string& out, const std::vector<std::string>& inputs, bool overwrite,
                  const std::vector<std::string>& argv);

/// What `mtplab upgrade` did.
struct UpgradeReport {
  int64_t from_version = 0;
  int64_t points = 0;
  /// Point attributes computed from the steps because the old file lacked them, as
  /// "name (N points)", and other notes (arms filled at their default, inputs not recorded).
  std::vector<std::string> notes;
};
/// Reads the results file `in` of schema version 1 or 2 and writes it as a version-3 file `out`
/// (created atomically; an existing results file is replaced only with `overwrite`, under the
/// output rule of io/output.hpp): every arm written in each point's config and attributes (an arm
/// the old file left out at its default, or that did not exist when it was written, takes its
/// default; record_margins reads off whether the point recorded margins), the typed assignment of
/// a version-1 file, the attributes a reader needs that can be computed from the steps (the
/// acceptance histogram and intervals; under greedy verification the expected figures and
/// acceptance probabilities), the identity recomputed, every dataset copied, the derived tables
/// rebuilt. A version-3 input, or one that is not a results file, is refused naming the file.
UpgradeReport upgrade_results(const std::string& in, const std::string& out, bool overwrite,
                              const std::vector<std::string>& argv);

/// One row of /divergence: how often `point`'s drafts differ from `reference`'s at the same
/// (sequence, position) of repeat 0 (docs/results-schema.md).
struct Divergence {
  int64_t point = 0, reference = 0;
  std::string axis, value, reference_value;
  int64_t steps = 0, common_steps = 0, differ_any = 0, differ_first = 0;
  /// Of the differ_any steps, those where the reference recorded draft margins (draft_margin), and
  /// of these the ones whose first differing draft had a reference margin below one BF16 step
  /// (margin_below_bf16_step, harness/uncertainty.hpp): a near-tie that any rounding may flip.
  int64_t differ_with_margin = 0, differ_near_tie = 0;
};
/// The divergence rows of every point against its reference points (same assignment except one
/// axis at that axis' first value).
std::vector<Divergence> compute_divergence(const io::Group& root);

}  // namespace mtplab::harness
