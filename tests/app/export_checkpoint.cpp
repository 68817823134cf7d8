// Test helper for test_hf_checkpoint.sh: the synthetic MTP weights of a model (a preset, a YAML
// file or a checkpoint directory's config.json), exported under the checkpoint names that model
// implies. (mtplab_export_weights does the same but is built with the CUDA benchmarks only.)
//
//   export_checkpoint MODEL SEED OUT [MAX_FILE_BYTES]   one file, or a sharded directory with an index
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

int main(int argc, char** argv) {
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
