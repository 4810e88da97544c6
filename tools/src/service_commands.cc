// ckpt-tool's service commands (service_commands.h) over the control client.
#include "service_commands.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "ckpt/records/config.h"
#include "ckpt/records/status.h"
#include "ckpt/scheduler/control_client.h"
#include "ckpt/scheduler/summary_text.h"
#include "service_view.h"
#include "session.h"
#include "text_table.h"

namespace ckpt::tool {
namespace {

using json = nlohmann::json;
using records::ExperimentPhase;
using scheduler::ControlClient;
using scheduler::ExperimentSummary;

// The reply of one request for --json: the protocol's own forms, without
// "ok" and "id".
StatusOr<json> Ask(ControlClient* client, const json& request) {
  CKPT_ASSIGN_OR_RETURN(std::string line, client->CallChecked(request.dump()));
  json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
  reply.erase("ok");
  reply.erase("id");
  return reply;
}

Status PrintJson(const ToolOptions& tool, const json& j, bool pretty) {
  return Print(tool.out, (pretty ? j.dump(2) : j.dump()) + "\n");
}

// OK when the experiment ended done; Aborted naming how it ended otherwise.
Status EndedWell(const ExperimentSummary& s) {
  if (s.status == records::ExperimentStatus::kDone) return Status::OK();
  return Status::Aborted("experiment " + s.id + " ended " +
                         records::ExperimentStatusName(s.status));
}

// How to name the socket in a hint: nothing when it is the default.
std::string SocketFlag(const ToolOptions& tool) {
  return tool.socket_path.empty() ? "" : "--socket " + tool.socket_path + " ";
}

// Follows `experiment` until it ends (Watch).
Status Follow(const ToolOptions& tool, ControlClient* client, const std::string& experiment,
              int poll_ms) {
  const bool tty = !tool.json && isatty(fileno(tool.out)) == 1;
  int drawn_lines = 0;  // on a terminal: lines of the last frame, redrawn in place
  int64_t printed_intervals = -1;
  ExperimentPhase printed_phase = ExperimentPhase::kTraining;
  std::optional<records::ExperimentStatus> printed_status;
  while (true) {
    CKPT_ASSIGN_OR_RETURN(ExperimentSummary s, client->ExperimentStatus(experiment));
    const bool ended = s.phase == ExperimentPhase::kDone;
    const bool changed = s.member_intervals != printed_intervals || s.phase != printed_phase ||
                         s.status != printed_status;
    if (tty) {
      std::string frame = scheduler::ProgressLine(s) + "\n" + scheduler::SummaryTable(s, 10);
      std::string out;
      if (drawn_lines > 0) out = "\033[" + std::to_string(drawn_lines) + "A\r\033[J";
      out += frame;
      drawn_lines = 0;
      for (char c : frame) drawn_lines += c == '\n';
      CKPT_RETURN_IF_ERROR(Print(tool.out, out));
    } else if (changed) {
      if (tool.json) {
        CKPT_ASSIGN_OR_RETURN(json reply,
                              Ask(client, {{"verb", "status"}, {"experiment", experiment}}));
        CKPT_RETURN_IF_ERROR(PrintJson(tool, reply["experiment"], false));
      } else {
        CKPT_RETURN_IF_ERROR(Print(tool.out, scheduler::ProgressLine(s) + "\n"));
        if (ended) CKPT_RETURN_IF_ERROR(Print(tool.out, scheduler::SummaryTable(s, 10)));
      }
    }
    printed_intervals = s.member_intervals;
    printed_phase = s.phase;
    printed_status = s.status;
    if (ended) return EndedWell(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
}

}  // namespace

StatusOr<std::unique_ptr<ControlClient>> ConnectService(const ToolOptions& tool) {
  scheduler::ControlClientOptions o;
  o.socket_path = tool.socket_path.empty() ? DefaultSocket() : tool.socket_path;
  o.timeout = std::chrono::milliseconds(30000);
  return ControlClient::Connect(o);
}

Status Submit(const ToolOptions& tool, const SubmitOptions& options) {
  std::ifstream in(options.file, std::ios::binary);
  if (!in) return Status::NotFound("cannot read " + options.file);
  std::stringstream text;
  text << in.rdbuf();
  // The scheduler's own parser: the same errors, with key and line, before
  // anything is sent.
  CKPT_ASSIGN_OR_RETURN(records::ExperimentConfig config,
                        records::ParseExperimentConfig(text.str(), options.file));
  CKPT_ASSIGN_OR_RETURN(auto client, ConnectService(tool));
  CKPT_ASSIGN_OR_RETURN(std::string id, client->Submit(text.str(), options.file));
  if (tool.json && !options.wait) {
    return PrintJson(tool, {{"experiment", id}}, true);
  }
  if (!tool.json) {
    CKPT_RETURN_IF_ERROR(Print(
        tool.out, "submitted " + id + ": follow it with `ckpt-tool " + SocketFlag(tool) + "watch " +
                      id + "` (or `ckpt-tool " + SocketFlag(tool) + "status " + id + "`)\n"));
  }
  if (!options.wait) return Status::OK();
  return Follow(tool, client.get(), id, options.poll_ms);
}

Status ServiceStatus(const ToolOptions& tool, const std::string& experiment) {
  CKPT_ASSIGN_OR_RETURN(auto client, ConnectService(tool));
  if (tool.json) {
    json request = {{"verb", "status"}};
    if (!experiment.empty()) request["experiment"] = experiment;
    CKPT_ASSIGN_OR_RETURN(json reply, Ask(client.get(), request));
    return PrintJson(tool, reply, true);
  }
  if (!experiment.empty()) {
    CKPT_ASSIGN_OR_RETURN(ExperimentSummary s, client->ExperimentStatus(experiment));
    return Print(tool.out, scheduler::ProgressLine(s) + "\n\n" +
                               scheduler::SummaryTable(s, s.members.size()));
  }
  CKPT_ASSIGN_OR_RETURN(scheduler::ServiceStatus all, client->Overview());
  std::string out;
  for (const auto& line : ServiceView(all)) out += line + "\n";
  return Print(tool.out, out);
}

Status Control(const ToolOptions& tool, ControlVerb verb, const std::string& experiment) {
  CKPT_ASSIGN_OR_RETURN(auto client, ConnectService(tool));
  const char* done = "";
  switch (verb) {
    case ControlVerb::kPause:
      CKPT_RETURN_IF_ERROR(client->Pause(experiment));
      done = "paused";
      break;
    case ControlVerb::kResume:
      CKPT_RETURN_IF_ERROR(client->Resume(experiment));
      done = "resumed";
      break;
    case ControlVerb::kStop:
      CKPT_RETURN_IF_ERROR(client->Stop(experiment));
      done = "stopped";
      break;
  }
  if (tool.json) return PrintJson(tool, {{"experiment", experiment}, {"done", done}}, true);
  return Print(tool.out, experiment + ": " + done + "\n");
}

Status Workers(const ToolOptions& tool) {
  CKPT_ASSIGN_OR_RETURN(auto client, ConnectService(tool));
  if (tool.json) {
    CKPT_ASSIGN_OR_RETURN(json reply, Ask(client.get(), {{"verb", "status"}}));
    return PrintJson(tool, {{"workers", reply["devices"]}, {"service", reply["service"]}}, true);
  }
  CKPT_ASSIGN_OR_RETURN(scheduler::ServiceStatus all, client->Overview());
  std::string out;
  for (const auto& line : WorkersView(all)) out += line + "\n";
  return Print(tool.out, out);
}

Status Watch(const ToolOptions& tool, const WatchOptions& options) {
  CKPT_ASSIGN_OR_RETURN(auto client, ConnectService(tool));
  return Follow(tool, client.get(), options.experiment, options.poll_ms);
}

}  // namespace ckpt::tool
