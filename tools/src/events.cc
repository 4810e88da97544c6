// events: an experiment's decision log, once or followed until it ends.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "json_output.h"
#include "session.h"
#include "tool.h"

namespace ckpt::tool {
namespace {

using json = nlohmann::json;

volatile std::sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

std::string EventLine(const store::Event& e, const json& j) {
  std::string type = j.value("type", "?");
  std::string member =
      j.contains("member") && j["member"].is_string() ? j["member"].get<std::string>() : "-";
  std::string details;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    // The store's own fields, and what the line already says.
    if (k == "type" || k == "member" || k == "exp" || k == "unix_ms" || k == "seq" || k == "blob" ||
        (k == "reason" && it->is_string() && it->get<std::string>() == type)) {
      continue;
    }
    if (!details.empty()) details += " ";
    if (it->is_string()) {
      details += k + "=" + it->get<std::string>();
    } else if (it->is_number_float()) {
      details += k + "=" + FormatNumber(it->get<double>());
    } else if (it->is_object() && k == "hparams") {
      std::map<std::string, double> hp;
      for (auto h = it->begin(); h != it->end(); ++h) {
        if (h->is_number()) hp[h.key()] = h->get<double>();
      }
      details += k + "={" + FormatHparams(hp) + "}";
    } else {
      details += k + "=" + it->dump();
    }
  }
  char seq[24];
  std::snprintf(seq, sizeof(seq), "%6llu", static_cast<unsigned long long>(e.seq));
  return std::string(seq) + "  " + FormatTime(j.value("unix_ms", int64_t{0})) + "  " + type +
         std::string(type.size() < 14 ? 14 - type.size() : 1, ' ') + member +
         std::string(member.size() < 6 ? 6 - member.size() : 1, ' ') + details + "\n";
}

}  // namespace

Status Events(const ToolOptions& tool, const EventsOptions& options) {
  Session session(tool);
  CKPT_ASSIGN_OR_RETURN(std::string exp, ParseExperimentId(options.experiment));
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session.Reader());
  if (auto info = s->GetExperiment(exp); !info.ok()) {
    if (info.status().IsNotFound()) return Status::NotFound("experiment " + exp + " not found");
    return info.status();
  }
  uint64_t next = std::max<uint64_t>(1, options.from_seq);
  json all = json::array();
  if (options.follow) {
    std::signal(SIGINT, OnInterrupt);
    std::signal(SIGTERM, OnInterrupt);
  }
  while (true) {
    CKPT_ASSIGN_OR_RETURN(s, session.Reader());
    CKPT_ASSIGN_OR_RETURN(auto events, s->ListEvents(exp, next, 100000));
    for (const auto& e : events) {
      next = e.seq + 1;
      json j = json::parse(e.json, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) j = json{{"type", "?"}, {"raw", e.json}};
      if (!options.type.empty() && j.value("type", "") != options.type) continue;
      j["seq"] = e.seq;
      if (tool.json && options.follow) {
        CKPT_RETURN_IF_ERROR(Print(tool.out, j.dump() + "\n"));
      } else if (tool.json) {
        all.push_back(j);
      } else {
        CKPT_RETURN_IF_ERROR(Print(tool.out, EventLine(e, j)));
      }
    }
    if (!options.follow) break;
    CKPT_ASSIGN_OR_RETURN(store::ExperimentInfo info, s->GetExperiment(exp));
    auto status = records::ParseExperimentStatus(info.status);
    if (status.ok() && (*status == records::ExperimentStatus::kDone ||
                        *status == records::ExperimentStatus::kStopped ||
                        *status == records::ExperimentStatus::kFailed)) {
      // Events appended with the final status were read above only if this
      // view saw them; one more pass reads the rest.
      CKPT_ASSIGN_OR_RETURN(auto rest, s->ListEvents(exp, next, 100000));
      if (rest.empty()) break;
      continue;
    }
    for (int waited = 0; waited < options.poll_ms && !g_interrupted; waited += 50) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (g_interrupted) break;
    CKPT_RETURN_IF_ERROR(session.RefreshReader());
  }
  if (tool.json && !options.follow) {
    return PrintJson(tool, json{{"experiment", exp}, {"events", all}});
  }
  return Status::OK();
}

}  // namespace ckpt::tool
