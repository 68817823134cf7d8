// `mtplab trace`: a trace from mtplab's synthetic target (a stack of DSA + MoE layers, a final
// norm and the lm_head, decoding greedily from seeded random prompts). Rank 0 writes the file;
// other ranks (if any) wait. The embedding and lm_head are the MTP weights' own (--weight-seed),
// so the drafter replaying the trace uses the same trunk the target did.
#include <cstdint>
#include <cstdio>
#include <ctime>
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
             "Writes a trace (docs/trace-format.md) by greedy decoding of mtplab's synthetic target.\n"
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
      .integer("layers", "N", "target layers (default 2)", 1, 64)
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
  const int sequences = static_cast<int>(cli->integer("sequences", 8));
  const int prompt_len = static_cast<int>(cli->integer("prompt-len", 32));
  const int new_tokens = static_cast<int>(cli->integer("new-tokens", 96));
  const uint64_t seed = static_cast<uint64_t>(cli->integer("seed", 1));
  const uint64_t weight_seed = static_cast<uint64_t>(cli->integer("weight-seed", 1));
  const int layers = static_cast<int>(cli->integer("layers", 2));
  const int batch = static_cast<int>(cli->integer("batch", drafter::kMaxTargetBatch));
  const std::string backend = cli->choice("backend", "cpu");

  dist::Runtime rt;
  if (rt.rank() != 0) return 0;
  // The output rule (io/output.hpp), before any work: a trace, replaced only with --force.
  const io::OutputKind kind{"trace", "format", io::kTraceFormatName};
  const std::string out =
      io::resolve_output("mtplab trace", cli->text("out"), kind, {cli->text("model", "")},
                         cli->flag("force") ? io::OutputMode::replace : io::OutputMode::create);
  model::ModelConfig cfg = model::load_model_preset(cli->text("model", "tiny"));
  MTP_REQUIRE(prompt_len + new_tokens <= cfg.max_seq_len, "mtplab trace: ", prompt_len, " + ", new_tokens,
              " positions exceed the model's max_seq_len ", cfg.max_seq_len);
  std::unique_ptr<ops::Backend> be;
  if (backend == "cuda") {
    be = ops::make_cuda_backend(rt.bind_device().device);
  } else {
    be = ops::make_cpu_backend();
  }
  drafter::SyntheticTarget target(*be, cfg, layers, weight_seed, seed, prompt_len + new_tokens);
  io::TraceProvenance prov;
  prov.generator = "mtplab trace (synthetic target)";
  prov.model = cfg.name;
  prov.seed = str("prompts/target ", seed, ", weights ", weight_seed, ", layers ", layers);
  prov.config = str("model: ", cfg.name, "\nsequences: ", sequences, "\nprompt_len: ", prompt_len,
                    "\nnew_tokens: ", new_tokens, "\nseed: ", seed, "\nweight_seed: ", weight_seed,
                    "\nlayers: ", layers, "\nbatch: ", batch, "\nbackend: ", backend, "\n");
  io::TraceWriter writer(out, cfg.hidden, cfg.vocab, prov);
  int done = 0;
  drafter::synthetic_trace_groups(target, cfg.vocab, sequences, prompt_len, new_tokens, seed,
                                  io::TraceSampling{}, batch, [&](std::vector<io::TraceSequence>&& group) {
                                    for (const io::TraceSequence& seq : group)
                                      writer.add_sequence(seq.tokens, seq.hiddens, seq.prompt_length);
                                    log_info("trace: sequences ", done + 1, "..",
                                             done + static_cast<int>(group.size()), "/", sequences, " (",
                                             prompt_len + new_tokens, " positions each)");
                                    done += static_cast<int>(group.size());
                                  });
  writer.commit();
  std::printf("wrote %s: %d sequences of %d positions (model %s, hidden %d, vocab %d)\n", out.c_str(),
              sequences, prompt_len + new_tokens, cfg.name.c_str(), cfg.hidden, cfg.vocab);
  return 0;
}

}  // namespace mtplab::app
