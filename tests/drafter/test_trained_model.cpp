// mtplab's CPU drafter on the trained tiny model (data/trained-tiny/, tools/train_tiny/) must
// reproduce the acceptance figures of the PyTorch oracle that replayed the same trace under the
// same rules (meta.json oracle.k1..k3) within 1 percentage point: both compute in BF16 at the
// same rounding points and differ only by fp32 summation order, so only drafts whose top-2
// logits are within about one BF16 ulp can flip (docs/trained-tiny.md gives the count of such
// near-ties, about 1 in 10 deciding drafts at most, and each flip moves the rate by 1/steps).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "drafter/factory.hpp"
#include "harness/replay.hpp"
#include "io/trace.hpp"
#include "model/weights.hpp"

using namespace mtplab;

namespace {
std::string data_dir() {
  const char* src = std::getenv("MTPLAB_SOURCE_DIR");
  return std::string(src ? src : ".") + "/data/trained-tiny";
}

// The figure `key` of oracle.k<k> in meta.json (a flat number inside that object).
double oracle_figure(const std::string& meta, int k, const std::string& key) {
  const size_t at = meta.find("\"k" + std::to_string(k) + "\"");
  if (at == std::string::npos) throw std::runtime_error("meta.json: no oracle.k" + std::to_string(k));
  const std::regex re("\"" + key + "\"\\s*:\\s*([-0-9.eE+]+)");
  std::smatch m;
  std::string rest = meta.substr(at);
  if (!std::regex_search(rest, m, re)) throw std::runtime_error("meta.json: no " + key);
  return std::stod(m[1]);
}
}  // namespace

TEST(TrainedTiny, CpuDrafterReproducesTheOracleAcceptance) {
  const std::string dir = data_dir();
  ASSERT_TRUE(std::filesystem::exists(dir + "/meta.json")) << dir << " is missing (tools/train_tiny makes it)";
  std::ifstream in(dir + "/meta.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string meta = ss.str();

  const model::ModelConfig cfg = model::load_model_preset(dir + "/trained-tiny.yaml");
  auto be = ops::make_cpu_backend();
  io::TraceReader trace(dir + "/trace.h5", cfg.hidden, cfg.vocab);
  std::vector<io::TraceSequence> seqs;
  for (int64_t s = 0; s < trace.num_sequences(); ++s) seqs.push_back(trace.sequence(s));
  for (int k = 1; k <= 3; ++k) {
    const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
    auto w = model::load_mtp_weights(cfg, plan, dir + "/model.safetensors");
    drafter::DrafterOptions opt;
    opt.draft_len = k;
    auto d = drafter::make_drafter(*be, nullptr, cfg, w, opt);
    harness::AcceptanceStats stats;
    for (const auto& seq : seqs) harness::replay_sequence(*d, seq, static_cast<int>(seq.index), k, cfg.hidden, stats);
    const double want_rate = oracle_figure(meta, k, "acceptance_rate");
    const double want_tau = oracle_figure(meta, k, "tau");
    std::printf("[trained-tiny] k=%d: mtplab rate %.4f tau %.4f | oracle rate %.4f tau %.4f (%lld steps)\n", k,
                stats.rate(), stats.tau(), want_rate, want_tau, static_cast<long long>(stats.steps));
    EXPECT_NEAR(stats.rate(), want_rate, 0.01) << "k=" << k;
    EXPECT_NEAR(stats.tau() - 1.0, want_tau - 1.0, 0.01 * k) << "k=" << k;  // tau - 1 = rate * k
    const auto pos = stats.per_position();
    for (int i = 0; i < k; ++i) {
      const std::regex re("\"k" + std::to_string(k) + "\"[^}]*\"per_position\"\\s*:\\s*\\[([^\\]]*)\\]");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(meta, m, re));
      std::stringstream list(m[1]);
      std::vector<double> want;
      for (std::string item; std::getline(list, item, ',');) want.push_back(std::stod(item));
      ASSERT_EQ(want.size(), static_cast<size_t>(k));
      EXPECT_NEAR(pos[i], want[i], 0.01) << "k=" << k << " position " << i + 1;
    }
  }
}
