// `mtplab routing TRACE.h5 [TRACE2.h5 ...]`: the distinct routed experts of verify-shaped batches
// (B sequences x R consecutive rows) in traces that record routing (io/routing.hpp), beside
// independent uniform routing: what decides a verify layer's routed-expert bytes at small B.
// No MPI: run it anywhere.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "io/routing.hpp"
#include "io/trace.hpp"

namespace mtplab::app {
namespace {

cli::Parser routing_cli() {
  return command_parser(
             "routing", "TRACE.h5 [TRACE.h5 ...] [options]",
             "Prints the distinct routed experts per layer of B sequences x R consecutive generated\n"
             "rows (a verify batch's shape) in each trace's recorded routing (/routing: mtplab trace\n"
             "--routing), the mean over the routed layers and --windows random batches with its 10th\n"
             "and 90th percentiles, and beside it the expectation under independent uniform routing.\n")
      .integer_list("batch", "B,...", "batch sizes (default 1,2,4,8,16,32,64,128)", 1, 1 << 20)
      .integer_list("rows", "R,...", "rows per sequence (default 1,2,3,4,5)", 1, 64)
      .integer("windows", "N", "random batches per (B, R) (default 64)", 1, 1 << 20)
      .integer("seed", "N", "seed of the batches' choice (default 1)", 0, INT64_MAX)
      .positionals("TRACE.h5", 1, 64);
}

}  // namespace

int cmd_routing(const Args& args) {
  const auto cli = parse_or_help(routing_cli(), args);
  if (!cli) return 0;
  check_logging_env();  // no Runtime here to check them
  const std::vector<int64_t> batches = cli->integers("batch", {1, 2, 4, 8, 16, 32, 64, 128});
  const std::vector<int64_t> rows = cli->integers("rows", {1, 2, 3, 4, 5});
  const int windows = static_cast<int>(cli->integer("windows", 64));
  const uint64_t seed = static_cast<uint64_t>(cli->integer("seed", 1));
  for (const std::string& path : cli->positional()) {
    const io::TraceReader trace(path);
    const io::RoutingBatches routing(trace);  // refuses a trace without routing
    const io::TraceRouting& r = routing.shape();
    std::printf("%s: %lld sequences, %lld layers, top_k %lld of %lld experts (%s)\n", path.c_str(),
                static_cast<long long>(trace.num_sequences()), static_cast<long long>(r.layers),
                static_cast<long long>(r.top_k), static_cast<long long>(r.experts),
                trace.provenance().model.c_str());
    std::printf("%5s %3s %9s %7s %7s %9s %8s\n", "B", "R", "distinct", "p10", "p90", "uniform", "ratio");
    for (int64_t B : batches)
      for (int64_t R : rows) {
        const io::DistinctExperts d =
            io::distinct_experts(routing, static_cast<int>(B), static_cast<int>(R), windows, seed);
        std::printf("%5lld %3lld %9.2f %7.1f %7.1f %9.2f %8.3f\n", static_cast<long long>(B),
                    static_cast<long long>(R), d.mean, d.p10, d.p90, d.uniform, d.mean / d.uniform);
      }
  }
  return 0;
}

}  // namespace mtplab::app
