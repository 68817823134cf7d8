// StepGraphs: record-once, replay-many CUDA graphs of the draft step (graph.hpp).
#include "drafter/graph.hpp"

#include "core/error.hpp"

namespace mtplab::drafter {

ops::Graph& StepGraphs::get(const Key& key, const std::function<void()>& record, bool& recorded) {
  for (auto& e : entries_) {
    if (e.key == key) {
      recorded = false;
      return *e.graph;
    }
  }
  be_.begin_capture();
  try {
    record();
  } catch (...) {
    // Close the capture so the stream is usable again; its (invalid) graph is dropped.
    try {
      be_.end_capture();
    } catch (...) {
    }
    throw;
  }
  std::unique_ptr<ops::Graph> graph = be_.end_capture();
  if (entries_.size() >= kMaxGraphs) entries_.erase(entries_.begin());
  entries_.push_back(Entry{key, std::move(graph)});
  ++recordings_;
  recorded = true;
  return *entries_.back().graph;
}

}  // namespace mtplab::drafter
