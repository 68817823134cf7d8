// mtplab_export_weights: writes the synthetic MTP weights of a model preset (the exact tensors
// mtplab_bench_step and the drafter synthesise for world 1: synthesize_mtp_weights(cfg, plan,
// seed), a pure function of (seed, tensor name, index)) as a safetensors checkpoint under the
// preset's checkpoint names, so that another implementation (bench/peer/peer_step.py) can run
// the same weights mtplab runs.
//
//   mtplab_export_weights [--preset NAME|PATH] [--seed 11] [--max-file-gb G] --out PATH
//
// One file at PATH (default), or a directory of files of at most G GB with
// model.safetensors.index.json. Experts are one tensor each (mlp.experts.{e}.{gate,up,down}_proj);
// e_score_correction_bias and index_kpool_compress_ape are F32, every other tensor BF16.
// The default seed, 11, is the one mtplab_bench_step synthesises with.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "bench_main.hpp"
#include "core/cli.hpp"
#include "core/error.hpp"
#include "model/weights.hpp"

using namespace mtplab;

int main(int argc, char** argv) {
  std::string preset = "glm5.3-flash", out;
  uint64_t seed = 11;
  double max_file_gb = 0;
  cli::Parser p("mtplab_export_weights",
                "mtplab_export_weights [--preset NAME|PATH] [--seed S] [--max-file-gb G] --out PATH");
  p.about("Writes the synthetic MTP weights of a preset (world 1) as a safetensors checkpoint.\n")
      .text("preset", "NAME|PATH", "model preset or config file (default glm5.3-flash)")
      .integer("seed", "S", "weight seed (default 11, the one mtplab_bench_step uses)", 0, INT64_MAX)
      .number("max-file-gb", "G", "largest file; 0 writes one file (default 0)", 0, 1e6)
      .text("out", "PATH", "the file, or the directory when --max-file-gb splits (required)");
  p.run_main(argc, argv, [&](const cli::Args& a) {
    preset = a.text("preset", preset);
    seed = static_cast<uint64_t>(a.integer("seed", static_cast<int64_t>(seed)));
    max_file_gb = a.number("max-file-gb", max_file_gb);
    out = a.text("out");
    MTP_REQUIRE(!out.empty(), "mtplab_export_weights: --out PATH is required");
  });
  return bench::guarded_main([&] {
    using Clock = std::chrono::steady_clock;
    const model::ModelConfig cfg = model::load_model_preset(preset);
    const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
    auto t0 = Clock::now();
    const auto w = model::synthesize_mtp_weights(cfg, plan, seed);
    const double synth_s = std::chrono::duration<double>(Clock::now() - t0).count();
    t0 = Clock::now();
    model::export_mtp_weights(cfg, w, out, static_cast<uint64_t>(max_file_gb * 1e9));
    const double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("exported %s (seed %llu): %.2f GB, synthesised in %.1f s, written in %.1f s to %s\n",
                cfg.summary().c_str(), static_cast<unsigned long long>(seed), w.bytes() / 1e9, synth_s,
                write_s, out.c_str());
    return 0;
  });
}
