// KernelPolicy (ops/kernel_policy.hpp): every value of every field prints and parses back to
// itself, a bad value is an Error naming the field, the value and the choices, the defaults are
// what runs with nothing configured, env_overrides takes each MTPLAB_* variable strictly and says
// what it took, and the CPU backend stores the policy it is given (and refuses a malformed one).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "ops/kernel_policy.hpp"
#include "ops/kernel_record.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops {
namespace {

/// The message of the Error `f` throws ("" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Every field with every text it accepts as canonical (the first is the default's).
const std::vector<std::pair<std::string, std::vector<std::string>>> kCanonical = {
    {"gemv_variant", {"auto", "v1", "rows4", "occ"}},
    {"gemv_split", {"auto", "1", "2", "4", "8"}},
    {"mla_decode", {"v2", "v1"}},
    {"pdl", {"on", "off"}},
    {"nccl_blocking", {"on", "off"}},
    {"head_gemm", {"auto", "mma", "cublaslt", "gemv", "wgmma"}},
    {"mla_batch_splits", {"auto", "1", "3", "64"}},
    {"moe_pipeline", {"auto", "v1", "slots", "ringpf"}},
    {"rows_linear", {"auto", "cublaslt", "gemv"}},
    {"mla_batch", {"auto", "tiles", "shared2", "shared32"}},
    {"indexer_scores", {"auto", "pools4", "tiled"}},
};

/// The MTPLAB_* variables env_overrides reads, in field order.
const std::vector<std::pair<std::string, std::string>> kVariables = {
    {"gemv_variant", "MTPLAB_GEMV_VARIANT"},
    {"gemv_split", "MTPLAB_GEMV_SPLIT"},
    {"mla_decode", "MTPLAB_MLA_DECODE"},
    {"pdl", "MTPLAB_CUDA_PDL"},
    {"nccl_blocking", "MTPLAB_NCCL_BLOCKING"},
    {"head_gemm", "MTPLAB_HEAD_GEMM"},
    {"mla_batch_splits", "MTPLAB_MLA_BATCH_SPLITS"},
    {"moe_pipeline", "MTPLAB_MOE_PIPELINE"},
    {"rows_linear", "MTPLAB_ROWS_LINEAR"},
    {"mla_batch", "MTPLAB_MLA_BATCH"},
    {"indexer_scores", "MTPLAB_INDEXER_SCORES"},
};

/// The variables of retired fields: env_overrides refuses them when set.
const std::vector<std::pair<std::string, std::string>> kRetiredVariables = {
    {"indexer_select", "MTPLAB_INDEXER_SELECT"},
    {"mla_clusters", "MTPLAB_MLA_CLUSTERS"},
};

/// Unsets every policy variable (the retired ones too) for the test's lifetime and restores the
/// values found before.
class CleanEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::pair<std::string, std::string>> all = kVariables;
    all.insert(all.end(), kRetiredVariables.begin(), kRetiredVariables.end());
    for (const auto& [field, var] : all) {
      const char* v = std::getenv(var.c_str());
      if (v) saved_[var] = v;
      unsetenv(var.c_str());
    }
  }
  void TearDown() override {
    std::vector<std::pair<std::string, std::string>> all = kVariables;
    all.insert(all.end(), kRetiredVariables.begin(), kRetiredVariables.end());
    for (const auto& [field, var] : all) {
      const auto it = saved_.find(var);
      if (it != saved_.end()) {
        setenv(var.c_str(), it->second.c_str(), 1);
      } else {
        unsetenv(var.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST(KernelPolicy, DefaultsAreWhatRunsWithNothingConfigured) {
  const KernelPolicy p;
  EXPECT_EQ(p.gemv_variant, GemvVariant::automatic);
  EXPECT_EQ(p.gemv_split, 0);
  EXPECT_EQ(p.mla_decode, MlaDecode::v2);
  EXPECT_TRUE(p.pdl);
  EXPECT_TRUE(p.nccl_blocking);
  EXPECT_EQ(p.head_gemm, HeadGemm::automatic);
  EXPECT_EQ(p.mla_batch_splits, 0);
  EXPECT_EQ(p.moe_pipeline, MoePipeline::automatic);
  EXPECT_EQ(p.rows_linear, RowsLinear::automatic);
  EXPECT_EQ(p.mla_batch, MlaBatch::automatic);
  EXPECT_EQ(p.indexer_scores, IndexerScores::automatic);
  for (const auto& [field, texts] : kCanonical) EXPECT_EQ(field_text(p, field), texts.front()) << field;
  EXPECT_EQ(to_string(p),
            "gemv_variant=auto gemv_split=auto mla_decode=v2 pdl=on nccl_blocking=on head_gemm=auto "
            "mla_batch_splits=auto moe_pipeline=auto rows_linear=auto mla_batch=auto indexer_scores=auto");
}

TEST(KernelPolicy, NamedListsEveryFieldInTheFixedOrder) {
  const std::vector<std::string_view>& fields = kernel_policy_fields();
  ASSERT_EQ(fields.size(), kCanonical.size());
  KernelPolicy p;
  p.gemv_variant = GemvVariant::rows4;
  p.mla_batch_splits = 16;
  p.pdl = false;
  const auto n = named(p);
  ASSERT_EQ(n.size(), kCanonical.size());
  for (size_t i = 0; i < n.size(); ++i) {
    EXPECT_EQ(fields[i], kCanonical[i].first);
    EXPECT_EQ(n[i].first, kCanonical[i].first);
    EXPECT_EQ(n[i].second, field_text(p, n[i].first));
  }
  EXPECT_EQ(n[0].second, "rows4");
  EXPECT_EQ(n[3].second, "off");
  EXPECT_EQ(n[6].second, "16");
}

TEST(KernelPolicy, EveryValueRoundTripsAndChangesOnlyItsField) {
  for (const auto& [field, texts] : kCanonical) {
    for (const std::string& text : texts) {
      SCOPED_TRACE(field + " = " + text);
      KernelPolicy p;
      parse_field(p, field, text);
      EXPECT_EQ(field_text(p, field), text);
      KernelPolicy again;
      parse_field(again, field, field_text(p, field));
      EXPECT_EQ(again, p);
      EXPECT_EQ(p == KernelPolicy{}, text == texts.front());
      for (const auto& [other, other_texts] : kCanonical)
        if (other != field) {
          EXPECT_EQ(field_text(p, other), other_texts.front()) << other;
        }
    }
  }
}

TEST(KernelPolicy, ZeroIsTheAutomaticCount) {
  KernelPolicy p;
  p.gemv_split = 4;
  p.mla_batch_splits = 8;
  parse_field(p, "gemv_split", "0");
  parse_field(p, "mla_batch_splits", "0");
  EXPECT_EQ(p, KernelPolicy{});
  EXPECT_EQ(field_text(p, "gemv_split"), "auto");
  EXPECT_EQ(field_text(p, "mla_batch_splits"), "auto");
}

TEST(KernelPolicy, EqualityComparesEveryField) {
  const KernelPolicy base;
  for (const auto& [field, texts] : kCanonical) {
    KernelPolicy p;
    parse_field(p, field, texts.back());
    EXPECT_NE(p, base) << field;
    EXPECT_FALSE(p == base) << field;
  }
}

TEST(KernelPolicy, ABadValueNamesTheFieldTheValueAndTheChoices) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"gemv_variant", "rows3"},
      {"gemv_variant", "V1"},
      {"gemv_variant", ""},
      {"gemv_split", "3"},
      {"gemv_split", "16"},
      {"gemv_split", "-1"},
      {"gemv_split", "2x"},
      {"gemv_split", " 2"},
      {"mla_decode", "v3"},
      {"mla_decode", "auto"},
      {"pdl", "1"},
      {"pdl", "true"},
      {"nccl_blocking", "0"},
      {"nccl_blocking", "ON"},
      {"head_gemm", "lt"},
      {"head_gemm", "v1"},
      {"head_gemm", "GEMV"},
      {"mla_batch_splits", "65"},
      {"mla_batch_splits", "-1"},
      {"moe_pipeline", "v2"},
      {"moe_pipeline", "Ring"},
      {"rows_linear", "cublas"},
      {"rows_linear", "mma"},
      {"rows_linear", "GEMV"},
      {"mla_batch", "v3"},
      {"mla_batch", "Shared"},
      {"mla_batch", "shared4"},
      {"indexer_scores", "v1"},
      {"indexer_scores", "Tiled"},
      {"indexer_scores", "pools16"},
  };
  for (const auto& [field, text] : bad) {
    SCOPED_TRACE(field + " = \"" + text + "\"");
    KernelPolicy p;
    const std::string msg = error_of([&] { parse_field(p, field, text); });
    EXPECT_TRUE(contains(msg, field)) << msg;
    EXPECT_TRUE(contains(msg, "\"" + text + "\"")) << msg;
    EXPECT_TRUE(contains(msg, field_choices(field))) << msg;
    EXPECT_EQ(p, KernelPolicy{}) << "a refused value must leave the policy as it was";
  }
  // The choices a message lists are the canonical texts (mla_batch_splits: a range, "1 .. 64").
  for (const auto& [field, texts] : kCanonical) {
    const std::string choices = field_choices(field);
    for (const std::string& t : texts) {
      if (field == "mla_batch_splits" && t == "3") continue;
      EXPECT_TRUE(contains(choices, t)) << field << ": " << choices;
    }
  }
}

TEST(KernelPolicy, AnUnknownFieldListsTheFields) {
  KernelPolicy p;
  for (const auto& f : std::vector<std::function<void()>>{[&] { parse_field(p, "gemv_varient", "v1"); },
                                                          [&] { (void)field_text(p, "split"); },
                                                          [&] { (void)field_choices("pdl_on"); }}) {
    const std::string msg = error_of(f);
    EXPECT_TRUE(contains(msg, "unknown field")) << msg;
    for (const auto& [field, texts] : kCanonical) EXPECT_TRUE(contains(msg, field)) << msg;
  }
}

TEST(KernelPolicy, ValidateRefusesAHandBuiltValueOutsideItsChoices) {
  EXPECT_NO_THROW(validate(KernelPolicy{}));
  KernelPolicy split;
  split.gemv_split = 3;
  const std::string msg = error_of([&] { validate(split); });
  EXPECT_TRUE(contains(msg, "gemv_split")) << msg;
  EXPECT_TRUE(contains(msg, field_choices("gemv_split"))) << msg;
  KernelPolicy splits;
  splits.mla_batch_splits = kMaxMlaBatchSplits + 1;
  EXPECT_TRUE(contains(error_of([&] { validate(splits); }), "mla_batch_splits"));
  splits.mla_batch_splits = -1;
  EXPECT_TRUE(contains(error_of([&] { validate(splits); }), "mla_batch_splits"));
  KernelPolicy variant;
  variant.gemv_variant = static_cast<GemvVariant>(17);
  EXPECT_TRUE(contains(error_of([&] { validate(variant); }), "gemv_variant"));
  KernelPolicy pipeline;
  pipeline.moe_pipeline = static_cast<MoePipeline>(4);
  EXPECT_TRUE(contains(error_of([&] { validate(pipeline); }), "moe_pipeline"));
  KernelPolicy head;
  head.head_gemm = HeadGemm::gemv;
  EXPECT_NO_THROW(validate(head));
  head.head_gemm = HeadGemm::wgmma;
  EXPECT_NO_THROW(validate(head));
  head.head_gemm = static_cast<HeadGemm>(5);
  EXPECT_TRUE(contains(error_of([&] { validate(head); }), "head_gemm"));
  KernelPolicy batch;
  batch.mla_batch = MlaBatch::shared32;
  EXPECT_NO_THROW(validate(batch));
  batch.mla_batch = static_cast<MlaBatch>(4);
  EXPECT_TRUE(contains(error_of([&] { validate(batch); }), "mla_batch"));
  KernelPolicy scores;
  scores.indexer_scores = IndexerScores::tiled;
  EXPECT_NO_THROW(validate(scores));
  scores.indexer_scores = static_cast<IndexerScores>(3);
  EXPECT_TRUE(contains(error_of([&] { validate(scores); }), "indexer_scores"));
}

TEST(KernelPolicy, CpuBackendStoresThePolicyAndRefusesAMalformedOne) {
  auto be = make_cpu_backend();
  EXPECT_EQ(be->kernel_policy(), KernelPolicy{});
  KernelPolicy p;
  p.gemv_variant = GemvVariant::occ;
  p.mla_decode = MlaDecode::v1;
  p.nccl_blocking = false;
  be->set_kernel_policy(p);
  EXPECT_EQ(be->kernel_policy(), p);
  KernelPolicy bad = p;
  bad.gemv_split = 5;
  EXPECT_THROW(be->set_kernel_policy(bad), Error);
  EXPECT_EQ(be->kernel_policy(), p) << "a refused policy must leave the backend's as it was";
}

using KernelPolicyEnv = CleanEnv;

TEST_F(KernelPolicyEnv, NothingSetLeavesTheBaseAndReportsNothing) {
  KernelPolicy base;
  base.gemv_variant = GemvVariant::v1;
  base.mla_batch_splits = 4;
  base.pdl = false;
  std::vector<std::string> overridden;
  EXPECT_EQ(env_overrides(base, &overridden), base);
  EXPECT_TRUE(overridden.empty());
  // Empty values count as unset (core/env.hpp).
  for (const auto& [field, var] : kVariables) setenv(var.c_str(), "", 1);
  EXPECT_EQ(env_overrides(base, &overridden), base);
  EXPECT_TRUE(overridden.empty());
  EXPECT_EQ(env_overrides(KernelPolicy{}, nullptr), KernelPolicy{});
}

TEST_F(KernelPolicyEnv, EachVariableOverridesItsFieldAndIsReported) {
  struct Case {
    std::string var, value, field, text;
  };
  const std::vector<Case> cases = {
      {"MTPLAB_GEMV_VARIANT", "rows4", "gemv_variant", "rows4"},
      {"MTPLAB_GEMV_VARIANT", "auto", "gemv_variant", "auto"},
      {"MTPLAB_GEMV_SPLIT", "4", "gemv_split", "4"},
      {"MTPLAB_MLA_DECODE", "v1", "mla_decode", "v1"},
      {"MTPLAB_CUDA_PDL", "0", "pdl", "off"},
      {"MTPLAB_CUDA_PDL", "1", "pdl", "on"},
      {"MTPLAB_NCCL_BLOCKING", "0", "nccl_blocking", "off"},
      {"MTPLAB_HEAD_GEMM", "cublaslt", "head_gemm", "cublaslt"},
      {"MTPLAB_HEAD_GEMM", "gemv", "head_gemm", "gemv"},
      {"MTPLAB_MLA_BATCH_SPLITS", "4", "mla_batch_splits", "4"},
      {"MTPLAB_MOE_PIPELINE", "ringpf", "moe_pipeline", "ringpf"},
      {"MTPLAB_MOE_PIPELINE", "auto", "moe_pipeline", "auto"},
      {"MTPLAB_ROWS_LINEAR", "gemv", "rows_linear", "gemv"},
      {"MTPLAB_ROWS_LINEAR", "cublaslt", "rows_linear", "cublaslt"},
      {"MTPLAB_MLA_BATCH", "shared2", "mla_batch", "shared2"},
      {"MTPLAB_MLA_BATCH", "tiles", "mla_batch", "tiles"},
      {"MTPLAB_INDEXER_SCORES", "tiled", "indexer_scores", "tiled"},
      {"MTPLAB_INDEXER_SCORES", "pools4", "indexer_scores", "pools4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.var + "=" + c.value);
    setenv(c.var.c_str(), c.value.c_str(), 1);
    KernelPolicy base;
    base.gemv_split = 2;  // a non-default base: the fields left alone keep their values
    if (c.field == "gemv_split") base.mla_batch_splits = 8;
    std::vector<std::string> overridden;
    const KernelPolicy got = env_overrides(base, &overridden);
    EXPECT_EQ(field_text(got, c.field), c.text);
    for (const auto& [field, texts] : kCanonical)
      if (field != c.field) {
        EXPECT_EQ(field_text(got, field), field_text(base, field)) << field;
      }
    // Reported even where the value equals the base's (MTPLAB_CUDA_PDL=1, MTPLAB_GEMV_VARIANT=auto):
    // the environment decided the field.
    ASSERT_EQ(overridden.size(), 1u);
    EXPECT_EQ(overridden[0], c.field + "=" + c.text + " (" + c.var + ")");
    unsetenv(c.var.c_str());
  }
}

TEST_F(KernelPolicyEnv, EveryVariableAtOnceIsReportedInFieldOrder) {
  setenv("MTPLAB_NCCL_BLOCKING", "0", 1);
  setenv("MTPLAB_GEMV_VARIANT", "occ", 1);
  setenv("MTPLAB_CUDA_PDL", "0", 1);
  setenv("MTPLAB_GEMV_SPLIT", "1", 1);
  setenv("MTPLAB_MLA_DECODE", "v1", 1);
  setenv("MTPLAB_MLA_BATCH_SPLITS", "2", 1);
  setenv("MTPLAB_HEAD_GEMM", "mma", 1);
  setenv("MTPLAB_MOE_PIPELINE", "v1", 1);
  setenv("MTPLAB_ROWS_LINEAR", "gemv", 1);
  setenv("MTPLAB_MLA_BATCH", "tiles", 1);
  setenv("MTPLAB_INDEXER_SCORES", "pools4", 1);
  std::vector<std::string> overridden;
  const KernelPolicy got = env_overrides(KernelPolicy{}, &overridden);
  KernelPolicy want;
  want.gemv_variant = GemvVariant::occ;
  want.gemv_split = 1;
  want.mla_decode = MlaDecode::v1;
  want.pdl = false;
  want.nccl_blocking = false;
  want.head_gemm = HeadGemm::mma;
  want.mla_batch_splits = 2;
  want.moe_pipeline = MoePipeline::v1;
  want.rows_linear = RowsLinear::gemv;
  want.mla_batch = MlaBatch::tiles;
  want.indexer_scores = IndexerScores::pools4;
  EXPECT_EQ(got, want) << to_string(got);
  const std::vector<std::string> expected = {"gemv_variant=occ (MTPLAB_GEMV_VARIANT)",
                                             "gemv_split=1 (MTPLAB_GEMV_SPLIT)",
                                             "mla_decode=v1 (MTPLAB_MLA_DECODE)",
                                             "pdl=off (MTPLAB_CUDA_PDL)",
                                             "nccl_blocking=off (MTPLAB_NCCL_BLOCKING)",
                                             "head_gemm=mma (MTPLAB_HEAD_GEMM)",
                                             "mla_batch_splits=2 (MTPLAB_MLA_BATCH_SPLITS)",
                                             "moe_pipeline=v1 (MTPLAB_MOE_PIPELINE)",
                                             "rows_linear=gemv (MTPLAB_ROWS_LINEAR)",
                                             "mla_batch=tiles (MTPLAB_MLA_BATCH)",
                                             "indexer_scores=pools4 (MTPLAB_INDEXER_SCORES)"};
  EXPECT_EQ(overridden, expected);
}

TEST_F(KernelPolicyEnv, ABadValueIsAnErrorNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"MTPLAB_GEMV_VARIANT", "rows3"}, {"MTPLAB_GEMV_SPLIT", "3"},        {"MTPLAB_GEMV_SPLIT", "auto"},
      {"MTPLAB_GEMV_SPLIT", "0"},       {"MTPLAB_MLA_DECODE", "v3"},       {"MTPLAB_GEMV_VARIANT", "rows2"},
      {"MTPLAB_MLA_BATCH", "shared"},   {"MTPLAB_MLA_BATCH_SPLITS", "65"}, {"MTPLAB_CUDA_PDL", "off"},
      {"MTPLAB_CUDA_PDL", "2"},         {"MTPLAB_NCCL_BLOCKING", "on"},    {"MTPLAB_MOE_PIPELINE", "v2"},
      {"MTPLAB_ROWS_LINEAR", "mma"},    {"MTPLAB_ROWS_LINEAR", "1"},       {"MTPLAB_HEAD_GEMM", "rows"},
      {"MTPLAB_MLA_BATCH", "v3"},       {"MTPLAB_INDEXER_SCORES", "v2"},
  };
  for (const auto& [var, value] : bad) {
    SCOPED_TRACE(var + "=" + value);
    setenv(var.c_str(), value.c_str(), 1);
    std::vector<std::string> overridden;
    const std::string msg = error_of([&] { (void)env_overrides(KernelPolicy{}, &overridden); });
    EXPECT_TRUE(contains(msg, var + "=" + value)) << msg;
    unsetenv(var.c_str());
  }
}

// The kernels kept only for comparison are no policy values and the retired fields no fields:
// naming one is an Error that lists the choices (or fields) and says where it went, and a retired
// variable that is set is an Error too (it would otherwise be silently ignored).
TEST(KernelPolicy, AComparisonKernelOrARetiredFieldSaysWhereItWent) {
  const std::vector<std::tuple<std::string, std::string, std::string>> moved = {
      {"gemv_variant", "rows2", "dev/cuda/gemv.cu"}, {"gemv_variant", "fp8split", "dev/cuda/gemv.cu"},
      {"mla_batch", "shared", "dev/cuda/mla.cu"},    {"moe_pipeline", "spread", "dev/cuda/moe.cu"},
      {"moe_pipeline", "regs", "dev/cuda/moe.cu"},   {"moe_pipeline", "ring", "dev/cuda/moe.cu"},
      {"moe_pipeline", "split", "dev/cuda/moe.cu"},
  };
  for (const auto& [field, text, where] : moved) {
    KernelPolicy p;
    const std::string msg = error_of([&] { parse_field(p, field, text); });
    EXPECT_TRUE(contains(msg, field_choices(field))) << msg;
    EXPECT_TRUE(contains(msg, where)) << msg;
    EXPECT_EQ(p, KernelPolicy{});
  }
  KernelPolicy p;
  for (const auto& [field, where] : std::vector<std::pair<std::string, std::string>>{
           {"indexer_select", "dev/cuda/indexer.cu"}, {"mla_clusters", "mla_batch_splits"}}) {
    const std::string msg = error_of([&] { parse_field(p, field, "v1"); });
    EXPECT_TRUE(contains(msg, "unknown field")) << msg;
    EXPECT_TRUE(contains(msg, where)) << msg;
  }
  // A value no field ever had gets no note.
  EXPECT_FALSE(contains(error_of([&] { parse_field(p, "gemv_variant", "rows8"); }), "retired"));
}

// A comparison pipeline named in its variable is refused the same way: the choices and the
// playground it went to, the policy untouched once the variable is unset.
TEST_F(KernelPolicyEnv, AComparisonKernelInAVariableSaysWhereItWent) {
  for (const std::string value : {"spread", "regs", "ring", "split"}) {
    setenv("MTPLAB_MOE_PIPELINE", value.c_str(), 1);
    const std::string msg = error_of([] { (void)env_overrides(KernelPolicy{}, nullptr); });
    EXPECT_TRUE(contains(msg, "MTPLAB_MOE_PIPELINE=" + value)) << msg;
    EXPECT_TRUE(contains(msg, field_choices("moe_pipeline"))) << msg;
    EXPECT_TRUE(contains(msg, "dev/cuda/moe.cu")) << msg;
    unsetenv("MTPLAB_MOE_PIPELINE");
  }
  setenv("MTPLAB_MOE_PIPELINE", "ringpf", 1);
  KernelPolicy want;
  want.moe_pipeline = MoePipeline::ringpf;
  EXPECT_EQ(env_overrides(KernelPolicy{}, nullptr), want);
  unsetenv("MTPLAB_MOE_PIPELINE");
}

TEST_F(KernelPolicyEnv, ARetiredVariableThatIsSetIsAnError) {
  for (const auto& [field, var] : kRetiredVariables) {
    setenv(var.c_str(), "1", 1);
    const std::string msg = error_of([] { (void)env_overrides(KernelPolicy{}, nullptr); });
    EXPECT_TRUE(contains(msg, var)) << msg;
    EXPECT_TRUE(contains(msg, "retired")) << msg;
    unsetenv(var.c_str());
    EXPECT_EQ(env_overrides(KernelPolicy{}, nullptr), KernelPolicy{}) << var << " unset";
  }
}

// KernelRecord (ops/kernel_record.hpp): per op the distinct kernels in the order first seen, ops
// listed in name order, equal texts from other pointers counted as one; clear() empties it; the
// CPU reference notes "cpu" under each op whose CUDA kernel a rule picks.
TEST(KernelRecord, ListsEachOpsDistinctKernelsInNameOrder) {
  KernelRecord r;
  EXPECT_TRUE(r.empty());
  r.note("mla_decode_batch", "shared2");
  r.note("head_argmax_batch", "cublaslt");
  r.note("mla_decode_batch", "shared2");
  const std::string again = "head_argmax_batch";  // another pointer, the same text
  const std::string mma = "mma";
  r.note(again.c_str(), mma.c_str());
  r.note("head_argmax_batch", "cublaslt");
  r.note("mla_decode_batch", "v1");
  const std::vector<std::pair<std::string, std::string>> want = {{"head_argmax_batch", "cublaslt,mma"},
                                                                 {"mla_decode_batch", "shared2,v1"}};
  EXPECT_EQ(r.named(), want);
  EXPECT_EQ(r.text(), "head_argmax_batch=cublaslt,mma mla_decode_batch=shared2,v1");
  r.clear();
  EXPECT_TRUE(r.empty());
  EXPECT_TRUE(r.named().empty());
  r.note("gemv_bf16", "rows4 split 1");
  EXPECT_EQ(r.text(), "gemv_bf16=rows4 split 1");
}

TEST(KernelRecord, TheCpuReferenceNotesCpu) {
  auto be = make_cpu_backend();
  std::vector<bf16> W(64 * 32, to_bf16(0.5f)), x(32, to_bf16(1.0f)), y(64);
  std::vector<float> yf(64);
  EXPECT_TRUE(be->kernels_chosen().empty());
  be->linear(W.data(), x.data(), y.data(), 1, 64, 32);
  be->linear(W.data(), x.data(), y.data(), 1, 64, 32, RowsMode::batched);
  be->linear_f32(W.data(), x.data(), yf.data(), 1, 64, 32);
  be->rmsnorm(x.data(), x.data(), y.data(), 1, 32, 1e-6f);  // no kernel choice on CUDA: not noted
  EXPECT_EQ(be->kernels_chosen().text(), "linear=cpu linear_f32=cpu");
  be->reset_kernels_chosen();
  EXPECT_TRUE(be->kernels_chosen().empty());
}

}  // namespace
}  // namespace mtplab::ops
