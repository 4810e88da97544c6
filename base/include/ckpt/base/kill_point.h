// Kill points: the named places where a crash test makes a process SIGKILL
// itself, and the one parser of the environment variable that arms them.
//
// CKPT_KILL_AT=POINT:N makes a process (the scheduler, with its store, or a
// worker) kill itself the N-th time it passes POINT, counted per process. The
// scheduler refuses a malformed value at start; a worker ignores it (the
// scheduler that spawns it has refused it already). The points are named
// here once, for the code that passes them and for the tests and the chaos
// harness that arm them.
//
// Thread-safety: constants and pure functions.
#ifndef CKPT_BASE_KILL_POINT_H_
#define CKPT_BASE_KILL_POINT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt::base {

// The environment variable that arms a kill point.
inline constexpr char kKillAtVariable[] = "CKPT_KILL_AT";

namespace kill_points {

// The store's (StoreOptions::kill_point), around the RocksDB write of each
// kind of version and control write.
inline constexpr char kCommitBeforeWrite[] = "commit.before_write";
inline constexpr char kCommitAfterWrite[] = "commit.after_write";
inline constexpr char kImportBeforeWrite[] = "import.before_write";
inline constexpr char kImportAfterWrite[] = "import.after_write";
inline constexpr char kExploitBeforeWrite[] = "exploit.before_write";
inline constexpr char kExploitAfterWrite[] = "exploit.after_write";
inline constexpr char kRestoreBeforeWrite[] = "restore.before_write";
inline constexpr char kRestoreAfterWrite[] = "restore.after_write";
inline constexpr char kPinBeforeWrite[] = "pin.before_write";
inline constexpr char kPinAfterWrite[] = "pin.after_write";
inline constexpr char kDeleteBeforeWrite[] = "delete.before_write";
inline constexpr char kDeleteAfterWrite[] = "delete.after_write";
// The blob log (StoreOptions::blob_log): a write's blob appended, before its
// fdatasync (taken only when the write is synced), and after it; both come
// before the write's RocksDB write (its *.before_write).
inline constexpr char kBlobBeforeSync[] = "blob.before_sync";
inline constexpr char kBlobAfterSync[] = "blob.after_sync";
// Retention releases a version's blob (inside the write that causes it).
inline constexpr char kRetentionRelease[] = "retention.release";

// The scheduler's engine: after an interval's commit and its state record;
// between an exploit and its state record.
inline constexpr char kSchedulerCommitted[] = "scheduler.committed";
inline constexpr char kSchedulerExploited[] = "scheduler.exploited";

// The worker's: a TRAIN record decoded, still in the ring; a slot starts a
// member-interval (the kill falls mid-training); a RESULT reserved in the
// ring, half written; a RESULT committed to the ring, not yet read.
inline constexpr char kWorkerDecode[] = "worker.decode";
inline constexpr char kWorkerTrain[] = "worker.train";
inline constexpr char kWorkerEncode[] = "worker.encode";
inline constexpr char kWorkerResultSent[] = "worker.result_sent";
inline constexpr std::array<const char*, 4> kWorkerPoints = {kWorkerDecode, kWorkerTrain,
                                                             kWorkerEncode, kWorkerResultSent};
// A SHUTDOWN received: the worker dies instead of exiting cleanly (not among
// kWorkerPoints: nothing is in flight then, so chaos has nothing to check).
inline constexpr char kWorkerShutdown[] = "worker.shutdown";

// The structured trace's event (ckpt/logging/trace_file.h) a worker writes,
// with "point", just before it kills itself at an armed kill point.
inline constexpr char kTraceEvent[] = "kill_point";

}  // namespace kill_points

// An armed kill point: die the n-th time `point` is passed.
struct KillAt {
  std::string point;
  int64_t n = 0;  // >= 1
};

// Parses a CKPT_KILL_AT value "POINT:N": POINT not empty (the last colon ends
// it), N decimal digits only, 1 <= N < 2^63. InvalidArgument
// "CKPT_KILL_AT=<text> is not POINT:N (N >= 1)" otherwise. The point is not
// checked against the names above: a process ignores the points it lacks.
StatusOr<KillAt> ParseKillAt(std::string_view text);

// $CKPT_KILL_AT parsed: nullopt when unset or empty, ParseKillAt's error when
// malformed.
StatusOr<std::optional<KillAt>> KillAtFromEnvironment();

}  // namespace ckpt::base

#endif  // CKPT_BASE_KILL_POINT_H_
