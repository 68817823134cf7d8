// Test helper for tests/io/check_trace_h5py.py: writes a trace whose values follow a formula
// the Python side recomputes, and summarises a trace through TraceReader, so traces written
// by h5py (docs/trace-format.md) are checked against the C++ reader and vice versa.
//
//   trace_tool write-sample PATH      hidden 16, vocab 1000, 3 sequences (formula below)
//   trace_tool check PATH             one line per fact (with routing: its shape and a sum per
//                                     sequence); exit 1 with the error on a bad trace
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/trace.hpp"

using namespace mtplab;
using namespace mtplab::io;

namespace {

// Exact in BF16: an integer in [-125, 125] over 8 needs at most 7 significant bits.
float sample_value(std::int64_t s, std::int64_t t, std::int64_t j) {
  return static_cast<float>((s * 131 + t * 17 + j * 7) % 251 - 125) / 8.0f;
}
std::int32_t sample_token(std::int64_t s, std::int64_t t) {
  return static_cast<std::int32_t>((s * 1000 + t * 37) % 1000);
}

int write_sample(const std::string& path) {
  const std::int64_t hidden = 16;
  const std::vector<std::int32_t> lengths = {5, 9, 3}, prompts = {2, 4, 3};
  TraceProvenance prov{"trace_tool", "sample-model", "7", "", "", "hidden: 16\n"};
  TraceWriter w(path, hidden, 1000, prov, TraceWriterOptions{4, 4});
  for (std::int64_t s = 0; s < 3; ++s) {
    std::vector<std::int32_t> tokens;
    std::vector<float> hiddens;
    for (std::int64_t t = 0; t < lengths[static_cast<std::size_t>(s)]; ++t) {
      tokens.push_back(sample_token(s, t));
      for (std::int64_t j = 0; j < hidden; ++j) hiddens.push_back(sample_value(s, t, j));
    }
    w.add_sequence(tokens, std::span<const float>(hiddens), prompts[static_cast<std::size_t>(s)]);
  }
  w.commit();
  return 0;
}

// Position-weighted integer sums: exact, so both sides agree bit for bit.
int check(const std::string& path) {
  TraceReader r(path);
  r.check_all_hiddens();
  std::printf("dims %lld %lld %lld %lld\n", static_cast<long long>(r.hidden()),
              static_cast<long long>(r.vocab()), static_cast<long long>(r.num_sequences()),
              static_cast<long long>(r.total_positions()));
  std::printf("prov %s|%s|%s\n", r.provenance().generator.c_str(), r.provenance().model.c_str(),
              r.provenance().seed.c_str());
  for (std::int64_t s = 0; s < r.num_sequences(); ++s) {
    long long token_sum = 0, bits_sum = 0;
    const auto tokens = r.tokens(s);
    for (std::size_t t = 0; t < tokens.size(); ++t) token_sum += static_cast<long long>(t + 1) * tokens[t];
    const auto hs = r.hiddens(s);
    for (std::size_t k = 0; k < hs.size(); ++k) bits_sum += static_cast<long long>(k % 1000 + 1) * hs[k].bits;
    std::printf("seq %lld %lld %d %lld %lld\n", static_cast<long long>(s),
                static_cast<long long>(r.sequence_length(s)), r.prompt_length(s), token_sum, bits_sum);
    if (r.has_routing()) {
      long long route_sum = 0;
      const std::vector<std::int32_t> ids = r.routing(s);
      for (std::size_t k = 0; k < ids.size(); ++k)
        route_sum += static_cast<long long>(k % 997 + 1) * (ids[k] + 2);
      std::printf("route %lld %lld\n", static_cast<long long>(s), route_sum);
    }
  }
  if (r.has_routing())
    std::printf("routing %lld %lld %lld\n", static_cast<long long>(r.routing_shape().layers),
                static_cast<long long>(r.routing_shape().top_k),
                static_cast<long long>(r.routing_shape().experts));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: trace_tool write-sample|check PATH\n");
    return 2;
  }
  try {
    const std::string cmd = argv[1];
    if (cmd == "write-sample") return write_sample(argv[2]);
    if (cmd == "check") return check(argv[2]);
    std::fprintf(stderr, "trace_tool: unknown command %s\n", argv[1]);
    return 2;
  } catch (const mtplab::Error& e) {
    std::fprintf(stderr, "%s\n", e.describe().c_str());
    return 1;
  }
}
