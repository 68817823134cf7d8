// Trace files: a random round trip, and every validation error naming the file, the sequence and
// the position. Damaged traces are written through the plain HDF5 wrapper (which does not
// validate), starting from a valid random trace and breaking one thing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "io/trace.hpp"
#include "io_test_util.hpp"

using namespace mtplab;
using namespace mtplab::io;
using mtplab::io::testing_util::error_of;

namespace {

// A trace as plain arrays, to write valid or deliberately broken files.
struct RawTrace {
  std::int64_t hidden = 0;
  std::int64_t vocab = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::uint16_t> hiddens;  // BF16 bits, [rows, hidden]
  std::vector<std::int64_t> offsets;
  std::vector<std::int32_t> prompts;
  std::string format = kTraceFormatName;
  std::int64_t version = kTraceFormatVersion;
  bool bf16_attr = true;
};

void write_raw(const std::string& path, const RawTrace& t) {
  H5File f = H5File::create(path);
  f.set_attr("format", t.format);
  f.set_attr("format_version", t.version);
  f.set_attr("hidden", t.hidden);
  f.set_attr("vocab", t.vocab);
  f.set_attr("num_sequences", static_cast<std::int64_t>(t.prompts.size()));
  f.write("tokens", t.tokens);
  Dataset h = f.write("hiddens", t.hiddens, t.hiddens.size() / static_cast<std::uint64_t>(t.hidden),
                      static_cast<std::uint64_t>(t.hidden));
  if (t.bf16_attr) h.set_attr("dtype", "bf16");
  f.write("seq_offsets", t.offsets);
  f.write("prompt_lengths", t.prompts);
  f.commit();
}

class TraceTest : public testing_util::TempDirTest {
 protected:
  // A valid random trace: 3..6 sequences of 2..80 positions, hiddens ~ N(0, 2) rounded to BF16.
  RawTrace random_trace() {
    RawTrace t;
    t.hidden = 8 + static_cast<std::int64_t>(rng_() % 40);
    t.vocab = 50 + static_cast<std::int64_t>(rng_() % 5000);
    const int n = 3 + static_cast<int>(rng_() % 4);
    t.offsets = {0};
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (int s = 0; s < n; ++s) {
      const auto len = 2 + static_cast<std::int32_t>(rng_() % 79);
      t.prompts.push_back(2 + static_cast<std::int32_t>(rng_() % static_cast<std::uint64_t>(len - 1)));
      for (std::int32_t p = 0; p < len; ++p) {
        t.tokens.push_back(static_cast<std::int32_t>(rng_() % static_cast<std::uint64_t>(t.vocab)));
        for (std::int64_t j = 0; j < t.hidden; ++j) t.hiddens.push_back(to_bf16(normal(rng_)).bits);
      }
      t.offsets.push_back(t.offsets.back() + len);
    }
    return t;
  }
  // Picks a sequence and a position inside it; returns the global row.
  std::int64_t pick(const RawTrace& t, std::int64_t& s, std::int64_t& pos) {
    s = static_cast<std::int64_t>(rng_() % t.prompts.size());
    const std::int64_t len =
        t.offsets[static_cast<std::size_t>(s + 1)] - t.offsets[static_cast<std::size_t>(s)];
    pos = static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(len));
    return t.offsets[static_cast<std::size_t>(s)] + pos;
  }
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST_F(TraceTest, RoundTripWithRandomData) {
  const std::string path = file("trace.h5");
  const RawTrace t = random_trace();
  const auto n = static_cast<std::int64_t>(t.prompts.size());
  TraceProvenance prov{"test generator", "glm-test", std::to_string(seed_), "", "", "model: tiny\nseed: 1\n"};
  TraceWriterOptions opts;
  opts.chunk_rows = 7;  // sequences straddle chunks
  {
    TraceWriter w(path, t.hidden, t.vocab, prov, opts);
    for (std::int64_t s = 0; s < n; ++s) {
      const auto b = static_cast<std::size_t>(t.offsets[static_cast<std::size_t>(s)]);
      const auto e = static_cast<std::size_t>(t.offsets[static_cast<std::size_t>(s + 1)]);
      std::span<const std::int32_t> toks(t.tokens.data() + b, e - b);
      const std::size_t h = static_cast<std::size_t>(t.hidden);
      if (s % 3 == 2) {  // the TraceSequence entry point
        TraceSequence seq;
        seq.hidden = t.hidden;
        seq.prompt_length = t.prompts[static_cast<std::size_t>(s)];
        seq.tokens.assign(toks.begin(), toks.end());
        seq.hiddens.resize(h * (e - b));
        for (std::size_t k = 0; k < seq.hiddens.size(); ++k) seq.hiddens[k].bits = t.hiddens[b * h + k];
        w.add_sequence(seq);
      } else if (s % 3 == 0) {  // the BF16 entry point
        std::vector<bf16> hs(h * (e - b));
        for (std::size_t k = 0; k < hs.size(); ++k) hs[k].bits = t.hiddens[b * h + k];
        w.add_sequence(toks, std::span<const bf16>(hs), t.prompts[static_cast<std::size_t>(s)]);
      } else {  // the fp32 entry point: values that are BF16 already round to themselves
        std::vector<float> hs(h * (e - b));
        for (std::size_t k = 0; k < hs.size(); ++k) hs[k] = to_float(bf16{t.hiddens[b * h + k]});
        w.add_sequence(toks, std::span<const float>(hs), t.prompts[static_cast<std::size_t>(s)]);
      }
    }
    EXPECT_EQ(w.num_sequences(), n);
    EXPECT_EQ(w.total_positions(), t.offsets.back());
    EXPECT_FALSE(std::filesystem::exists(path));
    w.commit();
  }
  TraceReader r(path, t.hidden, t.vocab);
  EXPECT_EQ(r.hidden(), t.hidden);
  EXPECT_EQ(r.vocab(), t.vocab);
  EXPECT_EQ(r.num_sequences(), n);
  EXPECT_EQ(r.total_positions(), t.offsets.back());
  EXPECT_EQ(r.provenance().generator, prov.generator);
  EXPECT_EQ(r.provenance().model, prov.model);
  EXPECT_EQ(r.provenance().seed, prov.seed);
  EXPECT_EQ(r.provenance().config, prov.config);
  EXPECT_EQ(r.provenance().created_at.size(), 20u) << r.provenance().created_at;  // YYYY-MM-DDTHH:MM:SSZ
  EXPECT_FALSE(r.provenance().git_sha.empty());
  // Read sequences out of order: each read touches only that sequence's rows.
  for (std::int64_t s = n - 1; s >= 0; --s) {
    SCOPED_TRACE(s);
    const auto b = static_cast<std::size_t>(t.offsets[static_cast<std::size_t>(s)]);
    const auto e = static_cast<std::size_t>(t.offsets[static_cast<std::size_t>(s + 1)]);
    EXPECT_EQ(r.sequence_offset(s), static_cast<std::int64_t>(b));
    EXPECT_EQ(r.sequence_length(s), static_cast<std::int64_t>(e - b));
    EXPECT_EQ(r.prompt_length(s), t.prompts[static_cast<std::size_t>(s)]);
    const auto toks = r.tokens(s);
    EXPECT_TRUE(std::equal(toks.begin(), toks.end(), t.tokens.begin() + static_cast<std::ptrdiff_t>(b)));
    const TraceSequence seq = r.sequence(s);
    ASSERT_EQ(seq.hiddens.size(), (e - b) * static_cast<std::size_t>(t.hidden));
    for (std::size_t k = 0; k < seq.hiddens.size(); ++k) {
      ASSERT_EQ(seq.hiddens[k].bits, t.hiddens[b * static_cast<std::size_t>(t.hidden) + k]) << k;
    }
    const std::int64_t last = seq.length() - 1;
    EXPECT_EQ(seq.hidden_at(last)[0].bits, t.hiddens[(e - 1) * static_cast<std::size_t>(t.hidden)]);
  }
  r.check_all_hiddens();
  // The raw file is what docs/trace-format.md says.
  H5File f = H5File::open_read(path);
  EXPECT_EQ(f.attr_string("format"), "mtplab-trace");
  EXPECT_EQ(f.attr_int("format_version"), 1);
  EXPECT_EQ(f.open_dataset("hiddens").attr_string("dtype"), "bf16");
  EXPECT_EQ(f.open_dataset("tokens").dtype(), DType::i32);
  EXPECT_EQ(f.open_dataset("seq_offsets").read<std::int64_t>(), t.offsets);
  EXPECT_EQ(f.open_dataset("prompt_lengths").read<std::int32_t>(), t.prompts);
}

TEST_F(TraceTest, WriterRejectsBadSequencesNamingThePosition) {
  const std::string path = file("bad.h5");
  TraceWriter w(path, 4, 100, {});
  std::vector<std::int32_t> toks = {5, 6, 7, 8, 9};
  std::vector<float> hs(toks.size() * 4);
  for (auto& x : hs) x = std::normal_distribution<float>(0.0f, 1.0f)(rng_);
  w.add_sequence(toks, std::span<const float>(hs), 2);

  auto bad_toks = toks;
  bad_toks[3] = 100;
  std::string m = error_of([&] { w.add_sequence(bad_toks, std::span<const float>(hs), 2); });
  EXPECT_TRUE(contains(m, path + ": sequence 1, position 3: token id 100 is outside [0, 100)")) << m;
  auto bad_hs = hs;
  bad_hs[2 * 4 + 1] = std::numeric_limits<float>::quiet_NaN();
  m = error_of([&] { w.add_sequence(toks, std::span<const float>(bad_hs), 2); });
  EXPECT_TRUE(contains(m, "sequence 1, position 2, element 1: hidden is NaN")) << m;
  m = error_of([&] { w.add_sequence(toks, std::span<const float>(hs), 1); });
  EXPECT_TRUE(contains(m, "sequence 1: prompt length 1 is below 2")) << m;
  m = error_of([&] { w.add_sequence(toks, std::span<const float>(hs), 6); });
  EXPECT_TRUE(contains(m, "sequence 1: prompt length 6 exceeds the sequence length 5")) << m;
  m = error_of([&] { w.add_sequence(toks, std::span<const float>(hs.data(), hs.size() - 1), 2); });
  EXPECT_TRUE(contains(m, "19 hidden values for 5 tokens")) << m;
  EXPECT_EQ(w.num_sequences(), 1);  // nothing refused was written
  w.commit();
  TraceReader r(path);
  EXPECT_EQ(r.num_sequences(), 1);
  EXPECT_EQ(r.total_positions(), 5);
}

TEST_F(TraceTest, DimensionMismatchIsRefused) {
  const std::string path = file("dims.h5");
  const RawTrace t = random_trace();
  write_raw(path, t);
  TraceReader ok(path, t.hidden, t.vocab);
  std::string m = error_of([&] { TraceReader r(path, t.hidden + 1, t.vocab); });
  EXPECT_TRUE(contains(m, path + ": trace hidden size " + std::to_string(t.hidden) +
                              " does not match the model's " + std::to_string(t.hidden + 1)))
      << m;
  m = error_of([&] { TraceReader r(path, t.hidden, t.vocab * 2); });
  EXPECT_TRUE(contains(m, "trace vocab " + std::to_string(t.vocab) + " does not match")) << m;
}

TEST_F(TraceTest, TokenOutOfRangeNamesSequenceAndPosition) {
  for (const bool negative : {false, true}) {
    RawTrace t = random_trace();
    std::int64_t s = 0, pos = 0;
    const std::int64_t row = pick(t, s, pos);
    const std::int32_t bad =
        negative ? -1 - static_cast<std::int32_t>(rng_() % 100)
                 : static_cast<std::int32_t>(t.vocab + static_cast<std::int64_t>(rng_() % 100));
    t.tokens[static_cast<std::size_t>(row)] = bad;
    const std::string path = file(negative ? "neg.h5" : "big.h5");
    write_raw(path, t);
    const std::string m = error_of([&] { TraceReader r(path, t.hidden, t.vocab); });
    EXPECT_TRUE(contains(m, str(path, ": sequence ", s, ", position ", pos, " (row ", row, "): token id ",
                                bad, " is outside [0, ", t.vocab, ")")))
        << m;
  }
}

TEST_F(TraceTest, NonFiniteHiddenNamesSequencePositionAndElement) {
  for (const std::uint16_t poison : {std::uint16_t{0x7fc0}, std::uint16_t{0x7f80}, std::uint16_t{0xff80}}) {
    RawTrace t = random_trace();
    std::int64_t s = 0, pos = 0;
    const std::int64_t row = pick(t, s, pos);
    const std::int64_t col = static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(t.hidden));
    t.hiddens[static_cast<std::size_t>(row * t.hidden + col)] = poison;
    const std::string path = file("nan.h5");
    write_raw(path, t);
    TraceReader r(path, t.hidden, t.vocab);  // hiddens are checked lazily, per sequence
    const std::string want =
        str(path, ": sequence ", s, ", position ", pos, " (row ", row, "), element ", col, ": hidden is ",
            poison == 0x7fc0   ? "NaN"
            : poison == 0x7f80 ? "+inf"
                               : "-inf");
    std::string m = error_of([&] { (void)r.hiddens(s); });
    EXPECT_TRUE(contains(m, want)) << m;
    m = error_of([&] { r.check_all_hiddens(); });
    EXPECT_TRUE(contains(m, want)) << m;
    const std::int64_t other = (s + 1) % r.num_sequences();
    EXPECT_EQ(r.hiddens(other).size(), static_cast<std::size_t>(r.sequence_length(other) * t.hidden));
  }
}

TEST_F(TraceTest, BadPromptLengthNamesTheSequence) {
  for (const bool too_long : {false, true}) {
    RawTrace t = random_trace();
    const std::size_t s = rng_() % t.prompts.size();
    const std::int64_t len = t.offsets[s + 1] - t.offsets[s];
    t.prompts[s] = too_long ? static_cast<std::int32_t>(len + 1) : static_cast<std::int32_t>(rng_() % 2);
    const std::string path = file("prompt.h5");
    write_raw(path, t);
    const std::string m = error_of([&] { TraceReader r(path); });
    EXPECT_TRUE(
        contains(m, str(path, ": sequence ", s, ": prompt length ", t.prompts[s],
                        too_long ? str(" exceeds the sequence length ", len) : std::string(" is below 2"))))
        << m;
  }
}

TEST_F(TraceTest, NonMonotonicOffsetsNameTheSequence) {
  RawTrace t = random_trace();
  // Swap the boundary between sequences s and s+1 backwards past the start of s.
  const std::size_t s = rng_() % (t.prompts.size() - 1);
  const std::int64_t begin = t.offsets[s];
  t.offsets[s + 1] = begin;  // sequence s becomes empty
  const std::string path = file("offsets.h5");
  write_raw(path, t);
  std::string m = error_of([&] { TraceReader r(path); });
  EXPECT_TRUE(contains(
      m, str(path, ": sequence ", s, ": seq_offsets are not increasing (", begin, " then ", begin, ")")))
      << m;

  RawTrace u = random_trace();
  u.offsets.back() += 1;  // ends past the last row
  write_raw(path, u);
  m = error_of([&] { TraceReader r(path); });
  EXPECT_TRUE(contains(m, "/tokens has")) << m;
}

TEST_F(TraceTest, WrongFormatVersionOrEncodingIsRefused) {
  const std::string path = file("fmt.h5");
  RawTrace t = random_trace();
  t.format = "something-else";
  write_raw(path, t);
  EXPECT_TRUE(contains(error_of([&] { TraceReader r(path); }), "not an mtplab trace"));
  t.format = kTraceFormatName;
  t.version = 2;
  write_raw(path, t);
  EXPECT_TRUE(contains(error_of([&] { TraceReader r(path); }), "trace format version 2 is not supported"));
  t.version = 1;
  t.bf16_attr = false;
  write_raw(path, t);
  EXPECT_TRUE(contains(error_of([&] { TraceReader r(path); }),
                       "/hiddens must be uint16 with attribute dtype=\"bf16\""));
}

TEST_F(TraceTest, TruncatedTraceGivesAClearError) {
  const std::string path = file("cut.h5");
  write_raw(path, random_trace());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  const std::string m = error_of([&] { TraceReader r(path); });
  EXPECT_EQ(m.rfind(path + ": not a valid HDF5 file or truncated", 0), 0u) << m;
}
