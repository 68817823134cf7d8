// Traces with float32 hiddens (dtype = "f32", docs/trace-format.md "Hidden dtype"): the writer stores
// the values exactly, the reader hands the drafter their BF16 rounding (nearest even, the same bits
// a BF16 trace of the same values holds) and read_hiddens_f32 the stored values; a float32 /hiddens
// without its dtype attribute, and values that overflow BF16, are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "io/hdf5.hpp"
#include "io/trace.hpp"
#include "io_test_util.hpp"

using namespace mtplab;
using namespace mtplab::io;

namespace {

using testing_util::error_of;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class TraceF32Test : public testing_util::TempDirTest {
 protected:
  /// Random fp32 values (most not representable in BF16), tokens and prompt lengths.
  void draw(std::int64_t hidden, std::vector<std::vector<std::int32_t>>& tokens,
            std::vector<std::vector<float>>& hiddens, std::vector<std::int32_t>& prompts) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    const int n = 2 + static_cast<int>(rng_() % 4);
    for (int s = 0; s < n; ++s) {
      const auto len = 2 + static_cast<std::int32_t>(rng_() % 50);
      tokens.emplace_back();
      hiddens.emplace_back();
      for (std::int32_t t = 0; t < len; ++t) {
        tokens.back().push_back(static_cast<std::int32_t>(rng_() % 1000));
        for (std::int64_t j = 0; j < hidden; ++j) hiddens.back().push_back(normal(rng_));
      }
      prompts.push_back(2 + static_cast<std::int32_t>(rng_() % static_cast<std::uint64_t>(len - 1)));
    }
  }
};

}  // namespace

TEST_F(TraceF32Test, StoredExactlyReadAsBf16) {
  const std::int64_t hidden = 4 + static_cast<std::int64_t>(rng_() % 30);
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::vector<float>> hiddens;
  std::vector<std::int32_t> prompts;
  draw(hidden, tokens, hiddens, prompts);
  const std::string f32_path = file("f32.h5"), bf16_path = file("bf16.h5");
  {
    TraceWriterOptions f32_opts;
    f32_opts.f32_hiddens = true;
    TraceWriter f32(f32_path, hidden, 1000, {}, f32_opts);
    TraceWriter b16(bf16_path, hidden, 1000, {});
    for (std::size_t s = 0; s < tokens.size(); ++s) {
      f32.add_sequence(tokens[s], std::span<const float>(hiddens[s]), prompts[s]);
      b16.add_sequence(tokens[s], std::span<const float>(hiddens[s]), prompts[s]);
    }
    f32.commit();
    b16.commit();
  }
  // On disk: float32 with dtype="f32", the values as given.
  {
    const H5File f = H5File::open_read(f32_path);
    const Dataset d = f.open_dataset("hiddens");
    EXPECT_EQ(d.dtype(), DType::f32);
    EXPECT_EQ(d.attr_string("dtype"), "f32");
  }
  const TraceReader r(f32_path, hidden, 1000), b(bf16_path, hidden, 1000);
  EXPECT_STREQ(r.hiddens_dtype(), "f32");
  EXPECT_STREQ(b.hiddens_dtype(), "bf16");
  std::size_t inexact = 0;
  for (std::int64_t s = 0; s < r.num_sequences(); ++s) {
    const auto& want = hiddens[static_cast<std::size_t>(s)];
    std::vector<float> stored(want.size());
    r.read_hiddens_f32(s, stored);
    ASSERT_EQ(stored, want) << "sequence " << s << ": f32 values not stored exactly";
    // The drafter's view: the BF16 rounding, bit for bit what the BF16 trace holds.
    const std::vector<bf16> as_bf16 = r.hiddens(s), from_bf16 = b.hiddens(s);
    ASSERT_EQ(as_bf16.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(as_bf16[i].bits, to_bf16(want[i]).bits) << "sequence " << s << " element " << i;
      ASSERT_EQ(as_bf16[i].bits, from_bf16[i].bits) << "sequence " << s << " element " << i;
      inexact += to_float(as_bf16[i]) != want[i];
    }
    // read_hiddens_f32 of a BF16 trace widens exactly.
    std::vector<float> widened(want.size());
    b.read_hiddens_f32(s, widened);
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(widened[i], to_float(from_bf16[i]));
    EXPECT_EQ(r.tokens(s).size(), tokens[static_cast<std::size_t>(s)].size());
  }
  EXPECT_GT(inexact, 0u) << "every value was exact in BF16: the rounding was not exercised";
}

TEST_F(TraceF32Test, BadF32TracesAreRefused) {
  // A float32 /hiddens without the dtype attribute.
  const std::string path = file("noattr.h5");
  {
    H5File f = H5File::create(path);
    f.set_attr("format", kTraceFormatName);
    f.set_attr("format_version", kTraceFormatVersion);
    f.set_attr("hidden", std::int64_t{2});
    f.set_attr("vocab", std::int64_t{10});
    f.set_attr("num_sequences", std::int64_t{1});
    f.write("tokens", std::vector<std::int32_t>{1, 2});
    f.write("hiddens", std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}, 2, 2);
    f.write("seq_offsets", std::vector<std::int64_t>{0, 2});
    f.write("prompt_lengths", std::vector<std::int32_t>{2});
    f.commit();
  }
  EXPECT_TRUE(contains(error_of([&] { TraceReader r(path); }),
                       "/hiddens is float32 but lacks the attribute dtype=\"f32\""));

  // A finite fp32 value past BF16's largest finite one rounds to infinity: refused on read as the
  // drafter would see it, and the writer refuses a non-finite value naming the element.
  TraceWriterOptions opts;
  opts.f32_hiddens = true;
  const std::string big = file("big.h5");
  {
    TraceWriter w(big, 2, 10, {}, opts);
    w.add_sequence(std::vector<std::int32_t>{1, 2}, std::vector<float>{1.0f, 3.4e38f, 0.0f, 1.0f}, 2);
    w.commit();
  }
  const TraceReader r(big);
  std::vector<float> f(4);
  r.read_hiddens_f32(0, f);
  EXPECT_EQ(f[1], 3.4e38f);
  EXPECT_TRUE(contains(error_of([&] { (void)r.hiddens(0); }),
                       "sequence 0, position 0 (row 0), element 1: hidden is +inf"));
  TraceWriter w(file("nan.h5"), 2, 10, {}, opts);
  EXPECT_TRUE(contains(
      error_of([&] {
        w.add_sequence(std::vector<std::int32_t>{1, 2},
                       std::vector<float>{1.0f, 0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f}, 2);
      }),
      "sequence 0, position 1, element 0: hidden is NaN"));
}
