// ls, show, diff, events, verify, stats: read commands on a read-only view.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "ckpt/format/checkpoint.h"
#include "session.h"
#include "tensor_math.h"
#include "text_table.h"
#include "tool.h"

namespace ckpt::tool {
namespace {

using json = nlohmann::json;

json ScoreJson(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json NumberMapJson(const std::map<std::string, double>& m) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = ScoreJson(v);
  return j;
}

Status PrintJson(const ToolOptions& tool, const json& doc) {
  return Print(tool.out, doc.dump(2) + "\n");
}

// Reads a blob, once more after a Refresh when the writer's garbage collection
// removed its file since the view was opened.
StatusOr<store::PinnedBlob> ReadBlobRetrying(Session* session, const BlobId& id) {
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session->Reader());
  auto blob = s->ReadBlob(id, /*verify=*/true);
  if (blob.ok() || !blob.status().IsIOError()) return blob;
  CKPT_RETURN_IF_ERROR(session->RefreshReader());
  CKPT_ASSIGN_OR_RETURN(s, session->Reader());
  return s->ReadBlob(id, /*verify=*/true);
}

struct ExperimentView {
  store::ExperimentInfo info;
  ExperimentSettings settings;
  std::vector<store::MemberHead> members;
};

StatusOr<ExperimentView> LoadExperiment(store::Store* s, const std::string& exp) {
  ExperimentView v;
  auto info = s->GetExperiment(exp);
  if (!info.ok()) {
    if (info.status().IsNotFound()) return Status::NotFound("experiment " + exp + " not found");
    return info.status();
  }
  v.info = *info;
  CKPT_ASSIGN_OR_RETURN(v.settings, ReadExperimentSettings(v.info));
  CKPT_ASSIGN_OR_RETURN(v.members, s->ListMembers(exp));
  return v;
}

json MemberJson(const ExperimentView& e, const store::MemberHead& h) {
  const records::MemberRecord p = ReadMemberRecord(h);
  return json{{"member", h.member},
              {"version", h.version},
              {"step", h.step},
              {"score", ScoreJson(h.last_score)},
              {"state", records::MemberStatusName(
                            ShownMemberStatus(p, e.settings.intervals, e.info.status))},
              {"intervals_done", p.interval},
              {"hparams", NumberMapJson(h.hparams)},
              {"blob", h.blob ? json(h.blob->Hex()) : json(nullptr)},
              {"updated_unix_ms", h.updated_unix_ms}};
}

Status LsExperiments(Session* session) {
  const ToolOptions& tool = session->options();
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session->Reader());
  CKPT_ASSIGN_OR_RETURN(auto experiments, s->ListExperiments());
  CKPT_ASSIGN_OR_RETURN(std::string path, session->StorePath());
  json list = json::array();
  TextTable table;
  table.AddRow({"EXPERIMENT", "STATUS", "MEMBERS", "INTERVALS", "BEST", "CREATED"});
  for (const auto& info : experiments) {
    CKPT_ASSIGN_OR_RETURN(ExperimentView e, LoadExperiment(s, info.id));
    // Intervals every member still in the race has done (failed and stopped
    // members are out of it), else the most any member did.
    int min_done = 1 << 30, max_done = 0;
    double best = std::nan("");
    std::string best_member;
    for (const auto& h : e.members) {
      const records::MemberRecord p = ReadMemberRecord(h);
      max_done = std::max(max_done, p.interval);
      if (p.status != records::MemberStatus::kFailed &&
          p.status != records::MemberStatus::kStopped) {
        min_done = std::min(min_done, p.interval);
      }
      if (std::isfinite(h.last_score) && !(h.last_score <= best)) {
        best = h.last_score;
        best_member = VersionName(h.member, h.version);
      }
    }
    if (min_done == 1 << 30) min_done = max_done;
    list.push_back({{"id", info.id},
                    {"status", info.status},
                    {"members", e.members.size()},
                    {"intervals_done", min_done},
                    {"intervals", e.settings.intervals},
                    {"best_score", ScoreJson(best)},
                    {"best_member", best_member.empty() ? json(nullptr) : json(best_member)},
                    {"created_unix_ms", info.created_unix_ms}});
    table.AddRow({info.id, info.status, std::to_string(e.members.size()),
                  std::to_string(min_done) + "/" + std::to_string(e.settings.intervals),
                  best_member.empty() ? "-" : FormatScore(best) + " (" + best_member + ")",
                  FormatTime(info.created_unix_ms)});
  }
  if (tool.json) return PrintJson(tool, json{{"store", path}, {"experiments", list}});
  if (experiments.empty()) return Print(tool.out, "store " + path + " holds no experiment\n");
  return Print(tool.out, table.Render());
}

Status LsMembers(Session* session, const LsOptions& options) {
  const ToolOptions& tool = session->options();
  CKPT_ASSIGN_OR_RETURN(std::string exp, ParseExperimentId(options.experiment));
  if (options.sort != "name" && options.sort != "score" && options.sort != "step") {
    return Status::InvalidArgument("--sort must be name, score or step, not \"" + options.sort +
                                   "\"");
  }
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session->Reader());
  CKPT_ASSIGN_OR_RETURN(ExperimentView e, LoadExperiment(s, exp));
  std::vector<store::MemberHead> members = e.members;
  if (options.sort == "score") {
    std::stable_sort(members.begin(), members.end(), [](const auto& a, const auto& b) {
      double x = std::isfinite(a.last_score) ? a.last_score : -INFINITY;
      double y = std::isfinite(b.last_score) ? b.last_score : -INFINITY;
      return x > y;
    });
  } else if (options.sort == "step") {
    std::stable_sort(members.begin(), members.end(),
                     [](const auto& a, const auto& b) { return a.step > b.step; });
  }
  if (tool.json) {
    json list = json::array();
    for (const auto& h : members) list.push_back(MemberJson(e, h));
    return PrintJson(tool, json{{"experiment", exp},
                                {"status", e.info.status},
                                {"intervals", e.settings.intervals},
                                {"members", list}});
  }
  TextTable table;
  table.AddRow({"MEMBER", "VERSION", "STEP", "SCORE", "STATE", "INTERVALS", "HYPERPARAMETERS"});
  for (const auto& h : members) {
    const records::MemberRecord p = ReadMemberRecord(h);
    table.AddRow(
        {h.member, std::to_string(h.version), std::to_string(h.step), FormatScore(h.last_score),
         records::MemberStatusName(ShownMemberStatus(p, e.settings.intervals, e.info.status)),
         std::to_string(p.interval) + "/" + std::to_string(e.settings.intervals),
         FormatHparams(h.hparams)});
  }
  return Print(tool.out, "experiment " + exp + " (" + e.info.status + ", " +
                             std::to_string(members.size()) + " members)\n" + table.Render());
}

std::string ParentName(const store::Manifest& m) {
  return m.parent ? VersionName(m.parent->member, m.parent->version) : "";
}

json ManifestJson(const std::string& exp, const store::Manifest& m) {
  return json{
      {"experiment", exp},
      {"member", m.member},
      {"version", m.version},
      {"reason", m.reason},
      {"parent", m.parent ? json{{"member", m.parent->member}, {"version", m.parent->version}}
                          : json(nullptr)},
      {"step", m.step},
      {"score", ScoreJson(m.score())},
      {"metrics", NumberMapJson(m.metrics)},
      {"hparams", NumberMapJson(m.hparams)},
      {"blob", m.blob.Hex()},
      {"bytes", m.bytes},
      {"pinned", m.pinned},
      {"holds_blob", m.holds_blob},
      {"unix_ms", m.unix_ms}};
}

std::string ReasonText(const store::Manifest& m) {
  if (m.reason == store::kReasonExploit && m.parent) {
    return "exploit: weights of " + ParentName(m) + ", hyperparameters explored";
  }
  if (m.reason == store::kReasonRestore && m.parent) return "restore of " + ParentName(m);
  if (m.reason == store::kReasonTrained && m.parent) return "trained from " + ParentName(m);
  if (m.reason == store::kReasonTrained) return "trained from a fresh initialisation";
  if (m.reason == store::kReasonImport) return "imported";
  return m.reason;
}

}  // namespace

Status Ls(const ToolOptions& tool, const LsOptions& options) {
  Session session(tool);
  if (options.experiment.empty()) return LsExperiments(&session);
  return LsMembers(&session, options);
}

Status Show(const ToolOptions& tool, const std::string& text) {
  Session session(tool);
  CKPT_ASSIGN_OR_RETURN(MemberRef ref, ParseMemberRef(text));
  CKPT_ASSIGN_OR_RETURN(store::Manifest m, session.ResolveManifest(ref));
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session.Reader());
  CKPT_ASSIGN_OR_RETURN(store::MemberHead head, s->GetMember(ref.exp, ref.member));
  Status blob_status;
  std::optional<store::PinnedBlob> blob;
  std::optional<format::CheckpointView> view;
  if (m.holds_blob) {
    auto b = ReadBlobRetrying(&session, m.blob);
    if (b.ok()) {
      blob = std::move(*b);
      auto v = format::ParseCheckpoint(blob->data(), blob->size());
      if (v.ok()) {
        view = std::move(*v);
      } else {
        blob_status = v.status();
      }
    } else {
      blob_status = b.status();
    }
  }
  if (!blob_status.ok()) {
    blob_status =
        Status(blob_status.code(), ref.exp + "/" + VersionName(m.member, m.version) + ": blob " +
                                       m.blob.Hex() + ": " + blob_status.message());
  }
  if (tool.json) {
    json j = ManifestJson(ref.exp, m);
    j["head"] = head.version == m.version;
    if (view) {
      const auto& meta = view->meta();
      j["checkpoint"] = {{"format_version", meta.format_version},
                         {"model_spec", meta.model_spec},
                         {"optimizer", meta.optimizer},
                         {"step", meta.step},
                         {"data_seed", meta.data_seed},
                         {"data_cursor", meta.data_cursor},
                         {"hparams", NumberMapJson(meta.hparams)},
                         {"extra", meta.extra}};
      json tensors = json::array();
      for (const auto& t : view->tensors()) {
        tensors.push_back({{"name", t.name},
                           {"dtype", std::string(format::DTypeName(t.dtype))},
                           {"shape", t.shape},
                           {"bytes", t.nbytes},
                           {"xxh3", HexU64(t.checksum)}});
      }
      j["tensors"] = tensors;
    } else {
      j["tensors"] = nullptr;
      if (!blob_status.ok()) j["blob_error"] = blob_status.ToString();
    }
    CKPT_RETURN_IF_ERROR(PrintJson(tool, j));
    return blob_status;
  }
  std::string out = ref.exp + "/" + VersionName(m.member, m.version) +
                    (head.version == m.version ? "  (head)" : "") + "\n";
  TextTable t("  ");
  t.AddRow({"reason", ReasonText(m)});
  t.AddRow({"step", std::to_string(m.step)});
  t.AddRow({"score", FormatScore(m.score())});
  t.AddRow({"metrics", FormatHparams(m.metrics)});
  t.AddRow({"hparams", FormatHparams(m.hparams)});
  t.AddRow({"blob", m.blob.Hex() + " (" + std::to_string(m.bytes) + " bytes" +
                        (m.holds_blob ? "" : ", released by retention") + ")"});
  t.AddRow({"pinned", m.pinned ? "yes" : "no"});
  t.AddRow({"time", FormatTime(m.unix_ms)});
  if (view) {
    const auto& meta = view->meta();
    t.AddRow({"model", meta.model_spec + ", optimizer " +
                           (meta.optimizer.empty() ? "none" : meta.optimizer)});
    t.AddRow({"data", "seed " + std::to_string(meta.data_seed) + ", cursor " +
                          std::to_string(meta.data_cursor)});
  }
  out += t.Render();
  if (view) {
    size_t model = 0;
    for (const auto& tv : view->tensors()) model += tv.name.rfind("optim.", 0) == 0 ? 0 : 1;
    out += "  tensors (" + std::to_string(model) + " model, " +
           std::to_string(view->tensors().size() - model) + " optimizer):\n";
    TextTable tt("    ");
    tt.AddRow({"NAME", "DTYPE", "SHAPE", "BYTES", "XXH3"});
    for (const auto& tv : view->tensors()) {
      tt.AddRow({tv.name, std::string(format::DTypeName(tv.dtype)), FormatShape(tv.shape),
                 std::to_string(tv.nbytes), HexU64(tv.checksum)});
    }
    out += tt.Render();
  } else if (!blob_status.ok()) {
    out += "  tensors: unreadable: " + blob_status.message() + "\n";
  }
  CKPT_RETURN_IF_ERROR(Print(tool.out, out));
  return blob_status;
}

Status Diff(const ToolOptions& tool, const std::string& a_text, const std::string& b_text) {
  Session session(tool);
  CKPT_ASSIGN_OR_RETURN(MemberRef ra, ParseMemberRef(a_text));
  CKPT_ASSIGN_OR_RETURN(MemberRef rb, ParseMemberRef(b_text));
  CKPT_ASSIGN_OR_RETURN(store::Manifest ma, session.ResolveManifest(ra));
  CKPT_ASSIGN_OR_RETURN(store::Manifest mb, session.ResolveManifest(rb));
  const std::string na = ra.exp + "/" + VersionName(ma.member, ma.version);
  const std::string nb = rb.exp + "/" + VersionName(mb.member, mb.version);
  for (const auto* m : {&ma, &mb}) {
    if (!m->holds_blob) {
      return Status::FailedPrecondition((m == &ma ? na : nb) +
                                        ": its blob was released by retention; nothing to compare");
    }
  }
  CKPT_ASSIGN_OR_RETURN(store::PinnedBlob ba, ReadBlobRetrying(&session, ma.blob));
  CKPT_ASSIGN_OR_RETURN(store::PinnedBlob bb, ReadBlobRetrying(&session, mb.blob));
  CKPT_ASSIGN_OR_RETURN(format::CheckpointView va, format::ParseCheckpoint(ba.data(), ba.size()));
  CKPT_ASSIGN_OR_RETURN(format::CheckpointView vb, format::ParseCheckpoint(bb.data(), bb.size()));

  std::set<std::string> keys;
  for (const auto& [k, v] : ma.hparams) keys.insert(k);
  for (const auto& [k, v] : mb.hparams) keys.insert(k);
  json hp = json::array();
  TextTable ht("  ");
  ht.AddRow({"HYPERPARAMETER", na, nb, "B/A"});
  auto get = [](const std::map<std::string, double>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? std::nan("") : it->second;
  };
  for (const auto& k : keys) {
    double x = get(ma.hparams, k), y = get(mb.hparams, k);
    double ratio = (std::isfinite(x) && std::isfinite(y) && x != 0) ? y / x : std::nan("");
    hp.push_back(
        {{"name", k}, {"a", ScoreJson(x)}, {"b", ScoreJson(y)}, {"ratio", ScoreJson(ratio)}});
    ht.AddRow({k, FormatNumber(x), FormatNumber(y), FormatNumber(ratio)});
  }
  ht.AddRow({"step", std::to_string(ma.step), std::to_string(mb.step), ""});
  ht.AddRow({"score", FormatScore(ma.score()), FormatScore(mb.score()), ""});

  json tensors = json::array();
  TextTable tt("  ");
  tt.AddRow({"TENSOR", "SHAPE", "L2(B-A)", "L2(A)", "RELATIVE"});
  bool same_blob = ma.blob == mb.blob;
  for (const auto& t : va.tensors()) {
    const format::TensorView* u = vb.Find(t.name);
    if (u == nullptr || u->dtype != t.dtype || u->shape != t.shape) {
      std::string why = u == nullptr
                            ? "only in A"
                            : "A " + std::string(format::DTypeName(t.dtype)) +
                                  FormatShape(t.shape) + ", B " +
                                  std::string(format::DTypeName(u->dtype)) + FormatShape(u->shape);
      tensors.push_back({{"name", t.name}, {"comparable", false}, {"why", why}});
      tt.AddRow({t.name, FormatShape(t.shape), why, "", ""});
      continue;
    }
    const size_t n = static_cast<size_t>(t.numel());
    double d = L2Distance(t.dtype, t.data, u->data, n);
    double norm = L2Distance(t.dtype, nullptr, t.data, n);
    double rel = norm > 0 ? d / norm : (d == 0 ? 0.0 : std::nan(""));
    tensors.push_back({{"name", t.name},
                       {"comparable", true},
                       {"shape", t.shape},
                       {"l2_diff", d},
                       {"l2_a", norm},
                       {"relative", ScoreJson(rel)}});
    tt.AddRow(
        {t.name, FormatShape(t.shape), FormatNumber(d), FormatNumber(norm), FormatNumber(rel)});
  }
  for (const auto& u : vb.tensors()) {
    if (va.Find(u.name) == nullptr) {
      tensors.push_back({{"name", u.name}, {"comparable", false}, {"why", "only in B"}});
      tt.AddRow({u.name, FormatShape(u.shape), "only in B", "", ""});
    }
  }
  if (tool.json) {
    return PrintJson(tool, json{{"a", ManifestJson(ra.exp, ma)},
                                {"b", ManifestJson(rb.exp, mb)},
                                {"same_blob", same_blob},
                                {"hparams", hp},
                                {"tensors", tensors}});
  }
  std::string out = "A = " + na + " (" + ma.reason + ")\nB = " + nb + " (" + mb.reason + ")\n";
  if (same_blob) out += "A and B share one blob (" + ma.blob.Hex() + "): the weights are equal\n";
  out += ht.Render() + tt.Render();
  return Print(tool.out, out);
}

namespace {

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
