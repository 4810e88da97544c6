// The events of an experiment's audit log (store::Store::AppendEvent, and the
// event of a commit, exploit or restore), as typed values with one encoder
// and one decoder shared by every writer (the scheduler, ckpt-tool) and
// reader (ckpt-tool's lineage, plots and events).
//
// Stored form: one JSON object per event, {"type": NAME, ...fields}; the
// store adds "exp", "unix_ms" and, for commits, exploits and restores, its
// own "member", "reason", "blob", "version", "step" fields. The fields of each
// type are those of its struct, under the names in events.cc. Every type the
// scheduler has written since the event log exists decodes:
//   trained, exploit, restore, failed, member_stopped, corrupt_state,
//   target_reached, wall_time_reached, configure_refused, paused, resumed,
//   stopped, final_eval, store_error, worker_lost, resume_failed.
// A "failed" event's code reads in every spelling ipc::ParseFailureCode reads; an
// unknown type or a field of the wrong type is Corruption naming the event;
// unknown fields are ignored (the store's, a newer writer's). Decoding never
// throws.
//
// Thread-safety: values and pure functions.
#ifndef CKPT_RECORDS_EVENTS_H_
#define CKPT_RECORDS_EVENTS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/task.h"
#include "ckpt/ipc/failure_code.h"

namespace ckpt::records {

// A member's interval committed (the event of store::CommitRequest). JSON:
// {"interval": 3, "val_accuracy": 0.87, "worker": 1, "hparams": {...}}: the score under its
// metric's name (format::SplitMetricName; null when not evaluated). Events
// written before the metric had its name read as "val_acc": accuracy.
struct TrainedEvent {
  int interval = 0;
  double val_score = 0;
  int worker = 0;
  // Filled in by the store: the member and the version committed.
  std::string member;
  int64_t version = 0;
  format::MetricKind metric = format::MetricKind::kAccuracy;
  // The hyperparameters it trained with (JSON "hparams"), which the
  // model-based policies' history is rebuilt from on resume; empty in events
  // written before it was logged.
  std::map<std::string, double> hparams = {};
};

// A member took a donor's weights and hyperparameters (store::Store::Exploit).
struct ExploitEvent {
  std::string member;
  std::string donor;
  int interval = 0;
  std::string why;
  std::map<std::string, double> hparams;  // after explore
  int64_t version = 0;                    // filled in by the store
};

// A member's head was set back to `from_version` (JSON "restored_version"),
// as the new `version`. Logged by the store's Restore in the restore's own
// write, which sets both (the same values).
struct RestoreEvent {
  std::string member;
  int64_t from_version = 0;
  int64_t version = 0;  // filled in by the store
  // Who restored it when not the scheduler ("ckpt-tool"); "" = the scheduler.
  std::string by;
};

// A member-interval failed.
struct FailedEvent {
  std::string member;
  ipc::FailureCode code = ipc::FailureCode::kInternal;
  std::string reason;
  int failures = 0;  // in a row, this one included
};

// A member was stopped by the policy or after too many failures.
struct MemberStoppedEvent {
  std::string member;
  std::string why;
  std::optional<int64_t> kept_version;  // after failures: its last good version
};

// A member's head blob was damaged; it fell back to an older version. Logged
// by the store's Restore in the restore's own write (Store::Restore's
// event_json), which sets `version`.
struct CorruptStateEvent {
  std::string member;
  int64_t bad_version = 0;
  int64_t restored_from = 0;  // JSON "restored_version", as the store names it
  int64_t version = 0;        // the restored head's (the store's "version")
  int interval = 0;
  std::string reason;  // the damage found (JSON "damage")
};

struct TargetReachedEvent {
  std::string member;
  double score = 0;
  double target = 0;
};

struct WallTimeReachedEvent {
  double max_wall_s = 0;
};

// A worker refused the experiment's CONFIGURE; the experiment failed.
struct ConfigureRefusedEvent {
  std::string reason;
};

struct PausedEvent {};
struct ResumedEvent {};
struct StoppedEvent {};

// The test-split evaluation at the end of an experiment. JSON: {"results":
// [{"member", "val_<metric>", "test_<metric>", "version"}]}, every result
// under the experiment's metric (old events: "val_acc", "test_acc").
struct FinalEvalEvent {
  struct Result {
    std::string member;
    double val_score = 0;
    double test_score = 0;
    int64_t version = 0;
  };
  std::vector<Result> results;
  format::MetricKind metric = format::MetricKind::kAccuracy;
};

// The store reported a background error (logged to every experiment).
struct StoreErrorEvent {
  std::string error;
};

// A worker died or hung; its members were requeued.
struct WorkerLostEvent {
  bool given_up = false;
  int64_t worker = 0;
  std::string device;
  std::string reason;
  int64_t requeued = 0;
};

// An unfinished experiment could not be resumed at start-up.
struct ResumeFailedEvent {
  std::string error;
};

using Event =
    std::variant<TrainedEvent, ExploitEvent, RestoreEvent, FailedEvent, MemberStoppedEvent,
                 CorruptStateEvent, TargetReachedEvent, WallTimeReachedEvent, ConfigureRefusedEvent,
                 PausedEvent, ResumedEvent, StoppedEvent, FinalEvalEvent, StoreErrorEvent,
                 WorkerLostEvent, ResumeFailedEvent>;

// The "type" of each alternative: "trained", "exploit", ... (see above).
const char* EventTypeName(const Event& event);

// The JSON object of `event` (store-filled fields left out).
std::string EncodeEvent(const Event& event);

// Decodes one stored event. `what` names it in errors ("experiment e event 12").
StatusOr<Event> DecodeEvent(std::string_view json, const std::string& what);

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_EVENTS_H_
