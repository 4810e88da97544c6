#include "simulated_run.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace ckpt::testing {

StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(size_t resident_bytes) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0)
    return Status::IOError(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(ready[0]);
    ::close(ready[1]);
    return Status::IOError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // The child of a threaded process: system calls and memset only.
    ::close(ready[0]);
    void* p =
        ::mmap(nullptr, resident_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ::_exit(1);
    std::memset(p, 1, resident_bytes);
    const char byte = 'r';
    if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  ssize_t n;
  do {
    n = ::read(ready[0], &byte, 1);
  } while (n < 0 && errno == EINTR);
  ::close(ready[0]);
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess(pid));
  if (n != 1) return Status::IOError("stand-in worker " + std::to_string(pid) + " died at start");
  return child;
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

ChildProcess::~ChildProcess() { Kill(); }

SimulatedRun::SimulatedRun(metrics::Metrics* metrics, std::string experiment, int members,
                           std::vector<SimulatedWorker> workers)
    : metrics_(metrics),
      experiment_(std::move(experiment)),
      members_(members),
      workers_(std::move(workers)),
      samples_total_(workers_.size(), 0),
      ring_to_(workers_.size(), 0),
      ring_from_(workers_.size(), 0) {}

void SimulatedRun::Start() {
  for (const SimulatedWorker& w : workers_) metrics_->WorkerStarted(w.worker, w.device, w.pid);
}

void SimulatedRun::Restart(size_t index, pid_t pid) {
  SimulatedWorker& w = workers_.at(index);
  metrics_->WorkerExited(w.worker, w.device);
  w.pid = pid;
  metrics_->WorkerStarted(w.worker, w.device, w.pid);
  // A new process and channel count their totals from zero.
  samples_total_[index] = 0;
  ring_to_[index] = 0;
  ring_from_[index] = 0;
}

void SimulatedRun::Step() {
  using metrics::StoreOp;
  constexpr uint64_t kSamples = uint64_t{100} * 64;       // 100 steps of batch 64
  constexpr uint64_t kStateBytes = uint64_t{250} * 1024;  // a LeNet-5 with SGD momentum
  for (size_t i = 0; i < workers_.size(); ++i) {
    const SimulatedWorker& w = workers_[i];
    const int64_t member = intervals_ % members_;
    ++intervals_;
    // Interval times spread over a few buckets, by member, so quantiles move.
    const double seconds = 0.2 + 0.05 * static_cast<double>(member % 10);
    metrics_->StoreOperation(StoreOp::kReadHeadBlob, 60e-6 + 1e-6 * (member % 7), kStateBytes);
    metrics_->RingSendObserved(w.worker, w.device, 40e-6 + 2e-6 * (member % 5));
    metrics_->IntervalCommitted(experiment_, w.device, seconds, kSamples);
    metrics_->StoreOperation(StoreOp::kCommitResult, 300e-6 + 10e-6 * (member % 9), kStateBytes);
    metrics_->StoreOperation(StoreOp::kSetMemberState, 25e-6, 300);
    metrics_->StoreOperation(StoreOp::kAppendEvent, 20e-6, 200);
    if (intervals_ % 4 == 0) {
      metrics_->Exploited(experiment_);
      metrics_->StoreOperation(StoreOp::kExploit, 150e-6, 600);
    }
    if (intervals_ % 25 == 0) {
      metrics_->MemberFailed(experiment_, ipc::FailureCode::kNonFinite);
    }
    samples_total_[i] += kSamples;
    metrics::WorkerStats stats;
    stats.samples_total = samples_total_[i];
    stats.slots = 4;
    stats.slots_busy = 1 + intervals_ % 4;
    stats.fused = i % 2 == 1;
    stats.allocator_allocated_bytes = int64_t{90} << 20;
    stats.allocator_reserved_bytes = int64_t{128} << 20;
    metrics_->SetWorkerStats(w.worker, w.device, stats);
    ring_to_[i] += kStateBytes + 64;
    ring_from_[i] += kStateBytes + 128;
    metrics::RingStats ring;
    ring.bytes_to_worker_total = ring_to_[i];
    ring.bytes_from_worker_total = ring_from_[i];
    ring.used_bytes = (kStateBytes + 64) * static_cast<uint64_t>(stats.slots_busy);
    ring.capacity_bytes = uint64_t{64} << 20;
    metrics_->SetRingStats(w.worker, w.device, ring);
  }
  const int64_t running = std::min<int64_t>(members_, 2 * static_cast<int64_t>(workers_.size()));
  done_ = std::min<int64_t>(members_ - running, intervals_ / 50);
  metrics::MemberCounts counts;
  counts.running = running;
  counts.done = done_;
  counts.queued = members_ - running - done_;
  metrics_->SetMemberCounts(experiment_, counts);
  const double progress = static_cast<double>(intervals_) / (intervals_ + 100.0);
  metrics_->SetScores(experiment_, format::MetricKind::kAccuracy, 0.5 + 0.4 * progress,
                      0.4 + 0.35 * progress);
}

}  // namespace ckpt::testing
