// `mtplab trace`: a trace from mtplab's target (a stack of DSA + MoE layers, a final norm and the
// lm_head) decoding greedily: synthetic layers from seeded random prompts, or a checkpoint's trunk
// (--checkpoint) from the prompts of an existing trace (--prompts), so that replaying the written
// trace and an online run on the same weights and prompts see the same target. With --routing the
// trace records every position's routed experts at every layer (docs/trace-format.md, "Routing").
// Rank 0 writes the file; other ranks (if any) wait. The synthetic target's embedding and lm_head
// are the MTP weights' own (--weight-seed), so the drafter replaying the trace uses the same trunk
// the target did.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <memory>
#include <vector>

#include "commands.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/runtime.hpp"
#include "drafter/target.hpp"
#include "io/output.hpp"
#include "io/trace.hpp"
#include "model/config.hpp"

namespace mtplab::app {
namespace {
cli::Parser trace_cli() {
  return command_parser(
             "trace", "--out FILE.h5 [--force] [options]",
             "Writes a trace (docs/trace-format.md) by greedy decoding of mtplab's target: synthetic\n"
             "layers, or with --checkpoint the checkpoint's trunk (--model its config).\n"
             "An existing FILE.h5 is replaced only when it is a trace and --force is given; any other\n"
             "file (a results file, ...) is never replaced. A link is followed to the file it names.\n")
      .text("out", "FILE.h5", "the trace file to write (required)")
      .flag("force", "replace FILE.h5 when it is an existing trace")
      .text("model", "NAME|PATH", "model preset or config file (default tiny)")
      .integer("sequences", "N", "sequences (default 8)", 1, 1 << 20)
      .integer("prompt-len", "N", "prompt tokens per sequence (default 32)", 2, 1 << 20)
      .integer("new-tokens", "N", "generated tokens per sequence (default 96)", 1, 1 << 20)
      .integer("seed", "N", "seed of the prompts and of the target's layers (default 1)", 0, INT64_MAX)
      .integer("weight-seed", "N",
               "seed of the synthetic MTP weights whose embedding and lm_head the\n"
               "target shares (default 1; use the experiment's weights seed)",
               0, INT64_MAX)
      .integer("layers", "N", "target layers (default 2; with --checkpoint, the config's num_hidden_layers)",
               1, 64)
      .text("checkpoint", "FILE|DIR",
            "the target's embedding, trunk layers, final norm and head from this\n"
            "checkpoint (safetensors; names as docs/target.md says) instead of seeds")
      .text("prompts", "TRACE.h5",
            "the prompts of this trace's sequences (each its prompt_length tokens)\n"
            "instead of seeded ones; --new-tokens defaults to each sequence's own count")
      .flag("routing", "record each position's routed experts at every layer (/routing)")
      .integer("batch", "N",
               "sequences generated together (default 128; 1 = one at a time: on cuda\n"
               "the tokens may differ at head near-ties, on cpu never)",
               1, drafter::kMaxTargetBatch)
      .choice("backend", {"cpu", "cuda"}, "where the target runs (default cpu)");
}
}  // namespace

int cmd_trace(const Args& args) {
  const auto cli = parse_or_help(trace_cli(), args);
  if (!cli) return 0;
  MTP_REQUIRE(cli->has("out"), "mtplab trace: --out FILE.h5 is required");
  const bool from_trace = cli->has("prompts");
  const bool from_checkpoint = cli->has("checkpoint");
  MTP_REQUIRE(!from_trace || !cli->has("sequences"), "mtplab trace: --sequences with --prompts (the trace's ",
              "sequences are the prompts)");
  MTP_REQUIRE(!from_trace || !cli->has("prompt-len"),
              "mtplab trace: --prompt-len with --prompts (each sequence's prompt_length is its prompt)");
  const uint64_t seed = static_cast<uint64_t>(cli->integer("seed", 1));
  const uint64_t weight_seed = static_cast<uint64_t>(cli->integer("weight-seed", 1));
  const int batch = static_cast<int>(cli->integer("batch", drafter::kMaxTargetBatch));
  const bool routing = cli->flag("routing");
  const std::string backend = cli->choice("backend", "cpu");

  dist::Runtime rt;
  if (rt.rank() != 0) return 0;
  // The output rule (io/output.hpp), before any work: a trace, replaced only with --force.
  const io::OutputKind kind{"trace", "format", io::kTraceFormatName};
  std::vector<std::string> inputs{cli->text("model", "")};
  if (from_trace) inputs.push_back(cli->text("prompts"));
  if (from_checkpoint) inputs.push_back(cli->text("checkpoint"));
  const std::string out =
      io::resolve_output("mtplab trace", cli->text("out"), kind, inputs,
                         cli->flag("force") ? io::OutputMode::replace : io::OutputMode::create);
  model::ModelConfig cfg = model::load_model_preset(cli->text("model", "tiny"));
  int layers = static_cast<int>(cli->integer("layers", 2));
  if (from_checkpoint && !cli->has("layers")) {
    MTP_REQUIRE(cfg.num_hidden_layers > 0, "mtplab trace: the model ", cfg.name,
                " gives no num_hidden_layers: say --layers N for the checkpoint's trunk");
    layers = cfg.num_hidden_layers;
  }

  // The sequences to generate: (prompt, new tokens) each.
  struct Job {
    std::vector<int32_t> prompt;
    int new_tokens = 0;
  };
  std::vector<Job> jobs;
  if (from_trace) {
    const io::TraceReader prompts(cli->text("prompts"), cfg.hidden, cfg.vocab);
    for (int64_t q = 0; q < prompts.num_sequences(); ++q) {
      const auto toks = prompts.tokens(q);
      const int P = prompts.prompt_length(q);
      const int generated = static_cast<int>(prompts.sequence_length(q)) - P;
      const int n = cli->has("new-tokens") ? static_cast<int>(cli->integer("new-tokens", 0)) : generated;
      MTP_REQUIRE(n >= 1, "mtplab trace: ", prompts.path(), ": sequence ", q,
                  " has no generated token: say --new-tokens N");
      jobs.push_back(Job{std::vector<int32_t>(toks.begin(), toks.begin() + P), n});
    }
  } else {
    const int sequences = static_cast<int>(cli->integer("sequences", 8));
    const int prompt_len = static_cast<int>(cli->integer("prompt-len", 32));
    const int new_tokens = static_cast<int>(cli->integer("new-tokens", 96));
    drafter::PromptGenerator gen(seed, cfg.vocab);
    for (int q = 0; q < sequences; ++q) jobs.push_back(Job{gen.next(prompt_len), new_tokens});
  }
  int longest = 0;
  for (const Job& j : jobs) longest = std::max(longest, static_cast<int>(j.prompt.size()) + j.new_tokens);
  MTP_REQUIRE(longest <= cfg.max_seq_len, "mtplab trace: ", longest,
              " positions exceed the model's max_seq_len ", cfg.max_seq_len);

  std::unique_ptr<ops::Backend> be;
  if (backend == "cuda") {
    be = ops::make_cuda_backend(rt.bind_device().device);
  } else {
    be = ops::make_cpu_backend();
  }
  std::unique_ptr<drafter::SyntheticTarget> synthetic;
  std::unique_ptr<drafter::Target> loaded;
  drafter::TargetOptions topt;
  topt.max_positions = longest;
  if (from_checkpoint) {
    loaded = drafter::load_target(*be, nullptr, cfg, layers, cli->text("checkpoint"), topt);
  } else {
    synthetic = std::make_unique<drafter::SyntheticTarget>(*be, cfg, layers, weight_seed, seed, longest);
  }
  drafter::Target& target = loaded ? *loaded : synthetic->target();

  io::TraceProvenance prov;
  prov.generator = from_checkpoint ? "mtplab trace (checkpoint target)" : "mtplab trace (synthetic target)";
  prov.model = from_checkpoint ? str(cfg.name, " (", cli->text("checkpoint"), ")") : cfg.name;
  if (!from_checkpoint)
    prov.seed = str("prompts/target ", seed, ", weights ", weight_seed, ", layers ", layers);
  prov.config = str("model: ", cfg.name, "\nsequences: ", jobs.size(), "\nlayers: ", layers,
                    "\nbatch: ", batch, "\nbackend: ", backend, "\nrouting: ", routing ? "true" : "false");
  if (from_trace)
    prov.config += str("\nprompts: ", cli->text("prompts"));
  else
    prov.config += str("\nprompt_len: ", cli->integer("prompt-len", 32),
                       "\nnew_tokens: ", cli->integer("new-tokens", 96), "\nseed: ", seed);
  if (from_checkpoint)
    prov.config += str("\ncheckpoint: ", cli->text("checkpoint"));
  else
    prov.config += str("\nweight_seed: ", weight_seed);
  prov.config += "\n";
  io::TraceWriter writer(out, cfg.hidden, cfg.vocab, prov);
  if (routing) writer.record_routing(io::TraceRouting{layers, cfg.num_experts_per_tok, cfg.n_routed_experts});
  // Groups of consecutive sequences of one prompt length and one count of new tokens, at most
  // `batch` each (generate_batch: on the CPU the same bits at every batch size).
  size_t done = 0;
  while (done < jobs.size()) {
    size_t end = done + 1;
    while (end < jobs.size() && end - done < static_cast<size_t>(batch) &&
           jobs[end].prompt.size() == jobs[done].prompt.size() &&
           jobs[end].new_tokens == jobs[done].new_tokens)
      ++end;
    std::vector<std::vector<int32_t>> prompts;
    for (size_t q = done; q < end; ++q) prompts.push_back(jobs[q].prompt);
    std::vector<io::TraceSequence> group = drafter::generate_batch(
        target, prompts, jobs[done].new_tokens, io::TraceSampling{}, static_cast<int64_t>(done), routing);
    for (const io::TraceSequence& q : group) writer.add_sequence(q);
    log_info("trace: sequences ", done + 1, "..", end, "/", jobs.size(), " (",
             jobs[done].prompt.size() + static_cast<size_t>(jobs[done].new_tokens), " positions each)");
    done = end;
  }
  writer.commit();
  std::printf("wrote %s: %zu sequences, %lld positions (model %s, hidden %d, vocab %d%s)\n", out.c_str(),
              jobs.size(), static_cast<long long>(writer.total_positions()), cfg.name.c_str(), cfg.hidden,
              cfg.vocab, routing ? ", routing recorded" : "");
  return 0;
}

}  // namespace mtplab::app
