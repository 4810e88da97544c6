// verify: every blob's checksums and every manifest's references.
#include <map>
#include <nlohmann/json.hpp>

#include "json_output.h"
#include "session.h"
#include "tool.h"

namespace ckpt::tool {

using json = nlohmann::json;

Status Verify(const ToolOptions& tool, const std::string& experiment) {
  Session session(tool);
  std::string only;
  if (!experiment.empty()) {
    CKPT_ASSIGN_OR_RETURN(only, ParseExperimentId(experiment));
  }
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session.Reader());
  std::vector<std::string> problems;
  uint64_t blobs_checked = 0, bytes_checked = 0, manifests_checked = 0;
  if (only.empty()) {
    CKPT_ASSIGN_OR_RETURN(store::VerifyReport r, s->Verify());
    problems = r.problems;
    blobs_checked = r.blobs_checked;
    bytes_checked = r.bytes_checked;
    manifests_checked = r.manifests_checked;
  }
  // Name the member versions behind each bad blob.
  std::vector<std::string> experiments;
  if (only.empty()) {
    CKPT_ASSIGN_OR_RETURN(auto all, s->ListExperiments());
    for (const auto& e : all) experiments.push_back(e.id);
  } else {
    if (auto info = s->GetExperiment(only); !info.ok()) {
      if (info.status().IsNotFound()) return Status::NotFound("experiment " + only + " not found");
      return info.status();
    }
    experiments.push_back(only);
  }
  std::map<BlobId, Status> checked;
  uint64_t walked = 0;
  for (const auto& exp : experiments) {
    CKPT_ASSIGN_OR_RETURN(auto members, s->ListMembers(exp));
    for (const auto& h : members) {
      CKPT_ASSIGN_OR_RETURN(auto versions, s->ListVersions(exp, h.member));
      for (const auto& m : versions) {
        ++walked;
        if (m.parent) {
          auto p = s->GetManifest(exp, m.parent->member, m.parent->version);
          if (!p.ok() && !p.status().IsNotFound()) {
            problems.push_back(exp + "/" + VersionName(m.member, m.version) + ": parent " +
                               VersionName(m.parent->member, m.parent->version) + ": " +
                               p.status().ToString());
          }
        }
        if (!m.holds_blob) continue;
        auto it = checked.find(m.blob);
        if (it == checked.end()) {
          auto b = s->ReadBlob(m.blob, /*verify=*/true);
          Status st = b.ok() ? Status::OK() : b.status();
          if (b.ok()) {
            if (!only.empty()) {  // the whole store's counts come from Store::Verify
              ++blobs_checked;
              bytes_checked += b->size();
            }
            if (b->size() != m.bytes) {
              st = Status::Corruption("blob is " + std::to_string(b->size()) +
                                      " bytes, the manifest says " + std::to_string(m.bytes));
            }
          }
          it = checked.emplace(m.blob, st).first;
        }
        if (!it->second.ok()) {
          problems.push_back(exp + "/" + VersionName(m.member, m.version) + ": blob " +
                             m.blob.Hex() + ": " + it->second.ToString());
        }
      }
    }
  }
  if (!only.empty()) manifests_checked = walked;
  if (tool.json) {
    CKPT_RETURN_IF_ERROR(
        PrintJson(tool, json{{"ok", problems.empty()},
                             {"experiment", only.empty() ? json(nullptr) : json(only)},
                             {"blobs_checked", blobs_checked},
                             {"bytes_checked", bytes_checked},
                             {"manifests_checked", manifests_checked},
                             {"problems", problems}}));
  } else {
    std::string out;
    for (const auto& p : problems) out += "BAD  " + p + "\n";
    out += (problems.empty() ? "ok: " : "FAILED: ") + std::to_string(blobs_checked) + " blobs (" +
           FormatBytes(bytes_checked) + ") and " + std::to_string(manifests_checked) +
           " manifests checked" +
           (problems.empty() ? "" : ", " + std::to_string(problems.size()) + " problems") + "\n";
    CKPT_RETURN_IF_ERROR(Print(tool.out, out));
  }
  if (!problems.empty()) {
    return Status::Corruption("verification failed: " + std::to_string(problems.size()) +
                              " problems, the first: " + problems.front());
  }
  return Status::OK();
}

}  // namespace ckpt::tool
