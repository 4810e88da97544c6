#include "service_view.h"

#include <cstdio>
#include <map>
#include <sstream>

#include "ckpt/records/status.h"
#include "ckpt/scheduler/summary_text.h"
#include "session.h"
#include "text_table.h"

namespace ckpt::tool {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string Rate(double samples_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", samples_per_s);
  return buf;
}

}  // namespace

std::vector<std::string> ServiceView(const scheduler::ServiceStatus& status) {
  const auto& svc = status.service;
  std::vector<std::string> out;
  out.push_back("ckpt-scheduler " + svc.version + " on " + svc.host + ", pid " +
                std::to_string(svc.pid) + ", up " + scheduler::FormatDuration(svc.uptime_s));
  out.push_back("store " + svc.store + ", socket " + svc.socket);
  int slots = 0, busy = 0, ready = 0;
  double rate = 0;
  for (const auto& w : status.workers) {
    slots += w.capacity;
    busy += w.busy;
    ready += w.ready ? 1 : 0;
    rate += w.samples_per_s;
  }
  out.push_back("workers " + std::to_string(status.workers.size()) + " (" + std::to_string(ready) +
                " ready), slots " + std::to_string(slots) + ", members in flight " +
                std::to_string(busy) + ", " + Rate(rate) + " samples/s");
  out.push_back("experiments " + std::to_string(status.experiments.size()));
  for (const auto& e : status.experiments) {
    std::map<std::string, int> by_state;
    for (const auto& m : e.members) ++by_state[records::MemberStatusName(m.status)];
    std::string members;
    for (const auto& [state, n] : by_state) {
      members += (members.empty() ? "" : ", ") + std::to_string(n) + " " + state;
    }
    out.push_back("  " + e.id + " [" + records::ExperimentStatusName(e.status) +
                  "] members: " + (members.empty() ? "none" : members));
    out.push_back("    " + scheduler::ProgressLine(e));
  }
  return out;
}

std::vector<std::string> WorkersView(const scheduler::ServiceStatus& status) {
  TextTable t;
  t.AddRow(
      {"worker", "host", "device", "slots", "state", "in flight", "samples/s", "restarts", "pid"});
  for (const auto& w : status.workers) {
    t.AddRow({std::to_string(w.index), w.host.empty() ? status.service.host : w.host, w.device,
              std::to_string(w.capacity), scheduler::WorkerStateName(w), std::to_string(w.busy),
              Rate(w.samples_per_s), std::to_string(w.restarts),
              w.pid > 0 ? std::to_string(w.pid) : "-"});
  }
  return Lines(t.Render());
}

}  // namespace ckpt::tool
