// StoreHealth: the scheduler's watch over its store (private to
// ckpt::scheduler), out of the event loop's way.
//
// - A full disk: when the store refuses a write for want of space (a commit,
//   or a write an experiment keeps to redo: an exploit, a state record, an
//   event, its end; ResourceExhausted), WaitForSpace pauses dispatch
//   (waiting_for_space()) and probes the store (Store::Recover) every 1 s,
//   doubling to 30 s, warning with the free bytes each time; once it takes
//   writes again (or refuses them for good, which is logged) `on_writable`
//   runs on the loop, and the caller redoes what was refused and dispatches.
// - A store broken for good: a write refused for another reason than space
//   may be the writer's own fault (a blob that does not parse) or the
//   store's (RocksDB failing to write: every later write returns it, store.h
//   "reopen the store"). BrokenForGood() tells them apart by asking the
//   store (Store::Recover); when it is the store's, and when a probe finds
//   it so, `on_broken` runs once with the error: the scheduler stops and
//   exits non-zero naming it, so that a supervisor (systemd's Restart=)
//   reopens the store instead of every member being charged a failure.
// - Background errors: what the store set aside of its background work (a
//   compaction failing on a damaged blob file) is logged and recorded in each
//   experiment's event log.
// - Memory: the store's blob cache and memtable follow the running
//   experiments' head states (population x largest state seen), resized only
//   when that estimate grows by more than a quarter.
//
// Ownership: borrows the store and the io_context, which outlive it.
// Thread-safety: none; the scheduler's event loop thread calls it, and its
// timer runs on that loop.
#ifndef CKPT_SCHEDULER_STORE_HEALTH_H_
#define CKPT_SCHEDULER_STORE_HEALTH_H_

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/store/store.h"

namespace ckpt::scheduler {

class StoreHealth {
 public:
  StoreHealth(store::Store* store, std::string store_path, boost::asio::io_context* io,
              std::function<void()> on_writable, std::function<void(const Status&)> on_broken);

  // While true nothing may be dispatched.
  bool waiting_for_space() const { return waiting_; }
  // The store refused a write for want of space (`reason` names it): pause
  // and probe as above. A no-op while already waiting.
  void WaitForSpace(const std::string& reason);
  // A write was refused for another reason than space or a moved head: true
  // when the store now refuses every write (it then ran on_broken, once),
  // false when it takes writes (the refusal was the writer's).
  bool BrokenForGood();
  // The error on_broken was given; OK while the store is not broken.
  const Status& broken() const { return broken_; }
  // No more probes (the scheduler is finishing).
  void Stop();

  // Logs the store's background errors and appends a store_error event to
  // each of `experiments`' logs.
  void ReportBackgroundErrors(const std::vector<std::string>& experiments);

  // The running experiments' head states now weigh `total_bytes`: resizes
  // the store's memory when that is more than a quarter above the last size.
  void SizeForHeadStates(uint64_t total_bytes);

 private:
  void Probe();
  void Arm();
  // Records `s` as the store's for-good failure and runs on_broken (once).
  void MarkBroken(const Status& s);

  store::Store* const store_;
  const std::string store_path_;
  const std::function<void()> on_writable_;
  const std::function<void(const Status&)> on_broken_;
  Status broken_;
  boost::asio::steady_timer timer_;
  bool waiting_ = false;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point waiting_since_{};
  std::chrono::milliseconds delay_{1000};
  uint64_t working_set_bytes_ = 0;  // last given to Store::SizeForWorkingSet
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_STORE_HEALTH_H_
