#include "trace.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "ckpt/logging/trace_file.h"

namespace ckpt::scheduler::trace {
namespace {

using json = nlohmann::json;

void Emit(const char* ev, json fields) { logging::EmitTrace(ev, std::move(fields)); }

}  // namespace

bool Enabled() { return logging::TraceEnabled(); }

void Result(int worker, uint64_t task) {
  if (Enabled()) Emit(kResult, {{"worker", worker}, {"task", task}});
}

void Committed(const std::string& exp, const std::string& member, int64_t version, int interval,
               const std::string& blob_hex) {
  if (!Enabled()) return;
  Emit(kCommitted, {{"exp", exp},
                    {"member", member},
                    {"version", version},
                    {"interval", interval},
                    {"blob", blob_hex}});
}

void Exploited(const std::string& exp, const std::string& member, const std::string& donor,
               int64_t version) {
  if (!Enabled()) return;
  Emit(kExploited, {{"exp", exp}, {"member", member}, {"donor", donor}, {"version", version}});
}

void Hello(int worker, const std::string& device) {
  if (Enabled()) Emit(kHello, {{"worker", worker}, {"device", device}});
}

void Lost(int worker, const std::string& reason) {
  if (Enabled()) Emit(kLost, {{"worker", worker}, {"reason", reason}});
}

void BadResult(int worker, uint64_t task, const std::string& member) {
  if (Enabled()) Emit(kBadResult, {{"worker", worker}, {"task", task}, {"member", member}});
}

void StoreFull() {
  if (Enabled()) Emit(kStoreFull, json::object());
}

void StoreWritable() {
  if (Enabled()) Emit(kStoreWritable, json::object());
}

void Ended(const std::string& exp, const std::string& status) {
  if (Enabled()) Emit(kEnded, {{"exp", exp}, {"status", status}});
}

}  // namespace ckpt::scheduler::trace
