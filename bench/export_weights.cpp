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
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "model/weights.hpp"

using namespace mtplab;

int main(int argc, char** argv) {
  std::string preset = "glm5.3-flash", out;
  uint64_t seed = 11;
  double max_file_gb = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--preset NAME|PATH] [--seed S] [--max-file-gb G] --out PATH\n", argv[0]);
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--preset") {
      preset = v;
    } else if (a == "--seed") {
      seed = std::strtoull(v.c_str(), nullptr, 10);
    } else if (a == "--max-file-gb") {
      max_file_gb = std::atof(v.c_str());
    } else if (a == "--out") {
      out = v;
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "--out PATH is required\n");
    return 2;
  }
  try {
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
                cfg.summary().c_str(), static_cast<unsigned long long>(seed), w.bytes() / 1e9, synth_s, write_s,
                out.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.describe().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
