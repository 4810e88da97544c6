// The control API's JSON forms of scheduler values, shared by the server and
// the client (private to ckpt::scheduler). The protocol itself is described in
// ckpt/scheduler/control_client.h.
//
// Thread-safety: pure functions.
#ifndef CKPT_SCHEDULER_CONTROL_PROTOCOL_H_
#define CKPT_SCHEDULER_CONTROL_PROTOCOL_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"
#include "ckpt/scheduler/control_client.h"
#include "ckpt/scheduler/summary.h"

namespace ckpt::scheduler::protocol {

// "brief" (no members) or "full" (with members) form of a summary.
nlohmann::json SummaryToJson(const ExperimentSummary& summary, bool with_members);
nlohmann::json WorkerToJson(const WorkerStatus& worker);
nlohmann::json ServiceToJson(const ServiceInfo& service);

// InvalidArgument naming the field when a value has the wrong shape.
StatusOr<ExperimentSummary> SummaryFromJson(const nlohmann::json& j);
StatusOr<WorkerStatus> WorkerFromJson(const nlohmann::json& j);
StatusOr<ServiceInfo> ServiceFromJson(const nlohmann::json& j);

// ckpt's version ("0.1.0"), as the service reports it.
const char* CkptVersion();

// {"ok": false, "code": <name>, "error": <message>}.
nlohmann::json ErrorReply(const Status& status);
// The Status an "ok": false reply stands for (Internal for an unknown code).
Status StatusFromReply(const nlohmann::json& reply);

// Requests nested deeper than this (arrays/objects) are refused before parsing.
inline constexpr int kMaxRequestDepth = 32;

// One request line, parsed and checked against its verb's fields.
struct Request {
  std::string verb;
  nlohmann::json body;   // the whole request object
  nlohmann::json id;     // the scalar "id" to echo in the reply; null when none
  bool mutates = false;  // the verb changes the scheduler (logged with the peer's uid)
};

// Parses one request line (its "\n" and any "\r" removed; the server bounds
// its length before). Returns OK when it is a JSON object whose verb is known,
// with every required field present, every field of its type and no unknown
// field; otherwise InvalidArgument naming the problem (empty line, NUL byte,
// nesting deeper than kMaxRequestDepth, malformed JSON, not an object, missing
// or unknown verb, missing, mistyped, empty or unknown field, a version below 1
// or above INT64_MAX). `out->id` is set whenever the line is an object with a
// scalar "id", even when the request is refused, so the error reply echoes it.
Status ParseRequest(std::string_view line, Request* out);

// Serializes one reply or request line (no "\n"); invalid UTF-8 in strings is
// replaced, never thrown on.
std::string Dump(const nlohmann::json& j);

}  // namespace ckpt::scheduler::protocol

#endif  // CKPT_SCHEDULER_CONTROL_PROTOCOL_H_
