// The trace's optional routing (/routing, docs/trace-format.md "Routing") and the distinct-experts
// figure read from it (io/routing.hpp): a random round trip, the writer's and the reader's
// refusals (each naming the file and what is wrong), and distinct_experts against counts worked
// out by hand and against the uniform formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "io/hdf5.hpp"
#include "io/routing.hpp"
#include "io/trace.hpp"
#include "io_test_util.hpp"

using namespace mtplab;
using namespace mtplab::io;
using mtplab::io::testing_util::error_of;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class TraceRoutingTest : public testing_util::TempDirTest {
 protected:
  // A sequence of `length` positions (prompt 2) with random tokens and hiddens.
  TraceSequence random_sequence(std::int64_t hidden, std::int64_t vocab, int length) {
    TraceSequence q;
    q.hidden = hidden;
    q.prompt_length = 2;
    for (int t = 0; t < length; ++t) {
      q.tokens.push_back(static_cast<std::int32_t>(rng_() % static_cast<std::uint64_t>(vocab)));
      for (std::int64_t j = 0; j < hidden; ++j)
        q.hiddens.push_back(to_bf16(static_cast<float>(rng_() % 1000) / 250.0f - 2.0f));
    }
    return q;
  }
  // Random routing of `length` positions: per routed layer top_k distinct ids, a dense layer -1.
  std::vector<std::int32_t> random_routing(const TraceRouting& r, int length, int dense_layers) {
    std::vector<std::int32_t> ids;
    for (int t = 0; t < length; ++t)
      for (std::int64_t l = 0; l < r.layers; ++l) {
        std::vector<std::int32_t> all(static_cast<std::size_t>(r.experts));
        for (std::int32_t e = 0; e < r.experts; ++e) all[static_cast<std::size_t>(e)] = e;
        std::shuffle(all.begin(), all.end(), rng_);
        for (std::int64_t j = 0; j < r.top_k; ++j)
          ids.push_back(l < dense_layers ? -1 : all[static_cast<std::size_t>(j)]);
      }
    return ids;
  }
};

TEST_F(TraceRoutingTest, RoundTripsAndATraceWithoutRoutingSaysSo) {
  const TraceRouting shape{2 + static_cast<std::int64_t>(rng_() % 3),
                           1 + static_cast<std::int64_t>(rng_() % 4),
                           8 + static_cast<std::int64_t>(rng_() % 24)};
  const std::string path = file("r.h5");
  std::vector<TraceSequence> seqs;
  {
    TraceWriter w(path, 16, 300, {});
    w.record_routing(shape);
    for (int s = 0; s < 3; ++s) {
      TraceSequence q = random_sequence(16, 300, 3 + static_cast<int>(rng_() % 20));
      q.routing = random_routing(shape, static_cast<int>(q.length()), s == 1 ? 1 : 0);  // layer 0 dense
      w.add_sequence(q);
      seqs.push_back(std::move(q));
    }
    w.commit();
  }
  const TraceReader r(path);
  ASSERT_TRUE(r.has_routing());
  EXPECT_EQ(r.routing_shape(), shape);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(r.routing(s), seqs[static_cast<std::size_t>(s)].routing) << "sequence " << s;
    EXPECT_EQ(r.sequence(s).routing, seqs[static_cast<std::size_t>(s)].routing);
  }

  const std::string plain = file("plain.h5");
  {
    TraceWriter w(plain, 16, 300, {});
    w.add_sequence(random_sequence(16, 300, 5));
    w.commit();
  }
  const TraceReader p(plain);
  EXPECT_FALSE(p.has_routing());
  EXPECT_TRUE(p.sequence(0).routing.empty());
  const std::string m = error_of([&] { (void)p.routing(0); });
  EXPECT_TRUE(contains(m, plain) && contains(m, "records no routing")) << m;
}

TEST_F(TraceRoutingTest, TheWriterRefusesWhatTheFormatDoesNotAllow) {
  const TraceRouting shape{2, 2, 8};
  auto attempt = [&](const std::function<void(TraceWriter&)>& body) {
    const std::string path = file("w" + std::to_string(rng_()) + ".h5");
    return error_of([&] {
      TraceWriter w(path, 4, 50, {});
      body(w);
    });
  };
  TraceSequence q = random_sequence(4, 50, 4);
  q.routing = random_routing(shape, 4, 0);

  std::string m = attempt([&](TraceWriter& w) {
    w.record_routing(shape);
    TraceSequence bad = q;
    bad.routing[5] = 8;  // position 1, layer 0, slot 1: past the 8 experts
    w.add_sequence(bad);
  });
  EXPECT_TRUE(contains(m, "routing of position 1, layer 0: expert id 8 is outside [0, 8)")) << m;
  m = attempt([&](TraceWriter& w) {
    w.record_routing(shape);
    TraceSequence bad = q;
    bad.routing[2] = -1;  // layer 1 of position 0: -1 beside an expert
    w.add_sequence(bad);
  });
  EXPECT_TRUE(contains(m, "layer 1: expert id") && contains(m, "a dense layer's slots are all -1")) << m;
  m = attempt([&](TraceWriter& w) {
    w.record_routing(shape);
    TraceSequence bad = q;
    bad.routing.pop_back();
    w.add_sequence(bad);
  });
  EXPECT_TRUE(contains(m, "15 routing ids for 4 positions")) << m;
  m = attempt([&](TraceWriter& w) {
    w.add_sequence(q);
    w.record_routing(shape);
  });
  EXPECT_TRUE(contains(m, "routing is recorded from the first sequence")) << m;
  m = attempt([&](TraceWriter& w) {
    w.record_routing(shape);
    w.add_sequence(q.tokens, q.hiddens, q.prompt_length);
    w.commit();
  });
  EXPECT_TRUE(contains(m, "sequence 0 has no routing")) << m;
  m = attempt([&](TraceWriter& w) { w.add_routing(q.routing); });
  EXPECT_TRUE(contains(m, "the trace does not record routing")) << m;
  m = attempt([&](TraceWriter& w) { w.record_routing(TraceRouting{2, 0, 8}); });
  EXPECT_TRUE(contains(m, "each must be >= 1")) << m;
}

TEST_F(TraceRoutingTest, TheReaderRefusesABrokenRoutingNamingTheFile) {
  const TraceRouting shape{2, 2, 8};
  const std::string good = file("good.h5");
  {
    TraceWriter w(good, 4, 50, {});
    w.record_routing(shape);
    TraceSequence q = random_sequence(4, 50, 6);
    q.routing = random_routing(shape, 6, 0);
    w.add_sequence(q);
    w.commit();
  }
  // A copy of the good trace whose /routing is replaced by `ids` [rows, cols] with `attrs`.
  auto broken = [&](const std::vector<std::int32_t>& ids, std::uint64_t rows, std::uint64_t cols,
                    bool with_attrs, std::int64_t experts) {
    const std::string path = file("b" + std::to_string(rng_()) + ".h5");
    std::filesystem::copy_file(good, path);
    H5File f = H5File::open_append(path);
    f.remove("routing");
    Dataset d = f.write("routing", ids, rows, cols);
    if (with_attrs) {
      d.set_attr("layers", std::int64_t{2});
      d.set_attr("top_k", std::int64_t{2});
      d.set_attr("experts", experts);
    }
    f.commit();
    return path;
  };
  std::vector<std::int32_t> ids(6 * 4, 3);
  std::string path = broken(ids, 6, 4, false, 8);
  std::string m = error_of([&] { TraceReader r(path); });
  EXPECT_TRUE(contains(m, path) && contains(m, "/routing lacks the attribute layers")) << m;
  path = broken(std::vector<std::int32_t>(5 * 4, 3), 5, 4, true, 8);
  m = error_of([&] { TraceReader r(path); });
  EXPECT_TRUE(contains(m, "/routing has 5 rows, seq_offsets end at 6")) << m;
  path = broken(std::vector<std::int32_t>(6 * 3, 3), 6, 3, true, 8);
  m = error_of([&] { TraceReader r(path); });
  EXPECT_TRUE(contains(m, "/routing has 3 columns, layers x top_k is 4")) << m;
  ids[4 * 3 + 2] = 9;  // position 3, layer 1
  path = broken(ids, 6, 4, true, 8);
  m = error_of([&] { TraceReader(path).routing(0); });
  EXPECT_TRUE(contains(m, path) &&
              contains(m, "routing of position 3, layer 1: expert id 9 is outside [0, 8)"))
      << m;
}

// distinct_experts on routings whose counts are known: every row of every sequence on the same
// top_k experts (top_k distinct whatever the batch); a row's experts set by its position modulo 4
// (R consecutive rows: min(R, 4) top_k at B = 1, at most 4 top_k at any B); and every row on fresh
// experts (R top_k at B = 1). The uniform figure is checked against a simulation.
TEST_F(TraceRoutingTest, DistinctExpertsCountsWhatTheRowsShare) {
  const int K = 2, E = 256, N = 8, length = 12, P = 2;  // N length K <= E: fresh ids fit
  auto trace_of = [&](const std::function<std::int32_t(int s, int t, int j)>& id) {
    const std::string path = file("d" + std::to_string(rng_()) + ".h5");
    TraceWriter w(path, 4, 50, {});
    w.record_routing(TraceRouting{2, K, E});
    for (int s = 0; s < N; ++s) {
      TraceSequence q = random_sequence(4, 50, length);
      q.prompt_length = P;
      for (int t = 0; t < length; ++t)
        for (int l = 0; l < 2; ++l)
          for (int j = 0; j < K; ++j) q.routing.push_back(l == 0 ? -1 : id(s, t, j));  // layer 0 dense
      w.add_sequence(q);
    }
    w.commit();
    return path;
  };
  const RoutingBatches same(TraceReader(trace_of([](int, int, int j) { return j; })));
  const RoutingBatches cyclic(TraceReader(trace_of([](int, int t, int j) { return (t % 4) * K + j; })));
  const RoutingBatches fresh(
      TraceReader(trace_of([](int s, int t, int j) { return (s * length + t) * K + j; })));
  const std::uint64_t seed = rng_();
  for (int B : {1, 3, 8})
    for (int R : {1, 2, 5}) {
      SCOPED_TRACE(testing::Message() << "B " << B << ", R " << R);
      EXPECT_EQ(distinct_experts(same, B, R, 16, seed).mean, K);
      const DistinctExperts c = distinct_experts(cyclic, B, R, 16, seed);
      if (B == 1) {
        EXPECT_EQ(c.mean, std::min(R, 4) * K);
      }
      EXPECT_GE(c.mean, std::min(R, 4) * K);
      EXPECT_LE(c.mean, 4 * K);
      const DistinctExperts f = distinct_experts(fresh, B, R, 16, seed);
      EXPECT_LE(f.mean, std::min(B * R * K, E));
      if (B == 1) {
        EXPECT_EQ(f.mean, R * K);
      }
      EXPECT_LE(f.p10, f.p90);
      EXPECT_LE(f.p90, B * R * K);  // a window's count never exceeds its ids
      EXPECT_GE(f.p10, R * K);      // one window's first sequence alone has R K fresh ids
    }
  // A batch larger than the places of R generated rows is refused.
  const std::string m = error_of([&] { (void)distinct_experts(same, N * (length - P) + 1, 1, 1, seed); });
  EXPECT_TRUE(contains(m, "fewer than the batch of")) << m;

  // The uniform formula against 4000 simulated batches of n rows (top_k of E without replacement).
  for (int n : {1, 4, 20}) {
    double sum = 0;
    for (int w = 0; w < 4000; ++w) {
      std::set<int> seen;
      for (int r = 0; r < n; ++r) {
        std::vector<int> all(E);
        for (int e = 0; e < E; ++e) all[static_cast<std::size_t>(e)] = e;
        std::shuffle(all.begin(), all.end(), rng_);
        for (int j = 0; j < K; ++j) seen.insert(all[static_cast<std::size_t>(j)]);
      }
      sum += static_cast<double>(seen.size());
    }
    // The mean of 4000 counts, each within [K, E]; its standard error is below 0.12 at these n.
    EXPECT_NEAR(sum / 4000, uniform_distinct_experts(E, K, n), 0.5) << "n " << n;
  }
}

}  // namespace
