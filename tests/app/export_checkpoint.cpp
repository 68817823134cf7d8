// Test helper for test_hf_checkpoint.sh: the synthetic MTP weights of a model (a preset, a YAML
// file or a checkpoint directory's config.json), exported under the checkpoint names that model
// implies. (mtplab_export_weights does the same but is built with the CUDA benchmarks only.)
//
//   export_checkpoint MODEL SEED OUT [MAX_FILE_BYTES]   one file, or a sharded directory with an index
//   export_checkpoint --target MODEL WEIGHT_SEED TARGET_SEED LAYERS OUT
//       the synthetic target of `mtplab trace --seed TARGET_SEED --weight-seed WEIGHT_SEED --layers
//       LAYERS` (model::synthesize_target_weights) as one safetensors file under the trunk's names
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/weights.hpp"

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--target") {
    try {
      using namespace mtplab::model;
      const ModelConfig cfg = load_model_preset(argv[2]);
      const int layers = std::atoi(argv[5]);
      const TargetWeights w =
          synthesize_target_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::none), layers,
                                    std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10));
      write_safetensors(argv[6], target_checkpoint_views(cfg, w));
      std::printf("exported the target of %d layers of %s to %s\n", layers, cfg.name.c_str(), argv[6]);
      return 0;
    } catch (const mtplab::Error& e) {
      std::fprintf(stderr, "%s\n", e.describe().c_str());
      return 1;
    }
  }
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: export_checkpoint MODEL SEED OUT [MAX_FILE_BYTES]\n");
    return 2;
  }
  try {
    using namespace mtplab::model;
    const ModelConfig cfg = load_model_preset(argv[1]);
    const MtpWeights w = synthesize_mtp_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::none),
                                                std::strtoull(argv[2], nullptr, 10));
    export_mtp_weights(cfg, w, argv[3], argc == 5 ? std::strtoull(argv[4], nullptr, 10) : 0);
    std::printf("exported %s (seed %s) to %s\n", cfg.summary().c_str(), argv[2], argv[3]);
    return 0;
  } catch (const mtplab::Error& e) {
    std::fprintf(stderr, "%s\n", e.describe().c_str());
    return 1;
  }
}
