// The experiment logic alone (scheduler/src/experiment.h), driven event by
// event with no process and no thread, over a real RocksDB store in a temp
// dir: PBT exploit and explore, truncation, async PBT, successive halving,
// member failures, ends by target and wall time, a refused CONFIGURE, crash
// and resume, and thousands of random event orders checked for invariants.
#include "experiment.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "ckpt/records/member_record.h"
#include "ckpt/scheduler/policy.h"
#include "experiment_store.h"
#include "model_based.h"
#include "store/test_util.h"

namespace ckpt::scheduler {
namespace {

using json = nlohmann::json;
using store::testing::TempDir;

records::ExperimentConfig BaseConfig(int population, int intervals) {
  records::ExperimentConfig c;
  c.name = "exp";
  c.seed = 7;
  c.population = population;
  c.intervals = intervals;
  c.steps_per_interval = 10;
  c.search_space["lr"] = records::SearchDim{records::SearchDim::Kind::kLogUniform, 1e-3, 1e-1, {}};
  c.search_space["momentum"] =
      records::SearchDim{records::SearchDim::Kind::kUniform, 0.5, 0.99, {}};
  c.policy.kind = records::PolicyKind::kPbt;
  c.policy.quantile = 0.25;
  c.policy.resample_probability = 0;
  c.source = "test " + std::to_string(population) + "x" + std::to_string(intervals);
  return c;
}

// A deterministic validation score of a member's interval: a function of the
// hyperparameters it trained with and the interval, as real training would
// be (for the same starting state).
double ScoreOf(const HParams& h, int interval) {
  double x = 0.3 + 0.05 * interval;
  for (const auto& [k, v] : h) x += 0.01 * std::fmod(std::fabs(std::log(v + 1e-9)) * 7.3, 3.0);
  return x;
}

// Counts the policy's synchronous decisions per generation (the real policy
// decides; this only records).
class RecordingPolicy : public Policy {
 public:
  RecordingPolicy(std::unique_ptr<Policy> inner, std::map<int, int>* decided)
      : inner_(std::move(inner)), decided_(decided) {}
  bool synchronous() const override { return inner_->synchronous(); }
  std::map<std::string, Decision> Decide(int generation, const std::vector<MemberProgress>& members,
                                         const std::vector<MemberProgress>& population,
                                         const History& history) const override {
    if (synchronous()) ++(*decided_)[generation];
    return inner_->Decide(generation, members, population, history);
  }
  std::optional<RunAheadMargins> RunAhead(int generation, const MemberProgress& member,
                                          int active) const override {
    return inner_->RunAhead(generation, member, active);
  }
  std::optional<HParams> Propose(const MemberProgress& member,
                                 const History& history) const override {
    return inner_->Propose(member, history);
  }

 private:
  std::unique_ptr<Policy> inner_;
  std::map<int, int>* decided_;
};

// The store's writes as the experiment makes them, except that they can be
// refused as a full disk refuses them (ResourceExhausted, nothing written). A
// real full disk is chaos.disk_full's (a tmpfs filled with ballast); this
// places the refusal at an exact write.
class SpaceIo : public ExperimentIo {
 public:
  explicit SpaceIo(std::unique_ptr<StoreExperimentIo> io) : io_(std::move(io)) {}
  // The next `allow` exploits are written, the `refuse` after them refused.
  void FillDisk(int allow, int refuse) {
    allow_ = allow;
    refuse_ = refuse;
  }
  // While full, every write is refused (records, events, status, exploits).
  void SetFull(bool full) { full_ = full; }
  int refused() const { return refused_; }

  static Status NoSpace(const std::string& what) {
    return Status::ResourceExhausted("store: no space left on the device to write " + what);
  }

  StatusOr<int64_t> Exploit(const std::string& member, const std::string& donor,
                            const HParams& hparams, const std::string& event_json) override {
    if (full_) {
      ++refused_;
      return NoSpace("exploit " + member + " <- " + donor);
    }
    if (allow_ > 0) {
      --allow_;
    } else if (refuse_ > 0) {
      --refuse_;
      ++refused_;
      return NoSpace("exploit " + member + " <- " + donor);
    }
    return io_->Exploit(member, donor, hparams, event_json);
  }
  Status SaveState(const std::string& member, const records::MemberRecord& state) override {
    if (full_) return Refuse("the state record of " + member);
    return io_->SaveState(member, state);
  }
  Status AppendEvent(const std::string& json) override {
    if (full_) return Refuse("an event");
    return io_->AppendEvent(json);
  }
  Status SetStatus(records::ExperimentStatus status) override {
    if (full_) return Refuse("the experiment's status");
    return io_->SetStatus(status);
  }
  void KillPoint(std::string_view point) override { io_->KillPoint(point); }
  StatusOr<GoodVersion> NewestGoodVersion(const std::string& member, int64_t bad_version) override {
    return io_->NewestGoodVersion(member, bad_version);
  }
  StatusOr<int64_t> Restore(const std::string& member, int64_t version,
                            const std::string& event_json) override {
    if (full_) return Refuse("a restore of " + member);
    return io_->Restore(member, version, event_json);
  }

 private:
  Status Refuse(const std::string& what) {
    ++refused_;
    return NoSpace(what);
  }

  std::unique_ptr<StoreExperimentIo> io_;
  bool full_ = false;
  int allow_ = 0;
  int refuse_ = 0;
  int refused_ = 0;
};

// An experiment over a real store, with a "worker" that commits real blobs.
class Harness {
 public:
  // `shared`: a store to create the experiment in (many harnesses, one
  // store); nullptr: a store of its own in a temp dir.
  explicit Harness(records::ExperimentConfig config, ExperimentOptions options = {},
                   store::Store* shared = nullptr)
      : config_(std::move(config)), options_(options), store_(shared) {
    if (store_ == nullptr) {
      dir_ = std::make_unique<TempDir>();
      store::StoreOptions so;
      so.path = dir_->Sub("store");
      so.keep_last_n = 2;
      auto s = store::Store::Open(so);
      CKPT_CHECK(s.ok());
      own_store_ = std::move(*s);
      store_ = own_store_.get();
    }
    CKPT_CHECK_OK(CreateExperimentRecords(store_, config_));
    Open();
  }

  // (Re)builds the experiment from the store, as a restarted scheduler does.
  void Open() {
    e_.reset();
    io_ = std::make_unique<SpaceIo>(
        std::make_unique<StoreExperimentIo>(store_, config_.name, [this](std::string_view p) {
          if (p == crash_at_ && --crash_countdown_ == 0) throw Crash{};
        }));
    io_->SetFull(full_);
    auto members = LoadMembers(store_, config_);
    CKPT_CHECK(members.ok());
    auto info = store_->GetExperiment(config_.name);
    CKPT_CHECK(info.ok());
    auto status = records::ParseExperimentStatus(info->status);
    CKPT_CHECK(status.ok());
    auto policy = Policy::Create(config_);
    CKPT_CHECK(policy.ok());
    auto history = LoadHistory(store_, config_, *members);
    CKPT_CHECK(history.ok());
    decided_.clear();
    e_ = std::make_unique<Experiment>(
        config_, std::make_unique<RecordingPolicy>(std::move(*policy), &decided_),
        std::move(*members), *status, options_, io_.get(), now_, std::move(*history));
    e_->Start();
  }

  struct Crash {};

  Experiment& e() { return *e_; }
  SpaceIo& io() { return *io_; }
  store::Store& store() { return *store_; }
  std::map<int, int>& decided() { return decided_; }
  void Advance(double seconds) {
    now_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  Clock::time_point now() const { return now_; }
  void CrashAt(std::string point, int nth) {
    crash_at_ = std::move(point);
    crash_countdown_ = nth;
  }

  WorkItem Take() { return e_->TakeNext(now_); }

  // The disk fills (every write of the experiment's refused, across
  // restarts) or has space again.
  void SetFull(bool full) {
    full_ = full;
    io_->SetFull(full);
  }
  bool full() const { return full_; }

  // What the worker handle does with a RESULT: commit the blob, then the
  // state record; then the loop hears of it. `crash_before_state`: the process
  // dies between the two (the record is reconciled at the next Open).
  void Commit(const WorkItem& w, double score, bool crash_before_state = false) {
    // The blob is a function of what was trained (member, interval), as real
    // training's is of its starting state, whatever order results come in.
    const std::string blob = store::testing::MakeBlob(
        std::hash<std::string>{}(w.member + "@" + std::to_string(w.interval_after)), 64, 0);
    store::CommitRequest c;
    c.exp = config_.name;
    c.member = w.member;
    c.expected_head_version = w.head_version;
    c.blob = blob.data();
    c.blob_size = blob.size();
    c.step = StepOf(w) + w.steps;
    c.metrics = {{store::kScoreMetric, score}, {"interval", w.interval_after}};
    c.hparams = w.hparams;
    // The event the worker handle logs with a commit (worker_commit.cc).
    records::TrainedEvent trained{w.interval_after, score, 0, "", 0};
    trained.hparams = w.hparams;
    c.event_json = records::EncodeEvent(trained);
    auto v = store_->CommitResult(c);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    trained_[{w.member, w.interval_after}]++;
    trained_hparams_[{w.member, w.interval_after}] = w.hparams;
    if (crash_before_state) throw Crash{};
    if (full_) {
      // The disk filled right after the commit: the record after it is refused.
      e_->OnCommitted(w, *v, c.step, score, w.steps * 64, now_);
      e_->OnRecordRefused(w.member, SpaceIo::NoSpace("the state record of " + w.member));
      return;
    }
    records::MemberRecord st = w.state_after;
    st.score = score;
    ASSERT_TRUE(
        store_->SetMemberState(config_.name, w.member, records::EncodeMemberRecord(st)).ok());
    e_->OnCommitted(w, *v, c.step, score, w.steps * 64, now_);
  }

  // Runs every queued item to completion in order, scores from ScoreOf.
  void RunToEnd(int limit = 100000) {
    for (int i = 0; i < limit && e_->Runnable(); ++i) {
      WorkItem w = Take();
      if (w.eval_only) {
        e_->OnEvaluated(w, 0.5 + 0.001 * e_->members()[e_->Find(w.member)].state.index);
      } else {
        Commit(w, ScoreOf(w.hparams, w.interval_after));
      }
    }
  }

  int64_t StepOf(const WorkItem& w) {
    auto head = store_->GetMember(config_.name, w.member);
    CKPT_CHECK(head.ok());
    return head->step;
  }

  std::vector<json> Events(const std::string& type) {
    auto ev = store_->ListEvents(config_.name, 0, 1 << 20);
    CKPT_CHECK(ev.ok());
    std::vector<json> out;
    for (const auto& e : *ev) {
      json j = json::parse(e.json);
      if (j.value("type", "") == type) out.push_back(j);
    }
    return out;
  }

  // (member, interval) -> times committed.
  std::map<std::pair<std::string, int>, int>& trained() { return trained_; }
  std::map<std::pair<std::string, int>, HParams>& trained_hparams() { return trained_hparams_; }

 private:
  std::unique_ptr<TempDir> dir_;
  records::ExperimentConfig config_;
  ExperimentOptions options_;
  std::unique_ptr<store::Store> own_store_;
  store::Store* store_;
  std::unique_ptr<SpaceIo> io_;
  std::unique_ptr<Experiment> e_;
  std::map<int, int> decided_;
  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  std::string crash_at_;
  int crash_countdown_ = 0;
  bool full_ = false;
  std::map<std::pair<std::string, int>, int> trained_;
  std::map<std::pair<std::string, int>, HParams> trained_hparams_;
};

// --- The member-state record -------------------------------------------------

TEST(MemberStateTest, NegativeAndNanScoresReadBackEqual) {
  for (double score : {-2.5, -1.0, 0.0, 0.75, std::nan("")}) {
    records::MemberRecord s;
    s.index = 12;
    s.interval = 4;
    s.last_exploit = 3;
    s.score = score;
    s.status = records::MemberStatus::kStopped;
    s.failures = 2;
    s.test_score = score < 0 ? std::nan("") : 0.5;
    auto back = records::DecodeMemberRecord(records::EncodeMemberRecord(s), "e", "m012");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, s) << records::EncodeMemberRecord(s);
  }
  EXPECT_NE(records::EncodeMemberRecord(records::MemberRecord{}).find("\"score\":null"),
            std::string::npos);
}

TEST(MemberStateTest, VersionOneRecordsReadTheirMinusOneAsNoScore) {
  auto s = records::DecodeMemberRecord(
      R"({"interval":3,"last_exploit":1,"score":-1.0,"status":"running"})", "e", "m001");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(std::isnan(s->score));
  EXPECT_EQ(s->interval, 3);
  EXPECT_EQ(s->index, -1);  // the caller supplies the position
  auto fresh = records::DecodeMemberRecord("created", "e", "m001");
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->interval, 0);
}

// Version 2 named the test score "test_acc"; version 3 "test_score".
TEST(MemberStateTest, VersionTwoRecordsReadTheirTestAccuracy) {
  auto s = records::DecodeMemberRecord(
      R"({"v":2,"index":4,"interval":5,"score":0.8,"status":"done","test_acc":0.78})", "e", "m004");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->test_score, 0.78);
  EXPECT_EQ(s->score, 0.8);
  records::MemberRecord r = *s;
  r.test_score = -1.0;  // a valid neg_mse or r2: kept as written
  const std::string v3 = records::EncodeMemberRecord(r);
  EXPECT_NE(v3.find(R"("test_score":-1.0)"), std::string::npos) << v3;
  EXPECT_NE(v3.find(R"("v":3)"), std::string::npos) << v3;
  EXPECT_EQ(records::DecodeMemberRecord(v3, "e", "m004")->test_score, -1.0);
}

TEST(MemberStateTest, DamagedRecordsAreCorruptionNamingExperimentAndMember) {
  for (const char* bad :
       {"{not json", "[1,2]", R"({"v":2,"interval":"three"})", R"({"v":2,"score":"high"})",
        R"({"v":2,"status":"dancing"})", R"({"v":9,"interval":1})", R"({"v":2,"interval":-4})",
        R"({"v":2,"interval":1,"last_exploit":5})", "\xff\xfe"}) {
    auto s = records::DecodeMemberRecord(bad, "fmnist", "m007");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(s.status().IsCorruption()) << s.status().ToString();
    EXPECT_NE(s.status().message().find("experiment fmnist member m007"), std::string::npos)
        << s.status().ToString();
  }
}

TEST(ExperimentStoreTest, DamagedRecordInTheStoreFailsLoadWithCorruption) {
  TempDir dir;
  store::StoreOptions so;
  so.path = dir.Sub("s");
  auto st = store::Store::Open(so);
  ASSERT_TRUE(st.ok());
  auto c = BaseConfig(3, 2);
  ASSERT_TRUE(CreateExperimentRecords(st->get(), c).ok());
  ASSERT_TRUE((*st)->SetMemberState("exp", "m001", "{\"v\":2,\"interval\":").ok());
  auto members = LoadMembers(st->get(), c);
  ASSERT_FALSE(members.ok());
  EXPECT_TRUE(members.status().IsCorruption());
  EXPECT_NE(members.status().message().find("experiment exp member m001"), std::string::npos);
}

TEST(ExperimentStoreTest, MemberIndexComesFromTheRecordNotTheName) {
  TempDir dir;
  store::StoreOptions so;
  so.path = dir.Sub("s");
  auto st = store::Store::Open(so);
  ASSERT_TRUE(st.ok());
  auto c = BaseConfig(12, 2);
  ASSERT_TRUE(CreateExperimentRecords(st->get(), c).ok());
  auto members = LoadMembers(st->get(), c);
  ASSERT_TRUE(members.ok());
  ASSERT_EQ(members->size(), 12u);
  for (size_t i = 0; i < members->size(); ++i) {
    EXPECT_EQ((*members)[i].state.index, static_cast<int>(i));
    EXPECT_EQ((*members)[i].name, MemberName(static_cast<int>(i), 12));
  }
  records::MemberRecord moved;
  moved.index = 40;
  ASSERT_TRUE((*st)->SetMemberState("exp", "m003", records::EncodeMemberRecord(moved)).ok());
  members = LoadMembers(st->get(), c);
  ASSERT_TRUE(members.ok());
  EXPECT_EQ((*members)[3].state.index, 40);
}

// --- PBT exploit and explore -------------------------------------------------

TEST(ExperimentTest, ExploitPointsAtTheDonorBlobWithPerturbedHparamsUsedNext) {
  auto c = BaseConfig(8, 3);
  Harness h(c);
  // Generation 1: every member trains once; the barrier then decides.
  std::vector<WorkItem> first;
  while (h.e().Runnable()) first.push_back(h.Take());
  ASSERT_EQ(first.size(), 8u);
  for (const auto& w : first) h.Commit(w, ScoreOf(w.hparams, 1));
  const auto exploits = h.Events("exploit");
  ASSERT_EQ(exploits.size(), 2u);  // floor(0.25 * 8)
  EXPECT_EQ(h.e().exploits(), 2);
  std::map<std::string, HParams> explored;
  for (const auto& ev : exploits) {
    const std::string m = ev["member"], d = ev["donor"];
    auto head = h.store().GetMember("exp", m);
    auto donor = h.store().GetMember("exp", d);
    ASSERT_TRUE(head.ok() && donor.ok());
    auto man = h.store().GetManifest("exp", m, head->version);
    ASSERT_TRUE(man.ok());
    EXPECT_EQ(man->reason, store::kReasonExploit);
    ASSERT_TRUE(head->blob && donor->blob);
    EXPECT_EQ(head->blob->Hex(), donor->blob->Hex()) << m << " <- " << d;
    // Each hyperparameter is the donor's times 0.8 or 1.2, clamped to the space.
    for (const auto& [k, v] : head->hparams) {
      const double dv = donor->hparams.at(k);
      const auto& dim = c.search_space.at(k);
      const double lo = std::clamp(dv * 0.8, dim.min, dim.max);
      const double hi = std::clamp(dv * 1.2, dim.min, dim.max);
      EXPECT_TRUE(std::fabs(v - lo) < 1e-12 || std::fabs(v - hi) < 1e-12)
          << m << "." << k << " = " << v << ", donor " << dv;
    }
    explored[m] = head->hparams;
  }
  // The next interval of each recipient trains from the exploit version with
  // exactly those hyperparameters.
  int seen = 0;
  while (h.e().Runnable()) {
    WorkItem w = h.Take();
    if (explored.count(w.member) && w.interval_after == 2) {
      ++seen;
      EXPECT_EQ(w.hparams, explored[w.member]);
      auto head = h.store().GetMember("exp", w.member);
      EXPECT_EQ(w.head_version, head->version);
      EXPECT_EQ(w.state_after.last_exploit, 1);
    }
    h.Commit(w, ScoreOf(w.hparams, w.interval_after));
  }
  EXPECT_EQ(seen, 2);
  for (const auto& [m, hp] : explored) EXPECT_EQ((h.trained_hparams()[{m, 2}]), hp);
}

TEST(ExperimentTest, ResampleProbabilityOneDrawsFromTheSearchSpace) {
  auto c = BaseConfig(10, 2);
  c.search_space["batch_norm"] =
      records::SearchDim{records::SearchDim::Kind::kChoice, 0, 0, {1, 2, 4}};
  c.policy.resample_probability = 1.0;
  Harness h(c);
  std::vector<WorkItem> first;
  while (h.e().Runnable()) first.push_back(h.Take());
  for (const auto& w : first) h.Commit(w, ScoreOf(w.hparams, 1));
  const auto exploits = h.Events("exploit");
  ASSERT_EQ(exploits.size(), 2u);
  for (const auto& ev : exploits) {
    auto head = h.store().GetMember("exp", ev["member"].get<std::string>());
    auto donor = h.store().GetMember("exp", ev["donor"].get<std::string>());
    for (const auto& [k, dim] : c.search_space) {
      const double v = head->hparams.at(k);
      if (dim.kind == records::SearchDim::Kind::kChoice) {
        EXPECT_NE(std::find(dim.values.begin(), dim.values.end(), v), dim.values.end());
      } else {
        EXPECT_GE(v, dim.min);
        EXPECT_LE(v, dim.max);
        // A resample, not a perturbation of the donor's value.
        EXPECT_GT(std::fabs(v - donor->hparams.at(k) * 0.8), 1e-12);
        EXPECT_GT(std::fabs(v - donor->hparams.at(k) * 1.2), 1e-12);
      }
    }
  }
}

// --- Truncation selection ----------------------------------------------------

// The documented count (policy.h): 0 below 2 active members, else
// clamp(floor(quantile * n), 1, floor(n / 2)).
size_t ExpectedExploits(size_t n, double q) {
  if (n < 2) return 0;
  size_t k = static_cast<size_t>(std::floor(q * static_cast<double>(n)));
  return std::clamp<size_t>(k, 1, n / 2);
}

TEST(TruncationTest, ExploitCountRecipientsAndDonorsForEverySizeAndQuantile) {
  for (int n = 1; n <= 40; ++n) {
    for (double q : {0.1, 0.2, 0.25, 0.3, 0.4, 0.5}) {
      auto c = BaseConfig(n, 5);
      c.policy.quantile = q;
      auto policy = Policy::Create(c);
      ASSERT_TRUE(policy.ok());
      std::vector<MemberProgress> pop;
      for (int i = 0; i < n; ++i) {
        // Scores decrease with the index, so the bottom k are the last k.
        pop.push_back(
            MemberProgress{MemberName(i, n), i, 2, 0, 1.0 - 0.01 * i, SampleInitial(c, i), true});
      }
      auto d = (*policy)->Decide(2, pop, pop, {});
      const size_t k = ExpectedExploits(static_cast<size_t>(n), q);
      ASSERT_EQ(d.size(), k) << "n=" << n << " q=" << q;
      for (const auto& [m, dec] : d) {
        const int idx = std::stoi(m.substr(1));
        EXPECT_GE(idx, n - static_cast<int>(k)) << "recipient " << m << " n=" << n << " q=" << q;
        const int donor = std::stoi(dec.donor.substr(1));
        EXPECT_LT(donor, static_cast<int>(k)) << "donor " << dec.donor << " n=" << n;
      }
    }
  }
}

TEST(TruncationTest, TiesBreakByNameNanRanksLastInactiveTakeNoPart) {
  auto c = BaseConfig(10, 5);
  c.policy.quantile = 0.2;
  auto policy = Policy::Create(c);
  ASSERT_TRUE(policy.ok());
  std::vector<MemberProgress> pop;
  for (int i = 0; i < 10; ++i) {
    pop.push_back(MemberProgress{MemberName(i, 10), i, 1, 0, 0.5, SampleInitial(c, i), true});
  }
  pop[3].score = std::nan("");  // ranks last: a recipient
  pop[0].active = false;        // stopped: neither recipient nor donor
  pop[0].score = 0.99;
  pop[9].active = false;
  pop[9].score = 0.01;
  auto d1 = (*policy)->Decide(1, pop, pop, {});
  std::vector<MemberProgress> shuffled = pop;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(3));
  auto d2 = (*policy)->Decide(1, shuffled, shuffled, {});
  ASSERT_EQ(d1.size(), 1u);  // floor(0.2 * 8 active)
  EXPECT_EQ(d1.begin()->first, "m003");
  // Ties (all 0.5) break by name: the top one is m001 (m000 is inactive).
  EXPECT_EQ(d1.begin()->second.donor, "m001");
  ASSERT_EQ(d2.size(), d1.size());
  EXPECT_EQ(d2.begin()->first, d1.begin()->first);
  EXPECT_EQ(d2.begin()->second.donor, d1.begin()->second.donor);
  EXPECT_EQ(d2.begin()->second.hparams, d1.begin()->second.hparams);
}

// Async PBT over 6 members (quantile 0.34).
records::ExperimentConfig AsyncConfig() {
  auto c = BaseConfig(6, 4);
  c.policy.mode = records::PolicyMode::kAsync;
  c.policy.quantile = 0.34;
  return c;
}

// The six start; five finish interval 1 with high scores (m005 stays in
// flight), which queues them for interval 2 at once (no barrier); then items
// are taken until m000's interval 2 (`m000`). `running`: the items in flight
// besides m000's.
void TakeM000AfterFiveFinish(Harness& h, std::vector<WorkItem>* running, WorkItem* m000) {
  while (h.e().Runnable()) running->push_back(h.Take());
  ASSERT_EQ(running->size(), 6u);
  // Five members finish interval 1 with high scores; m005 stays in flight.
  for (int i = 0; i < 5; ++i) h.Commit((*running)[i], 0.8 + 0.01 * i);
  running->erase(running->begin(), running->begin() + 5);
  // No barrier: the five are queued for interval 2 at once.
  EXPECT_EQ(h.e().queued(), 5u);
  do {
    *m000 = h.Take();
    if (m000->member != "m000") running->push_back(*m000);
  } while (m000->member != "m000");
}

// --- A full disk -------------------------------------------------------------

// Heads, hyperparameters and exploit events of a finished harness, to compare
// two runs.
json RunOutcome(Harness& h, int population) {
  json out;
  for (int i = 0; i < population; ++i) {
    const std::string m = MemberName(i, population);
    auto head = h.store().GetMember("exp", m);
    CKPT_CHECK(head.ok());
    out["heads"][m] = {{"step", head->step},
                       {"hparams", head->hparams},
                       {"blob", head->blob ? head->blob->Hex() : ""}};
  }
  for (auto ev : h.Events("exploit")) {
    ev.erase("unix_ms");
    out["exploits"].push_back(ev);
  }
  return out;
}

// Members running ahead of the barrier are not held: the policy's margins
// made them certain to continue before anything was decided.
TEST(ExperimentTest, ExploitRefusedForWantOfSpaceHoldsTheGenerationAndEndsAsTheUndisturbedRun) {
  auto c = BaseConfig(8, 4);
  ExperimentOptions waits;
  waits.run_ahead = false;
  Harness calm(c, waits);
  calm.RunToEnd();
  ASSERT_TRUE(calm.e().ended());

  for (const bool run_ahead : {false, true}) {
    SCOPED_TRACE(run_ahead ? "running ahead" : "waiting at every barrier");
    ExperimentOptions opts;
    opts.run_ahead = run_ahead;
    Harness h(c, opts);
    std::vector<WorkItem> first;
    while (h.e().Runnable()) first.push_back(h.Take());
    ASSERT_EQ(first.size(), 8u);
    // The disk fills between the barrier's two exploits: the first is written,
    // the second refused.
    h.io().FillDisk(/*allow=*/1, /*refuse=*/1);
    for (const auto& w : first) h.Commit(w, ScoreOf(w.hparams, 1));
    EXPECT_EQ(h.io().refused(), 1);
    EXPECT_TRUE(h.e().WaitingForStore());
    EXPECT_NE(h.e().store_refusal().find("no space left"), std::string::npos)
        << h.e().store_refusal();
    // 8 members, k = 2: once five have finished, the middle of them is sure.
    const size_t ahead = h.e().queued();
    if (run_ahead) {
      EXPECT_GT(ahead, 0u);
      EXPECT_LE(ahead, 4u);
    } else {
      EXPECT_EQ(ahead, 0u) << "the generation must wait for the refused exploit";
    }
    EXPECT_EQ(h.Events("exploit").size(), 1u);
    // Still full at the first retry: still waiting, nothing more queued.
    h.io().FillDisk(0, 1);
    h.e().RetryDeferred();
    EXPECT_EQ(h.io().refused(), 2);
    EXPECT_TRUE(h.e().WaitingForStore());
    EXPECT_EQ(h.e().queued(), ahead);
    // Space again: the kept decision is applied (not decided a second time),
    // the generation is queued and the run ends with the undisturbed heads.
    h.e().RetryDeferred();
    EXPECT_FALSE(h.e().WaitingForStore());
    EXPECT_TRUE(h.e().store_refusal().empty());
    EXPECT_EQ(h.e().queued(), 8u);
    EXPECT_EQ(h.Events("exploit").size(), 2u);
    h.RunToEnd();
    ASSERT_TRUE(h.e().ended());
    EXPECT_EQ(h.decided(), calm.decided());
    for (const auto& [gen, n] : h.decided()) EXPECT_EQ(n, 1) << "generation " << gen;
    EXPECT_EQ(RunOutcome(h, 8), RunOutcome(calm, 8));
    EXPECT_EQ(h.trained_hparams(), calm.trained_hparams());
  }
}

TEST(ExperimentTest, AsyncExploitRefusedForWantOfSpaceHoldsOnlyThatMember) {
  Harness h(AsyncConfig());
  std::vector<WorkItem> running;
  WorkItem w;
  ASSERT_NO_FATAL_FAILURE(TakeM000AfterFiveFinish(h, &running, &w));
  // m000 scores badly and would exploit at once: the disk is full.
  h.io().FillDisk(0, 1);
  h.Commit(w, 0.1);
  EXPECT_EQ(h.io().refused(), 1);
  EXPECT_TRUE(h.e().WaitingForStore());
  EXPECT_TRUE(h.Events("exploit").empty());
  const auto queued_members = [&h] {
    std::set<std::string> names;
    for (const auto& m : h.e().members()) {
      if (m.state.status == records::MemberStatus::kQueued) names.insert(m.name);
    }
    return names;
  };
  EXPECT_FALSE(queued_members().count("m000")) << "m000 must not train before its exploit";
  const int64_t before = h.e().members()[0].version;
  h.e().RetryDeferred();
  EXPECT_FALSE(h.e().WaitingForStore());
  const auto exploits = h.Events("exploit");
  ASSERT_EQ(exploits.size(), 1u);
  EXPECT_EQ(exploits[0]["member"], "m000");
  EXPECT_GT(h.e().members()[0].version, before);
  EXPECT_TRUE(queued_members().count("m000"));
  // It trains its next interval from the exploit version.
  WorkItem next;
  do {
    next = h.Take();
  } while (next.member != "m000");
  EXPECT_EQ(next.head_version, h.e().members()[0].version);
  EXPECT_EQ(next.interval_after, 3);
}

// The disk fills during the final evaluation: the test scores (in the
// members' records), the final evaluation's event and the end are kept and
// written once the store has space again, and only then has the experiment
// ended. Before, the scheduler ended (exiting 0, printing the results) with
// the store still saying it runs and the test scores lost (ckpt-chaos seed
// 16, its full disks late in the run).
TEST(ExperimentTest, AFullDiskDuringTheFinalEvaluationEndsTheRunOnlyOnceItsEndIsStored) {
  const auto c = BaseConfig(4, 2);
  Harness calm(c);
  calm.RunToEnd();
  ASSERT_TRUE(calm.e().ended());
  const auto test_score_of = [](Harness& x, const WorkItem& w) {
    return 0.5 + 0.001 * x.e().members()[x.e().Find(w.member)].state.index;
  };

  Harness h(c);
  std::vector<WorkItem> evals;
  while (h.e().Runnable()) {
    WorkItem w = h.Take();
    if (w.eval_only) {
      evals.push_back(w);
    } else {
      h.Commit(w, ScoreOf(w.hparams, w.interval_after));
    }
  }
  ASSERT_EQ(evals.size(), 4u);
  h.SetFull(true);
  for (const auto& w : evals) h.e().OnEvaluated(w, test_score_of(h, w));
  EXPECT_FALSE(h.e().ended()) << "its end is not stored";
  EXPECT_TRUE(h.e().WaitingForStore());
  EXPECT_NE(h.e().store_refusal().find("no space left"), std::string::npos)
      << h.e().store_refusal();
  EXPECT_NE(h.store().GetExperiment("exp")->status, "done");
  EXPECT_TRUE(h.Events("final_eval").empty());
  // Still full at the first retry.
  h.e().RetryDeferred();
  EXPECT_FALSE(h.e().ended());
  EXPECT_TRUE(h.e().WaitingForStore());
  // Space again: everything kept is written, in order, and the run ends.
  h.SetFull(false);
  h.e().RetryDeferred();
  EXPECT_TRUE(h.e().ended());
  EXPECT_FALSE(h.e().WaitingForStore());
  EXPECT_TRUE(h.e().store_refusal().empty());
  EXPECT_EQ(h.store().GetExperiment("exp")->status, "done");
  auto strip = [](std::vector<json> events) {
    for (auto& ev : events) ev.erase("unix_ms");
    return events;
  };
  EXPECT_EQ(strip(h.Events("final_eval")), strip(calm.Events("final_eval")));
  // A restarted scheduler reads the test scores back from the records.
  h.Open();
  calm.Open();
  ASSERT_TRUE(h.e().ended());
  int scored = 0;
  for (size_t i = 0; i < h.e().members().size(); ++i) {
    const double got = h.e().members()[i].state.test_score;
    const double want = calm.e().members()[i].state.test_score;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h.e().members()[i].name;
    } else {
      EXPECT_EQ(got, want) << h.e().members()[i].name;
      ++scored;
    }
  }
  EXPECT_EQ(scored, 4);
}

// A member's failure count and events refused on a full disk are written
// once it has space, in their order, before anything logged after them.
TEST(ExperimentTest, RecordsAndEventsRefusedForWantOfSpaceAreWrittenLaterInTheirOrder) {
  Harness h(BaseConfig(4, 2));
  WorkItem a = h.Take();
  WorkItem b = h.Take();
  h.SetFull(true);
  h.e().OnFailed(a, ipc::FailureCode::kNonFinite, "first", false);
  EXPECT_TRUE(h.e().WaitingForStore());
  h.SetFull(false);
  // Written while the first is still kept: it waits behind it.
  h.e().OnFailed(b, ipc::FailureCode::kNonFinite, "second", false);
  EXPECT_TRUE(h.Events("failed").empty());
  h.e().RetryDeferred();
  EXPECT_FALSE(h.e().WaitingForStore());
  const auto failed = h.Events("failed");
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_EQ(failed[0]["reason"], "first");
  EXPECT_EQ(failed[1]["reason"], "second");
  // The failure count is in the stored record: a restart goes on from it.
  h.Open();
  EXPECT_EQ(h.e().members()[h.e().Find(a.member)].state.failures, 1);
  EXPECT_EQ(h.e().members()[h.e().Find(b.member)].state.failures, 1);
}

// --- Async PBT ---------------------------------------------------------------

TEST(ExperimentTest, AsyncPbtDecidesWhenAMembersIntervalEndsWithoutABarrier) {
  Harness h(AsyncConfig());
  std::vector<WorkItem> running;
  // m000 (worst so far, 0.80) trains interval 2 and scores badly: it is
  // decided on alone, at once, and exploits a top member while m005 is
  // still on its first interval.
  WorkItem w;
  ASSERT_NO_FATAL_FAILURE(TakeM000AfterFiveFinish(h, &running, &w));
  ASSERT_EQ(w.interval_after, 2);
  const size_t before = h.Events("exploit").size();
  h.Commit(w, 0.1);
  const auto exploits = h.Events("exploit");
  ASSERT_EQ(exploits.size(), before + 1);
  EXPECT_EQ(exploits.back()["member"], "m000");
  EXPECT_EQ(h.e().members()[5].state.interval, 0);
  // m000 is queued for interval 3 from its exploit version.
  EXPECT_EQ(h.e().members()[0].state.status, records::MemberStatus::kQueued);
  EXPECT_TRUE(h.decided().empty());
  // The rest runs out; every member ends with all its intervals.
  for (auto& r : running) {
    if (r.member == "m000") continue;
    h.Commit(r, ScoreOf(r.hparams, r.interval_after));
  }
  h.RunToEnd();
  EXPECT_TRUE(h.e().ended());
  EXPECT_EQ(h.e().status(), records::ExperimentStatus::kDone);
  for (const auto& m : h.e().members()) EXPECT_EQ(m.state.interval, 4) << m.name;
}

// --- Successive halving -------------------------------------------------------

TEST(ExperimentTest, SyncSuccessiveHalvingStopsAllButTheTopThirdAtEachRung) {
  auto c = BaseConfig(9, 4);
  c.policy.kind = records::PolicyKind::kSuccessiveHalving;
  c.policy.eta = 3;
  c.policy.min_intervals = 1;
  Harness h(c);
  // Scores by index: m008 best. Rungs at 1 and 3.
  auto score = [](const WorkItem& w) {
    return 0.1 * std::stoi(w.member.substr(1)) + w.interval_after;
  };
  std::vector<WorkItem> batch;
  while (h.e().Runnable()) batch.push_back(h.Take());
  for (const auto& w : batch) h.Commit(w, score(w));
  std::set<std::string> stopped;
  for (const auto& ev : h.Events("member_stopped")) stopped.insert(ev["member"]);
  EXPECT_EQ(stopped, (std::set<std::string>{"m000", "m001", "m002", "m003", "m004", "m005"}));
  while (h.e().Runnable()) {
    WorkItem w = h.Take();
    if (w.eval_only) {
      h.e().OnEvaluated(w, 0.5);
    } else {
      EXPECT_GE(std::stoi(w.member.substr(1)), 6) << "a stopped member trained: " << w.member;
      h.Commit(w, score(w));
    }
  }
  stopped.clear();
  for (const auto& ev : h.Events("member_stopped")) stopped.insert(ev["member"]);
  EXPECT_EQ(stopped.size(), 8u);
  EXPECT_EQ(stopped.count("m008"), 0u);
  EXPECT_EQ(h.e().members()[8].state.interval, 4);
  EXPECT_EQ(h.e().members()[7].state.interval, 3);
  EXPECT_EQ(h.e().members()[7].state.status, records::MemberStatus::kStopped);
  EXPECT_TRUE(h.e().ended());
}

TEST(ExperimentTest, AsyncSuccessiveHalvingStopsLateArrivalsBelowTheRungsCut) {
  auto c = BaseConfig(6, 3);
  c.policy.kind = records::PolicyKind::kSuccessiveHalving;
  c.policy.mode = records::PolicyMode::kAsync;
  c.policy.eta = 2;
  Harness h(c);
  std::vector<WorkItem> batch;
  while (h.e().Runnable()) batch.push_back(h.Take());
  // m005 arrives first with the best score: kept (1 of 1). Then worse ones.
  std::map<std::string, double> score = {{"m005", 0.9}, {"m004", 0.8}, {"m000", 0.1},
                                         {"m003", 0.7}, {"m001", 0.2}, {"m002", 0.6}};
  std::sort(batch.begin(), batch.end(),
            [](const WorkItem& a, const WorkItem& b) { return a.member > b.member; });
  for (const auto& w : batch) h.Commit(w, score[w.member]);
  std::set<std::string> stopped;
  for (const auto& ev : h.Events("member_stopped")) stopped.insert(ev["member"]);
  // Order of arrival: m005 (1/1 kept), m004 (2/2: keep 1 -> stopped),
  // m003 (3rd of 3: keep 2 -> stopped), m002 (4th of 4 -> stopped),
  // m001 (5th of 5 -> stopped), m000 (6th of 6 -> stopped).
  EXPECT_EQ(stopped, (std::set<std::string>{"m000", "m001", "m002", "m003", "m004"}));
}

// --- Median stopping and the history ------------------------------------------

// Sync random search: after interval 2 the members whose best is below the
// others' median running average stop; a restart reads back the history the
// run kept, from the store's trained events.
TEST(ExperimentTest, SyncMedianStoppingStopsMembersBelowTheMedianAndTheHistoryReadsBack) {
  auto c = BaseConfig(6, 4);
  c.policy.kind = records::PolicyKind::kRandom;
  c.policy.median_stopping = true;
  c.policy.median_grace_intervals = 2;
  Harness h(c);
  // Member i scores 0.1 * i every interval: below the median are m000..m002.
  auto score = [](const WorkItem& w) { return 0.1 * std::stoi(w.member.substr(1)); };
  for (int round = 0; round < 2; ++round) {
    std::vector<WorkItem> batch;
    while (h.e().Runnable()) batch.push_back(h.Take());
    for (const auto& w : batch) h.Commit(w, score(w));
  }
  std::set<std::string> stopped;
  for (const auto& ev : h.Events("member_stopped")) {
    stopped.insert(ev["member"]);
    EXPECT_NE(ev["why"].get<std::string>().find("median"), std::string::npos) << ev.dump();
  }
  EXPECT_EQ(stopped, (std::set<std::string>{"m000", "m001", "m002"}));
  EXPECT_EQ(h.e().history().size(), 12u);
  const History kept = h.e().history();
  h.Open();
  EXPECT_EQ(h.e().history(), kept);
  EXPECT_EQ(h.e().history().at({2, 4}).score, 0.4);
  EXPECT_EQ(h.e().history().at({2, 4}).hparams, h.e().members()[4].hparams);
}

// Async random search with resample = "tpe": members that start once five
// results are in train TPE's proposal over them, not their first draw.
TEST(ExperimentTest, AsyncTpeProposesTheFirstHyperparametersOfLateStarters) {
  auto c = BaseConfig(8, 2);
  c.policy.kind = records::PolicyKind::kRandom;
  c.policy.mode = records::PolicyMode::kAsync;
  c.policy.resample = records::Resample::kTpe;
  Harness h(c);
  std::vector<WorkItem> first;
  first.reserve(5);
  for (int i = 0; i < 5; ++i) first.push_back(h.Take());
  for (const auto& w : first) {
    EXPECT_EQ(w.hparams, SampleInitial(c, std::stoi(w.member.substr(1))));  // nothing to model
    h.Commit(w, ScoreOf(w.hparams, 1));
  }
  const WorkItem late = h.Take();
  ASSERT_EQ(late.member, "m005");
  EXPECT_NE(late.hparams, SampleInitial(c, 5));
  std::vector<std::pair<HParams, double>> trials;
  trials.reserve(first.size());
  for (const auto& w : first) trials.emplace_back(w.hparams, ScoreOf(w.hparams, 1));
  EXPECT_EQ(late.hparams, ProposeTpe(c, trials, MixSeed(c.seed, 0x79E, 5)));
  EXPECT_EQ(h.e().members()[5].hparams, late.hparams);
  h.Commit(late, ScoreOf(late.hparams, 1));
  // Its second interval trains what it started with.
  h.RunToEnd();
  EXPECT_EQ(h.trained_hparams().at({"m005", 2}), late.hparams);
}

// PB2: a run restarted at every generation (its GP's data read back from the
// store's trained events) explores exactly as the uninterrupted run, and
// once it has data by GP-UCB.
TEST(ExperimentTest, Pb2RestartedAtEveryGenerationChoosesAsTheUninterruptedRun) {
  auto c = BaseConfig(8, 5);
  c.policy.kind = records::PolicyKind::kPb2;
  ExperimentOptions waits;
  waits.run_ahead = false;
  Harness whole(c, waits);
  whole.RunToEnd();
  ASSERT_TRUE(whole.e().ended());
  Harness restarted(c, waits);
  while (restarted.e().Runnable()) {
    std::vector<WorkItem> batch;
    while (restarted.e().Runnable()) batch.push_back(restarted.Take());
    for (const auto& w : batch) {
      if (w.eval_only) {
        restarted.e().OnEvaluated(w, 0.5 + 0.001 * std::stoi(w.member.substr(1)));
      } else {
        restarted.Commit(w, ScoreOf(w.hparams, w.interval_after));
      }
    }
    if (!restarted.e().ended()) restarted.Open();
  }
  ASSERT_TRUE(restarted.e().ended());
  auto exploits = [](Harness& h) {
    std::vector<std::string> out;
    for (auto ev : h.Events("exploit")) {
      ev.erase("unix_ms");
      ev.erase("exp");
      out.push_back(ev.dump());
    }
    return out;
  };
  const auto expected = exploits(whole);
  EXPECT_EQ(exploits(restarted), expected);
  int by_gp = 0;
  for (const auto& e : expected) by_gp += e.find("GP-UCB") != std::string::npos;
  EXPECT_GT(by_gp, 0);
  for (size_t i = 0; i < whole.e().members().size(); ++i) {
    EXPECT_EQ(restarted.e().members()[i].hparams, whole.e().members()[i].hparams) << i;
  }
}

// --- Failures ----------------------------------------------------------------

TEST(ExperimentTest, MemberFailingMaxTimesIsStoppedAndTheGenerationGoesOn) {
  auto c = BaseConfig(4, 2);
  ExperimentOptions o;
  o.max_member_failures = 3;
  Harness h(c, o);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    std::vector<WorkItem> batch;
    while (h.e().Runnable()) batch.push_back(h.Take());
    for (const auto& w : batch) {
      if (w.member == "m002") {
        h.e().OnFailed(w, ipc::FailureCode::kNonFinite, "loss is nan at step 3", false);
      } else {
        h.Commit(w, ScoreOf(w.hparams, w.interval_after));
      }
    }
    const Member& m = h.e().members()[2];
    if (attempt < 3) {
      EXPECT_EQ(m.state.failures, attempt);
      EXPECT_EQ(m.state.status, records::MemberStatus::kQueued) << "retried";
    } else {
      EXPECT_EQ(m.state.status, records::MemberStatus::kFailed);
    }
  }
  auto head = h.store().GetMember("exp", "m002");
  auto st = records::DecodeMemberRecord(head->state, "exp", "m002");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->status, records::MemberStatus::kFailed);
  EXPECT_EQ(h.Events("failed").size(), 3u);
  // The others went past the barrier without it.
  h.RunToEnd();
  EXPECT_TRUE(h.e().ended());
  for (int i : {0, 1, 3}) EXPECT_EQ(h.e().members()[i].state.interval, 2);
  EXPECT_EQ(h.e().members()[2].state.interval, 0);
}

TEST(ExperimentTest, CommitRefusedBecauseTheHeadMovedCountsNoFailure) {
  Harness h(BaseConfig(2, 1));
  WorkItem w = h.Take();
  h.e().OnFailed(w, ipc::FailureCode::kCommitError, "head moved", /*head_moved=*/true);
  EXPECT_EQ(h.e().members()[h.e().Find(w.member)].state.failures, 0);
  EXPECT_EQ(h.e().members()[h.e().Find(w.member)].state.status, records::MemberStatus::kQueued);
}

// Flips one byte of `needle`'s copy on disk, in the blob log's segments
// (<store>/blob-log/*.seg) or RocksDB's blob files (*.blob); false when no
// such file holds it.
bool DamageInBlobFiles(const std::string& dir, const std::string& needle, size_t at) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const auto ext = entry.path().extension();
    if (ext != ".seg" && ext != ".blob") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t base = content.find(needle);
    if (base == std::string::npos) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(base + at));
    f.put(static_cast<char>(content[base + at] ^ 0x01));
    f.flush();
    return f.good();
  }
  return false;
}

TEST(ExperimentTest, DamagedHeadBlobFallsBackToTheNewestIntactVersionAndRetrains) {
  TempDir dir;
  store::StoreOptions so;
  so.path = dir.Sub("s");
  so.blob_cache_bytes = 0;  // every read goes to the disk
  auto st = store::Store::Open(so);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  Harness h(BaseConfig(4, 4), {}, st->get());
  for (int g = 0; g < 2; ++g) {
    std::vector<WorkItem> batch;
    while (h.e().Runnable()) batch.push_back(h.Take());
    for (const auto& w : batch) h.Commit(w, ScoreOf(w.hparams, w.interval_after));
  }
  // Generation 3 is dispatched; one member's head (its own interval-2 result)
  // is damaged on disk, and its worker refuses the state.
  std::vector<WorkItem> batch;
  while (h.e().Runnable()) batch.push_back(h.Take());
  ASSERT_EQ(batch.size(), 4u);
  const WorkItem* victim = nullptr;
  for (const auto& w : batch) {
    auto man = h.store().GetManifest("exp", w.member, w.head_version);
    ASSERT_TRUE(man.ok());
    if (man->reason == store::kReasonTrained) victim = &w;
  }
  ASSERT_NE(victim, nullptr);
  const WorkItem bad = *victim;
  auto head = h.store().ReadHeadBlob("exp", bad.member);
  ASSERT_TRUE(head.ok());
  const std::string bytes(reinterpret_cast<const char*>(head->data()), head->size());
  ASSERT_TRUE(h.store().Flush().ok());
  ASSERT_TRUE(DamageInBlobFiles(so.path, bytes, bytes.size() / 2));
  ASSERT_TRUE(h.store().ReadHeadBlob("exp", bad.member).status().IsCorruption());

  h.e().OnFailed(bad, ipc::FailureCode::kBadState, "tensor fc3.weight: checksum mismatch", false);
  const Member& m = h.e().members()[h.e().Find(bad.member)];
  EXPECT_EQ(m.state.failures, 0);
  EXPECT_EQ(m.state.interval, 1);
  EXPECT_GT(m.version, bad.head_version);
  auto events = h.Events("corrupt_state");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["member"], bad.member);
  EXPECT_EQ(events[0]["bad_version"], bad.head_version);
  EXPECT_EQ(events[0]["version"], m.version);
  // Logged in the restore's own write (the store's fields are in it), so no
  // crash or full disk can leave the restore without it; and only there.
  EXPECT_EQ(events[0]["reason"], store::kReasonRestore);
  EXPECT_EQ(events[0]["damage"], "tensor fc3.weight: checksum mismatch");
  // The version restored under one name, the store's.
  EXPECT_FALSE(events[0].contains("restored_from"));
  EXPECT_TRUE(h.Events("restore").empty());
  const int64_t from = events[0]["restored_version"];
  EXPECT_LT(from, bad.head_version);
  auto restored = h.store().GetManifest("exp", bad.member, m.version);
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(restored->reason, store::kReasonRestore);
  ASSERT_TRUE(h.store().ReadHeadBlob("exp", bad.member).ok());
  EXPECT_TRUE(h.Events("failed").empty());
  // The others finish generation 3 and wait at the barrier while it catches up.
  for (const auto& w : batch) {
    if (w.member != bad.member) h.Commit(w, ScoreOf(w.hparams, w.interval_after));
  }
  ASSERT_TRUE(h.e().Runnable());
  WorkItem retry = h.Take();
  EXPECT_EQ(retry.member, bad.member);
  EXPECT_EQ(retry.head_version, m.version);
  EXPECT_EQ(retry.interval_after, 2);
  EXPECT_FALSE(h.e().Runnable());
  h.Commit(retry, ScoreOf(retry.hparams, retry.interval_after));
  h.RunToEnd();
  EXPECT_TRUE(h.e().ended());
  EXPECT_EQ(h.e().status(), records::ExperimentStatus::kDone);
  for (const auto& mm : h.e().members()) EXPECT_EQ(mm.state.interval, 4) << mm.name;
  EXPECT_EQ((h.trained()[{bad.member, 2}]), 2);
  EXPECT_EQ((h.trained()[{bad.member, 3}]), 1);
}

TEST(ExperimentTest, BadStateWithAnIntactHeadIsAnOrdinaryFailure) {
  Harness h(BaseConfig(2, 3));
  std::vector<WorkItem> batch;
  while (h.e().Runnable()) batch.push_back(h.Take());
  for (const auto& w : batch) h.Commit(w, ScoreOf(w.hparams, w.interval_after));
  WorkItem w = h.Take();
  ASSERT_GT(w.head_version, 0);
  h.e().OnFailed(w, ipc::FailureCode::kBadState, "shape mismatch", false);
  EXPECT_EQ(h.e().members()[h.e().Find(w.member)].state.failures, 1);
  EXPECT_EQ(h.e().members()[h.e().Find(w.member)].version, w.head_version);
  EXPECT_TRUE(h.Events("corrupt_state").empty());
  EXPECT_EQ(h.Events("failed").size(), 1u);
}

TEST(ExperimentTest, ReturnedTasksRunAgainFromTheCommittedHead) {
  Harness h(BaseConfig(3, 1));
  WorkItem w = h.Take();
  h.e().OnReturned(w);
  EXPECT_EQ(h.e().in_flight(), 0);
  WorkItem again = h.Take();
  EXPECT_EQ(again.member, w.member);
  EXPECT_EQ(again.head_version, w.head_version);
  EXPECT_EQ(again.interval_after, w.interval_after);
}

TEST(ExperimentTest, RefusedConfigureEndsTheExperimentAtOnceAsFailed) {
  Harness h(BaseConfig(4, 3));
  WorkItem w = h.Take();
  h.e().OnConfigureRefused("worker 0: model spec torchscript:/x.pt: cannot load");
  EXPECT_TRUE(h.e().ended());
  EXPECT_EQ(h.e().status(), records::ExperimentStatus::kFailed);
  EXPECT_FALSE(h.e().Runnable());
  EXPECT_EQ(h.store().GetExperiment("exp")->status, "failed");
  ASSERT_EQ(h.Events("configure_refused").size(), 1u);
  EXPECT_NE(h.Events("configure_refused")[0]["reason"].get<std::string>().find("cannot load"),
            std::string::npos);
  // The in-flight task's FAILED, when it comes, counts nothing.
  h.e().OnFailed(w, ipc::FailureCode::kBadRequest, "no CONFIGURE", false);
  EXPECT_EQ(h.e().members()[h.e().Find(w.member)].state.failures, 0);
  EXPECT_TRUE(h.Events("failed").empty());
}

// Every member of a failed experiment shows a final status (it used to read
// `running` for ever): in the summary, in its record, after a restart, and
// whatever its in-flight task brings back later.
TEST(ExperimentTest, MembersOfAFailedExperimentEndFailed) {
  Harness h(BaseConfig(4, 3));
  WorkItem committed = h.Take();
  WorkItem failed = h.Take();
  WorkItem returned = h.Take();
  h.e().OnConfigureRefused("worker 1: model spec's last layer has 3 outputs");
  h.Commit(committed, 0.5);
  h.e().OnFailed(failed, ipc::FailureCode::kBadRequest, "no CONFIGURE", false);
  h.e().OnReturned(returned);
  auto expect_failed = [&h](const char* when) {
    SCOPED_TRACE(when);
    const ExperimentSummary s = h.e().Summary(h.now());
    ASSERT_EQ(s.members.size(), 4u);
    for (const auto& m : s.members) {
      EXPECT_EQ(m.status, records::MemberStatus::kFailed) << m.member;
      auto head = h.store().GetMember("exp", m.member);
      ASSERT_TRUE(head.ok());
      auto record = records::DecodeMemberRecord(head->state, "exp", m.member);
      ASSERT_TRUE(record.ok()) << record.status().ToString();
      EXPECT_EQ(record->status, records::MemberStatus::kFailed) << m.member;
    }
  };
  expect_failed("after the refusal");
  EXPECT_EQ(h.e().members()[h.e().Find(committed.member)].state.interval, 1);
  h.Open();
  expect_failed("after a restart");
}

// --- Ends --------------------------------------------------------------------

TEST(ExperimentTest, TargetMetricEndsTrainingAndTheExperiment) {
  auto c = BaseConfig(4, 10);
  c.target_metric = 0.9;
  Harness h(c);
  std::vector<WorkItem> batch;
  while (h.e().Runnable()) batch.push_back(h.Take());
  h.Commit(batch[0], 0.95);  // reaches the target
  for (size_t i = 1; i < batch.size(); ++i) h.Commit(batch[i], 0.5);
  // No new intervals: only the final evaluation runs.
  while (h.e().Runnable()) {
    WorkItem w = h.Take();
    ASSERT_TRUE(w.eval_only) << w.member << " trained after the target";
    h.e().OnEvaluated(w, 0.9);
  }
  EXPECT_TRUE(h.e().ended());
  EXPECT_EQ(h.e().status(), records::ExperimentStatus::kDone);
  EXPECT_EQ(h.Events("target_reached").size(), 1u);
  for (const auto& m : h.e().members()) EXPECT_EQ(m.state.interval, 1);
}

TEST(ExperimentTest, MaxWallTimeEndsTrainingAndTheExperiment) {
  auto c = BaseConfig(3, 10);
  c.max_wall_s = 60;
  Harness h(c);
  h.RunToEnd(6);  // two generations
  h.Advance(61);
  h.RunToEnd();
  EXPECT_TRUE(h.e().ended());
  EXPECT_EQ(h.Events("wall_time_reached").size(), 1u);
  for (const auto& m : h.e().members()) EXPECT_LE(m.state.interval, 3);
}

TEST(ExperimentTest, FinalTestAccuraciesSurviveARestartWithoutTheEventLog) {
  auto c = BaseConfig(4, 1);
  Harness h(c, ExperimentOptions{3, 2});
  h.RunToEnd();
  ASSERT_TRUE(h.e().ended());
  int evaluated = 0;
  for (const auto& m : h.e().members()) evaluated += std::isnan(m.state.test_score) ? 0 : 1;
  EXPECT_EQ(evaluated, 2);
  h.Open();
  int after = 0;
  for (const auto& m : h.e().Summary(h.now()).members) after += m.test_score >= 0 ? 1 : 0;
  EXPECT_EQ(after, 2);
}

// --- Crash and resume ----------------------------------------------------------

TEST(ExperimentTest, CrashBetweenCommitAndStateRecordIsReconciledNotRetrained) {
  auto c = BaseConfig(4, 3);
  Harness h(c);
  WorkItem w = h.Take();
  EXPECT_THROW(h.Commit(w, 0.7, /*crash_before_state=*/true), Harness::Crash);
  h.Open();
  const Member& m = h.e().members()[h.e().Find(w.member)];
  EXPECT_EQ(m.state.interval, 1);
  EXPECT_DOUBLE_EQ(m.state.score, 0.7);
  h.RunToEnd();
  for (const auto& [key, times] : h.trained())
    EXPECT_EQ(times, 1) << key.first << "@" << key.second;
}

TEST(ExperimentTest, CrashMidBarrierEndsAsTheUndisturbedRun) {
  auto c = BaseConfig(8, 3);
  Harness undisturbed(c);
  undisturbed.RunToEnd();
  Harness h(c);
  h.CrashAt("scheduler.exploited", 1);  // first exploit written, its state record not
  EXPECT_THROW(h.RunToEnd(), Harness::Crash);
  h.CrashAt("", 0);
  h.Open();
  h.RunToEnd();
  ASSERT_TRUE(h.e().ended());
  for (size_t i = 0; i < 8; ++i) {
    const Member& a = undisturbed.e().members()[i];
    const Member& b = h.e().members()[i];
    EXPECT_EQ(a.hparams, b.hparams) << a.name;
    EXPECT_EQ(a.step, b.step) << a.name;
    EXPECT_EQ(a.state.interval, b.state.interval) << a.name;
    EXPECT_EQ(a.state.last_exploit, b.state.last_exploit) << a.name;
  }
  EXPECT_EQ(undisturbed.Events("exploit").size(), h.Events("exploit").size());
}

// --- Running ahead of a barrier ---------------------------------------------------

// Scores of generation 1 by member (positions 0..7), and one high score for
// position 2's second interval; everything else from ScoreOf.
double AheadScore(const WorkItem& w) {
  static const double kFirst[8] = {0.9, 0.8, 0.7, 0.6, 0.5, 0.95, 0.4, 0.3};
  const int i = std::stoi(w.member.substr(1));
  if (w.interval_after == 1) return kFirst[i];
  if (w.interval_after == 2 && i == 2) return 0.99;
  return ScoreOf(w.hparams, w.interval_after);
}

void RunToEndWithAheadScores(Harness& h) {
  while (h.e().Runnable()) {
    WorkItem w = h.Take();
    if (w.eval_only) {
      h.e().OnEvaluated(w, 0.5);
    } else {
      h.Commit(w, AheadScore(w));
    }
  }
}

// 8 members, k = 2 (the top two donate, the bottom two are exploited). Once
// five have finished generation 1 (scores 0.9 0.8 0.7 0.6 0.5), the third
// (0.7) has two above and two below it for certain: it starts interval 2
// before the barrier. It commits 0.99 there, and the scheduler restarts,
// before the last three finish; the barrier still ranks it at 0.7 (not a
// donor), and the run ends as one that waited at every barrier.
// The run that waits at every barrier, to the end, with AheadScore's scores.
std::unique_ptr<Harness> WaitingRun(const records::ExperimentConfig& c) {
  ExperimentOptions waits;
  waits.run_ahead = false;
  auto calm = std::make_unique<Harness>(c, waits);
  RunToEndWithAheadScores(*calm);
  return calm;
}

// Eight members' first intervals handed out, the first five committed (with
// AheadScore's scores): nothing is queued until the fifth.
void FirstFiveOfEightCommitted(Harness& h, std::vector<WorkItem>* first) {
  while (h.e().Runnable()) first->push_back(h.Take());
  ASSERT_EQ(first->size(), 8u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_FALSE(h.e().Runnable()) << "after " << i << " results";
    h.Commit((*first)[i], AheadScore((*first)[i]));
  }
}

TEST(ExperimentTest, AMemberSureToContinueRunsAheadOfTheBarrierAndTheRunEndsTheSame) {
  auto c = BaseConfig(8, 3);
  auto calm_run = WaitingRun(c);
  Harness& calm = *calm_run;
  ASSERT_TRUE(calm.e().ended());
  ASSERT_EQ(calm.Events("exploit").size(), 4u);  // two at each of barriers 1 and 2

  Harness h(c);
  std::vector<WorkItem> first;
  ASSERT_NO_FATAL_FAILURE(FirstFiveOfEightCommitted(h, &first));
  ASSERT_TRUE(h.e().Runnable());
  EXPECT_EQ(h.e().queued(), 1u);
  WorkItem ahead = h.Take();
  EXPECT_EQ(ahead.member, first[2].member);
  EXPECT_EQ(ahead.interval_after, 2);
  EXPECT_EQ(ahead.state_after.ahead_of, 1);
  EXPECT_TRUE(h.decided().empty()) << "barrier 1 must not be decided yet";
  h.Commit(ahead, AheadScore(ahead));  // 0.99 at interval 2, barrier 1 still open
  EXPECT_TRUE(h.decided().empty());
  // The stored record keeps the mark and the score at 1.
  auto head = h.store().GetMember("exp", ahead.member);
  ASSERT_TRUE(head.ok());
  auto rec = records::DecodeMemberRecord(head->state, "exp", ahead.member);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->interval, 2);
  EXPECT_EQ(rec->ahead_of, 1);
  EXPECT_DOUBLE_EQ(rec->ahead_score, 0.7);
  // The scheduler restarts; the last three members' intervals were lost.
  h.Open();
  RunToEndWithAheadScores(h);
  ASSERT_TRUE(h.e().ended());
  int at_barrier_1 = 0;
  for (const auto& ev : h.Events("exploit")) {
    if (ev["interval"] != 1) continue;
    ++at_barrier_1;
    EXPECT_NE(ev["donor"], ahead.member) << ev.dump();
    EXPECT_NE(ev["member"], ahead.member) << ev.dump();
  }
  EXPECT_EQ(at_barrier_1, 2);
  EXPECT_EQ(RunOutcome(h, 8), RunOutcome(calm, 8));
  EXPECT_EQ(h.trained_hparams(), calm.trained_hparams());
  for (const auto& [key, times] : h.trained())
    EXPECT_EQ(times, 1) << key.first << "@" << key.second;
}

// ckpt-chaos found it: the member running ahead of barrier 1 commits
// interval 2 and the scheduler is killed before the state record after the
// commit is written. The record reconciled from the head must still say that
// it ran ahead of 1; read as a member past 1, it made the resumed run take
// barrier 1 for decided, and it made no exploits.
TEST(ExperimentTest, ARunAheadCommitWhoseRecordWasLostStillWaitsForItsBarrier) {
  auto c = BaseConfig(8, 3);
  auto calm_run = WaitingRun(c);
  Harness& calm = *calm_run;
  ASSERT_TRUE(calm.e().ended());

  Harness h(c);
  std::vector<WorkItem> first;
  ASSERT_NO_FATAL_FAILURE(FirstFiveOfEightCommitted(h, &first));
  ASSERT_EQ(h.e().queued(), 1u);
  WorkItem ahead = h.Take();
  ASSERT_EQ(ahead.interval_after, 2);
  // Marked in the store before it was handed out.
  auto head = h.store().GetMember("exp", ahead.member);
  ASSERT_TRUE(head.ok());
  auto rec = records::DecodeMemberRecord(head->state, "exp", ahead.member);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->interval, 1);
  EXPECT_EQ(rec->ahead_of, 1);
  EXPECT_DOUBLE_EQ(rec->ahead_score, 0.7);
  EXPECT_THROW(h.Commit(ahead, AheadScore(ahead), /*crash_before_state=*/true), Harness::Crash);
  h.Open();
  const Member& m = h.e().members()[static_cast<size_t>(h.e().Find(ahead.member))];
  EXPECT_EQ(m.state.interval, 2);  // from the head
  EXPECT_EQ(m.state.ahead_of, 1);  // from the record
  RunToEndWithAheadScores(h);
  ASSERT_TRUE(h.e().ended());
  EXPECT_EQ(h.decided()[1], 1) << "barrier 1 was not decided after the restart";
  EXPECT_EQ(RunOutcome(h, 8), RunOutcome(calm, 8));
  EXPECT_EQ(h.trained_hparams(), calm.trained_hparams());
}

TEST(MemberStateTest, TheRunAheadMarkReadsBackAndIsCheckedAgainstTheInterval) {
  records::MemberRecord s;
  s.index = 2;
  s.interval = 2;
  s.ahead_of = 1;
  s.ahead_score = -0.25;
  auto back = records::DecodeMemberRecord(records::EncodeMemberRecord(s), "e", "m2");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
  s.ahead_score = std::nan("");
  back = records::DecodeMemberRecord(records::EncodeMemberRecord(s), "e", "m2");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, s);
  // Unmarked records carry no field at all.
  EXPECT_EQ(records::EncodeMemberRecord(records::MemberRecord{}).find("ahead"), std::string::npos);
  for (const char* bad :
       {R"({"v":3,"interval":4,"ahead":{"of":1,"score":0.5}})",
        R"({"v":3,"interval":1,"ahead":{"of":2,"score":0.5}})",
        R"({"v":3,"interval":2,"ahead":{"of":1}})", R"({"v":3,"interval":2,"ahead":[1,0.5]})"}) {
    auto r = records::DecodeMemberRecord(bad, "e", "m2");
    EXPECT_TRUE(r.status().IsCorruption()) << bad;
    EXPECT_NE(r.status().message().find("m2"), std::string::npos) << r.status().ToString();
  }
}

// --- Random event orders -------------------------------------------------------

struct Outcome {
  std::map<std::string, std::tuple<HParams, int64_t, int, int>> members;
  std::set<std::tuple<std::string, std::string, int>> exploits;
};

Outcome OutcomeOf(Harness& h) {
  Outcome o;
  for (const auto& m : h.e().members()) {
    o.members[m.name] = {m.hparams, m.step, m.state.interval, static_cast<int>(m.state.status)};
  }
  for (const auto& ev : h.Events("exploit")) {
    o.exploits.insert({ev["member"], ev["donor"], ev["interval"].get<int>()});
  }
  return o;
}

// Counts over all the random sequences, printed and checked at the end.
struct RandomTally {
  int sequences = 0;
  int events = 0;
  int restarts = 0;
  int ran_ahead = 0;
  int commits_lost = 0;
  int full_disks = 0;
  int writes_refused = 0;
  // The new policies' own decisions, so that the sequences are known to
  // exercise them: PB2 explores by its GP, members stopped by the median
  // rule, members that started on a TPE proposal.
  int gp_explores = 0;
  int median_stops = 0;
  int tpe_starts = 0;
};

// Adds what `h`'s run decided by the new policies to `tally`.
void TallyPolicies(Harness& h, const records::ExperimentConfig& c, RandomTally* tally) {
  for (const auto& ev : h.Events("exploit")) {
    tally->gp_explores += ev["why"].get<std::string>().find("GP-UCB") != std::string::npos;
  }
  for (const auto& ev : h.Events("member_stopped")) {
    tally->median_stops += ev["why"].get<std::string>().find("median") != std::string::npos;
  }
  if (c.policy.resample != records::Resample::kTpe || c.policy.kind == records::PolicyKind::kPbt) {
    return;
  }
  for (const auto& [key, hparams] : h.trained_hparams()) {
    if (key.second != 1) continue;
    tally->tpe_starts += hparams != SampleInitial(c, h.e().Find(key.first));
  }
}

// One random sequence's experiment: its config and options, and whether its
// policy is synchronous (then its end is known from an in-order run).
struct RandomSequence {
  records::ExperimentConfig config;
  ExperimentOptions opts;
  bool sync = false;
};

RandomSequence DrawSequence(std::mt19937_64& rng, int seq) {
  RandomSequence s;
  const int population = 2 + static_cast<int>(rng() % 7);
  const int intervals = 1 + static_cast<int>(rng() % 4);
  records::ExperimentConfig& c = s.config;
  c = BaseConfig(population, intervals);
  c.seed = rng();
  c.source = "random " + std::to_string(seq);
  // Every policy kind, the sync ones compared with an in-order run.
  c.policy.kind = records::kPolicyKinds[rng() % records::kPolicyKinds.size()];
  c.policy.eta = 2;
  c.policy.brackets = std::min(population, records::MaxHyperbandBrackets(intervals, 1, 2));
  c.policy.median_stopping = (c.policy.kind == records::PolicyKind::kRandom ||
                              c.policy.kind == records::PolicyKind::kSuccessiveHalving) &&
                             rng() % 2 == 0;
  c.policy.quantile = 0.25 + 0.05 * static_cast<double>(rng() % 5);
  s.sync = rng() % 4 != 0;
  c.policy.mode = s.sync ? records::PolicyMode::kSync : records::PolicyMode::kAsync;
  // TPE where it applies: PBT's resample (sync: compared with the in-order
  // run), and first hyperparameters in async mode.
  if ((c.policy.kind == records::PolicyKind::kPbt || !s.sync) && rng() % 2 == 0) {
    c.policy.resample = records::Resample::kTpe;
    c.policy.resample_probability = 0.5;
  }
  s.opts.max_member_failures = 3;
  s.opts.final_eval_top = 2;
  return s;
}

// How a synchronous sequence must end: its experiment run in order, waiting
// at every barrier, as "ref<seq>" in `shared`.
void RunReference(const RandomSequence& s, int seq, store::Store* shared, Outcome* expected) {
  records::ExperimentConfig rc = s.config;
  rc.name = "ref" + std::to_string(seq);
  ExperimentOptions waits = s.opts;
  waits.run_ahead = false;  // the random run runs ahead of barriers and must end the same
  Harness ref(rc, waits, shared);
  ref.RunToEnd();
  ASSERT_TRUE(ref.e().ended());
  *expected = OutcomeOf(ref);
}

// Applies random events to one harness: results, failures, worker losses,
// scheduler restarts and full disks, each drawn from `rng`, and holds the
// work the workers have in flight.
class RandomEvents {
 public:
  RandomEvents(Harness* h, std::mt19937_64* rng, const ExperimentOptions& opts, RandomTally* tally)
      : h_(*h), rng_(*rng), opts_(opts), tally_(*tally) {}

  const std::vector<WorkItem>& in_flight() const { return in_flight_; }

  void Step() {
    ++tally_.events;
    if (full_for_ > 0 && --full_for_ == 0) {
      tally_.writes_refused += h_.io().refused();
      h_.SetFull(false);
      h_.e().RetryDeferred();  // StoreHealth's probe found space
    }
    const int action = static_cast<int>(rng_() % 10);
    if (action < 4 && Runnable()) {
      in_flight_.push_back(h_.Take());
      if (in_flight_.back().state_after.ahead()) ++tally_.ran_ahead;
    } else if (!in_flight_.empty() && action < 8) {
      ReportRandomOne(action);
    } else if (!in_flight_.empty() && action == 8) {
      // A worker is lost with everything it held.
      for (const auto& w : in_flight_) h_.e().OnReturned(w);
      in_flight_.clear();
    } else if (action == 9 && rng_() % 8 == 0) {
      KillScheduler();
    } else if (action == 9 && full_for_ == 0 && rng_() % 6 == 0) {
      // The disk fills for a while: every write of the experiment is
      // refused (records, events, exploits, its end).
      full_for_ = 1 + static_cast<int>(rng_() % 30);
      ++tally_.full_disks;
      h_.SetFull(true);
    } else if (Runnable()) {
      in_flight_.push_back(h_.Take());
    } else if (!in_flight_.empty()) {
      WorkItem w = in_flight_.front();
      in_flight_.erase(in_flight_.begin());
      if (w.eval_only) {
        h_.e().OnEvaluated(w, 0.5);
      } else {
        Commit(w);
      }
    } else if (h_.full()) {
      full_for_ = 1;  // nothing left to do but wait for space
    }
  }

 private:
  // Dispatch pauses once a write was refused (StoreHealth) until space returns.
  bool Runnable() { return h_.e().Runnable() && !(h_.full() && h_.e().WaitingForStore()); }

  // What the scheduler does with a result while the disk is full: the
  // commit is refused (the interval reruns from its committed head) or, the
  // disk having filled just after it, the writes after it are.
  void Commit(const WorkItem& w) {
    if (h_.full() && rng_() % 2 == 0) {
      h_.e().OnReturned(w);
    } else {
      h_.Commit(w, ScoreOf(w.hparams, w.interval_after));
    }
  }

  // A random in-flight item comes back: failed (action 7, while the member
  // has failures to spare), evaluated or committed.
  void ReportRandomOne(int action) {
    const size_t i = rng_() % in_flight_.size();
    WorkItem w = in_flight_[i];
    in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    const Member& m = h_.e().members()[h_.e().Find(w.member)];
    if (action == 7 && m.state.failures + 1 < opts_.max_member_failures) {
      h_.e().OnFailed(w, ipc::FailureCode::kNonFinite, "random failure", false);
    } else if (w.eval_only) {
      h_.e().OnEvaluated(w, 0.5);
    } else {
      Commit(w);
    }
  }

  // The scheduler is killed: in-flight work is never reported. Half the
  // time one interval's result was committed just before, and the process
  // died before it wrote the member's state record (the record is
  // reconciled from the head at the next start).
  void KillScheduler() {
    const bool committed_one = !in_flight_.empty() && rng_() % 2 == 0;
    if (committed_one) {
      const size_t i = rng_() % in_flight_.size();
      const WorkItem w = in_flight_[i];
      if (!w.eval_only) {
        try {
          h_.Commit(w, ScoreOf(w.hparams, w.interval_after), /*crash_before_state=*/true);
        } catch (const Harness::Crash&) {
          ++tally_.commits_lost;
        }
      }
    }
    in_flight_.clear();
    ++tally_.restarts;
    h_.Open();
  }

  Harness& h_;
  std::mt19937_64& rng_;
  const ExperimentOptions& opts_;
  RandomTally& tally_;
  std::vector<WorkItem> in_flight_;
  int full_for_ = 0;  // steps the disk stays full
};

// What must hold after every event: each interval trained once, each
// barrier decided once, no member past the last interval, the
// experiment's count of work in flight the workers', and its incremental
// bookkeeping (PopulationIndex) answering as scans of the whole population
// do (the barrier, who is busy or past it, the idle members, who may run
// ahead of the barrier, ranked by nth_element as before).
void CheckInvariants(Harness& h, const std::vector<WorkItem>& in_flight, int seq, int intervals) {
  ASSERT_EQ(h.e().CheckIndex(), "") << "seq " << seq;
  for (const auto& [key, times] : h.trained()) {
    ASSERT_EQ(times, 1) << "seq " << seq << ": " << key.first << " trained interval " << key.second
                        << " " << times << " times";
  }
  for (const auto& [gen, times] : h.decided()) {
    ASSERT_EQ(times, 1) << "seq " << seq << ": barrier " << gen << " decided " << times << " times";
  }
  for (const auto& m : h.e().members()) {
    ASSERT_LE(m.state.interval, intervals) << "seq " << seq << " " << m.name;
    ASSERT_LE(m.state.last_exploit, m.state.interval);
  }
  ASSERT_GE(h.e().in_flight(), 0);
  ASSERT_EQ(static_cast<size_t>(h.e().in_flight()), in_flight.size()) << "seq " << seq;
}

// What must hold once a sequence's events ran out: it ended, exploited no
// member twice in an interval, trained its done members to the end, ended
// as its in-order reference did (sync), and stored its end.
void CheckEnd(Harness& h, const RandomSequence& s, int seq, const Outcome& expected) {
  const records::ExperimentConfig& c = s.config;
  if (!h.e().ended()) {
    std::string where;
    for (const auto& m : h.e().members()) {
      where += " " + m.name + "@" + std::to_string(m.state.interval) + "/" +
               records::MemberStatusName(m.state.status) +
               (m.state.ahead() ? "/ahead of " + std::to_string(m.state.ahead_of) : "");
    }
    FAIL() << "seq " << seq << " did not end: generation " << h.e().generation() << ", "
           << h.e().queued() << " queued, " << h.e().in_flight() << " in flight;" << where;
  }
  std::set<std::tuple<std::string, int>> exploited;
  for (const auto& ev : h.Events("exploit")) {
    ASSERT_TRUE(exploited.insert({ev["member"], ev["interval"].get<int>()}).second)
        << "seq " << seq << ": " << ev.dump() << " exploited twice";
  }
  for (const auto& m : h.e().members()) {
    if (m.state.status == records::MemberStatus::kDone && s.sync) {
      EXPECT_EQ(m.step, static_cast<int64_t>(c.intervals) * c.steps_per_interval)
          << "seq " << seq << " " << m.name;
    }
    if (m.state.status == records::MemberStatus::kDone) {
      EXPECT_EQ(m.state.interval, c.intervals);
    }
  }
  if (s.sync) {
    const Outcome got = OutcomeOf(h);
    EXPECT_EQ(got.members, expected.members) << "seq " << seq;
    EXPECT_EQ(got.exploits, expected.exploits) << "seq " << seq;
  }
  // Its end is stored (a full disk at the end only delays it).
  EXPECT_EQ(h.store().GetExperiment(c.name)->status, records::ExperimentStatusName(h.e().status()))
      << "seq " << seq;
  EXPECT_FALSE(h.Events("final_eval").empty()) << "seq " << seq;
}

// Thousands of random sequences of results, failures, worker losses and
// scheduler restarts; the invariants are checked after every event.
TEST(ExperimentRandomTest, InvariantsHoldUnderRandomEventOrders) {
  constexpr int kSequences = 2000;
  TempDir dir;
  store::StoreOptions so;
  so.path = dir.Sub("store");
  so.keep_last_n = 2;
  auto shared = store::Store::Open(so);
  ASSERT_TRUE(shared.ok());
  std::mt19937_64 rng(20261203);
  RandomTally tally;
  for (int seq = 0; seq < kSequences; ++seq) {
    RandomSequence s = DrawSequence(rng, seq);
    Outcome expected;
    if (s.sync) {
      RunReference(s, seq, shared->get(), &expected);
      if (HasFatalFailure()) return;
    }
    s.config.name = "run" + std::to_string(seq);
    Harness h(s.config, s.opts, shared->get());
    RandomEvents events(&h, &rng, s.opts, &tally);
    for (int step = 0; step < 5000 && !h.e().ended(); ++step) {
      events.Step();
      CheckInvariants(h, events.in_flight(), seq, s.config.intervals);
      if (HasFatalFailure()) return;
    }
    CheckEnd(h, s, seq, expected);
    if (HasFatalFailure()) return;
    TallyPolicies(h, s.config, &tally);
    ++tally.sequences;
  }
  std::printf(
      "%d sequences, %d events, %d scheduler restarts (%d right after a commit, before its "
      "state record), %d intervals run ahead, %d full disks (%d writes refused)\n",
      tally.sequences, tally.events, tally.restarts, tally.commits_lost, tally.ran_ahead,
      tally.full_disks, tally.writes_refused);
  std::printf("%d PB2 explores by its GP, %d median stops, %d members started on a TPE proposal\n",
              tally.gp_explores, tally.median_stops, tally.tpe_starts);
  EXPECT_EQ(tally.sequences, kSequences);
  EXPECT_GT(tally.ran_ahead, kSequences / 10);
  EXPECT_GT(tally.restarts, 5 * kSequences / 40);
  EXPECT_GT(tally.commits_lost, tally.restarts / 8);
  EXPECT_GT(tally.full_disks, kSequences / 10);
  EXPECT_GT(tally.writes_refused, tally.full_disks);
  EXPECT_GT(tally.gp_explores, kSequences / 20);
  EXPECT_GT(tally.median_stops, kSequences / 20);
  EXPECT_GT(tally.tpe_starts, kSequences / 100);
}

}  // namespace
}  // namespace ckpt::scheduler
