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

// "1.2 GiB" of resident memory; "-" before the worker's first STATS.
std::string Memory(int64_t bytes) {
  return bytes > 0 ? FormatBytes(static_cast<uint64_t>(bytes)) : "-";
}

// "37% 2.1 GiB/80.0 GiB": the worker's GPU as NVML sees it (every process on
// it), then its own allocator's share; "-" without NVML figures.
std::string Gpu(const scheduler::WorkerStatus& w) {
  std::string out;
  if (w.gpu_utilization) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.0f%%", *w.gpu_utilization * 100);
    out = buf;
  }
  if (w.gpu_memory_used_bytes && w.gpu_memory_total_bytes) {
    out += (out.empty() ? "" : " ") + FormatBytes(static_cast<uint64_t>(*w.gpu_memory_used_bytes)) +
           "/" + FormatBytes(static_cast<uint64_t>(*w.gpu_memory_total_bytes));
  }
  return out.empty() ? "-" : out;
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
  t.AddRow({"worker", "host", "device", "slots", "state", "in flight", "samples/s", "restarts",
            "pid", "rss", "device mem", "gpu (util, used/total)"});
  for (const auto& w : status.workers) {
    t.AddRow({std::to_string(w.index), w.host.empty() ? status.service.host : w.host, w.device,
              std::to_string(w.capacity), scheduler::WorkerStateName(w), std::to_string(w.busy),
              Rate(w.samples_per_s), std::to_string(w.restarts),
              w.pid > 0 ? std::to_string(w.pid) : "-", Memory(w.rss_bytes),
              Memory(w.device_memory_bytes), Gpu(w)});
  }
  return Lines(t.Render());
}

}  // namespace ckpt::tool
