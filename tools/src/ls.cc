// ls: the store's experiments, or one experiment's members.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "json_output.h"
#include "session.h"
#include "text_table.h"
#include "tool.h"

namespace ckpt::tool {
namespace {

using json = nlohmann::json;

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

}  // namespace

Status Ls(const ToolOptions& tool, const LsOptions& options) {
  Session session(tool);
  if (options.experiment.empty()) return LsExperiments(&session);
  return LsMembers(&session, options);
}

}  // namespace ckpt::tool
