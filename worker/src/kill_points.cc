#include "kill_points.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>
#include <utility>

#include "ckpt/base/kill_point.h"
#include "ckpt/logging/logging.h"
#include "ckpt/logging/trace_file.h"

namespace ckpt::worker {
namespace {

void Die(const char* point) {
  logging::EmitTrace(base::kill_points::kTraceEvent, {{"point", point}});
  logging::Logger().error("ckpt-worker: kill point {}", point);
  raise(SIGKILL);
}

}  // namespace

KillPoints::KillPoints() {
  auto at = base::KillAtFromEnvironment();
  if (!at.ok() || !*at) return;
  point_ = std::move((*at)->point);
  n_ = (*at)->n;
  if (const char* once = std::getenv("CKPT_KILL_ONCE"); once != nullptr && *once != '\0') {
    once_file_ = once;
  }
}

bool KillPoints::Hit(const char* point) {
  if (n_ <= 0 || point_ != point || hits_.fetch_add(1) + 1 != n_) return false;
  if (once_file_.empty()) return true;
  const int fd = open(once_file_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return false;
  close(fd);
  return true;
}

void KillPoints::At(const char* point) {
  if (Hit(point)) Die(point);
}

void KillPoints::AtAfter(const char* point, double after_s) {
  if (!Hit(point)) return;
  std::thread([point, after_s] {
    std::this_thread::sleep_for(std::chrono::duration<double>(after_s));
    Die(point);
  }).detach();
}

KillPoints& WorkerKillPoints() {
  static KillPoints k;
  return k;
}

}  // namespace ckpt::worker
