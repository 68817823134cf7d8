// mtplab's drafter math against transformers' glm5_next, on the fixtures in data/reference/tiny
// (tests/reference/make_fixtures.py; docs/reference-check.md lists every point where the two
// differ and which side mtplab follows).
//
// Three tests, one table each on stdout:
// - Pieces: every piece of the MTP step on the CPU reference ops, each from the fixture's own
//   input for it (transformers' value of the piece before), so errors do not compound and a
//   failure names the piece. This is check_fixtures.py's recomputation, in C++, on mtplab's ops
//   and mtplab's loader.
// - Block: drafter::Block::forward over the 40 fixture rows in order (a causal prefill: row t
//   attends to the rows selected at t), then the head and the 3 chained drafts: the composition
//   of the pieces as the drafter runs it, errors compounding within the block.
// - Drafter: MtpDrafter::append_rows + propose from the fixture's tokens and hiddens, under both
//   context-row arms: its caches (latent rows, indexer rows, pool keys) and its drafts.
//
// Invariants:
// - The weights come through model::load_mtp_weights with tests/reference/tiny_fixtures.yaml,
//   whose sizes are checked against meta.json first (yaml-cpp reads JSON: it is YAML's flow style).
// - Every tolerance is stated where it is used, with why: from check_fixtures.py's measured errors
//   (data/reference/tiny/check_fixtures.log) and docs/reference-check.md's "Rounding points".
//   Selections and argmaxes must agree exactly wherever the reference's margin exceeds twice the
//   score / logit error (two candidates' errors can add up against the margin), and everywhere the
//   two sides start from the same BF16 input and round at the same points.
// - Every output buffer is poisoned (NaN / -1) before an op writes it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "core/yaml.hpp"
#include "drafter/block.hpp"
#include "drafter/drafter.hpp"
#include "drafter/factory.hpp"
#include "model/fields.hpp"
#include "model/sharding.hpp"
#include "model/weights.hpp"
#include "ops/one_row.hpp"
#include "ops/ops.hpp"
#include "reference_util.hpp"

using namespace mtplab;
using reftest::PieceTable;
using reftest::poisoned;
using reftest::widen;

namespace {

// ---- the fixtures ---------------------------------------------------------------------------------

struct ReferenceData {
  model::ModelConfig cfg;
  model::MtpWeights w;
  std::unique_ptr<reftest::FixtureFile> X;
  int T = 0;      ///< fixture rows (meta.json config.seq_len)
  int chain = 0;  ///< chained drafts after row T-1
  int pools = 0;  ///< complete pools among the T rows
  std::string provenance;
};

int64_t meta_int(MapReader& r, const std::string& key) { return r.req_int(key, 0, int64_t{1} << 40); }

/// Checks every field of the YAML config that a Hugging Face config gives directly (the field
/// table's rows with an hf field) against the transformers config the fixtures were made with
/// (meta.json `transformers_config`), and the MTP layer against meta.json `config`, so the
/// fixture and the config cannot drift apart silently.
void check_against_meta(const model::ModelConfig& c, const YamlNode& meta, ReferenceData& ref) {
  MapReader root(meta);
  const YamlNode conf_node = root.req("config");
  MapReader m(conf_node);
  const YamlNode tc_node = root.req("transformers_config");
  MapReader tc(tc_node);
  for (const model::ModelField& f : model::model_fields()) {
    const model::HfRead how = f.hf.read;
    if (how == model::HfRead::none || how == model::HfRead::derived) continue;
    const YamlNode theirs = tc.req(f.hf.key);
    if (f.type() == FieldType::integer) {
      const int64_t mine = field_ref<int>(c, f.member);
      MTP_REQUIRE(theirs.as_int() == mine, theirs.where(), ": meta.json transformers_config.", f.hf.key,
                  " is ", theirs.as_int(), " but ", c.source, " has ", f.name, " ", mine);
    } else {
      const double mine = field_ref<float>(c, f.member), t = theirs.as_double();
      MTP_REQUIRE(std::fabs(t - mine) <= 1e-6 * std::fabs(t), theirs.where(),
                  ": meta.json transformers_config.", f.hf.key, " is ", t, " but ", c.source, " has ", f.name,
                  " ", mine);
    }
  }
  MTP_REQUIRE(meta_int(m, "mtp_layer") == c.mtp_layer_index, m.node().where(),
              ": meta.json config.mtp_layer is ", meta_int(m, "mtp_layer"), " but ", c.source, " has ",
              c.mtp_layer_index);
  ref.T = static_cast<int>(meta_int(m, "seq_len"));
  ref.chain = static_cast<int>(meta_int(m, "chain"));
  MTP_REQUIRE(c.mtp_prefix == str("model.language_model.layers.", c.mtp_layer_index, "."), c.source,
              ": mtp_prefix ", c.mtp_prefix, " does not name layer ", c.mtp_layer_index);
  // Switches transformers has and mtplab hard-wires (docs/reference-check.md rows 10, 11, 17).
  MTP_REQUIRE(tc.req_bool("index_kpool_always_select_tail"), tc.node().where(),
              ": the fixture does not always select the tail; mtplab always does");
  MTP_REQUIRE(tc.req_bool("norm_topk_prob"), tc.node().where(),
              ": the fixture does not normalise the routing weights");
  MTP_REQUIRE(tc.req_string("hidden_act") == "silu", tc.node().where(), ": hidden_act is not silu");
  const YamlNode versions = root.req("versions");
  MapReader vr(versions);
  ref.provenance = str("transformers ", vr.req_string("transformers"), ", torch ", vr.req_string("torch"),
                       ", device ", root.req_string("device"), ", seed ", meta_int(root, "seed_used"));
}

std::unique_ptr<ReferenceData> load_reference() {
  auto r = std::make_unique<ReferenceData>();
  const std::string dir = reftest::fixture_dir();
  r->cfg = model::load_model_preset(reftest::source_dir() + "/tests/reference/tiny_fixtures.yaml");
  check_against_meta(r->cfg, YamlNode::load_file(dir + "/meta.json"), *r);
  MTP_REQUIRE(r->T + r->chain <= r->cfg.max_seq_len, "tiny_fixtures.yaml: max_seq_len ", r->cfg.max_seq_len,
              " cannot hold the ", r->T, " + ", r->chain, " fixture rows");
  r->pools = r->T / r->cfg.index_kpool;
  const model::ShardPlan plan = model::make_shard_plan(r->cfg, 0, 1, model::HeadSharding::none);
  r->w = model::load_mtp_weights(r->cfg, plan, dir + "/weights.safetensors");
  r->X = std::make_unique<reftest::FixtureFile>(dir + "/fixtures.safetensors");
  r->provenance = str(dir, " (", r->provenance, "), ", r->T, " rows + ", r->chain, " chained");
  return r;
}

const ReferenceData& reference() {
  static const std::unique_ptr<ReferenceData> ref = load_reference();
  return *ref;
}

// ---- backend memory --------------------------------------------------------------------------------

template <typename T>
ops::Array<T> put(ops::Backend& be, const std::vector<T>& host) {
  ops::Array<T> a(be, host.size());
  be.upload(a.data(), host.data(), host.size() * sizeof(T));
  return a;
}
template <typename T>
ops::Array<T> poisoned_array(ops::Backend& be, size_t n) {
  ops::Array<T> a(be, n);
  be.fill_bytes(a.data(), 0xFF, a.bytes());
  return a;
}
template <typename T>
std::vector<T> get(ops::Backend& be, const T* src, size_t n) {
  std::vector<T> out = poisoned<T>(n);
  be.download(out.data(), src, n * sizeof(T));
  return out;
}
template <typename T>
std::vector<T> get(ops::Backend& be, const ops::Array<T>& a) {
  return get(be, a.data(), a.size());
}
std::vector<float> get_widened(ops::Backend& be, const ops::Array<bf16>& a) { return widen(get(be, a)); }

/// Rows [r0, r0 + n) of a row-major [*, width] host matrix.
template <typename T>
std::vector<T> rows_of(const std::vector<T>& m, int width, int r0, int n) {
  return std::vector<T>(m.begin() + static_cast<ptrdiff_t>(r0) * width,
                        m.begin() + static_cast<ptrdiff_t>(r0 + n) * width);
}

/// The valid (non -1) entries of a selection row, ascending: a selection is a set (reference-check
/// row 12: transformers lists pools in score order, mtplab in pool order).
std::vector<int32_t> as_set(const int32_t* row, int width) {
  std::vector<int32_t> s;
  for (int i = 0; i < width; ++i)
    if (row[i] >= 0) s.push_back(row[i]);
  std::sort(s.begin(), s.end());
  return s;
}

/// The front weights (the drafter keeps them in FrontWeights, the block's in BlockWeights).
struct Front {
  ops::Array<bf16> embed, enorm, hnorm, eh_proj, shared_head_norm, lm_head;
  Front(ops::Backend& be, const model::MtpWeights& w)
      : embed(drafter::upload(be, w.embed_tokens)),
        enorm(drafter::upload(be, w.enorm)),
        hnorm(drafter::upload(be, w.hnorm)),
        eh_proj(drafter::upload(be, w.eh_proj)),
        shared_head_norm(drafter::upload(be, w.shared_head_norm)),
        lm_head(drafter::upload(be, w.lm_head)) {}
};

/// x0 = eh_proj [enorm(E[token]) ; hnorm(hidden)] for one row (docs/model.md, "One draft token").
void front_row(ops::Backend& be, const model::ModelConfig& c, const Front& f, const int32_t* token_dev,
               const bf16* hidden_dev, bf16* x0) {
  auto cat = poisoned_array<bf16>(be, 2 * static_cast<size_t>(c.hidden));
  mtplab::ops::OneRow(be).embed_rmsnorm(f.embed.data(), token_dev, f.enorm.data(), cat.data(), c.hidden,
                                        c.rms_norm_eps);
  be.rmsnorm(hidden_dev, f.hnorm.data(), cat.data() + c.hidden, 1, c.hidden, c.rms_norm_eps);
  be.linear(f.eh_proj.data(), cat.data(), x0, 1, c.hidden, 2 * c.hidden);
}

/// The head on BF16 rows y [n, H]: (max logit, argmax) per row and the full BF16 logits.
struct HeadOut {
  std::vector<ops::ArgMax> best;
  std::vector<float> logits;  ///< [n, V]
};
HeadOut run_head(ops::Backend& be, const model::ModelConfig& c, const Front& f, const std::vector<bf16>& y,
                 int n) {
  auto y_dev = put(be, y);
  auto logits = poisoned_array<bf16>(be, static_cast<size_t>(n) * c.vocab);
  auto best = poisoned_array<ops::ArgMax>(be, n);
  for (int t = 0; t < n; ++t)
    be.head_argmax(f.lm_head.data(), nullptr, nullptr, y_dev.data() + static_cast<size_t>(t) * c.hidden,
                   c.vocab, c.hidden, 0, logits.data() + static_cast<size_t>(t) * c.vocab, best.data() + t);
  return HeadOut{get(be, best), get_widened(be, logits)};
}

// ---- end-to-end tolerances (Block and drafter tests), where the pieces' errors compound --------------
//
// A context row's x1 and y: the MoE output dominates x1 (RMS 5.2 against x0's 1.0: the fixture
// scales 1/8 of the expert rows x6 so the clamp bites) and carries v's relative error (~3e-3: a
// norm ulp plus r's, which holds attention's 5e-3 on a third of r) about twice, once through the
// gate and once through the up projection, on top of its own rounding gap (4e-3 RMS, 4 ulps):
// ~1e-2 expected (measured x1 8.6e-3 / 9 ulps, y 9.3e-3 / 8 ulps), 2e-2 and 16 ulps allowed.
constexpr double kRowRel = 2e-2, kRowUlp = 16;
// Chained row i (0-based) inherits the y error of the row before through hnorm and eh_proj (gain
// <= 1, diluted by the exact embedding half) and adds its own ~1e-2: <= (i + 2) x 1e-2, so 4e-2
// over the 3 chained rows (measured per row 1.3e-2, 1.9e-2, 2.3e-2; 9 ulps), 24 ulps.
constexpr double kChainRel = 4e-2, kChainUlp = 24;
// A logit is W_v . y with W_v ~ N(0, 1/H) and unit-RMS y, so y's relative error e gives a logit
// error ~ N(0, e^2): the largest of 40 x 4096 logits is ~4.6 e, plus one BF16 ulp of a logit
// below 4 (1/64). With the tolerances above: 0.125 for a context row (measured 0.0625), 0.25 for
// a chained row (measured 0.090). An argmax must agree wherever the fixture's top-2 margin
// exceeds twice that (both logits can move).
constexpr double kLogitRow = 0.125, kLogitChain = 0.25;

/// BF16 spacing at |v| (2^(e-7) for |v| in [2^e, 2^(e+1))).
double bf16_ulp(double v) { return std::exp2(std::floor(std::log2(std::max(std::fabs(v), 1e-30))) - 7); }

void finish(const PieceTable& tab, std::chrono::steady_clock::time_point start) {
  tab.print();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("     (%.0f ms)\n", ms);
  const std::string bad = tab.failures();
  EXPECT_TRUE(bad.empty()) << "pieces past their tolerance:\n" << bad;
}

// What every test starts from: its start time, the reference (config, weights, fixture file) and
// a CPU backend.
class Reference : public ::testing::Test {
 protected:
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  const ReferenceData& R = reference();
  const model::ModelConfig& c = R.cfg;
  const reftest::FixtureFile& X = *R.X;
  std::unique_ptr<ops::Backend> be_owner = ops::make_cpu_backend();
  ops::Backend& be = *be_owner;
};

}  // namespace

// =====================================================================================================
// Pieces, each from the fixture's own input.
// =====================================================================================================

TEST_F(Reference, PiecesMatchTransformers) {
  const int T = R.T, H = c.hidden, V = c.vocab, P = c.index_kpool, K = c.index_topk, D = c.index_head_dim;
  const int nI = c.index_n_heads, nh = c.n_heads, dq = c.qk_nope_head_dim, dv = c.v_head_dim;
  const int E = c.n_routed_experts, k_top = c.num_experts_per_tok, SI = c.shared_intermediate();
  const int npools = R.pools, width = c.selection_width();
  const float eps = c.rms_norm_eps;
  const drafter::BlockDims dims = drafter::block_dims(c, 1, 0, ops::KvDtype::bf16);
  const int maxp = dims.max_pools();
  const Front f(be, R.w);
  const drafter::BlockWeights bw = drafter::upload_block_weights(be, R.w);
  PieceTable tab(str("pieces from the fixture's own inputs: ", R.provenance));

  // Tolerances in BF16 ulps where both sides see the same BF16 input (check_fixtures.py's, whose
  // measured maxima are in the comments): transformers' RMSNorm rounds twice (normalised, then
  // times w: reference-check row 1) where mtplab rounds once, <= 1 ulp apart (measured 1.00);
  // a GEMM of the same BF16 inputs sums in another order, which moves the rounded output by at
  // most 1 ulp (measured 0.02); a norm of a GEMM compounds both (measured 1.00, allowed 4).
  // With the ulp bound goes a relative RMS bound: elements one rounding apart differ by at most
  // one ulp, which is <= 2^-7 of the element (<= 2^-8 for half an ulp), so a larger RMS means a
  // systematic error (a missing eps moves front.e by 1.3e-2, an unbiased LayerNorm variance moves
  // k_normed by 1.6e-2, both within a few ulps per element).
  const double t_norm = 2, t_gemm = 1, t_norm_gemm = 4;
  const double r_ulp = std::exp2(-7), r_half_ulp = std::exp2(-8);

  const std::vector<int32_t> tokens = X.ints("input.tokens", {T + 1});
  std::vector<int32_t> positions(static_cast<size_t>(c.max_seq_len));
  std::iota(positions.begin(), positions.end(), 0);
  auto pos = put(be, positions);
  auto tok = put(be, tokens);

  // ---- front ------------------------------------------------------------------------------------
  {
    const std::vector<bf16> embed_ref = X.bf16s("front.embed", {T, H});
    int same = 0;
    for (int t = 0; t < T; ++t)
      same += std::equal(embed_ref.begin() + static_cast<ptrdiff_t>(t) * H, embed_ref.begin() + (t + 1) * H,
                         R.w.embed_tokens.data.begin() + static_cast<ptrdiff_t>(tokens[t + 1]) * H);
    tab.count("front.embed = E[tokens[t+1]]", same, T,
              "bitwise: loader's embed_tokens, row t embeds tokens[t+1]");
  }
  auto e = poisoned_array<bf16>(be, static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t)
    mtplab::ops::OneRow(be).embed_rmsnorm(f.embed.data(), tok.data() + t + 1, f.enorm.data(),
                                          e.data() + static_cast<size_t>(t) * H, H, eps);
  tab.ulps("front.e = enorm(embed)", get_widened(be, e), X.floats("front.e", {T, H}), t_norm, r_ulp,
           "RMSNorm, eps matters");
  auto hidden = put(be, X.bf16s("input.hidden", {T, H}));
  auto h = poisoned_array<bf16>(be, static_cast<size_t>(T) * H);
  be.rmsnorm(hidden.data(), f.hnorm.data(), h.data(), T, H, eps);
  tab.ulps("front.h = hnorm(hidden)", get_widened(be, h), X.floats("front.h", {T, H}), t_norm, r_ulp,
           "RMSNorm");
  {
    const std::vector<bf16> e_ref = X.bf16s("front.e", {T, H}), h_ref = X.bf16s("front.h", {T, H});
    std::vector<bf16> cat(static_cast<size_t>(T) * 2 * H);
    for (int t = 0; t < T; ++t) {
      std::copy_n(e_ref.begin() + static_cast<ptrdiff_t>(t) * H, H,
                  cat.begin() + static_cast<ptrdiff_t>(t) * 2 * H);
      std::copy_n(h_ref.begin() + static_cast<ptrdiff_t>(t) * H, H,
                  cat.begin() + static_cast<ptrdiff_t>(t) * 2 * H + H);
    }
    auto cat_dev = put(be, cat);
    auto x0 = poisoned_array<bf16>(be, static_cast<size_t>(T) * H);
    be.linear(f.eh_proj.data(), cat_dev.data(), x0.data(), T, H, 2 * H);
    tab.ulps("front.x0 = eh_proj [e ; h]", get_widened(be, x0), X.floats("front.x0", {T, H}), t_gemm,
             r_half_ulp, "BF16 GEMM, embedding first");
  }
  auto x0_ref = put(be, X.bf16s("front.x0", {T, H}));
  auto u = poisoned_array<bf16>(be, static_cast<size_t>(T) * H);
  be.rmsnorm(x0_ref.data(), bw.input_norm.data(), u.data(), T, H, eps);
  tab.ulps("block.u = input_layernorm(x0)", get_widened(be, u), X.floats("block.u", {T, H}), t_norm, r_ulp,
           "RMSNorm");

  // ---- latents ----------------------------------------------------------------------------------
  auto u_ref = put(be, X.bf16s("block.u", {T, H}));
  {
    auto pre = poisoned_array<bf16>(be, static_cast<size_t>(T) * c.q_lora_rank);
    auto cq = poisoned_array<bf16>(be, static_cast<size_t>(T) * c.q_lora_rank);
    be.linear(bw.q_a.data(), u_ref.data(), pre.data(), T, c.q_lora_rank, H);
    be.rmsnorm(pre.data(), bw.q_a_norm.data(), cq.data(), T, c.q_lora_rank, eps);
    tab.ulps("attn.c_q = q_a_layernorm(q_a_proj u)", get_widened(be, cq),
             X.floats("attn.c_q", {T, c.q_lora_rank}), t_norm_gemm, r_ulp, "RMSNorm of a GEMM");
    auto kpre = poisoned_array<bf16>(be, static_cast<size_t>(T) * c.kv_lora_rank);
    auto ckv = poisoned_array<bf16>(be, static_cast<size_t>(T) * c.kv_lora_rank);
    be.linear(bw.kv_a.data(), u_ref.data(), kpre.data(), T, c.kv_a_rows(), H);
    be.rmsnorm(kpre.data(), bw.kv_a_norm.data(), ckv.data(), T, c.kv_lora_rank, eps);
    tab.ulps("attn.c_kv = kv_a_layernorm(kv_a u)", get_widened(be, ckv),
             X.floats("attn.c_kv", {T, c.kv_lora_rank}), t_norm_gemm, r_ulp, "RMSNorm of a GEMM");
  }
  auto cq_ref = put(be, X.bf16s("attn.c_q", {T, c.q_lora_rank}));
  const std::vector<bf16> ckv_ref = X.bf16s("attn.c_kv", {T, c.kv_lora_rank});

  // ---- indexer rows and pool keys ------------------------------------------------------------------
  // mtplab keeps q^I, gate and the head weights in fp32 where transformers rounds them to BF16
  // (reference-check "Rounding points"): <= 0.5 ulp apart plus summation order, so 1 ulp
  // (measured 0.49 / 0.50).
  auto q_idx = poisoned_array<float>(be, static_cast<size_t>(T) * nI * D);
  be.linear_f32(bw.idx_wq_b.data(), cq_ref.data(), q_idx.data(), T, nI * D, c.q_lora_rank);
  tab.ulps("indexer.q = wq_b c_q", get(be, q_idx), X.floats("indexer.q", {T, nI * D}), 1, r_half_ulp,
           "fp32 here, BF16 there; reads c_q, not u (row 4)");
  {
    auto kpre = poisoned_array<bf16>(be, static_cast<size_t>(T) * D);
    auto kn = poisoned_array<bf16>(be, static_cast<size_t>(T) * D);
    be.linear(bw.idx_wk.data(), u_ref.data(), kpre.data(), T, D, H);
    be.layernorm(kpre.data(), bw.idx_k_norm_w.data(), bw.idx_k_norm_b.data(), kn.data(), T, D,
                 c.index_norm_eps);
    tab.ulps("indexer.k_normed = LayerNorm(wk u)", get_widened(be, kn), X.floats("indexer.k_normed", {T, D}),
             t_norm_gemm, r_ulp, "LayerNorm eps 1e-6, weight and bias, one rounding on both sides");
  }
  auto gate = poisoned_array<float>(be, static_cast<size_t>(T) * D);
  be.linear_f32(bw.idx_gate.data(), u_ref.data(), gate.data(), T, D, H);
  tab.ulps("indexer.gate = compress_gate u", get(be, gate), X.floats("indexer.gate", {T, D}), 1, r_half_ulp,
           "fp32 here, BF16 there");
  auto w_idx = poisoned_array<float>(be, static_cast<size_t>(T) * nI);
  be.linear_f32(bw.idx_weights_proj.data(), u_ref.data(), w_idx.data(), T, nI, H);
  be.scale_f32(w_idx.data(), 1.0f / std::sqrt(static_cast<float>(nI)), T * nI);
  tab.ulps("indexer.weights = weights_proj u / sqrt(n_I)", get(be, w_idx),
           X.floats("indexer.weights", {T, nI}), 1, r_half_ulp, "fp32 here, BF16 linear there");

  // Pool keys through the cache op, rows stored in order from the fixture's k_normed and this
  // side's fp32 gate. transformers rounds the gate, alpha, the products and the sum to BF16
  // (row 7): a few 2^-9 relative roundings, so RMS 1e-2 (measured 2.7e-3).
  drafter::SlotCaches cache(be, dims, 1);
  be.fill_bytes(cache.pool_keys.data(), 0xFF, cache.pool_keys.bytes());
  {
    auto kn_ref = put(be, X.bf16s("indexer.k_normed", {T, D}));
    for (int t = 0; t < T; ++t)
      be.indexer_store(kn_ref.data() + static_cast<size_t>(t) * D, gate.data() + static_cast<size_t>(t) * D,
                       bw.idx_ape.data(), pos.data() + t, cache.k_cache.data(), cache.gate_cache.data(),
                       cache.valid.data(), cache.pool_keys.data(), D, P);
    const std::vector<int32_t> pool_rows = X.ints("indexer.pool_rows", {npools, P});
    int layout = 0;
    for (int j = 0; j < npools; ++j) {
      bool ok = true;
      for (int m = 0; m < P; ++m) ok = ok && pool_rows[static_cast<size_t>(j) * P + m] == j * P + m;
      layout += ok;
    }
    tab.count("indexer.pool_rows = jP .. jP+P-1", layout, npools, "pool layout (row 8)");
  }
  tab.rms("indexer.pool_keys", get(be, cache.pool_keys.data(), static_cast<size_t>(npools) * D),
          X.floats("indexer.pool_keys", {npools, D}), 1e-2,
          "fp32 here; BF16 gate, alpha, products, sum there");

  // ---- indexer scores and selection --------------------------------------------------------------
  auto scores = poisoned_array<float>(be, static_cast<size_t>(T) * maxp);
  for (int t = 0; t < T; ++t)
    be.indexer_scores(q_idx.data() + static_cast<size_t>(t) * nI * D,
                      w_idx.data() + static_cast<size_t>(t) * nI, cache.pool_keys.data(), pos.data() + t,
                      scores.data() + static_cast<size_t>(t) * maxp, nI, D, P, maxp);
  const std::vector<float> sc = get(be, scores);
  const std::vector<float> sc_ref = X.floats("indexer.scores", {T, npools});
  const std::vector<int32_t> n_cand_ref = X.ints("indexer.candidates", {T});
  std::vector<float> sc_mine, sc_theirs;
  int cand_rows = 0;
  for (int t = 0; t < T; ++t) {
    bool same = true;
    int n = 0;
    for (int j = 0; j < maxp; ++j) {
      const float mine = sc[static_cast<size_t>(t) * maxp + j];
      const float theirs =
          j < npools ? sc_ref[static_cast<size_t>(t) * npools + j] : -std::numeric_limits<float>::infinity();
      same = same && (std::isfinite(mine) == std::isfinite(theirs));
      if (std::isfinite(theirs)) {
        sc_mine.push_back(mine);
        sc_theirs.push_back(theirs);
        ++n;
      }
    }
    cand_rows += same && n == n_cand_ref[t];
  }
  tab.count("indexer candidates (last row <= t)", cand_rows, T, "complete pools only (rows 8, 9)");
  // q, K and w are BF16 there, fp32 here, and K differs as measured above: RMS 2e-2 (measured 4.0e-3).
  const reftest::Distance sd =
      tab.rms("indexer.scores (candidates)", sc_mine, sc_theirs, 2e-2, "q, K, w rounded to BF16 there");
  const std::vector<int32_t> canon = X.ints("indexer.selected_rows_canonical", {T, width});
  const std::vector<int32_t> module_rows = X.ints("indexer.selected_rows", {T, width});
  const std::vector<float> margin = X.floats("indexer.boundary_margin", {T});
  {
    // docs/model.md's rule on transformers' own scores: the same fp32 numbers in, so every row must
    // agree exactly, ties included (lower pool index; the fixture has no exact tie at the boundary).
    auto sc_ref_dev = put(be, sc_ref);
    auto sel = poisoned_array<int32_t>(be, static_cast<size_t>(T) * width);
    for (int t = 0; t < T; ++t)
      be.indexer_select(sc_ref_dev.data() + static_cast<size_t>(t) * npools, pos.data() + t,
                        sel.data() + static_cast<size_t>(t) * width, K, P, npools);
    const std::vector<int32_t> s = get(be, sel);
    int same = 0;
    for (int t = 0; t < T; ++t)
      same += std::equal(s.begin() + static_cast<ptrdiff_t>(t) * width, s.begin() + (t + 1) * width,
                         canon.begin() + static_cast<ptrdiff_t>(t) * width);
    tab.count("indexer_select(their scores) == canonical", same, T,
              "bitwise: pools ascending, then the tail, -1 padded (rows 11, 12)");
  }
  auto sel_mine = poisoned_array<int32_t>(be, static_cast<size_t>(T) * width);
  for (int t = 0; t < T; ++t)
    be.indexer_select(scores.data() + static_cast<size_t>(t) * maxp, pos.data() + t,
                      sel_mine.data() + static_cast<size_t>(t) * width, K, P, maxp);
  const std::vector<int32_t> sm = get(be, sel_mine);
  {
    // On this side's scores: a pool can only swap across the boundary when the errors of the two
    // pools add up to the margin, so rows whose margin exceeds twice the largest score error
    // measured above must agree exactly.
    const double need = 2 * sd.max_abs;
    int total = 0, same = 0, same_all = 0, module_same = 0;
    for (int t = 0; t < T; ++t) {
      const bool eq = std::equal(sm.begin() + static_cast<ptrdiff_t>(t) * width, sm.begin() + (t + 1) * width,
                                 canon.begin() + static_cast<ptrdiff_t>(t) * width);
      same_all += eq;
      if (margin[t] > need) {
        ++total;
        same += eq;
      }
      module_same += as_set(sm.data() + static_cast<size_t>(t) * width, width) ==
                     as_set(module_rows.data() + static_cast<size_t>(t) * width, width);
    }
    tab.count("indexer selection (own scores)", same, total,
              str("rows with margin > 2 x ", reftest::num(need / 2)));
    tab.note(str("own selection equals the canonical one on ", same_all, "/", T,
                 " rows, near-tied rows included; equals the module's own output (as a set) on ", module_same,
                 "/", T));
  }

  // ---- sparse attention, a causal prefill --------------------------------------------------------
  // Row t's latent is written before row t attends (its own row is in its tail), over the fixture's
  // selection. transformers rounds scores (twice) and probabilities to BF16 and runs the
  // materialised form; mtplab keeps them fp32 and runs the absorbed form (rows 14-16): RMS 2e-2
  // (measured 5.1e-3).
  std::vector<float> att;
  {
    drafter::SlotCaches kv(be, dims, 1);
    auto ckv_dev = put(be, ckv_ref);
    auto sel_dev = put(be, canon);
    auto q = poisoned_array<bf16>(be, static_cast<size_t>(T) * nh * dq);
    be.linear(bw.q_b.data(), cq_ref.data(), q.data(), T, nh * dq, c.q_lora_rank);
    auto q_abs = poisoned_array<bf16>(be, static_cast<size_t>(nh) * c.kv_lora_rank);
    auto o_lat = poisoned_array<bf16>(be, static_cast<size_t>(nh) * c.kv_lora_rank);
    auto o = poisoned_array<bf16>(be, static_cast<size_t>(nh) * dv);
    auto out = poisoned_array<bf16>(be, static_cast<size_t>(T) * H);
    for (int t = 0; t < T; ++t) {
      be.kv_write(ckv_dev.data() + static_cast<size_t>(t) * c.kv_lora_rank, kv.block_tables.data(),
                  pos.data() + t, kv.kv_slots().cache);
      mtplab::ops::OneRow(be).mla_absorb_q(q.data() + static_cast<size_t>(t) * nh * dq, bw.kv_b.data(),
                                           q_abs.data(), nh, dq, dv, c.kv_lora_rank);
      mtplab::ops::OneRow(be).mla_decode(q_abs.data(), sel_dev.data() + static_cast<size_t>(t) * width, width,
                                         kv.block_tables.data(), kv.kv_slots().cache, o_lat.data(), nh,
                                         c.softmax_scale());
      mtplab::ops::OneRow(be).mla_out_v(o_lat.data(), bw.kv_b.data(), o.data(), nh, dq, dv, c.kv_lora_rank);
      be.linear(bw.o_proj.data(), o.data(), out.data() + static_cast<size_t>(t) * H, 1, H, nh * dv);
    }
    att = get_widened(be, out);
  }
  const std::vector<float> att_ref = X.floats("attn.out", {T, H});
  const std::vector<float> att_dense = X.floats("attn.out_dense", {T, H});
  tab.rms("attn.out (sparse, absorbed)", att, att_ref, 2e-2, "BF16 scores and probabilities there (row 16)");
  {
    // The sparse rows must be told apart from dense causal attention: on every row where the two
    // references differ, this side is nearer the sparse one.
    int differ = 0, nearer = 0;
    for (int t = 0; t < T; ++t) {
      const auto a = rows_of(att, H, t, 1), s = rows_of(att_ref, H, t, 1), d = rows_of(att_dense, H, t, 1);
      if (s == d) continue;
      ++differ;
      nearer += reftest::distance(a, s).rel_rms < reftest::distance(a, d).rel_rms;
    }
    tab.count("attn.out nearer sparse than dense", nearer, differ, "rows where selection changes the output");
  }

  // ---- residual, post-attention norm -------------------------------------------------------------
  // A residual add, a + the fixture's `b_key` against the fixture's `sum_key` (bitwise: one rounding
  // of the exact sum on both sides), then the norm of the fixture's sum against `norm_key`; returns
  // the fixture's sum on the backend (the next residual's input).
  auto residual_then_norm = [&](const bf16* a, const char* b_key, const char* sum_key, const char* sum_label,
                                const char* sum_why, const bf16* norm_w, const char* norm_key,
                                const char* norm_label) {
    auto b_dev = put(be, X.bf16s(b_key, {T, H}));
    auto sum = poisoned_array<bf16>(be, static_cast<size_t>(T) * H);
    be.add(a, b_dev.data(), sum.data(), T * H);
    tab.ulps(sum_label, get_widened(be, sum), X.floats(sum_key, {T, H}), 0, 0, sum_why);
    auto sum_ref = put(be, X.bf16s(sum_key, {T, H}));
    auto normed = poisoned_array<bf16>(be, static_cast<size_t>(T) * H);
    be.rmsnorm(sum_ref.data(), norm_w, normed.data(), T, H, eps);
    tab.ulps(norm_label, get_widened(be, normed), X.floats(norm_key, {T, H}), t_norm, r_ulp, "RMSNorm");
    return sum_ref;
  };
  auto r_ref = residual_then_norm(x0_ref.data(), "attn.out", "block.r", "block.r = x0 + attn",
                                  "bitwise: one rounding of the exact sum on both sides", bw.post_norm.data(),
                                  "block.v", "block.v = post_attention_layernorm(r)");

  // ---- router ------------------------------------------------------------------------------------
  auto v_ref = put(be, X.bf16s("block.v", {T, H}));
  auto logits = poisoned_array<float>(be, static_cast<size_t>(T) * E);
  be.linear_f32(bw.router.data(), v_ref.data(), logits.data(), T, E, H);
  // The same fp32 GEMM of the same BF16 input: only summation order (measured 7.9e-8).
  tab.rms("moe.router_logits = gate v (fp32)", get(be, logits), X.floats("moe.router_logits", {T, E}), 1e-5,
          "fp32 on both sides (row 17)");
  auto idx = poisoned_array<int32_t>(be, static_cast<size_t>(T) * k_top);
  auto wts = poisoned_array<float>(be, static_cast<size_t>(T) * k_top);
  for (int t = 0; t < T; ++t)
    mtplab::ops::OneRow(be).moe_route(logits.data() + static_cast<size_t>(t) * E, bw.router_bias.data(), E,
                                      k_top, c.n_group, c.topk_group, c.routed_scaling_factor,
                                      idx.data() + static_cast<size_t>(t) * k_top,
                                      wts.data() + static_cast<size_t>(t) * k_top);
  {
    // mtplab orders the experts by s' (ties: lower id); the fixture by id. Compare by id.
    const std::vector<int32_t> id = get(be, idx);
    const std::vector<float> wt = get(be, wts);
    const std::vector<int32_t> id_ref = X.ints("moe.topk_ids", {T, k_top});
    const std::vector<float> rmargin = X.floats("moe.router_margin", {T});
    std::vector<float> wt_sorted, wt_ref = X.floats("moe.topk_weights", {T, k_top});
    int total = 0, same = 0;
    for (int t = 0; t < T; ++t) {
      std::vector<std::pair<int32_t, float>> pairs;
      for (int j = 0; j < k_top; ++j)
        pairs.emplace_back(id[static_cast<size_t>(t) * k_top + j], wt[static_cast<size_t>(t) * k_top + j]);
      std::sort(pairs.begin(), pairs.end());
      bool eq = true;
      for (int j = 0; j < k_top; ++j) {
        eq = eq && pairs[j].first == id_ref[static_cast<size_t>(t) * k_top + j];
        wt_sorted.push_back(pairs[j].second);
      }
      // The logits agree to ~1e-7 and sigmoid's slope is <= 1/4, so s' agrees to < 1e-6: a
      // margin above 1e-4 cannot be crossed.
      if (rmargin[t] > 1e-4f) {
        ++total;
        same += eq;
      }
    }
    tab.count("moe.topk_ids (bias chooses)", same, total, "rows with router margin > 1e-4 (rows 17, 18)");
    tab.rms("moe.topk_weights (unbiased s)", wt_sorted, wt_ref, 1e-5, "fp32 on both sides");
  }

  // ---- experts -----------------------------------------------------------------------------------
  // The shared expert is the same SwiGLU as the routed ones, clamp included (row 20). transformers
  // rounds silu and the product separately (one extra 2^-9 relative rounding of each a_r), which
  // moves an output by a few ulps through the I-term down projection: RMS 1e-2 and 8 ulps
  // (measured 3.2e-3 and 4.0). The ulp bound is what catches a missing clamp: the fixture's
  // weights make about 1% of gate/up values pass the limit, and each such value moves its
  // outputs by far more than 8 ulps.
  const double t_expert_ulp = 8;
  const int32_t zero = 0;
  const float one = 1.0f;
  auto idx0 = put(be, std::vector<int32_t>{zero});
  auto w1 = put(be, std::vector<float>{one});
  const ops::ExpertWeights shared{bw.sh_gate.data(), bw.sh_up.data(), bw.sh_down.data(), 0, 1, H, SI};
  const ops::ExpertWeights routed{bw.exp_gate.data(),     bw.exp_up.data(),     bw.exp_down.data(),
                                  bw.first_expert,        bw.num_local_experts, H,
                                  c.moe_intermediate_size};
  auto run_moe = [&](float limit, bool with_routed) {
    auto part = poisoned_array<float>(be, H);
    auto sh = poisoned_array<float>(be, H);
    auto out = poisoned_array<bf16>(be, static_cast<size_t>(T) * H);
    for (int t = 0; t < T; ++t) {
      const bf16* vt = v_ref.data() + static_cast<size_t>(t) * H;
      mtplab::ops::OneRow(be).moe_experts(vt, shared, idx0.data(), w1.data(), 1, limit, sh.data());
      if (with_routed) {
        mtplab::ops::OneRow(be).moe_experts(vt, routed, idx.data() + static_cast<size_t>(t) * k_top,
                                            wts.data() + static_cast<size_t>(t) * k_top, k_top, limit,
                                            part.data());
        be.accumulate_f32(sh.data(), part.data(), H);
        be.to_bf16(part.data(), out.data() + static_cast<size_t>(t) * H, H);
      } else {
        be.to_bf16(sh.data(), out.data() + static_cast<size_t>(t) * H, H);
      }
    }
    return get_widened(be, out);
  };
  const std::vector<float> shared_ref = X.floats("moe.shared_out", {T, H});
  const std::vector<float> moe_ref = X.floats("moe.out", {T, H});
  tab.rms("moe.shared_out (clamped)", run_moe(c.swiglu_limit, false), shared_ref, 1e-2,
          "silu * up rounded twice there", t_expert_ulp);
  {
    const reftest::Distance dn = reftest::distance(run_moe(0.0f, false), shared_ref);
    tab.check("moe.shared_out WITHOUT the clamp differs", dn.max_ulp > t_expert_ulp,
              str("max ", dn.max_ulp, " ulp, max|d| ", dn.max_abs), str("> ", t_expert_ulp, " ulp"),
              "the fixture exercises the shared clamp");
  }
  // Routed experts: the same per-expert rounding gap, plus transformers' BF16 index_add of each
  // weighted expert and of the shared output (row 21) where mtplab sums in fp32 and rounds once:
  // RMS 1e-2 and 8 ulps (measured 4.2e-3 and 4.0).
  tab.rms("moe.out = routed + shared", run_moe(c.swiglu_limit, true), moe_ref, 1e-2, "BF16 index_add there",
          t_expert_ulp);

  // ---- residual, head ----------------------------------------------------------------------------
  residual_then_norm(r_ref.data(), "moe.out", "block.x1", "block.x1 = r + moe", "bitwise, as block.r",
                     f.shared_head_norm.data(), "head.y", "head.y = shared_head.norm(x1)");

  // The head from the fixture's own y: the same BF16 inputs, so a logit can differ only where the
  // two fp32 sums straddle a BF16 rounding boundary (<= 1 ulp). The argmax must agree on every row
  // whose top-2 margin exceeds twice that (2 ulps of the top logit), and on every row whose top-8
  // logits and maximum are bit-identical to the fixture's, near-ties and exact ties included:
  // there the same values meet the same rule (the lowest id wins: reference-check row 25).
  auto check_head = [&](const char* what, const std::vector<bf16>& y_in, int n, const std::string& prefix,
                        const std::vector<int32_t>& argmax_ref) {
    const HeadOut ho = run_head(be, c, f, y_in, n);
    const std::vector<int32_t> top_ids = X.ints(prefix + ".top_ids", {n, 8});
    const std::vector<float> top_logits = X.floats(prefix + ".top_logits", {n, 8});
    const std::vector<float> hmargin = X.floats(prefix + ".margin", {n});
    std::vector<float> mine;
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < 8; ++j)
        mine.push_back(ho.logits[static_cast<size_t>(t) * V + top_ids[static_cast<size_t>(t) * 8 + j]]);
    tab.ulps(str(what, " logits (their top 8)"), mine, top_logits, 1, r_half_ulp, "BF16 logits, same BF16 y");
    int total = 0, same = 0, same_all = 0, ties = 0;
    for (int t = 0; t < n; ++t) {
      const bool eq = ho.best[t].index == argmax_ref[t];
      same_all += eq;
      bool identical = ho.best[t].value == top_logits[static_cast<size_t>(t) * 8];
      for (int j = 0; j < 8; ++j)
        identical =
            identical && mine[static_cast<size_t>(t) * 8 + j] == top_logits[static_cast<size_t>(t) * 8 + j];
      const double ulp = bf16_ulp(top_logits[static_cast<size_t>(t) * 8]);
      ties += hmargin[t] == 0;
      if (hmargin[t] > 2 * ulp || identical) {
        ++total;
        same += eq;
      }
    }
    tab.count(str(what, " argmax"), same, total, "margin > 2 ulp, or identical top-8 logits");
    tab.note(str(what, " argmax agrees on ", same_all, "/", n, " rows (", ties, " with an exact top-2 tie)"));
  };
  check_head("head", X.bf16s("head.y", {T, H}), T, "head", X.ints("head.argmax", {T}));
  {
    const std::vector<int32_t> chain_tokens = X.ints("chain.input_tokens", {R.chain});
    const std::vector<int32_t> chain_argmax = X.ints("chain.argmax", {R.chain});
    const std::vector<int32_t> head_argmax = X.ints("head.argmax", {T});
    bool linked = chain_tokens[0] == head_argmax[T - 1];
    for (int i = 0; i + 1 < R.chain; ++i) linked = linked && chain_tokens[i + 1] == chain_argmax[i];
    tab.check("chain.input_tokens = previous drafts", linked, linked ? "linked" : "not linked", "exact",
              "draft i+1 embeds draft i (docs/model.md)");
    check_head("chain", X.bf16s("chain.y", {R.chain, H}), R.chain, "chain", chain_argmax);
  }
  finish(tab, start);
}

// =====================================================================================================
// The Block over the fixture rows, then the head and the chained drafts.
// =====================================================================================================

TEST_F(Reference, BlockMatchesTransformers) {
  const int T = R.T, H = c.hidden, width = c.selection_width(), rows = R.T + R.chain;
  const drafter::BlockDims dims = drafter::block_dims(c, 1, 0, ops::KvDtype::bf16);
  const Front f(be, R.w);
  drafter::Block block(be, nullptr, dims, drafter::upload_block_weights(be, R.w));
  drafter::SlotCaches cache(be, dims, 1);
  block.reserve(1);
  auto slot0 = put(be, std::vector<int32_t>{0});
  PieceTable tab(str("Block::forward over the fixture rows (input front.x0), head, chain: ", R.provenance));

  std::vector<int32_t> positions(static_cast<size_t>(c.max_seq_len));
  std::iota(positions.begin(), positions.end(), 0);
  auto pos = put(be, positions);
  auto x0_ref = put(be, X.bf16s("front.x0", {T, H}));
  auto x1 = poisoned_array<bf16>(be, static_cast<size_t>(rows) * H);
  auto y = poisoned_array<bf16>(be, static_cast<size_t>(rows) * H);
  std::vector<int32_t> sel(static_cast<size_t>(T) * width);
  for (int t = 0; t < T; ++t) {
    block.forward(ops::RowBatch{slot0.data(), pos.data() + t, 1, 1},
                  x0_ref.data() + static_cast<size_t>(t) * H, cache, x1.data() + static_cast<size_t>(t) * H);
    const std::vector<int32_t> s = get(be, block.selection(), static_cast<size_t>(width));
    std::copy(s.begin(), s.end(), sel.begin() + static_cast<ptrdiff_t>(t) * width);
  }
  {
    const std::vector<uint8_t> valid = get(be, cache.valid);
    const auto held = std::count(valid.begin(), valid.end(), uint8_t{1});
    tab.check("cache rows after the prefill", held == T && valid[static_cast<size_t>(T) - 1] == 1, str(held),
              str(T), "dense rows, one per forward");
  }

  // Chained rows: draft i+1 embeds draft i (the fixture's chain.input_tokens, checked above to be
  // the previous drafts) and recycles this side's y of the row before (post shared_head.norm).
  const std::vector<int32_t> chain_tokens = X.ints("chain.input_tokens", {R.chain});
  auto chain_tok = put(be, chain_tokens);
  be.rmsnorm(x1.data(), f.shared_head_norm.data(), y.data(), T, H, c.rms_norm_eps);
  for (int i = 0; i < R.chain; ++i) {
    const size_t row = static_cast<size_t>(T + i) * H;
    auto x0 = poisoned_array<bf16>(be, H);
    front_row(be, c, f, chain_tok.data() + i, y.data() + row - H, x0.data());
    block.forward(ops::RowBatch{slot0.data(), pos.data() + T + i, 1, 1}, x0.data(), cache, x1.data() + row);
    be.rmsnorm(x1.data() + row, f.shared_head_norm.data(), y.data() + row, 1, H, c.rms_norm_eps);
  }
  const std::vector<bf16> x1_all = get(be, x1), y_all = get(be, y);

  // Selections: the block's indexer reads its own u, c_q and k_normed (each within the piece
  // tolerances above of transformers'), so its scores carry the piece error (measured 1.0e-2 at
  // most) plus what the 1-ulp differences of u and c_q add through the projections; 2e-2 bounds
  // both. Rows whose margin exceeds twice that must select exactly the canonical rows.
  const double t_score_e2e = 2e-2;
  {
    const std::vector<int32_t> canon = X.ints("indexer.selected_rows_canonical", {T, width});
    const std::vector<float> margin = X.floats("indexer.boundary_margin", {T});
    int total = 0, same = 0, same_all = 0;
    for (int t = 0; t < T; ++t) {
      const bool eq =
          std::equal(sel.begin() + static_cast<ptrdiff_t>(t) * width, sel.begin() + (t + 1) * width,
                     canon.begin() + static_cast<ptrdiff_t>(t) * width);
      same_all += eq;
      if (margin[t] > 2 * t_score_e2e) {
        ++total;
        same += eq;
      }
    }
    tab.count("Block selection", same, total, str("rows with margin > 2 x ", t_score_e2e));
    tab.note(str("Block selection equals the canonical one on ", same_all, "/", T,
                 " rows, near-tied rows included"));
  }

  // x1 and y compound every piece of the block, and mtplab rounds x + attn and r + moe once where
  // transformers rounds attn and moe first (reference-check rows 16, 21): kRowRel / kChainRel.
  const std::vector<float> x1_ref = X.floats("block.x1", {T, H}), y_ref = X.floats("head.y", {T, H});
  tab.rms("Block x1 = x0 + attn + moe", rows_of(widen(x1_all), H, 0, T), x1_ref, kRowRel, "compounded block",
          kRowUlp);
  tab.rms("Block y = shared_head.norm(x1)", rows_of(widen(y_all), H, 0, T), y_ref, kRowRel,
          "compounded block + norm", kRowUlp);
  tab.rms("chain y (3 rows, recycled y)", rows_of(widen(y_all), H, T, R.chain),
          X.floats("chain.y", {R.chain, H}), kChainRel, "compounded over the chain", kChainUlp);

  // The head on this side's y against the fixture's argmax. The logit error is measured against
  // the logits of the fixture's own y (which the pieces test shows are bit-identical to
  // transformers') and must stay within kLogitRow / kLogitChain.
  auto head_rows = [&](const char* what, int r0, int n, double t_logit, const std::vector<bf16>& y_theirs,
                       const std::vector<float>& hmargin, const std::vector<int32_t>& argmax_ref) {
    const HeadOut mine = run_head(be, c, f, rows_of(y_all, H, r0, n), n);
    const HeadOut theirs = run_head(be, c, f, y_theirs, n);
    double worst = 0;
    for (size_t i = 0; i < mine.logits.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(mine.logits[i] - theirs.logits[i])));
    tab.check(str(what, " logits from own y"), worst <= t_logit, str("max|d| ", worst), str("<= ", t_logit),
              "y's compounded error through W_lm");
    int total = 0, same = 0, same_all = 0;
    std::string differing;
    for (int t = 0; t < n; ++t) {
      const bool eq = mine.best[t].index == argmax_ref[t];
      same_all += eq;
      if (!eq) differing += str(" row ", r0 + t, " (margin ", hmargin[t], ")");
      if (hmargin[t] > 2 * t_logit) {
        ++total;
        same += eq;
      }
    }
    tab.count(str(what, " argmax from own y"), same, total, str("rows with top-2 margin > 2 x ", t_logit));
    tab.note(str(what, " argmax from own y agrees on ", same_all, "/", n, " rows, near-ties included",
                 differing.empty() ? "" : "; differs at" + differing));
  };
  head_rows("head", 0, T, kLogitRow, X.bf16s("head.y", {T, H}), X.floats("head.margin", {T}),
            X.ints("head.argmax", {T}));
  head_rows("chain", T, R.chain, kLogitChain, X.bf16s("chain.y", {R.chain, H}),
            X.floats("chain.margin", {R.chain}), X.ints("chain.argmax", {R.chain}));
  finish(tab, start);
}

// =====================================================================================================
// MtpDrafter: context rows and a propose from the fixture's tokens and hiddens.
// =====================================================================================================

TEST_F(Reference, DrafterMatchesTransformers) {
  const int T = R.T, H = c.hidden, L = c.kv_lora_rank, D = c.index_head_dim, rows = R.T + R.chain;
  const Front f(be, R.w);
  PieceTable tab(str("MtpDrafter append_rows(0..", T - 2, ") + propose(", 1 + R.chain, "): ", R.provenance));

  const std::vector<int32_t> tokens = X.ints("input.tokens", {T + 1});
  const std::vector<bf16> hidden = X.bf16s("input.hidden", {T, H});
  const std::vector<int32_t> chain_tokens = X.ints("chain.input_tokens", {R.chain});
  std::vector<int32_t> drafts_ref = {X.ints("head.argmax", {T})[T - 1]};
  std::vector<float> margins_ref = {X.floats("head.margin", {T})[T - 1]};
  for (int32_t d : X.ints("chain.argmax", {R.chain})) drafts_ref.push_back(d);
  for (float m : X.floats("chain.margin", {R.chain})) margins_ref.push_back(m);

  // The latent rows of the chained rows as they should be: x0 from the draft's embedding and the
  // fixture's y of the row before (docs/model.md: the recycled hidden is y, post shared_head.norm),
  // then input_layernorm and the latent, on the reference ops.
  std::vector<float> ckv_chain_ref;
  {
    const drafter::BlockWeights bw = drafter::upload_block_weights(be, R.w);
    std::vector<bf16> prev_y = rows_of(X.bf16s("head.y", {T, H}), H, T - 1, 1);
    const std::vector<bf16> chain_y = X.bf16s("chain.y", {R.chain, H});
    for (int i = 0; i < R.chain; ++i) {
      auto tok = put(be, std::vector<int32_t>{chain_tokens[i]});
      auto hid = put(be, prev_y);
      auto x0 = poisoned_array<bf16>(be, H), u = poisoned_array<bf16>(be, H);
      auto pre = poisoned_array<bf16>(be, L), ckv = poisoned_array<bf16>(be, L);
      front_row(be, c, f, tok.data(), hid.data(), x0.data());
      be.rmsnorm(x0.data(), bw.input_norm.data(), u.data(), 1, H, c.rms_norm_eps);
      be.linear(bw.kv_a.data(), u.data(), pre.data(), 1, c.kv_a_rows(), H);
      be.rmsnorm(pre.data(), bw.kv_a_norm.data(), ckv.data(), 1, L, c.rms_norm_eps);
      for (float x : get_widened(be, ckv)) ckv_chain_ref.push_back(x);
      prev_y = rows_of(chain_y, H, i, 1);
    }
  }

  std::vector<bf16> kv_first, k_first;
  std::vector<int32_t> drafts_first;
  for (const drafter::ContextRows arm : {drafter::ContextRows::cache_only, drafter::ContextRows::full}) {
    const std::string tag = drafter::to_string(arm);
    model::MtpWeights w = R.w;
    drafter::DrafterOptions opt;
    opt.context_rows = arm;
    opt.draft_len = 1 + R.chain;
    auto d = drafter::make_drafter(be, nullptr, c, w, opt);
    auto st = d->new_sequence();
    be.fill_bytes(st->caches.kv_slots().cache.data, 0xFF,
                  static_cast<size_t>(c.max_seq_len) * L * sizeof(bf16));
    be.fill_bytes(st->caches.k_cache.data(), 0xFF, st->caches.k_cache.bytes());
    be.fill_bytes(st->caches.pool_keys.data(), 0xFF, st->caches.pool_keys.bytes());
    d->append_rows(*st, tokens.data() + 1, hidden.data(), T - 1, 0);
    const std::vector<int32_t> drafts =
        d->propose(*st, tokens[T], hidden.data() + static_cast<size_t>(T - 1) * H, 1 + R.chain);
    tab.check(str("[", tag, "] rows written"), st->seq_len(0) == rows, str(st->seq_len(0)), str(rows),
              "T-1 context rows + 1 + chain propose rows");
    // A pool of one slot: its block table is the identity, so row t is at offset t.
    const std::vector<bf16> kv =
        get(be, static_cast<const bf16*>(st->caches.kv_slots().cache.data), static_cast<size_t>(rows) * L);
    const std::vector<bf16> kc = get(be, st->caches.k_cache.data(), static_cast<size_t>(rows) * D);

    // The drafter's own front: e and h each 1 ulp from transformers' (2.8e-3 RMS, pieces), which
    // x0 carries, then input_layernorm's and the latent norm's own ulp: ~5e-3 RMS in quadrature
    // (measured 5.9e-3, 3 ulps); 1e-2 and 4 ulps as for a norm of a GEMM. The pool keys add the
    // pool-key piece's 2.7e-3 to k_normed's error (measured 6.8e-3): 1e-2.
    tab.rms(str("[", tag, "] cache c_kv rows 0..", T - 1), rows_of(widen(kv), L, 0, T),
            X.floats("attn.c_kv", {T, L}), 1e-2, "front + input norm + latent", 4);
    tab.rms(str("[", tag, "] cache k_normed rows 0..", T - 1), rows_of(widen(kc), D, 0, T),
            X.floats("indexer.k_normed", {T, D}), 1e-2, "front + input norm + indexer key", 4);
    tab.rms(str("[", tag, "] cache pool keys"),
            get(be, st->caches.pool_keys.data(), static_cast<size_t>(R.pools) * D),
            X.floats("indexer.pool_keys", {R.pools, D}), 1e-2, "as the pool-key piece");
    // Chained rows: the drafter's recycled y carries the block's compounded error (kRowRel for
    // row T-1, growing along the chain as in kChainRel), which hnorm and eh_proj pass with gain
    // <= 1 and the exact embedding half dilutes: 3e-2 and 16 ulps (measured 1.2e-2, 5 ulps).
    // Recycling the pre-norm x1 instead moves h by the shared_head.norm weight (1 + N(0, 0.1^2)).
    tab.rms(str("[", tag, "] cache c_kv chained rows ", T, "..", rows - 1), rows_of(widen(kv), L, T, R.chain),
            ckv_chain_ref, 3e-2, "recycles y, embeds the draft", 16);

    // Draft 0 is the head of context row T-1, drafts 1.. are chained rows.
    int total = 0, same = 0;
    for (size_t i = 0; i < drafts.size(); ++i)
      if (margins_ref[i] > 2 * (i == 0 ? kLogitRow : kLogitChain)) {
        ++total;
        same += drafts[i] == drafts_ref[i];
      }
    tab.count(str("[", tag, "] drafts"), same, total,
              str("margin > 2 x ", kLogitRow, " (draft 0), 2 x ", kLogitChain, " (chained)"));
    tab.note(str("[", tag, "] drafts ", join(drafts, " "), ", fixture ", join(drafts_ref, " ")));
    if (kv_first.empty()) {
      kv_first = kv;
      k_first = kc;
      drafts_first = drafts;
    } else {
      const bool same_cache = kv == kv_first && kc == k_first;
      tab.check("cache_only and full leave the same cache", same_cache,
                same_cache ? "bitwise equal" : "differ", "bitwise",
                "docs/model.md: the arms differ only in time");
      tab.check("cache_only and full draft the same", drafts == drafts_first, join(drafts, " "),
                join(drafts_first, " "), "same cache, same drafts");
    }
  }
  finish(tab, start);
}
