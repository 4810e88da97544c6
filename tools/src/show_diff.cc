// show and diff: one version's manifest and tensors, and two versions
// compared.
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ckpt/format/checkpoint.h"
#include "json_output.h"
#include "session.h"
#include "tensor_math.h"
#include "text_table.h"
#include "tool.h"

namespace ckpt::tool {
namespace {

using json = nlohmann::json;

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

}  // namespace ckpt::tool
