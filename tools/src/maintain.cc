// restore, pin, unpin (through the running scheduler when one serves the
// store, else on the store) and gc.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "ckpt/records/events.h"
#include "session.h"
#include "text_table.h"
#include "tool.h"

namespace ckpt::tool {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

StatusOr<MemberRef> ParseVersionRef(const std::string& text, const char* verb) {
  CKPT_ASSIGN_OR_RETURN(MemberRef ref, ParseMemberRef(text));
  if (!ref.version) {
    return Status::InvalidArgument(std::string(verb) +
                                   " needs a version: EXPERIMENT/MEMBER@VERSION");
  }
  return ref;
}

Status Done(const ToolOptions& tool, const json& j, const std::string& text) {
  if (tool.json) return Print(tool.out, j.dump(2) + "\n");
  return Print(tool.out, text + "\n");
}

}  // namespace

Status Restore(const ToolOptions& tool, const std::string& text) {
  Session session(tool);
  CKPT_ASSIGN_OR_RETURN(MemberRef ref, ParseVersionRef(text, "restore"));
  CKPT_ASSIGN_OR_RETURN(scheduler::ControlClient * control, session.Control());
  int64_t version = 0;
  std::string via;
  if (control != nullptr) {
    auto v = control->Restore(ref.exp, ref.member, *ref.version);
    if (!v.ok())
      return Status(v.status().code(), "restore " + ref.ToString() + ": " + v.status().message());
    version = *v;
    via = "scheduler";
  } else {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, session.OpenWriter({}));
    // The restore event the scheduler logs, by ckpt-tool, in the same write.
    auto v = s->Restore(
        ref.exp, ref.member, *ref.version,
        records::EncodeEvent(records::RestoreEvent{ref.member, *ref.version, 0, "ckpt-tool"}));
    if (!v.ok())
      return Status(v.status().code(), "restore " + ref.ToString() + ": " + v.status().message());
    version = *v;
    via = "store";
  }
  return Done(tool,
              json{{"experiment", ref.exp},
                   {"member", ref.member},
                   {"restored", *ref.version},
                   {"version", version},
                   {"via", via}},
              "restored " + ref.exp + "/" + VersionName(ref.member, *ref.version) + " as " +
                  VersionName(ref.member, version) +
                  (via == "scheduler" ? " (through the running scheduler: the member trains on "
                                        "from it at its next interval)"
                                      : " (in the store)"));
}

Status Pin(const ToolOptions& tool, const std::string& text, bool pin) {
  Session session(tool);
  const char* verb = pin ? "pin" : "unpin";
  CKPT_ASSIGN_OR_RETURN(MemberRef ref, ParseVersionRef(text, verb));
  CKPT_ASSIGN_OR_RETURN(scheduler::ControlClient * control, session.Control());
  std::string via;
  Status s;
  if (control != nullptr) {
    s = pin ? control->Pin(ref.exp, ref.member, *ref.version)
            : control->Unpin(ref.exp, ref.member, *ref.version);
    via = "scheduler";
  } else {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> st, session.OpenWriter({}));
    s = pin ? st->Pin(ref.exp, ref.member, *ref.version)
            : st->Unpin(ref.exp, ref.member, *ref.version);
    via = "store";
  }
  if (!s.ok())
    return Status(s.code(), std::string(verb) + " " + ref.ToString() + ": " + s.message());
  return Done(tool,
              json{{"experiment", ref.exp},
                   {"member", ref.member},
                   {"version", *ref.version},
                   {"pinned", pin},
                   {"via", via}},
              std::string(pin ? "pinned " : "unpinned ") + ref.ToString());
}

namespace {

// What retention keeps: per (experiment, member, version), whether the
// manifest exists and holds its blob.
struct Holding {
  std::map<std::tuple<std::string, std::string, int64_t>, store::Manifest> manifests;
  std::set<BlobId> blobs;
};

StatusOr<Holding> ReadHolding(store::Store* s) {
  Holding h;
  CKPT_ASSIGN_OR_RETURN(auto experiments, s->ListExperiments());
  for (const auto& e : experiments) {
    CKPT_ASSIGN_OR_RETURN(auto members, s->ListMembers(e.id));
    for (const auto& m : members) {
      CKPT_ASSIGN_OR_RETURN(auto versions, s->ListVersions(e.id, m.member));
      for (auto& v : versions) {
        if (v.holds_blob) h.blobs.insert(v.blob);
        h.manifests.emplace(std::make_tuple(e.id, m.member, v.version), std::move(v));
      }
    }
  }
  return h;
}

// A copy of the store's directory to sweep without touching the original:
// RocksDB never rewrites an SST or blob file, so those are hard links; the
// files it appends to (MANIFEST, WAL, CURRENT, OPTIONS) are copied. It is made
// beside the store (same file system, so the links work), else in $TMPDIR.
StatusOr<std::string> ShadowCopy(const std::string& dir) {
  const std::string name = ".ckpt-tool-gc-" + std::to_string(getpid());
  const char* tmp = std::getenv("TMPDIR");
  std::error_code ec;
  const std::vector<fs::path> parents = {fs::absolute(dir, ec).parent_path(),
                                         fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp")};
  std::string base;
  for (const fs::path& parent : parents) {
    base = (parent / name).string();
    ec.clear();
    fs::remove_all(base, ec);
    ec.clear();
    if (fs::create_directories(base, ec) && !ec) break;
  }
  if (ec) return Status::IOError("cannot create " + base + ": " + ec.message());
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name == "LOCK") continue;
    const fs::path to = fs::path(base) / name;
    const bool immutable = name.size() > 4 && (name.compare(name.size() - 4, 4, ".sst") == 0 ||
                                               name.compare(name.size() - 5, 5, ".blob") == 0);
    std::error_code e2;
    if (immutable) {
      fs::create_hard_link(entry.path(), to, e2);
      if (e2) fs::copy_file(entry.path(), to, e2);
    } else {
      fs::copy_file(entry.path(), to, e2);
    }
    if (e2) return Status::IOError("cannot copy " + entry.path().string() + ": " + e2.message());
  }
  if (ec) return Status::IOError("cannot list " + dir + ": " + ec.message());
  return base;
}

}  // namespace

Status Gc(const ToolOptions& tool, const GcOptions& options) {
  Session session(tool);
  if (options.keep_last_n < 1 || options.keep_best_k < 0) {
    return Status::InvalidArgument("--keep-last must be at least 1 and --keep-best at least 0");
  }
  CKPT_ASSIGN_OR_RETURN(std::string path, session.StorePath());
  Holding before;
  {
    CKPT_ASSIGN_OR_RETURN(store::Store * r, session.Reader());
    CKPT_ASSIGN_OR_RETURN(before, ReadHolding(r));
  }
  store::StoreOptions so;
  so.keep_last_n = options.keep_last_n;
  so.keep_best_k = options.keep_best_k;
  std::string shadow;
  Holding after;
  if (options.dry_run) {
    // The sweep runs on a shadow copy: the same code as a real gc, nothing changed here.
    CKPT_ASSIGN_OR_RETURN(shadow, ShadowCopy(path));
    store::StoreOptions o = so;
    o.path = shadow;
    o.create_if_missing = false;
    auto s = store::Store::Open(o);
    if (!s.ok()) {
      std::error_code ec;
      fs::remove_all(shadow, ec);
      return s.status();
    }
    auto h = ReadHolding(s->get());
    s->reset();
    std::error_code ec;
    fs::remove_all(shadow, ec);
    if (!h.ok()) return h.status();
    after = std::move(*h);
  } else {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, session.OpenWriter(so));
    CKPT_ASSIGN_OR_RETURN(after, ReadHolding(s.get()));
    CKPT_RETURN_IF_ERROR(s->Compact());
  }
  json released = json::array();
  TextTable t("  ");
  for (const auto& [key, m] : before.manifests) {
    if (!m.holds_blob) continue;
    auto it = after.manifests.find(key);
    const bool erased = it == after.manifests.end();
    if (!erased && it->second.holds_blob) continue;
    const std::string name = std::get<0>(key) + "/" + VersionName(m.member, m.version);
    released.push_back({{"version", name},
                        {"blob", m.blob.Hex()},
                        {"bytes", m.bytes},
                        {"manifest_erased", erased}});
    t.AddRow({name, m.reason, FormatBytes(m.bytes), erased ? "manifest deleted" : "manifest kept"});
  }
  std::set<BlobId> freed;
  for (const auto& b : before.blobs) {
    if (!after.blobs.count(b)) freed.insert(b);
  }
  uint64_t freed_bytes = 0;
  for (const auto& [key, m] : before.manifests) {
    if (m.holds_blob && freed.count(m.blob)) {
      freed_bytes += m.bytes;
      freed.erase(m.blob);  // each blob once
    }
  }
  if (tool.json) {
    return Print(tool.out, json{{"dry_run", options.dry_run},
                                {"keep_last_n", options.keep_last_n},
                                {"keep_best_k", options.keep_best_k},
                                {"released", released},
                                {"blobs_freed_bytes", freed_bytes}}
                                   .dump(2) +
                               "\n");
  }
  std::string out = std::string(options.dry_run ? "would release " : "released ") +
                    std::to_string(released.size()) + " blob references (" +
                    FormatBytes(freed_bytes) +
                    " of blobs no longer referenced), keeping the last " +
                    std::to_string(options.keep_last_n) + " versions per member and the best " +
                    std::to_string(options.keep_best_k) + " per experiment\n";
  return Print(tool.out, out + t.Render());
}

}  // namespace ckpt::tool
