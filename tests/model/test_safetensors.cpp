// Safetensors: round trips (file and sharded directory), strict header checks, FP8 block
// scales, and the MTP loader on exported synthetic weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "model/safetensors.hpp"
#include "model/weights.hpp"
#include "weights_compare.hpp"

using namespace mtplab;
using namespace mtplab::model;
namespace fs = std::filesystem;

namespace {

using mtplab::test::error_of;
using mtplab::test::expect_has;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("mtplab-model") {}
};

std::vector<bf16> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<bf16> v(n);
  for (auto& x : v) x = to_bf16(d(rng));
  return v;
}

std::vector<float> random_f32(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <typename T>
TensorView view(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& data) {
  return TensorView{name, dt, std::move(shape), data.data(), data.size() * sizeof(T)};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A file with a hand-written header and `data_bytes` zero bytes of data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header;
  bytes += std::string(data_bytes, '\0');
  write_bytes(path, bytes);
}

}  // namespace

TEST(Safetensors, RoundTripSingleFile) {
  TempDir dir;
  const auto a = random_bf16(6 * 10, 1);
  const auto b = random_f32(7, 2);
  std::vector<uint8_t> c(3 * 5);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(17 * i + 3);
  const std::string path = dir / "x.safetensors";
  write_safetensors(path,
                    {view("layer.a.weight", DType::bf16, {6, 10}, a),
                     view("b \"quoted\"", DType::f32, {7}, b), view("raw", DType::u8, {3, 5}, c)},
                    {{"format", "pt"}, {"note", "line\nbreak"}});
  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "line\nbreak");
  const TensorInfo* ta = f.find("layer.a.weight");
  ASSERT_TRUE(ta);
  EXPECT_EQ(ta->dtype, DType::bf16);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{6, 10}));
  EXPECT_EQ(std::memcmp(f.bytes(*ta), a.data(), a.size() * 2), 0);
  ASSERT_TRUE(f.find("b \"quoted\""));
  EXPECT_EQ(std::memcmp(f.bytes(*f.find("b \"quoted\"")), b.data(), b.size() * 4), 0);
  EXPECT_EQ(std::memcmp(f.bytes(*f.find("raw")), c.data(), c.size()), 0);
  EXPECT_EQ(f.find("nope"), nullptr);

  const Checkpoint ck(path);
  EXPECT_EQ(ck.read_bf16("layer.a.weight", {6, 10}).size(), 60u);
  // A block: rows [2, 5) x cols [3, 7).
  const auto blk = ck.read_bf16("layer.a.weight", {6, 10}, Block{Range{2, 3}, Range{3, 4}});
  ASSERT_EQ(blk.size(), 12u);
  for (int r = 0; r < 3; ++r)
    for (int col = 0; col < 4; ++col)
      EXPECT_EQ(blk[size_t(r * 4 + col)].bits, a[size_t((2 + r) * 10 + 3 + col)].bits);
  // BF16 widened to fp32 exactly; F32 kept exactly.
  const auto af = ck.read_f32("layer.a.weight", {6, 10});
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(af[i], to_float(a[i]));
  const auto bf = ck.read_f32("b \"quoted\"", {7});
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(bf[i], b[i]);
  // F32 read as BF16 is rounded to nearest even.
  const auto bb = ck.read_bf16("b \"quoted\"", {7});
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(bb[i].bits, to_bf16(b[i]).bits);
  expect_has(error_of([&] { ck.read_bf16("raw", {3, 5}); }), "dtype U8 cannot be read as a weight");
  expect_has(error_of([&] {
               ck.read_bf16("layer.a.weight", {6, 10}, Block{Range{5, 2}, Range{0, -1}});
             }),
             "is outside 6 x 10");
}

TEST(Safetensors, RoundTripShardedDirectory) {
  TempDir dir;
  std::vector<std::vector<bf16>> data;
  std::vector<TensorView> views;
  for (int i = 0; i < 7; ++i) data.push_back(random_bf16(size_t(16 * (i + 1)), uint32_t(10 + i)));
  for (int i = 0; i < 7; ++i)
    views.push_back(view(str("t", i, ".weight"), DType::bf16, {i + 1, 16}, data[size_t(i)]));
  const std::string ck_dir = dir / "ckpt";
  const int files = write_safetensors_sharded(ck_dir, views, 200);  // ~3 tensors per file
  EXPECT_GE(files, 3);
  EXPECT_TRUE(fs::exists(ck_dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(ck_dir + str("/model-00001-of-0000", files, ".safetensors")));
  const Checkpoint ck(ck_dir);
  EXPECT_EQ(ck.names().size(), 7u);
  for (int i = 0; i < 7; ++i) {
    const auto got = ck.read_bf16(str("t", i, ".weight"), {i + 1, 16});
    for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k].bits, data[size_t(i)][k].bits);
  }
  EXPECT_NE(ck.file_of("t0.weight"), ck.file_of("t6.weight"));

  // Without the index, the directory's files are merged.
  fs::remove(ck_dir + "/model.safetensors.index.json");
  const Checkpoint merged(ck_dir);
  EXPECT_EQ(merged.names().size(), 7u);

  // An index naming a tensor its file lacks is refused.
  write_bytes(ck_dir + "/model.safetensors.index.json",
              "{\"metadata\": {}, \"weight_map\": {\"ghost\": \"model-00001-of-0000" + std::to_string(files) +
                  ".safetensors\"}}");
  expect_has(error_of([&] { Checkpoint bad(ck_dir); }), "weight_map puts \"ghost\" in model-00001");
}

TEST(Safetensors, TruncatedAndMalformedFilesAreRefused) {
  TempDir dir;
  const auto a = random_bf16(64, 3);
  const std::string path = dir / "t.safetensors";
  write_safetensors(path, {view("a", DType::bf16, {8, 8}, a)});
  const auto full_size = fs::file_size(path);

  fs::resize_file(path, full_size - 10);
  expect_has(error_of([&] { SafetensorsFile f(path); }),
             "truncated: the tensors need 128 bytes of data after the header but the file holds 118");
  fs::resize_file(path, 20);
  expect_has(error_of([&] { SafetensorsFile f(path); }), "truncated: the header says");
  fs::resize_file(path, 5);
  expect_has(error_of([&] { SafetensorsFile f(path); }), "truncated: 5 bytes is too short");

  const std::string p2 = dir / "m.safetensors";
  write_raw(p2, R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})", 9);
  expect_has(error_of([&] { SafetensorsFile f(p2); }), "1 trailing bytes after the last tensor");
  write_raw(p2, R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,6]}})", 6);
  expect_has(error_of([&] { SafetensorsFile f(p2); }),
             "BF16 [2, 2] needs 8 bytes but data_offsets [0, 6] span 6");
  write_raw(
      p2,
      R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}})",
      6);
  expect_has(error_of([&] { SafetensorsFile f(p2); }), "overlaps the tensor before it");
  write_raw(p2, R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]}})", 8);
  expect_has(error_of([&] { SafetensorsFile f(p2); }), "the data has a hole at bytes [0, 4)");
  write_raw(p2, R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},})", 4);
  expect_has(error_of([&] { SafetensorsFile f(p2); }), "invalid JSON at byte");
  write_raw(
      p2,
      R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"a":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]}})",
      8);
  expect_has(error_of([&] { SafetensorsFile f(p2); }), "duplicate key \"a\"");
  write_raw(p2, R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,4]}})", 4);
  expect_has(error_of([&] { SafetensorsFile f(p2); }), "unknown dtype \"Q4\"");
  write_raw(p2, R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4],"extra":1}})", 4);
  expect_has(error_of([&] { SafetensorsFile f(p2); }), "unknown field \"extra\"");
  write_raw(p2, R"({"a":{"dtype":"BF16","shape":[-2],"data_offsets":[0,4]}})", 4);
  expect_has(error_of([&] { SafetensorsFile f(p2); }), "expected a non-negative integer");
  // Unicode escapes in names decode to UTF-8.
  write_raw(p2, R"({"\u00e9\ud83d\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  SafetensorsFile ok(p2);
  EXPECT_TRUE(ok.find("\xc3\xa9\xf0\x9f\x98\x80"));
  expect_has(error_of([&] { Checkpoint c(dir / "none.safetensors"); }), "no such file or directory");
}

TEST(Safetensors, Fp8BlockScalesDequantiseAgainstAHandComputation) {
  TempDir dir;
  // A [130, 260] FP8 tensor: blocks of 128 give a [2, 3] scale grid with partial edge blocks.
  const int R = 130, C = 260;
  std::vector<uint8_t> q(size_t(R * C));
  std::mt19937 rng(4);
  for (auto& v : q) {
    do v = static_cast<uint8_t>(rng() & 0xff);
    while ((v & 0x7f) == 0x7f);  // no NaN codes
  }
  // Hand-picked elements (E4M3: 0x38 = 1.0, 0xC4 = -3.0, 0x30 = 0.5, 0x01 = 2^-9).
  q[0] = 0x38;
  q[size_t(129 * C + 259)] = 0xc4;
  q[size_t(127 * C + 128)] = 0x30;
  q[size_t(128 * C + 127)] = 0x01;
  const std::vector<float> scale = {0.25f, 3.0f, 7.0f, 512.0f, 0.125f, 2.0f};
  const std::string path = dir / "fp8.safetensors";
  write_safetensors(path, {view("w.weight", DType::f8_e4m3, {R, C}, q),
                           view("w.weight_scale_inv", DType::f32, {2, 3}, scale)});
  const Checkpoint ck(path);
  const auto w = ck.read_f32("w.weight", {R, C});
  EXPECT_EQ(w[0], 0.25f);                      // 1.0 * scale[0][0]
  EXPECT_EQ(w[size_t(129 * C + 259)], -6.0f);  // -3.0 * scale[1][2]
  EXPECT_EQ(w[size_t(127 * C + 128)], 1.5f);   // 0.5 * scale[0][1]
  EXPECT_EQ(w[size_t(128 * C + 127)], 1.0f);   // 2^-9 * scale[1][0]
  // Every element, with E4M3 decoded from its fields here (independently of numeric.hpp).
  auto decode = [](uint8_t b) {
    const int sign = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
    return sign ? -v : v;
  };
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const double want = decode(q[size_t(r * C + c)]) * scale[size_t((r / 128) * 3 + c / 128)];
      ASSERT_EQ(w[size_t(r * C + c)], static_cast<float>(want)) << r << "," << c;
    }
  // As BF16, over a block that crosses scale-block boundaries.
  const auto blk = ck.read_bf16("w.weight", {R, C}, Block{Range{120, 10}, Range{125, 10}});
  for (int r = 0; r < 10; ++r)
    for (int c = 0; c < 10; ++c)
      ASSERT_EQ(blk[size_t(r * 10 + c)].bits, to_bf16(w[size_t((120 + r) * C + 125 + c)]).bits);

  // A wrongly shaped scale, and a missing one, are refused by name.
  const std::string p2 = dir / "fp8bad.safetensors";
  write_safetensors(p2, {view("w.weight", DType::f8_e4m3, {R, C}, q),
                         view("w.weight_scale_inv", DType::f32, {3, 2}, scale)});
  expect_has(error_of([&] {
               Checkpoint(p2).read_bf16("w.weight", {R, C});
             }),
             "tensor \"w.weight_scale_inv\" in " + p2 + ": expected shape [2, 3], found [3, 2]");
  write_safetensors(p2, {view("w.weight", DType::f8_e4m3, {R, C}, q)});
  expect_has(error_of([&] {
               Checkpoint(p2).read_bf16("w.weight", {R, C});
             }),
             "F8_E4M3 without its block scale \"w.weight_scale_inv\"");
}

TEST(Safetensors, F16IsConverted) {
  TempDir dir;
  // 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), 0x7c00 = inf.
  const std::vector<uint16_t> h = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00};
  const std::string path = dir / "h.safetensors";
  write_safetensors(path, {view("h", DType::f16, {5}, h)});
  const auto v = Checkpoint(path).read_f32("h", {5});
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], 65504.0f);
  EXPECT_EQ(v[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(v[4]));
}

// ---- the MTP loader on exported synthetic weights ------------------------------------------------

class MtpCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = load_model_preset("tiny");
    whole_ = synthesize_mtp_weights(cfg_, make_shard_plan(cfg_, 0, 1, HeadSharding::vocab), 21);
  }
  ModelConfig cfg_;
  MtpWeights whole_;
  TempDir dir_;
};

TEST_F(MtpCheckpoint, ExportThenLoadEqualsSyntheticShards) {
  const std::string file = dir_ / "tiny.safetensors";
  export_mtp_weights(cfg_, whole_, file);
  const std::string sharded = dir_ / "tiny-sharded";
  export_mtp_weights(cfg_, whole_, sharded, 256 << 10);
  EXPECT_GT(std::distance(fs::directory_iterator(sharded), fs::directory_iterator{}), 3);
  EXPECT_TRUE(Checkpoint(file).contains("model.language_model.layers.45.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(Checkpoint(file).contains("model.language_model.embed_tokens.weight"));
  for (const std::string& src : {file, sharded}) {
    for (int world : {1, 2, 4}) {
      for (int rank = 0; rank < world; ++rank) {
        const ShardPlan p = make_shard_plan(cfg_, rank, world, HeadSharding::vocab);
        SCOPED_TRACE(str(src, " rank ", rank, "/", world));
        test_util::expect_same_weights(load_mtp_weights(cfg_, p, src), synthesize_mtp_weights(cfg_, p, 21));
      }
    }
  }
  // Exporting a shard is refused: a checkpoint holds the whole model.
  const MtpWeights shard = synthesize_mtp_weights(cfg_, make_shard_plan(cfg_, 1, 2, HeadSharding::vocab), 21);
  expect_has(error_of([&] { export_mtp_weights(cfg_, shard, dir_ / "x.safetensors"); }),
             "a checkpoint needs the whole model");
}

TEST_F(MtpCheckpoint, WrongShapeAndMissingTensorAreNamed) {
  std::vector<TensorView> views = checkpoint_views(cfg_, whole_);
  const std::string eh = "model.language_model.layers.45.eh_proj.weight";
  const std::string hn = "model.language_model.layers.45.hnorm.weight";
  std::vector<TensorView> bad_shape, missing;
  for (TensorView v : views) {
    if (v.name == eh) {
      v.shape = {2 * cfg_.hidden, cfg_.hidden};  // transposed
    }
    bad_shape.push_back(v);
    if (v.name != hn) missing.push_back(v);
  }
  const std::string p1 = dir_ / "bad_shape.safetensors";
  write_safetensors(p1, bad_shape);
  expect_has(error_of([&] { load_mtp_weights(cfg_, make_shard_plan(cfg_, 0, 2, HeadSharding::vocab), p1); }),
             "tensor \"" + eh + "\" in " + p1 + ": expected shape [128, 256], found [256, 128]");
  const std::string p2 = dir_ / "missing";
  write_safetensors_sharded(p2, missing, 1 << 20);
  expect_has(error_of([&] { load_mtp_weights(cfg_, make_shard_plan(cfg_, 0, 1, HeadSharding::none), p2); }),
             "checkpoint " + p2 + ": tensor \"" + hn + "\" not found");
}

TEST_F(MtpCheckpoint, ConfigurableNamesAndFp8Projections) {
  // A checkpoint with other trunk names and layer index, and eh_proj / one expert stored as FP8.
  ModelConfig c = cfg_;
  c.mtp_layer_index = 3;
  c.mtp_prefix = "mtp.layers.3.";
  c.embed_tokens_name = "embed.weight";
  c.lm_head_name = "head.weight";
  std::vector<TensorView> views = checkpoint_views(c, whole_);
  EXPECT_EQ(views[0].name, "embed.weight");

  // Quantise eh_proj [128, 256] with 128x128 block scales: q = fp8(x / s), s = amax_block / 448.
  const int64_t R = cfg_.hidden, C = 2 * cfg_.hidden;
  std::vector<uint8_t> q(size_t(R * C));
  std::vector<float> s(size_t(((R + 127) / 128) * ((C + 127) / 128)));
  for (int64_t br = 0; br < (R + 127) / 128; ++br)
    for (int64_t bc = 0; bc < (C + 127) / 128; ++bc) {
      float amax = 0;
      for (int64_t r = br * 128; r < std::min(R, br * 128 + 128); ++r)
        for (int64_t k = bc * 128; k < std::min(C, bc * 128 + 128); ++k)
          amax = std::max(amax, std::fabs(to_float(whole_.eh_proj.data[size_t(r * C + k)])));
      const float sc = amax / 448.0f;
      s[size_t(br * ((C + 127) / 128) + bc)] = sc;
      for (int64_t r = br * 128; r < std::min(R, br * 128 + 128); ++r)
        for (int64_t k = bc * 128; k < std::min(C, bc * 128 + 128); ++k)
          q[size_t(r * C + k)] = to_fp8e4m3(to_float(whole_.eh_proj.data[size_t(r * C + k)]) / sc).bits;
    }
  for (TensorView& v : views)
    if (v.name == "mtp.layers.3.eh_proj.weight") v = view(v.name, DType::f8_e4m3, {R, C}, q);
  views.push_back(view("mtp.layers.3.eh_proj.weight_scale_inv", DType::f32, {1, 2}, s));
  const std::string path = dir_ / "fp8.safetensors";
  write_safetensors(path, views);

  const MtpWeights w = load_mtp_weights(c, make_shard_plan(c, 1, 2, HeadSharding::vocab), path);
  const MtpWeights ref = synthesize_mtp_weights(c, make_shard_plan(c, 1, 2, HeadSharding::vocab), 21);
  test_util::expect_same_tensor(w.embed_tokens, ref.embed_tokens, "embed_tokens");
  test_util::expect_same_tensor(w.lm_head, ref.lm_head, "lm_head");
  test_util::expect_same_tensor(w.moe.experts_down, ref.moe.experts_down, "experts_down");
  // eh_proj is the dequantised FP8: exactly bf16(fp8 * scale), and close to the original
  // (E4M3 relative error <= 2^-4, plus the subnormal step near zero, plus the BF16 rounding).
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < C; ++k) {
      const float sc = s[size_t(k / 128)];
      const float deq = to_float(fp8e4m3{q[size_t(r * C + k)]}) * sc;
      ASSERT_EQ(w.eh_proj.data[size_t(r * C + k)].bits, to_bf16(deq).bits);
      const float x = to_float(whole_.eh_proj.data[size_t(r * C + k)]);
      ASSERT_LE(std::fabs(to_float(w.eh_proj.data[size_t(r * C + k)]) - x),
                std::fabs(x) * (1.0f / 16 + 1.0f / 128) + sc / 1024);
    }
}
