#include "store_health.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <utility>

#include "ckpt/records/events.h"
#include "log.h"
#include "trace.h"

namespace ckpt::scheduler {
namespace {

using std::chrono::milliseconds;

uint64_t FreeBytes(const std::string& path) {
  struct statvfs st {};
  if (statvfs(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

StoreHealth::StoreHealth(store::Store* store, std::string store_path, boost::asio::io_context* io,
                         std::function<void()> on_writable,
                         std::function<void(const Status&)> on_broken)
    : store_(store),
      store_path_(std::move(store_path)),
      on_writable_(std::move(on_writable)),
      on_broken_(std::move(on_broken)),
      timer_(*io) {}

bool StoreHealth::BrokenForGood() {
  if (!broken_.ok()) return true;
  const Status s = store_->Recover();
  if (s.ok() || s.IsResourceExhausted()) return false;
  MarkBroken(s);
  return true;
}

void StoreHealth::MarkBroken(const Status& s) {
  if (!broken_.ok()) return;
  broken_ = s;
  Logger().error("store {} refuses every write: {}", store_path_, s.ToString());
  on_broken_(s);
}

void StoreHealth::WaitForSpace(const std::string& reason) {
  if (waiting_ || stopped_) return;
  waiting_ = true;
  waiting_since_ = std::chrono::steady_clock::now();
  delay_ = milliseconds(1000);
  Logger().error(
      "store full: {}; dispatch paused until the store accepts writes again ({} bytes free on "
      "its file system); what it refused is redone then (an interval from its committed "
      "head, an exploit as decided)",
      reason, FreeBytes(store_path_));
  trace::StoreFull();
  Arm();
}

void StoreHealth::Stop() {
  stopped_ = true;
  timer_.cancel();
}

void StoreHealth::Arm() {
  timer_.expires_after(delay_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Probe();
  });
}

void StoreHealth::Probe() {
  if (stopped_) return;
  const Status s = store_->Recover();
  if (s.IsResourceExhausted()) {
    delay_ = std::min(delay_ * 2, milliseconds(30000));
    Logger().warn("store still full after {:.0f} s ({} bytes free): {}; next try in {} s",
                  SecondsSince(waiting_since_), FreeBytes(store_path_), s.message(),
                  delay_.count() / 1000);
    Arm();
    return;
  }
  waiting_ = false;
  if (!s.ok()) {
    // Not a full disk any more but a store that refuses writes for good.
    MarkBroken(s);
    return;
  }
  Logger().info("store writable again after {:.1f} s waiting for space; dispatch resumes",
                SecondsSince(waiting_since_));
  trace::StoreWritable();
  on_writable_();
}

void StoreHealth::ReportBackgroundErrors(const std::vector<std::string>& experiments) {
  for (const std::string& error : store_->TakeBackgroundErrors()) {
    Logger().error("{}", error);
    for (const auto& id : experiments) {
      (void)store_->AppendEvent(id, records::EncodeEvent(records::StoreErrorEvent{error}));
    }
  }
}

void StoreHealth::SizeForHeadStates(uint64_t total_bytes) {
  // Resize only on a change of more than a quarter (states differ by a few
  // bytes between members and intervals).
  if (total_bytes <= working_set_bytes_ + working_set_bytes_ / 4) return;
  working_set_bytes_ = total_bytes;
  const Status s = store_->SizeForWorkingSet(total_bytes);
  if (!s.ok()) {
    Logger().warn("sizing the store's memory to {} MB of states: {}", total_bytes >> 20,
                  s.ToString());
    return;
  }
  Logger().debug("store memory for {} MB of head states: blob cache {} MB, memtable {} MB",
                 total_bytes >> 20, store_->blob_cache_capacity() >> 20,
                 store_->blob_memtable_bytes() >> 20);
}

}  // namespace ckpt::scheduler
