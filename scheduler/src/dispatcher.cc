#include "dispatcher.h"

namespace ckpt::scheduler {

void Dispatcher::Dispatch(TaskSink* sink, const std::vector<Experiment*>& experiments,
                          Clock::time_point now) {
  if (experiments.empty()) return;
  while (true) {
    const int worker = sink->PickFree(kInFlightPerSlot);
    if (worker < 0) return;
    Experiment* e = nullptr;
    for (size_t k = 0; k < experiments.size(); ++k) {
      Experiment* c = experiments[(rr_ + k) % experiments.size()];
      if (c->Runnable()) {
        e = c;
        rr_ = (rr_ + k + 1) % experiments.size();
        break;
      }
    }
    if (e == nullptr) return;
    Task t;
    static_cast<WorkItem&>(t) = e->TakeNext(now);
    t.id = next_task_++;
    t.exp = e->id();
    t.dispatched = now;
    t.rules = ResultRulesFor(e->config());
    sink->Send(static_cast<size_t>(worker), std::move(t));
  }
}

}  // namespace ckpt::scheduler
