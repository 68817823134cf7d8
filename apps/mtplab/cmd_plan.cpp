// `mtplab plan [PLAN.yaml] [options]`: the best draft length per concurrency from acceptance
// (replay or online results, or a profile) and costs (benchmark CSVs, online points) for a model
// (lib/plan/planner.hpp, docs/planning.md). Tables on stdout; the plan file (HDF5) and the engine schedules
// when asked. No MPI: run it anywhere.
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "plan/planner.hpp"

namespace mtplab::app {
namespace {

cli::Parser plan_cli() {
  return command_parser(
             "plan",
             "[PLAN.yaml] [--set key=value ...] [--profile F | --results F ...] [--step F ...] [--verify F "
             "...] [--online F.h5 ...] [--online-points p0,p4] "
             "[--model M] [--batch 1,2,4] [--k-max K] [--fixed-us C] [--out F.h5] [--exports DIR] [--force]",
             "The best draft length k per concurrency B (0: MTP off), with 95% intervals, from acceptance\n"
             "(replay or online results files, or an acceptance profile), costs (bench_step_batch.csv, "
             "bench_verify.csv,\n"
             "online points) and the model's layer count: T(B, k) = draft(B, k) + L x layer(B, k + 1) + "
             "head(B (k + 1)) + c,\n"
             "tokens/s per user tau(k) / T, per GPU B tau(k) / T / gpus, speedup over k = 0. The plan file\n"
             "(PLAN.yaml) holds the keys of docs/planning.md; the options below set or replace them. Prints\n"
             "the inputs, warnings where they disagree, tau(k), the speedup per (B, k) and the best k per "
             "B;\n"
             "writes the plan file (HDF5, its `plan` group) and the engine schedules when asked.\n")
      .repeatable_text("set", "key=value", "override a key of the plan (YAML value), e.g. costs.fixed_us=150")
      .text("model", "M", "model preset or config file (model:); its num_hidden_layers is L")
      .text("profile", "F", "acceptance profile JSON (acceptance.profile); replaces the plan's acceptance")
      .repeatable_text("results", "F.h5",
                       "replay or online results file (acceptance.results); replaces the plan's acceptance")
      .text("points", "p0,p4", "points of the results files (acceptance.points)")
      .repeatable_text("step", "F.csv", "bench_step_batch CSV (costs.step); replaces the plan's")
      .repeatable_text("verify", "F.csv", "bench_verify CSV (costs.verify); replaces the plan's")
      .repeatable_text("online", "F.h5",
                       "results file of online points (costs.online): the fixed cost per B (replacing "
                       "costs.fixed_us), and with --set costs.online_terms=all every cost")
      .text("online-points", "p0,p4", "online points of those files (costs.online_points)")
      .integer_list("batch", "1,2,4", "the batch sizes to plan (batch:)", 1, 1 << 20)
      .integer("k-max", "K", "the largest draft length (k_max:)", 1, 64)
      .number("fixed-us", "C", "the fixed cost per step in us (costs.fixed_us)", 0, 1e9)
      .text("out", "F.h5", "the plan file to write (output:)")
      .text("exports", "DIR", "where the engine schedules and the acceptance profile go (exports:)")
      .flag("force", "replace an existing plan file and existing exports (never any other file)")
      .positionals("the plan file", 0, 1);
}

std::string yaml_text(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

YAML::Node string_list(const std::vector<std::string>& v) {
  YAML::Node n(YAML::NodeType::Sequence);
  for (const auto& s : v) n.push_back(s);
  return n;
}

}  // namespace

int cmd_plan(const Args& args) {
  const auto cli = parse_or_help(plan_cli(), args);
  if (!cli) return 0;
  check_logging_env();
  std::vector<std::pair<std::string, std::string>> overrides;
  if (cli->has("model")) overrides.emplace_back("model", yaml_text(YAML::Node(cli->text("model"))));
  if (cli->has("profile") && cli->has("results"))
    throw Error("mtplab plan: give --profile or --results, not both", __FILE__, __LINE__);
  if (cli->has("profile")) {
    YAML::Node a(YAML::NodeType::Map);
    a["profile"] = cli->text("profile");
    overrides.emplace_back("acceptance", yaml_text(a));
  }
  if (cli->has("results")) {
    YAML::Node a(YAML::NodeType::Map);
    a["results"] = string_list(cli->texts("results"));
    overrides.emplace_back("acceptance", yaml_text(a));
  }
  if (cli->has("points"))
    overrides.emplace_back("acceptance.points", yaml_text(string_list(split(cli->text("points"), ','))));
  if (cli->has("step")) overrides.emplace_back("costs.step", yaml_text(string_list(cli->texts("step"))));
  if (cli->has("verify"))
    overrides.emplace_back("costs.verify", yaml_text(string_list(cli->texts("verify"))));
  if (cli->has("online")) {  // the online points give c(B): the plan's own fixed cost is replaced
    overrides.emplace_back("costs.online", yaml_text(string_list(cli->texts("online"))));
    overrides.emplace_back("costs.fixed_us", "~");
  }
  if (cli->has("online-points"))
    overrides.emplace_back("costs.online_points",
                           yaml_text(string_list(split(cli->text("online-points"), ','))));
  if (cli->has("batch")) {
    YAML::Node b(YAML::NodeType::Sequence);
    for (const int64_t v : cli->integers("batch", {})) b.push_back(v);
    overrides.emplace_back("batch", yaml_text(b));
  }
  if (cli->has("k-max")) overrides.emplace_back("k_max", std::to_string(cli->integer("k-max", 0)));
  if (cli->has("fixed-us"))
    overrides.emplace_back("costs.fixed_us", yaml_text(YAML::Node(cli->number("fixed-us", 0))));
  if (cli->has("out")) overrides.emplace_back("output", yaml_text(YAML::Node(cli->text("out"))));
  if (cli->has("exports")) overrides.emplace_back("exports", yaml_text(YAML::Node(cli->text("exports"))));
  for (const auto& s : cli->texts("set")) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(str("mtplab plan: --set \"", s, "\": expected key.path=value"), __FILE__, __LINE__);
    overrides.emplace_back(trim(s.substr(0, eq)), s.substr(eq + 1));
  }
  const std::string file = cli->positional().empty() ? "" : cli->positional()[0];
  const plan::PlanSpec spec = plan::load_plan_spec(file, overrides);
  plan::check_outputs(spec, cli->flag("force"));  // before anything is written
  const plan::PlanResult result = plan::run_plan(spec);
  std::fputs(plan::format_plan(result).c_str(), stdout);
  std::vector<std::string> argv = {"mtplab", "plan"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (!spec.output.empty()) {
    const io::OutputLock claim = claim_output(spec.output, argv);
    plan::write_plan_file(spec.output, result, argv, cli->flag("force"));
    std::printf("\nplan file: %s (group plan; docs/planning.md)\n", spec.output.c_str());
  } else {
    std::printf("\nno plan file written (output: or --out)\n");
  }
  if (!spec.exports.empty())
    for (const auto& f : plan::write_exports(spec.exports, result, cli->flag("force")))
      std::printf("export: %s\n", f.c_str());
  return 0;
}

}  // namespace mtplab::app
