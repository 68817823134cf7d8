// CUDA graphs of the draft step (`cuda_graph: on`): the whole propose of k drafts (front, block,
// head and the cross-rank pick, collectives included) recorded once and replayed every step.
//
// Invariants:
// - A graph bakes in device addresses and host scalars: it is keyed by the draft count k, the
//   addresses of the slot pool's caches (a new pool at new addresses gets a new graph; one at
//   reused addresses reuses the graph, which is then exactly right) and the padded row count (one
//   graph per batch bucket). The drafter's own scratch and weights never move (growing the step's
//   scratch drops the graphs).
// - Everything that changes per step is read on the device: the slots, positions, input tokens
//   and hiddens are uploaded into fixed buffers before the launch, the drafts downloaded after.
// - Recording does not run the work: the caller launches the graph it gets back.
// - At most kMaxGraphs graphs live at once (oldest dropped first), so replaying many sequences
//   does not grow device memory without bound.
// - Graphs that recorded NCCL collectives must be destroyed before the communicator: clear()
//   (or the owner's destructor) before the dist::Group goes.
#pragma once
#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "ops/ops.hpp"

namespace mtplab::drafter {

class StepGraphs {
 public:
  static constexpr size_t kMaxGraphs = 16;
  struct Key {
    int k = 0;
    std::array<const void*, 6> cache{};
    int rows = 1;  ///< the batch's padded row count (batched drafting: one graph per bucket)
    /// What else the recorded work does (MtpDrafter: chain tokens, kept logits, the stats pass);
    /// 0: the plain step.
    int variant = 0;
    bool operator==(const Key&) const = default;
  };

  explicit StepGraphs(ops::Backend& be) : be_(be) {}
  ~StepGraphs() { clear(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  /// The graph for `key`, recording it by calling `record` when there is none yet (`recorded`
  /// then says so: the host-side effects of `record` have happened, the device work has not).
  /// An exception inside `record` closes the capture and propagates.
  ops::Graph& get(const Key& key, const std::function<void()>& record, bool& recorded);
  void clear() noexcept { entries_.clear(); }
  size_t size() const { return entries_.size(); }
  /// Recordings made so far (tests check that a replay reuses graphs).
  int recordings() const { return recordings_; }

 private:
  struct Entry {
    Key key;
    std::unique_ptr<ops::Graph> graph;
  };
  ops::Backend& be_;
  std::vector<Entry> entries_;  // oldest first
  int recordings_ = 0;
};

}  // namespace mtplab::drafter
