#include "harness/timer.hpp"

#include <numeric>

#include "core/error.hpp"

namespace mtplab::harness {

double PhaseTimes::block_total() const { return std::accumulate(block.begin(), block.end(), 0.0); }
double PhaseTimes::head_total() const { return std::accumulate(head.begin(), head.end(), 0.0); }
double PhaseTimes::exchange_total() const { return std::accumulate(exchange.begin(), exchange.end(), 0.0); }

EventPhaseTimer::EventPhaseTimer(ops::Backend& be, int max_draft) : be_(be), max_draft_(max_draft) {}

ops::Event& EventPhaseTimer::acquire(size_t& slot) {
  if (used_ == pool_.size()) pool_.push_back(be_.make_event());
  slot = used_++;
  return *pool_[slot];
}

void EventPhaseTimer::begin(drafter::Phase phase, int index) {
  size_t slot = 0;
  acquire(slot).record();
  open_.push_back({phase, index, slot});
}

void EventPhaseTimer::end(drafter::Phase phase, int index) {
  size_t slot = 0;
  acquire(slot).record();
  for (size_t i = open_.size(); i-- > 0;) {
    if (open_[i].phase == phase && open_[i].index == index) {
      closed_.push_back({phase, index, open_[i].event, slot});
      open_.erase(open_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
  MTP_FAIL("timer: phase ", drafter::to_string(phase), "[", index, "] ended without a begin");
}

PhaseTimes EventPhaseTimer::collect() {
  MTP_REQUIRE(open_.empty(), "timer: phase ", drafter::to_string(open_.front().phase), "[",
              open_.front().index, "] began and never ended");
  PhaseTimes t;
  t.block.assign(static_cast<size_t>(max_draft_), 0.0);
  t.head.assign(static_cast<size_t>(max_draft_), 0.0);
  t.exchange.assign(static_cast<size_t>(max_draft_), 0.0);
  for (const auto& c : closed_) {
    const double ms = be_.elapsed_ms(*pool_[c.start], *pool_[c.end]);
    const size_t i = static_cast<size_t>(c.index);
    auto per_draft = [&](std::vector<double>& v) {
      MTP_REQUIRE(c.index >= 0 && i < v.size(), "timer: draft index ", c.index, " outside 0..", v.size() - 1);
      v[i] += ms;
    };
    using drafter::Phase;
    if (c.phase == Phase::block || c.phase == Phase::head || c.phase == Phase::exchange) {
      per_draft(c.phase == Phase::block ? t.block : c.phase == Phase::head ? t.head : t.exchange);
    } else {
      double& total = c.phase == Phase::prefill        ? t.prefill
                      : c.phase == Phase::propose      ? t.propose
                      : c.phase == Phase::after_verify ? t.after_verify
                      : c.phase == Phase::stats        ? t.stats
                      : c.phase == Phase::verify       ? t.verify
                                                       : t.catch_up;
      total += ms;
    }
  }
  closed_.clear();
  used_ = 0;
  return t;
}

}  // namespace mtplab::harness
