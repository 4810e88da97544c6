// stats: counts, bytes per column family, bytes saved by shared blobs.
#include <nlohmann/json.hpp>

#include "json_output.h"
#include "session.h"
#include "text_table.h"
#include "tool.h"

namespace ckpt::tool {

using json = nlohmann::json;

Status Stats(const ToolOptions& tool) {
  Session session(tool);
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session.Reader());
  CKPT_ASSIGN_OR_RETURN(std::string path, session.StorePath());
  CKPT_ASSIGN_OR_RETURN(store::StoreStats st, s->Stats());
  // What the manifests holding a blob would take if none were shared.
  uint64_t referenced_bytes = 0;
  uint64_t references = 0;
  CKPT_ASSIGN_OR_RETURN(auto experiments, s->ListExperiments());
  for (const auto& e : experiments) {
    CKPT_ASSIGN_OR_RETURN(auto members, s->ListMembers(e.id));
    for (const auto& h : members) {
      CKPT_ASSIGN_OR_RETURN(auto versions, s->ListVersions(e.id, h.member));
      for (const auto& m : versions) {
        if (!m.holds_blob) continue;
        referenced_bytes += m.bytes;
        ++references;
      }
    }
  }
  const uint64_t saved = referenced_bytes > st.blob_bytes ? referenced_bytes - st.blob_bytes : 0;
  if (tool.json) {
    json fam = json::array();
    for (const auto& f : st.families) {
      fam.push_back({{"name", f.name},
                     {"keys", f.keys},
                     {"logical_bytes", f.logical_bytes},
                     {"sst_bytes", f.sst_bytes},
                     {"blob_file_bytes", f.blob_file_bytes}});
    }
    return PrintJson(tool, json{{"store", path},
                                {"experiments", st.experiments},
                                {"members", st.members},
                                {"manifests", st.manifests},
                                {"manifests_holding", st.manifests_holding},
                                {"blobs", st.blobs},
                                {"blob_bytes", st.blob_bytes},
                                {"blob_references", references},
                                {"referenced_bytes", referenced_bytes},
                                {"bytes_saved_by_sharing", saved},
                                {"events", st.events},
                                {"families", fam}});
  }
  TextTable t;
  t.AddRow({"store", path});
  t.AddRow({"experiments", std::to_string(st.experiments)});
  t.AddRow({"members", std::to_string(st.members)});
  t.AddRow({"manifests", std::to_string(st.manifests) + " (" +
                             std::to_string(st.manifests_holding) + " holding a blob)"});
  t.AddRow({"blobs", std::to_string(st.blobs) + " (" + FormatBytes(st.blob_bytes) + ")"});
  t.AddRow({"shared", std::to_string(references) + " references to " + std::to_string(st.blobs) +
                          " blobs: " + FormatBytes(saved) + " saved by sharing"});
  t.AddRow({"events", std::to_string(st.events)});
  TextTable f("  ");
  f.AddRow({"FAMILY", "KEYS", "LOGICAL", "SST", "BLOB FILES"});
  for (const auto& x : st.families) {
    f.AddRow({x.name, std::to_string(x.keys), FormatBytes(x.logical_bytes),
              FormatBytes(x.sst_bytes), FormatBytes(x.blob_file_bytes)});
  }
  return Print(tool.out, t.Render() + f.Render());
}

}  // namespace ckpt::tool
