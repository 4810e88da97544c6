// PhaseTimes: where a worker's time goes, for CKPT_WORKER_PHASES=1 (at exit,
// one stderr line "ckpt-worker phases: {JSON}"): the seconds the slot threads
// spent per phase of a member-interval, summed over slots (receive: the ring
// copy; decode: blob parse and validation; train; evaluate; encode:
// finiteness check and blob preparation; send: writing the RESULT into the
// ring; idle: waiting for work), the CONFIGURE time and the time from start
// to the first RESULT.
//
// Thread-safety: every method may be called from any thread (relaxed atomics:
// the figures are read once, at exit).
#ifndef CKPT_WORKER_SRC_PHASE_TIMES_H_
#define CKPT_WORKER_SRC_PHASE_TIMES_H_

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace ckpt::worker {

class PhaseTimes {
 public:
  enum Phase { kReceive, kDecode, kTrain, kEvaluate, kEncode, kSend, kIdle, kCount };
  void Add(Phase p, double seconds) {
    ns_[p].fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
  }
  void Member() { members_.fetch_add(1, std::memory_order_relaxed); }
  void FirstResult(double seconds) {
    double none = -1;
    first_result_s_.compare_exchange_strong(none, seconds);
  }
  void Configure(double seconds) { configure_s_.store(seconds); }
  std::string ToJson() const {
    static constexpr const char* kNames[kCount] = {"receive_s", "decode_s", "train_s", "evaluate_s",
                                                   "encode_s",  "send_s",   "idle_s"};
    nlohmann::json j{{"members", members_.load()},
                     {"configure_s", configure_s_.load()},
                     {"first_result_s", first_result_s_.load()}};
    for (int p = 0; p < kCount; ++p) j[kNames[p]] = 1e-9 * static_cast<double>(ns_[p].load());
    return j.dump();
  }

 private:
  std::atomic<int64_t> ns_[kCount] = {};
  std::atomic<int64_t> members_{0};
  std::atomic<double> configure_s_{0};
  std::atomic<double> first_result_s_{-1};
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_SRC_PHASE_TIMES_H_
