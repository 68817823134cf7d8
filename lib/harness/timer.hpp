// The harness's PhaseTimer: backend events at the drafter's phase boundaries (CUDA events on a
// GPU, the steady clock on the CPU), resolved into milliseconds once per step.
//
// Invariants: events are recorded in stream order and only read (elapsed_ms, which waits for the
// end event) in collect(), after the step's work was enqueued, so timing adds no synchronisation
// inside a step. Phases nest (exchange inside head); each is reported on its own. Events are
// pooled and reused across steps.
#pragma once
#include <memory>
#include <vector>

#include "drafter/drafter.hpp"
#include "ops/ops.hpp"

namespace mtplab::harness {

/// Milliseconds per phase since the last collect(). Per-draft phases are indexed by draft.
struct PhaseTimes {
  double prefill = 0, propose = 0, after_verify = 0, catch_up = 0;
  double stats = 0;   ///< the drafts' DraftStats pass after a propose (sampling, margins)
  double verify = 0;  ///< the target's verify forward (online runs)
  std::vector<double> block, head, exchange;  ///< [max_draft]
  double block_total() const;
  double head_total() const;
  double exchange_total() const;
};

class EventPhaseTimer final : public drafter::PhaseTimer {
 public:
  EventPhaseTimer(ops::Backend& be, int max_draft);
  void begin(drafter::Phase phase, int index) override;
  void end(drafter::Phase phase, int index) override;
  /// Resolves every closed interval since the last collect and starts afresh. An interval left
  /// open is an Error (a phase began and never ended).
  PhaseTimes collect();

 private:
  struct Open {
    drafter::Phase phase;
    int index;
    size_t event;
  };
  struct Closed {
    drafter::Phase phase;
    int index;
    size_t start, end;
  };
  ops::Event& acquire(size_t& slot);
  ops::Backend& be_;
  int max_draft_;
  std::vector<std::unique_ptr<ops::Event>> pool_;
  size_t used_ = 0;
  std::vector<Open> open_;
  std::vector<Closed> closed_;
};

}  // namespace mtplab::harness
