// `mtplab info [--backend auto|cpu|cuda]`: one row per rank (host, ranks, device, library
// versions, git commit), gathered at rank 0 and printed as one table. Run it under the same
// launcher and options as an experiment to see where each rank lands before spending GPU hours.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/build_info.hpp"
#include "core/cli.hpp"
#include "core/error.hpp"
#include "core/str.hpp"
#include "dist/collectives.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "provenance/versions.hpp"

namespace mtplab::app {
namespace {

constexpr char kFieldSep = '\x1f';  // never in a host name, device name or version string

cli::Parser info_cli() {
  return command_parser(
             "info", "[--backend auto|cpu|cuda]",
             "Prints, for every rank: host, rank, local rank, device and PCI bus id, CUDA runtime and\n"
             "driver, NCCL, MPI, HDF5 and yaml-cpp versions, and the git commit of the binary.\n")
      .choice("backend", {"auto", "cpu", "cuda"},
              "where the ranks run (default auto):\n"
              "auto  cuda when built with CUDA and every rank sees a GPU, else cpu\n"
              "cpu   no GPU binding\n"
              "cuda  bind each rank to its GPU as an experiment would (refusals included)");
}

}  // namespace

int cmd_info(const Args& args) {
  const auto cli = parse_or_help(info_cli(), args);
  if (!cli) return 0;
  std::string backend = cli->choice("backend", "auto");

  dist::Runtime rt;
  if (backend == "auto") backend = rt.min_visible_gpus() > 0 ? "cuda" : "cpu";
  std::string device = "cpu", pci = "-";
  if (backend == "cuda") {
    // A refusal (more ranks than GPUs, two ranks on one GPU) is usually every rank's: agreed, so
    // that it is printed once.
    dist::run_agreed([&] {
      const auto& bound = rt.bind_device();
      device = str(bound.device, ": ", bound.name);
      pci = bound.pci_bus_id;
    });
  }

  const provenance::LibraryVersions v = provenance::library_versions();
  const std::string git = str(git_sha(), git_dirty() ? "-dirty" : "");
  const std::vector<std::string> mine = {
      rt.host(), str(rt.rank()), str(rt.local_rank()), device, pci,  v.cuda_runtime, v.cuda_driver,
      v.nccl,    v.hdf5,         v.yaml_cpp,           git,    v.mpi};
  const auto rows = rt.gather_strings(join(mine, std::string(1, kFieldSep)));
  if (rt.rank() != 0) return 0;

  std::vector<std::vector<std::string>> table = {{"host", "rank", "local", "device", "pci bus id", "cuda",
                                                  "driver", "nccl", "hdf5", "yaml-cpp", "git", "mpi"}};
  for (const auto& row : rows) table.push_back(split(row, kFieldSep));
  std::vector<size_t> width(table[0].size(), 0);
  for (const auto& row : table) {
    MTP_REQUIRE(row.size() == width.size(), "mtplab info: a rank sent ", row.size(), " fields instead of ",
                width.size());
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::printf("mtplab %s, %d rank(s) on %d node(s), backend %s\n", project_version(), rt.world(),
              rt.num_nodes(), backend.c_str());
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      std::string cell = row[c];
      if (c + 1 < row.size()) cell.resize(width[c] + 2, ' ');  // the last column is not padded
      line += cell;
    }
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace mtplab::app
