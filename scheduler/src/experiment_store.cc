#include "experiment_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

#include "ckpt/records/events.h"
#include "log.h"
#include "trace.h"

namespace ckpt::scheduler {

std::string MemberName(int index, int population) {
  const int width =
      std::max(3, static_cast<int>(std::to_string(std::max(0, population - 1)).size()));
  const std::string n = std::to_string(index);
  return "m" + std::string(width > static_cast<int>(n.size()) ? width - n.size() : 0, '0') + n;
}

Status CreateExperimentRecords(store::Store* store, const records::ExperimentConfig& config,
                               std::optional<uint32_t> submitter) {
  const std::string& id = config.name;
  std::string record = records::EncodeExperimentRecord(config);
  if (submitter) {
    nlohmann::json j = nlohmann::json::parse(record);
    j["submitter_uid"] = *submitter;
    record = j.dump();
  }
  CKPT_RETURN_IF_ERROR(store->CreateExperiment(id, record));
  std::map<std::string, std::map<std::string, double>> hparams;
  for (int i = 0; i < config.population; ++i) {
    hparams[MemberName(i, config.population)] = SampleInitial(config, i);
  }
  CKPT_RETURN_IF_ERROR(store->CreateMembers(id, hparams));
  for (int i = 0; i < config.population; ++i) {
    records::MemberRecord s;
    s.index = i;
    CKPT_RETURN_IF_ERROR(
        WriteMemberRecord(store, id, MemberName(i, config.population), s, /*metrics=*/nullptr));
  }
  return Status::OK();
}

std::optional<uint32_t> StoredSubmitter(std::string_view config_json) {
  const auto j = nlohmann::json::parse(config_json.begin(), config_json.end(), nullptr,
                                       /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto it = j.find("submitter_uid");
  if (it == j.end() || !it->is_number_unsigned() ||
      it->get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(it->get<uint64_t>());
}

StatusOr<std::vector<Member>> LoadMembers(store::Store* store,
                                          const records::ExperimentConfig& config) {
  const std::string& exp = config.name;
  CKPT_ASSIGN_OR_RETURN(auto heads, store->ListMembers(exp));
  std::vector<Member> members;
  members.reserve(heads.size());
  for (const auto& h : heads) {
    Member m;
    m.name = h.member;
    m.version = h.version;
    m.step = h.step;
    m.hparams = h.hparams;
    CKPT_ASSIGN_OR_RETURN(m.state, records::DecodeMemberRecord(h.state, exp, h.member));
    // A record without an index (a fresh or version-1 one): the position in
    // the population, which the zero-padded names keep in key order.
    if (m.state.index < 0) m.state.index = static_cast<int>(members.size());
    if (h.version > 0) {
      auto man = store->GetManifest(exp, h.member, h.version);
      if (!man.ok()) {
        return man.status().WithPrefix("experiment " + exp + " member " + h.member + " head v" +
                                       std::to_string(h.version));
      }
      if (man->reason == store::kReasonTrained) {
        auto it = man->metrics.find("interval");
        const int iv = it == man->metrics.end() ? 0 : static_cast<int>(it->second);
        if (iv > m.state.interval) {
          m.state.interval = iv;
          m.state.score = man->score();
          m.state.failures = 0;
        }
      } else if (man->reason == store::kReasonExploit) {
        // An exploit always follows the member's own interval-`interval` result.
        m.state.last_exploit = m.state.interval;
      }
    }
    if (m.state.status != records::MemberStatus::kStopped &&
        m.state.status != records::MemberStatus::kFailed) {
      m.state.status = m.state.interval >= config.intervals ? records::MemberStatus::kDone
                                                            : records::MemberStatus::kIdle;
    }
    members.push_back(std::move(m));
  }
  return members;
}

namespace {

// Times one store write for the metrics (when there are any).
class StoreTimer {
 public:
  StoreTimer(metrics::Metrics* m, metrics::StoreOp op, uint64_t bytes)
      : m_(m), op_(op), bytes_(bytes), t0_(std::chrono::steady_clock::now()) {}
  ~StoreTimer() {
    if (m_ == nullptr) return;
    m_->StoreOperation(
        op_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(), bytes_);
  }

 private:
  metrics::Metrics* const m_;
  const metrics::StoreOp op_;
  const uint64_t bytes_;
  const std::chrono::steady_clock::time_point t0_;
};

}  // namespace

StoreExperimentIo::StoreExperimentIo(store::Store* store, std::string exp,
                                     std::function<void(std::string_view)> kill_point,
                                     metrics::Metrics* metrics)
    : store_(store), exp_(std::move(exp)), kill_point_(std::move(kill_point)), metrics_(metrics) {}

StatusOr<int64_t> StoreExperimentIo::Exploit(const std::string& member, const std::string& donor,
                                             const HParams& hparams,
                                             const std::string& event_json) {
  StoreTimer t(metrics_, metrics::StoreOp::kExploit, event_json.size());
  auto v = store_->Exploit(exp_, member, donor, hparams, event_json);
  if (v.ok() && metrics_) metrics_->Exploited(exp_);
  if (v.ok()) trace::Exploited(exp_, member, donor, *v);
  return v;
}

StatusOr<History> LoadHistory(store::Store* store, const records::ExperimentConfig& config,
                              const std::vector<Member>& members) {
  std::map<std::string, int> index;
  for (const auto& m : members) index[m.name] = m.state.index;
  History history;
  constexpr size_t kPage = 4096;
  for (uint64_t next = 1;;) {
    CKPT_ASSIGN_OR_RETURN(auto events, store->ListEvents(config.name, next, kPage));
    for (const auto& e : events) {
      next = e.seq + 1;
      // Only "trained" events (the worker handle's commits) carry a trained
      // interval's hyperparameters; others (the store's own, ckpt-tool's)
      // are not decoded here.
      if (e.json.find("\"hparams\"") == std::string::npos) continue;
      const auto j = nlohmann::json::parse(e.json, nullptr, /*allow_exceptions=*/false);
      const auto type = j.is_object() ? j.find("type") : j.end();
      if (type == j.end() || !type->is_string() || *type != "trained") continue;
      CKPT_ASSIGN_OR_RETURN(records::Event decoded,
                            records::DecodeEvent(e.json, "experiment " + config.name + " event " +
                                                             std::to_string(e.seq)));
      const auto* t = std::get_if<records::TrainedEvent>(&decoded);
      if (t == nullptr || t->hparams.empty()) continue;
      auto i = index.find(t->member);
      if (i == index.end()) continue;
      history[{t->interval, i->second}] =
          Observation{i->second, t->interval, t->hparams, t->val_score};
    }
    if (events.size() < kPage) break;
  }
  return history;
}

Status WriteMemberRecord(store::Store* store, const std::string& exp, const std::string& member,
                         const records::MemberRecord& record, metrics::Metrics* metrics) {
  const std::string bytes = records::EncodeMemberRecord(record);
  StoreTimer t(metrics, metrics::StoreOp::kSetMemberState, bytes.size());
  return store->SetMemberState(exp, member, bytes);
}

Status StoreExperimentIo::SaveState(const std::string& member, const records::MemberRecord& state) {
  Status s = WriteMemberRecord(store_, exp_, member, state, metrics_);
  if (!s.ok()) {
    Logger().error("{}: writing the state record of {}: {}", exp_, member, s.ToString());
  }
  return s;
}

Status StoreExperimentIo::AppendEvent(const std::string& json) {
  StoreTimer t(metrics_, metrics::StoreOp::kAppendEvent, json.size());
  auto s = store_->AppendEvent(exp_, json);
  if (!s.ok()) Logger().error("{}: appending an event: {}", exp_, s.status().ToString());
  return s.status();
}

Status StoreExperimentIo::SetStatus(records::ExperimentStatus status) {
  return store_->SetExperimentStatus(exp_, records::ExperimentStatusName(status));
}

void StoreExperimentIo::KillPoint(std::string_view point) {
  if (kill_point_) kill_point_(point);
}

StatusOr<GoodVersion> StoreExperimentIo::NewestGoodVersion(const std::string& member,
                                                           int64_t bad_version) {
  CKPT_ASSIGN_OR_RETURN(store::Manifest bad, store_->GetManifest(exp_, member, bad_version));
  {
    auto read = store_->ReadBlob(bad.blob, /*verify=*/true);
    if (read.ok()) {
      return Status::NotFound("member " + member + " v" + std::to_string(bad_version) +
                              ": its blob is intact");
    }
    if (!read.status().IsCorruption()) return read.status();
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<store::Manifest> versions, store_->ListVersions(exp_, member));
  // The member's interval count at each version: a trained version's own, an
  // exploit's or import's that of the member's last trained version before it,
  // a restore's that of the version it restored.
  std::map<int64_t, int> interval_at;
  int current = 0;
  for (const auto& v : versions) {
    if (v.reason == store::kReasonTrained) {
      auto it = v.metrics.find("interval");
      if (it != v.metrics.end() && std::isfinite(it->second))
        current = static_cast<int>(it->second);
    } else if (v.reason == store::kReasonRestore && v.parent && v.parent->member == member) {
      auto it = interval_at.find(v.parent->version);
      if (it != interval_at.end()) current = it->second;
    }
    interval_at[v.version] = current;
  }
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if (it->version >= bad_version || it->blob == bad.blob || !it->holds_blob) continue;
    if (!store_->ReadBlob(it->blob, /*verify=*/true).ok()) continue;
    GoodVersion g;
    g.version = it->version;
    g.step = it->step;
    g.hparams = it->hparams;
    g.interval = interval_at[it->version];
    g.score = it->score();
    return g;
  }
  return Status::FailedPrecondition("member " + member + ": no version before v" +
                                    std::to_string(bad_version) + " reads back intact");
}

StatusOr<int64_t> StoreExperimentIo::Restore(const std::string& member, int64_t version,
                                             const std::string& event_json) {
  StoreTimer t(metrics_, metrics::StoreOp::kRestore, 0);
  return store_->Restore(exp_, member, version, event_json);
}

}  // namespace ckpt::scheduler
