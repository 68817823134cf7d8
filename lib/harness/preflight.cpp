// The arguments run and check share, resolved alike (preflight.hpp).
#include "harness/preflight.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/str.hpp"
#include "io/output.hpp"
#include "ops/ops.hpp"

namespace mtplab::harness {

Preflight prepare_run(const dist::Runtime& rt, const RunArgs& args) {
  Preflight pre;
  pre.ex = load_experiment(args.file, args.sets, args.ranks > 0 ? args.ranks : rt.world());
  const std::string out = args.out.empty() ? pre.ex.output : args.out;
  // A link is written through, never replaced (io/output.hpp: the rest of the output rule is the
  // input check's, harness::inspect_results_file).
  pre.output = out.empty() ? std::string() : io::follow_output_link(out);
  const int n = static_cast<int>(pre.ex.points.size());
  MTP_REQUIRE(args.point < n, args.file, ": --point ", args.point, " is out of range: the experiment has ", n,
              " point(s), 0..", n - 1);
  for (int i = 0; i < n; ++i)
    if (args.point < 0 || args.point == i) pre.todo.push_back(i);
  return pre;
}

std::string resolve_backend(const dist::Runtime& rt, const Experiment& ex) {
  const std::string backend = ex.points.front().backend;
  if (backend != "auto") return backend;
  return ops::cuda_backend_available() && rt.min_visible_gpus() > 0 ? "cuda" : "cpu";
}

CheckOptions run_check_options(const Preflight& pre, const std::string& backend) {
  CheckOptions o;
  o.output = pre.output;
  o.backend = backend;
  o.load_points = pre.todo;
  o.skip_done = true;
  return o;
}

std::string shell_quote(const std::string& text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string("_-+=./,:@%^").find(c) != std::string::npos;
  });
  if (plain) return text;
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string check_command(const RunArgs& args, int world) {
  std::string cmd = str("mtplab check ", shell_quote(args.file));
  const int ranks = args.ranks > 0 ? args.ranks : world;
  if (ranks > 1) cmd += str(" --ranks ", ranks);
  for (const auto& s : args.sets) cmd += str(" --set ", shell_quote(s));
  if (!args.out.empty()) cmd += str(" --out ", shell_quote(args.out));
  if (args.point >= 0) cmd += str(" --point ", args.point);
  return cmd;
}

}  // namespace mtplab::harness
