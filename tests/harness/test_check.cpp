// The input check (harness/check.hpp) and the results identity, in one process (world 1):
// - a clean checkpoint and trace pass; their fingerprints follow their bytes and nothing else;
// - NaN / Inf weights are named (tensor, file, first bad element) by the scan and refused at load;
// - a NaN hidden, measure.sequences above the trace's count, a trace of another model, sequences
//   longer than max_seq_len or too short for draft_len are problems (or a warning) naming the points;
// - an output under a regular file, and an existing output of other inputs, are problems naming the
//   keys that differ; the identity covers the inputs, the backend and the bit-changing kernels;
// - stale `<file>.tmp.<pid>` files are those whose pid is dead, and only those are removed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "common/trace.hpp"
#include "core/hash.hpp"
#include "harness/check.hpp"
#include "harness/results.hpp"
#include "harness/results_format.hpp"
#include "io/trace.hpp"
#include "model/safetensors.hpp"
#include "model/weights.hpp"

using namespace mtplab;
using namespace mtplab::harness;
namespace fs = std::filesystem;

namespace {

using mtplab::test::expect_has;

// One MPI runtime for the whole binary (MPI cannot be initialised again after it is finalised).
dist::Runtime& runtime() {
  static dist::Runtime rt;
  return rt;
}

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("mtplab-check") {}
};

model::ModelConfig tiny() { return test::tiny_config(128); }

void write_checkpoint(const std::string& path, uint64_t seed) {
  const model::ModelConfig cfg = tiny();
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  model::export_mtp_weights(cfg, model::synthesize_mtp_weights(cfg, plan, seed), path);
}

// Overwrites element `index` of tensor `name` (a 2-byte dtype) with `bits`, in place.
void poke_bf16(const std::string& path, const std::string& name, int64_t index, uint16_t bits) {
  uint64_t offset = 0;
  {
    const model::SafetensorsFile f(path);
    const model::TensorInfo* t = f.find(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(model::dtype_size(t->dtype), 2u);
    offset = t->offset + static_cast<uint64_t>(index) * 2;
  }
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(reinterpret_cast<const char*>(&bits), 2);
  ASSERT_TRUE(io.good());
}

// `count` sequences of `length` positions (prompt 8), finite random hiddens.
void write_trace(const std::string& path, int hidden, int vocab, int count, int length, uint32_t seed) {
  io::TraceWriter w(path, hidden, vocab, io::TraceProvenance{"test_check", "tiny", str(seed), "", "", ""});
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::normal_distribution<float> h(0.0f, 1.0f);
  for (int s = 0; s < count; ++s) {
    std::vector<int32_t> tokens(static_cast<size_t>(length));
    std::vector<float> hiddens(static_cast<size_t>(length) * static_cast<size_t>(hidden));
    for (auto& t : tokens) t = tok(rng);
    for (auto& x : hiddens) x = h(rng);
    w.add_sequence(tokens, hiddens, 8);
  }
  w.commit();
}

std::string experiment_text(const TempDir& dir, const std::string& extra = "") {
  return str("model: {preset: tiny, max_seq_len: 128}\n", "weights: {checkpoint: ", dir / "ckpt.safetensors",
             "}\n", "trace: {path: ", dir / "trace.h5", "}\n", "measure: {warmup_steps: 1, sequences: 0}\n",
             "output: ", dir / "out.h5", "\n", "backend: cpu\n", extra);
}

CheckReport check(const Experiment& ex, const std::string& output) {
  CheckOptions o;
  o.output = output;
  o.backend = "cpu";
  return check_inputs(runtime(), ex, o);
}

// The inputs set up for a check: tiny checkpoint and a 4-sequence trace of 24 positions.
struct Inputs {
  TempDir dir;
  Inputs() {
    write_checkpoint(dir / "ckpt.safetensors", 11);
    const model::ModelConfig cfg = tiny();
    write_trace(dir / "trace.h5", cfg.hidden, cfg.vocab, 4, 24, 5);
  }
};

}  // namespace

TEST(Check, CleanInputsPass) {
  Inputs in;
  const Experiment ex = parse_experiment(experiment_text(in.dir), "exp.yaml", {}, 1);
  const CheckReport rep = check(ex, in.dir / "out.h5");
  EXPECT_EQ(rep.total_problems, 0u) << rep.text();
  const std::string text = rep.text();
  expect_has(text, "ok       checkpoint " + (in.dir / "ckpt.safetensors"));
  expect_has(text, "ok       trace " + (in.dir / "trace.h5"));
  expect_has(text, "4 sequence(s) of 24..24 positions");
  expect_has(text, "ok       output " + (in.dir / "out.h5") + ": new file in ");
  EXPECT_TRUE(text.ends_with("OK\n")) << text;
  // The identity's inputs: the files' fingerprints, the backend, the bit-changing kernel fields.
  std::vector<std::string> keys;
  for (const auto& [k, v] : rep.identity) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"backend", "checkpoint " + (in.dir / "ckpt.safetensors"),
                                            "kernels.gemv_split", "kernels.gemv_variant",
                                            "kernels.mla_decode", "trace " + (in.dir / "trace.h5")}));
  EXPECT_FALSE(fs::exists(in.dir / "out.h5")) << "the check must not create the output";
}

TEST(Check, CheckpointFingerprintFollowsTheBytes) {
  TempDir dir;
  write_checkpoint(dir / "a.safetensors", 11);
  write_checkpoint(dir / "b.safetensors", 11);
  write_checkpoint(dir / "c.safetensors", 12);
  const CheckpointScan a = scan_checkpoint(tiny(), dir / "a.safetensors");
  EXPECT_TRUE(a.problems.empty());
  EXPECT_EQ(a.fingerprint.size(), 16u);
  EXPECT_EQ(a.tensors,
            model::checkpoint_views(
                tiny(), model::synthesize_mtp_weights(
                            tiny(), model::make_shard_plan(tiny(), 0, 1, model::HeadSharding::none), 11))
                .size());
  // Same bytes in another file: same fingerprint; another seed, or one bit of one weight: another.
  EXPECT_EQ(scan_checkpoint(tiny(), dir / "b.safetensors").fingerprint, a.fingerprint);
  EXPECT_NE(scan_checkpoint(tiny(), dir / "c.safetensors").fingerprint, a.fingerprint);
  poke_bf16(dir / "b.safetensors", tiny().mtp_prefix + "eh_proj.weight", 77, 0x3F81);
  const CheckpointScan b = scan_checkpoint(tiny(), dir / "b.safetensors");
  EXPECT_TRUE(b.problems.empty());
  EXPECT_NE(b.fingerprint, a.fingerprint);
}

TEST(Check, NonFiniteWeightsAreNamedAndRefusedAtLoad) {
  TempDir dir;
  const std::string path = dir / "ckpt.safetensors";
  write_checkpoint(path, 11);
  const model::ModelConfig cfg = tiny();
  const std::string hnorm = cfg.mtp_prefix + "hnorm.weight", eh = cfg.mtp_prefix + "eh_proj.weight";
  poke_bf16(path, hnorm, 5, 0x7FC0);                       // NaN at [5]
  poke_bf16(path, eh, 3 * (2 * cfg.hidden) + 17, 0xFF80);  // -Inf at [3, 17]
  const CheckpointScan scan = scan_checkpoint(cfg, path);
  ASSERT_EQ(scan.problems.size(), 2u);
  const std::string all = join(scan.problems, "\n");
  expect_has(all, str("tensor \"", hnorm, "\" in ", path, " (BF16 [", cfg.hidden,
                      "]): element [5] (flat index 5) is NaN"));
  expect_has(all, str("tensor \"", eh, "\" in ", path, " (BF16 [", cfg.hidden, ", ", 2 * cfg.hidden,
                      "]): element [3, 17] (flat index ", 3 * 2 * cfg.hidden + 17, ") is -Inf"));
  // The loader refuses the first bad tensor it reads, whatever the shard.
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  const std::string load = test::error_of([&] { (void)model::load_mtp_weights(cfg, plan, path); });
  expect_has(load, str("tensor \"", hnorm, "\" in ", path));
  expect_has(load, "element [5] (flat index 5) is NaN as loaded");

  // The check reports it on the checkpoint's line, and nothing is created.
  const model::ModelConfig m = cfg;
  write_trace(dir / "trace.h5", m.hidden, m.vocab, 2, 24, 5);
  const Experiment ex = parse_experiment(experiment_text(dir), "exp.yaml", {}, 1);
  const CheckReport rep = check(ex, dir / "out.h5");
  EXPECT_GE(rep.total_problems, 2u);
  expect_has(rep.text(), "PROBLEM  checkpoint " + path);
  expect_has(rep.text(), "element [5] (flat index 5) is NaN");
  EXPECT_FALSE(fs::exists(dir / "out.h5"));
}

TEST(Check, TraceProblemsNameThePoints) {
  Inputs in;
  const std::string exp = experiment_text(in.dir, "sweep:\n  grid:\n    draft_len: [3, 16]\n");
  {
    // measure.sequences above the trace's count: a problem (it used to replay the 4 silently).
    const Experiment ex = parse_experiment(exp, "exp.yaml", {"measure.sequences=9"}, 1);
    const CheckReport rep = check(ex, in.dir / "out.h5");
    EXPECT_GE(rep.total_problems, 1u);
    expect_has(rep.text(),
               "measure.sequences 9 exceeds the trace's 4 sequence(s): the points would replay 4 and record "
               "9 (points "
               "p0000-p0001)");
  }
  {
    // 24 positions, prompt 8: draft_len 16 has no step (8 + 16 > 23); 3 has.
    const Experiment ex = parse_experiment(exp, "exp.yaml", {}, 1);
    const CheckReport rep = check(ex, in.dir / "out.h5");
    EXPECT_EQ(rep.total_problems, 1u) << rep.text();
    expect_has(rep.text(),
               "no sequence of the 4 read is long enough for one step at draft_len 16 (a step needs "
               "prompt_length + draft_len + 1 positions; first: sequence 0, prompt 8 of 24 positions) "
               "(point p0001)");
  }
  {
    // A sequence longer than max_seq_len.
    const Experiment ex = parse_experiment(experiment_text(in.dir), "exp.yaml", {"model.max_seq_len=20"}, 1);
    const CheckReport rep = check(ex, in.dir / "out.h5");
    expect_has(rep.text(),
               "4 of the 4 sequence(s) read exceed model.max_seq_len 20 (first: sequence 0, 24 positions)");
  }
  {
    // A trace of another model.
    write_trace(in.dir / "trace.h5", 32, tiny().vocab, 2, 24, 5);
    const Experiment ex = parse_experiment(experiment_text(in.dir), "exp.yaml", {}, 1);
    const CheckReport rep = check(ex, in.dir / "out.h5");
    expect_has(rep.text(), str("hidden 32 and vocab ", tiny().vocab, " do not match model tiny (hidden ",
                               tiny().hidden, ", vocab ", tiny().vocab, ") (point p0000)"));
  }
}

TEST(Check, TraceNaNHiddenAndFingerprint) {
  TempDir dir;
  const model::ModelConfig cfg = tiny();
  write_trace(dir / "a.h5", cfg.hidden, cfg.vocab, 3, 24, 5);
  write_trace(dir / "b.h5", cfg.hidden, cfg.vocab, 3, 24, 5);
  write_trace(dir / "c.h5", cfg.hidden, cfg.vocab, 3, 24, 6);
  const TraceScan a = scan_trace(dir / "a.h5");
  EXPECT_TRUE(a.problem.empty()) << a.problem;
  EXPECT_EQ(a.sequences, 3);
  EXPECT_EQ(a.positions, 72);
  EXPECT_EQ(scan_trace(dir / "b.h5").fingerprint, a.fingerprint);
  EXPECT_NE(scan_trace(dir / "c.h5").fingerprint, a.fingerprint);
  {
    // Row 30 = sequence 1, position 6; element 7 becomes NaN.
    io::H5File f = io::H5File::open_append(dir / "b.h5");
    io::Dataset h = f.open_dataset("hiddens");
    std::vector<bf16> row(static_cast<size_t>(cfg.hidden));
    h.read_rows_into(30, 1, std::span<bf16>(row));
    row[7] = bf16{0x7FC0};
    h.write_rows(30, std::span<const bf16>(row));
    f.commit();
  }
  const TraceScan b = scan_trace(dir / "b.h5");
  expect_has(b.problem, "sequence 1, position 6 (row 30), element 7: hidden is NaN");
}

TEST(Check, OutputUnderAFileIsAProblem) {
  Inputs in;
  { std::ofstream(in.dir / "plain") << "x"; }
  const Experiment ex = parse_experiment(experiment_text(in.dir), "exp.yaml", {}, 1);
  const CheckReport rep = check(ex, in.dir / "plain/out.h5");
  EXPECT_EQ(rep.total_problems, 1u) << rep.text();
  expect_has(rep.text(), (in.dir / "plain") + " is not a directory, so " + (in.dir / "plain/out.h5") +
                             " cannot be created");
}

TEST(Check, AnOutputOfOtherInputsIsRefusedNamingTheKeys) {
  Inputs in;
  const Experiment ex = parse_experiment(experiment_text(in.dir), "exp.yaml", {}, 1);
  const std::string out = in.dir / "out.h5";
  const CheckReport first = check(ex, out);
  ASSERT_EQ(first.total_problems, 0u) << first.text();
  RunProvenance prov;
  prov.world = 1;
  prov.backend = "cpu";
  prov.identity_inputs = first.identity;
  EXPECT_TRUE(prepare_results_file(out, ex, prov).empty());
  // Same configuration and inputs: the file takes the run.
  const CheckReport again = check(ex, out);
  EXPECT_EQ(again.total_problems, 0u) << again.text();
  expect_has(again.text(), "exists, same configuration and inputs: 0 of 1 point(s) done");

  // Another trace at the same path (same sizes, other values): refused, naming the key.
  write_trace(in.dir / "trace.h5", tiny().hidden, tiny().vocab, 4, 24, 99);
  const CheckReport other = check(ex, out);
  ASSERT_EQ(other.total_problems, 1u) << other.text();
  std::string old_fp, new_fp;
  for (const auto& [k, v] : first.identity)
    if (k.starts_with("trace ")) old_fp = v;
  for (const auto& [k, v] : other.identity)
    if (k.starts_with("trace ")) new_fp = v;
  ASSERT_NE(old_fp, new_fp);
  expect_has(other.text(),
             str("trace ", in.dir / "trace.h5", ": ", old_fp, " (in the file) vs ", new_fp, " (this run)"));
  expect_has(other.text(), "(it holds no point: deleting it loses nothing)");
  // prepare_results_file refuses the same way, and leaves the file as it was.
  prov.identity_inputs = other.identity;
  expect_has(test::error_of([&] { (void)prepare_results_file(out, ex, prov); }),
             "(in the file) vs " + new_fp);
}

TEST(ResultsIdentity, CoversEveryInputAndNamesTheKeys) {
  const IdentityInputs a = {{"backend", "cpu"}, {"kernels.gemv_split", "auto"}, {"trace t.h5", "fnv1a64 1"}};
  IdentityInputs b = a;
  EXPECT_EQ(results_identity("0123456789abcdef", a), results_identity("0123456789abcdef", b));
  EXPECT_NE(results_identity("0123456789abcdef", a), results_identity("0123456789abcdef", {}));
  EXPECT_NE(results_identity("0123456789abcdef", a), results_identity("fedcba9876543210", a));
  // The recipe of docs/results-schema.md: FNV-1a 64 over the configuration, then "\nkey=value".
  EXPECT_EQ(results_identity("c", {{"k", "v"}}), hex16(fnv1a64("c\nk=v")));
  b[1].second = "2";
  b.push_back({"weights synthetic", "seed 1"});
  EXPECT_NE(results_identity("x", a), results_identity("x", b));
  const results_format::IdentityParts pa{"model: tiny\noutput: a.h5\n", 2, a};
  const results_format::IdentityParts pb{"model: tiny\noutput: b.h5\n", 1, b};
  const std::string d = join(results_format::identity_differences(pa, pb, "in A", "in B"), "; ");
  EXPECT_EQ(d,
            "world size: 2 (in A) vs 1 (in B); kernels.gemv_split: auto (in A) vs 2 (in B); weights "
            "synthetic: absent "
            "(in A) vs seed 1 (in B)");
  // A file upgraded from one that recorded no inputs differs from every run in them.
  const results_format::IdentityParts old{"model: tiny\n", 2, {{"inputs", "not recorded"}}};
  const std::string o = join(results_format::identity_differences(old, pa, "in the file", "this run"), "; ");
  expect_has(o, "backend: absent (in the file) vs cpu (this run)");
  expect_has(o, "inputs: not recorded (in the file) vs absent (this run)");
}

TEST(Check, StaleTemporariesAreThoseOfDeadWriters) {
  TempDir dir;
  const std::string out = dir / "r.h5";
  // A pid that was alive and is now dead: a child that exited and was reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const std::string dead = str(out, ".tmp.", child), alive = str(out, ".tmp.", ::getpid());
  for (const auto& f : {dead, alive, out + ".tmp.abc", dir / "other.h5.tmp.1"}) std::ofstream(f) << "x";
  EXPECT_EQ(stale_temporaries(out), std::vector<std::string>{dead});
  EXPECT_EQ(remove_stale_temporaries(out), std::vector<std::string>{dead});
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive));
  EXPECT_TRUE(fs::exists(out + ".tmp.abc"));
  EXPECT_TRUE(stale_temporaries(out).empty());
}

TEST(Check, AnExperimentThatDoesNotLoadIsOneProblem) {
  const CheckReport rep = experiment_failed("exp.yaml", "exp.yaml:3:1: unknown key \"trac\"");
  EXPECT_EQ(rep.total_problems, 1u);
  EXPECT_EQ(
      rep.text(),
      "PROBLEM  experiment exp.yaml: does not load\n           problem: exp.yaml:3:1: unknown key \"trac\"\n"
      "1 problem(s)\n");
}

TEST(Check, SyntheticInputsAreTheirSettings) {
  TempDir dir;
  const std::string exp =
      str("model: {preset: tiny, max_seq_len: 128}\nweights: {synthetic: {seed: 3}}\n"
          "trace: {synthetic: {sequences: 2, prompt_len: 8, new_tokens: 16, seed: 5, layers: 1}}\n"
          "output: ",
          dir / "out.h5", "\nbackend: cpu\nsweep:\n  grid:\n    measure.sequences: [0, 9]\n");
  const Experiment ex = parse_experiment(exp, "exp.yaml", {}, 1);
  const CheckReport rep = check(ex, dir / "out.h5");
  EXPECT_EQ(rep.total_problems, 1u) << rep.text();
  expect_has(rep.text(),
             "PROBLEM  trace synthetic (2 sequence(s) of 8 + 16 tokens, seed 5, 1 layer(s), weights seed 3): "
             "generated "
             "by the synthetic target (points p0000-p0001)\n           problem: measure.sequences 9 exceeds "
             "trace.synthetic.sequences 2: the points would replay 2 and record 9 (point p0001)");
  std::map<std::string, std::string> id(rep.identity.begin(), rep.identity.end());
  EXPECT_EQ(id["trace synthetic"], "2 sequence(s) of 8 + 16 tokens, seed 5, 1 layer(s), weights seed 3");
  EXPECT_EQ(id["weights synthetic"], "seed 3");
  EXPECT_EQ(id["backend"], "cpu");
  EXPECT_EQ(id["kernels.gemv_split"], "auto");
}
