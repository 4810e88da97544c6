// What a population run reports to ckpt::metrics, without training: the same
// calls, in the same proportions, as the scheduler makes while members train,
// commit, exploit and sometimes fail. Real worker processes are the caller's
// (ChildProcess), so that the process sampler reads real /proc entries.
//
// Thread-compatible: one thread calls Step.
#ifndef CKPT_TESTS_METRICS_SIMULATED_RUN_H_
#define CKPT_TESTS_METRICS_SIMULATED_RUN_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/metrics/metrics.h"

namespace ckpt::testing {

// A child process that holds `resident_bytes` of touched memory and waits
// until it is killed: a stand-in worker process with a real pid, CPU time and
// resident memory. Start returns once the memory is touched. The destructor
// kills and reaps it.
class ChildProcess {
 public:
  // Forks the child (which only makes system calls: safe in a threaded
  // parent). IOError when fork or the pipe fails or the child dies first.
  static StatusOr<std::unique_ptr<ChildProcess>> Start(size_t resident_bytes = size_t{16} << 20);
  ~ChildProcess();
  pid_t pid() const { return pid_; }
  // Kills and reaps the process now.
  void Kill();

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

struct SimulatedWorker {
  std::string worker;  // "w0"
  std::string device;  // "cpu", "cuda:0"
  pid_t pid = 0;
};

class SimulatedRun {
 public:
  SimulatedRun(metrics::Metrics* metrics, std::string experiment, int members,
               std::vector<SimulatedWorker> workers);

  // Announces the workers (WorkerStarted).
  void Start();
  // One member-interval committed on each worker, with the store, ring, STATS,
  // member-count and score updates that go with it; every 4th interval an
  // exploit, every 25th a failure.
  void Step();
  // Restarts worker `index` as process `pid` (its counters continue).
  void Restart(size_t index, pid_t pid);

  int64_t intervals() const { return intervals_; }
  const std::string& experiment() const { return experiment_; }

 private:
  metrics::Metrics* const metrics_;
  const std::string experiment_;
  const int members_;
  std::vector<SimulatedWorker> workers_;
  std::vector<uint64_t> samples_total_;
  std::vector<uint64_t> ring_to_, ring_from_;
  int64_t intervals_ = 0;
  int64_t done_ = 0;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_METRICS_SIMULATED_RUN_H_
