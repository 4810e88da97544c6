// Fuzz target for the control API's request parser (the scheduler's side of
// every line a client sends) and the client's readers of replies.
//
// The input is one request line. ParseRequest must give OK or an
// InvalidArgument, never a crash or an exception; an accepted request must be
// a JSON object with a known verb whose re-serialization (Dump, as replies
// are written) parses to an accepted request with the same verb. The same
// bytes, parsed as JSON, also go through the reply readers (SummaryFromJson,
// WorkerFromJson, StatusFromReply), which must never throw.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "control_protocol.h"

using ckpt::scheduler::protocol::ParseRequest;
using ckpt::scheduler::protocol::Request;
using json = nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  Request request;
  ckpt::Status s = ParseRequest(line, &request);
  if (s.ok()) {
    if (!request.body.is_object() || request.verb.empty()) std::abort();
    if (request.body.at("verb").get<std::string>() != request.verb) std::abort();
    const std::string again = ckpt::scheduler::protocol::Dump(request.body);
    Request reparsed;
    // Dump replaces invalid UTF-8, which the parser refuses to begin with, so
    // an accepted request survives the round trip unchanged in meaning.
    if (!ParseRequest(again, &reparsed).ok() || reparsed.verb != request.verb) std::abort();
  } else if (!s.IsInvalidArgument()) {
    std::abort();
  }
  if (!request.id.is_null() && request.id.is_structured()) std::abort();

  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) {
    (void)ckpt::scheduler::protocol::SummaryFromJson(j);
    (void)ckpt::scheduler::protocol::WorkerFromJson(j);
    (void)ckpt::scheduler::protocol::StatusFromReply(j);
    if (j.is_object()) {
      for (const auto& [key, value] : j.items()) {
        (void)ckpt::scheduler::protocol::SummaryFromJson(value);
        (void)ckpt::scheduler::protocol::WorkerFromJson(value);
      }
    }
  }
  return 0;
}
