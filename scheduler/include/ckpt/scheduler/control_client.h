// ControlClient: talks to a running `ckpt-scheduler serve` over its control
// socket (what `ckpt-tool` uses).
//
// Protocol (one JSON object per line, UTF-8, "\n"-terminated, both ways):
//
//   request  {"verb": "<verb>", <fields>, "id": <any scalar, optional>}
//   reply    {"ok": true, <results>, "id": <echoed>}
//            {"ok": false, "code": "<StatusCode name>", "error": "<what and why>", "id": ...}
//
//   verb      fields (all required unless marked)         results
//   submit    toml: string, origin: string (optional)     experiment: string
//   list      -                                           experiments: [brief]
//   status    experiment: string (optional)               experiment: full  | experiments: [full];
//                                                         devices: [device]; service: service
//   pause     experiment                                  -
//   resume    experiment                                  -
//   stop      experiment                                  -
//   restore   experiment, member: string, version: int    version: int (the new head version)
//   pin       experiment, member, version                 -
//   unpin     experiment, member, version                 -
//   shutdown  why: string (optional)                      - (then the scheduler stops gracefully)
//
//   brief  {"id", "status", "phase" ("training", "final eval", "done"), "population",
//           "intervals", "generation", "exploits", "member_intervals", "train_samples",
//           "metric" (what every score is: "accuracy", "neg_mse", "r2"),
//           "best_val_score" (null: none yet), "progress" (the progress line of `ckpt-scheduler
//           run`, ckpt/scheduler/summary_text.h)}
//   full   brief + {"wall_s", "training_s", "store", "members": [{"member", "status",
//           "intervals_done", "val_score", "test_score" (null: not evaluated), "version", "step",
//           "hparams": {name: value}}]} (best first)
//   device {"index", "device", "host" ("" = the scheduler's host; "ADDRESS:PORT"
//           of a worker connected over TCP), "pid", "ready", "mode", "capacity"
//           (slots), "busy" (members in flight), "restarts", "given_up",
//           "samples_per_s"}
//   service {"version" (ckpt's), "host" (hostname), "pid", "uptime_s" (since the
//           control socket opened), "store" (directory), "socket" (path)}
//
// An experiment that is not found gets a NotFound reply that lists the
// experiments that exist ("experiment 'x' not found (experiments: a, b)").
//
// A field of the wrong type, a missing required field, an unknown field, an
// unknown verb or malformed JSON gets an InvalidArgument reply naming it, and
// the connection stays open. A line longer than the server's limit gets a
// ResourceExhausted reply and the connection is closed. A peer whose uid/gid is
// not allowed gets one reply (code "FailedPrecondition", "permission denied:
// uid N ...") and is closed; so is one beyond max_clients ("ResourceExhausted").
// A connection that has not completed a request within the server's idle
// timeout is closed. Requests on one connection are answered in order.
//
// Thread-safety: a ControlClient is one connection; use it from one thread at
// a time. Every call is blocking, bounded by the timeout given to Connect.
#ifndef CKPT_SCHEDULER_CONTROL_CLIENT_H_
#define CKPT_SCHEDULER_CONTROL_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/scheduler/summary.h"

namespace ckpt::scheduler {

// The service itself, as the `status` verb reports it.
struct ServiceInfo {
  std::string version;  // ckpt's version ("0.1.0")
  std::string host;     // the scheduler's hostname
  int64_t pid = 0;
  double uptime_s = 0;  // since the control socket opened
  std::string store;    // store directory
  std::string socket;   // control socket path
};

// Everything one `status` request without an experiment returns: what `ckpt-tool
// status` and `top` show.
struct ServiceStatus {
  ServiceInfo service;
  std::vector<ExperimentSummary> experiments;  // members filled, best first
  std::vector<WorkerStatus> workers;
};

struct ControlClientOptions {
  // Socket of the running scheduler. Required.
  std::string socket_path;
  // Bound on connecting and on each request/reply exchange. Default: 30 s.
  std::chrono::milliseconds timeout{30000};
  // Longest reply line accepted (ResourceExhausted above). Default: 64 MiB.
  size_t max_reply_bytes = size_t{64} << 20;
};

class ControlClient {
 public:
  virtual ~ControlClient() = default;

  // Connects. Unavailable when nothing is at the path or nobody listens there
  // (a stale socket): "no ckpt-scheduler answers at PATH: is the service
  // running? `systemctl status ckpt-scheduler`"; FailedPrecondition when the
  // socket or its directory may not be used ("permission denied on PATH: add
  // yourself to group G", G the group owning it); IOError naming the path and
  // errno otherwise.
  static StatusOr<std::unique_ptr<ControlClient>> Connect(const ControlClientOptions& options);

  // Sends one request line (a JSON object; a trailing "\n" is added when
  // missing) and returns the reply line without its "\n". Errors: IOError /
  // Unavailable when the connection fails or is closed by the server,
  // Aborted on timeout. The reply is returned even when it says "ok": false.
  virtual StatusOr<std::string> CallRaw(const std::string& request_line) = 0;

  // CallRaw, except that an "ok": false reply becomes its Status (code and
  // message as the server gave them) and a reply that is no JSON object with a
  // boolean "ok" is Corruption. Returns the reply line (for clients that print
  // the protocol's JSON forms as they are).
  virtual StatusOr<std::string> CallChecked(const std::string& request_line) = 0;

  // Typed helpers: an "ok": false reply becomes its Status (code and message
  // as the server gave them).
  virtual StatusOr<std::string> Submit(const std::string& toml, const std::string& origin) = 0;
  virtual StatusOr<std::vector<ExperimentSummary>> List() = 0;
  // Members are filled; best first.
  virtual StatusOr<ExperimentSummary> ExperimentStatus(const std::string& experiment) = 0;
  // Every experiment the scheduler runs or ran since it started, members filled.
  virtual StatusOr<std::vector<ExperimentSummary>> AllExperimentStatus() = 0;
  virtual StatusOr<std::vector<WorkerStatus>> Devices() = 0;
  // The service, every experiment (members filled) and every worker, in one request.
  virtual StatusOr<ServiceStatus> Overview() = 0;
  virtual Status Pause(const std::string& experiment) = 0;
  virtual Status Resume(const std::string& experiment) = 0;
  virtual Status Stop(const std::string& experiment) = 0;
  // Returns the member's new head version.
  virtual StatusOr<int64_t> Restore(const std::string& experiment, const std::string& member,
                                    int64_t version) = 0;
  virtual Status Pin(const std::string& experiment, const std::string& member, int64_t version) = 0;
  virtual Status Unpin(const std::string& experiment, const std::string& member,
                       int64_t version) = 0;
  virtual Status Shutdown(const std::string& why) = 0;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_CONTROL_CLIENT_H_
