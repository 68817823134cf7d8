// `mtplab trace`: a trace from mtplab's synthetic target (a stack of DSA + MoE layers, a final
// norm and the lm_head, decoding greedily from seeded random prompts). Rank 0 writes the file;
// other ranks (if any) wait. The embedding and lm_head are the MTP weights' own (--weight-seed),
// so the drafter replaying the trace uses the same trunk the target did.
#include <cstdio>
#include <ctime>

#include "cli.hpp"
#include "commands.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/runtime.hpp"
#include "drafter/target.hpp"
#include "io/trace.hpp"
#include "model/config.hpp"

namespace mtplab::app {
namespace {
const char* kTraceHelp =
    "usage: mtplab trace --out FILE.h5 [options]\n\n"
    "Writes a trace (docs/trace-format.md) by greedy decoding of mtplab's synthetic target.\n"
    "  --model NAME|PATH     model preset or config file (default tiny)\n"
    "  --sequences N         sequences (default 8)\n"
    "  --prompt-len N        prompt tokens per sequence (default 32)\n"
    "  --new-tokens N        generated tokens per sequence (default 96)\n"
    "  --seed N              seed of the prompts and of the target's layers (default 1)\n"
    "  --weight-seed N       seed of the synthetic MTP weights whose embedding and lm_head the\n"
    "                        target shares (default 1; use the experiment's weights seed)\n"
    "  --layers N            target layers (default 2)\n"
    "  --backend cpu|cuda    where the target runs (default cpu)\n";
}  // namespace

int cmd_trace(const Args& args) {
  Cli cli("trace", args,
          {"out", "model", "sequences", "prompt-len", "new-tokens", "seed", "weight-seed", "layers", "backend"});
  if (cli.flag("help")) {
    std::fputs(kTraceHelp, stdout);
    return 0;
  }
  MTP_REQUIRE(cli.positional().empty(), "mtplab trace: unexpected argument \"", cli.positional().front(), "\"");
  MTP_REQUIRE(cli.has("out"), "mtplab trace: --out FILE.h5 is required");
  const std::string out = *cli.get("out");
  const int sequences = static_cast<int>(cli.get_int("sequences", 8, 1, 1 << 20));
  const int prompt_len = static_cast<int>(cli.get_int("prompt-len", 32, 2, 1 << 20));
  const int new_tokens = static_cast<int>(cli.get_int("new-tokens", 96, 1, 1 << 20));
  const uint64_t seed = static_cast<uint64_t>(cli.get_int("seed", 1, 0, INT64_MAX));
  const uint64_t weight_seed = static_cast<uint64_t>(cli.get_int("weight-seed", 1, 0, INT64_MAX));
  const int layers = static_cast<int>(cli.get_int("layers", 2, 1, 64));
  const std::string backend = cli.get_or("backend", "cpu");
  MTP_REQUIRE(backend == "cpu" || backend == "cuda", "mtplab trace: --backend \"", backend,
              "\" is not one of cpu, cuda");

  dist::Runtime rt;
  if (rt.rank() != 0) return 0;
  model::ModelConfig cfg = model::load_model_preset(cli.get_or("model", "tiny"));
  MTP_REQUIRE(prompt_len + new_tokens <= cfg.max_seq_len, "mtplab trace: ", prompt_len, " + ", new_tokens,
              " positions exceed the model's max_seq_len ", cfg.max_seq_len);
  std::unique_ptr<ops::Backend> be;
  if (backend == "cuda") {
    be = ops::make_cuda_backend(rt.bind_device().device);
  } else {
    be = ops::make_cpu_backend();
  }
  drafter::SyntheticTarget target(*be, cfg, layers, weight_seed, seed);
  io::TraceProvenance prov;
  prov.generator = "mtplab trace (synthetic target)";
  prov.model = cfg.name;
  prov.seed = str("prompts/target ", seed, ", weights ", weight_seed, ", layers ", layers);
  prov.config = str("model: ", cfg.name, "\nsequences: ", sequences, "\nprompt_len: ", prompt_len,
                    "\nnew_tokens: ", new_tokens, "\nseed: ", seed, "\nweight_seed: ", weight_seed,
                    "\nlayers: ", layers, "\nbackend: ", backend, "\n");
  io::TraceWriter writer(out, cfg.hidden, cfg.vocab, prov);
  drafter::PromptGenerator prompts(seed, cfg.vocab);
  for (int s = 0; s < sequences; ++s) {
    const io::TraceSequence seq = target.generate(prompts.next(prompt_len), new_tokens);
    writer.add_sequence(seq.tokens, seq.hiddens, seq.prompt_length);
    log_info("trace: sequence ", s + 1, "/", sequences, " (", seq.tokens.size(), " positions)");
  }
  writer.commit();
  std::printf("wrote %s: %d sequences of %d positions (model %s, hidden %d, vocab %d)\n", out.c_str(), sequences,
              prompt_len + new_tokens, cfg.name.c_str(), cfg.hidden, cfg.vocab);
  return 0;
}

}  // namespace mtplab::app
