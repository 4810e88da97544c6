// The control API's JSON forms of scheduler values, shared by the server and
// the client (private to ckpt::scheduler). The protocol itself is described in
// ckpt/scheduler/control_client.h.
//
// Thread-safety: pure functions.
#ifndef CKPT_SCHEDULER_CONTROL_PROTOCOL_H_
#define CKPT_SCHEDULER_CONTROL_PROTOCOL_H_

#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/format/status.h"
#include "ckpt/scheduler/summary.h"

namespace ckpt::scheduler::protocol {

// "brief" (no members) or "full" (with members) form of a summary.
nlohmann::json SummaryToJson(const ExperimentSummary& summary, bool with_members);
nlohmann::json WorkerToJson(const WorkerStatus& worker);

// InvalidArgument naming the field when a value has the wrong shape.
StatusOr<ExperimentSummary> SummaryFromJson(const nlohmann::json& j);
StatusOr<WorkerStatus> WorkerFromJson(const nlohmann::json& j);

// {"ok": false, "code": <name>, "error": <message>}.
nlohmann::json ErrorReply(const Status& status);
// The Status an "ok": false reply stands for (Internal for an unknown code).
Status StatusFromReply(const nlohmann::json& reply);

// Serializes one reply or request line (no "\n"); invalid UTF-8 in strings is
// replaced, never thrown on.
std::string Dump(const nlohmann::json& j);

}  // namespace ckpt::scheduler::protocol

#endif  // CKPT_SCHEDULER_CONTROL_PROTOCOL_H_
