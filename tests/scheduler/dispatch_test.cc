// The worker pool's restart backoff and the dispatcher's assignment, as pure
// logic (no process): the dispatcher is driven with the real Experiment over a
// real store and a TaskSink that records what a worker pool would receive.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "dispatcher.h"
#include "experiment.h"
#include "experiment_store.h"
#include "store/test_util.h"
#include "worker_pool.h"

namespace ckpt::scheduler {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RestartBackoffTest, DoublesUpToTheCapAndResetsAfterAHealthyUptime) {
  records::SupervisionOptions s;
  s.restart_backoff = milliseconds(100);
  s.max_restart_backoff = milliseconds(1000);
  s.healthy_reset = seconds(60);
  milliseconds d = NextRestartDelay(milliseconds(0), seconds(1), s);
  EXPECT_EQ(d, milliseconds(100));
  std::vector<milliseconds> seen;
  for (int i = 0; i < 6; ++i) {
    d = NextRestartDelay(d, seconds(1), s);
    seen.push_back(d);
  }
  EXPECT_EQ(seen, (std::vector<milliseconds>{milliseconds(200), milliseconds(400),
                                             milliseconds(800), milliseconds(1000),
                                             milliseconds(1000), milliseconds(1000)}));
  EXPECT_EQ(NextRestartDelay(milliseconds(1000), seconds(61), s), milliseconds(100));
}

TEST(ExpandDevicesTest, CountExpandsAndAutoFallsBackToTheCpuWithoutGpus) {
  records::DeviceConfig cpu;
  cpu.device = "cpu";
  cpu.count = 3;
  records::DeviceConfig gpu;
  gpu.device = "cuda:1";
  auto out = ExpandDevices({cpu, gpu});
  ASSERT_EQ(out.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i].device, "cpu");
  EXPECT_EQ(out[3].device, "cuda:1");
  for (const auto& d : out) EXPECT_EQ(d.count, 1);
  records::DeviceConfig any;
  any.device = "auto";
  auto autos = ExpandDevices({any});
  ASSERT_FALSE(autos.empty());
  if (!std::filesystem::exists("/proc/driver/nvidia/gpus")) {
    ASSERT_EQ(autos.size(), 1u);
    EXPECT_EQ(autos[0].device, "cpu");
  }
}

// Records tasks; each worker has `capacity` slots.
class RecordingSink : public TaskSink {
 public:
  explicit RecordingSink(std::vector<int> capacity)
      : capacity_(std::move(capacity)), busy_(capacity_.size(), 0) {}
  int PickFree(int per_slot) const override {
    int best = -1;
    for (size_t i = 0; i < capacity_.size(); ++i) {
      if (busy_[i] >= per_slot * capacity_[i]) continue;
      if (best < 0 || capacity_[i] - busy_[i] > capacity_[best] - busy_[best]) {
        best = static_cast<int>(i);
      }
    }
    return best;
  }
  void Send(size_t worker, Task task) override {
    ++busy_[worker];
    sent.push_back({worker, task});
  }
  std::vector<std::pair<size_t, Task>> sent;

 private:
  std::vector<int> capacity_;
  std::vector<int> busy_;
};

records::ExperimentConfig Config(const std::string& name, int population) {
  records::ExperimentConfig c;
  c.name = name;
  c.seed = 3;
  c.population = population;
  c.intervals = 2;
  c.search_space["lr"] = records::SearchDim{records::SearchDim::Kind::kLogUniform, 1e-3, 1e-1, {}};
  c.source = name;
  return c;
}

TEST(DispatcherTest, ExperimentsShareWorkersRoundRobinWithinTwoTasksPerSlot) {
  store::testing::TempDir dir;
  store::StoreOptions so;
  so.path = dir.Sub("s");
  auto st = store::Store::Open(so);
  ASSERT_TRUE(st.ok());
  std::vector<std::unique_ptr<StoreExperimentIo>> ios;
  std::vector<std::unique_ptr<Experiment>> exps;
  for (auto [name, n] : std::vector<std::pair<std::string, int>>{{"big", 20}, {"small", 3}}) {
    auto c = Config(name, n);
    ASSERT_TRUE(CreateExperimentRecords(st->get(), c).ok());
    auto members = LoadMembers(st->get(), c);
    ASSERT_TRUE(members.ok());
    ios.push_back(std::make_unique<StoreExperimentIo>(st->get(), name, nullptr));
    auto policy = Policy::Create(c);
    ASSERT_TRUE(policy.ok());
    exps.push_back(std::make_unique<Experiment>(
        c, std::move(*policy), std::move(*members), records::ExperimentStatus::kRunning,
        ExperimentOptions{}, ios.back().get(), Clock::now()));
    exps.back()->Start();
  }
  RecordingSink sink({2, 1});  // two workers: 2 slots and 1 slot
  Dispatcher d;
  d.Dispatch(&sink, {exps[0].get(), exps[1].get()}, Clock::now());
  // Two in flight per slot: 4 + 2.
  ASSERT_EQ(sink.sent.size(), 6u);
  std::map<size_t, int> per_worker;
  std::map<std::string, int> per_exp;
  std::set<uint64_t> ids;
  for (const auto& [w, t] : sink.sent) {
    ++per_worker[w];
    ++per_exp[t.exp];
    ids.insert(t.id);
  }
  EXPECT_EQ(per_worker[0], 4);
  EXPECT_EQ(per_worker[1], 2);
  // Round-robin: the small experiment got every other task until it ran out.
  EXPECT_EQ(per_exp["small"], 3);
  EXPECT_EQ(per_exp["big"], 3);
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(exps[0]->in_flight() + exps[1]->in_flight(), 6);
  // Nothing more fits.
  d.Dispatch(&sink, {exps[0].get(), exps[1].get()}, Clock::now());
  EXPECT_EQ(sink.sent.size(), 6u);
  // A paused experiment gets nothing.
  ASSERT_TRUE(exps[0]->Pause().ok());
  RecordingSink more({4});
  d.Dispatch(&more, {exps[0].get(), exps[1].get()}, Clock::now());
  EXPECT_TRUE(more.sent.empty());
}

TEST(DispatcherTest, EachTaskCarriesItsExperimentsResultRules) {
  store::testing::TempDir dir;
  store::StoreOptions so;
  so.path = dir.Sub("s");
  auto st = store::Store::Open(so);
  ASSERT_TRUE(st.ok());
  auto c = Config("regress", 2);
  c.batch_size = 48;
  c.eval_size = 0;
  c.metric = format::MetricKind::kNegMse;
  ASSERT_TRUE(CreateExperimentRecords(st->get(), c).ok());
  auto members = LoadMembers(st->get(), c);
  ASSERT_TRUE(members.ok());
  StoreExperimentIo io(st->get(), c.name, nullptr);
  auto policy = Policy::Create(c);
  ASSERT_TRUE(policy.ok());
  Experiment e(c, std::move(*policy), std::move(*members), records::ExperimentStatus::kRunning,
               ExperimentOptions{}, &io, Clock::now());
  e.Start();
  RecordingSink sink({1});
  Dispatcher d;
  d.Dispatch(&sink, {&e}, Clock::now());
  ASSERT_EQ(sink.sent.size(), 2u);
  for (const auto& [w, t] : sink.sent) {
    EXPECT_EQ(t.rules.batch_size, 48);
    EXPECT_FALSE(t.rules.validates);
    EXPECT_EQ(t.rules.metric, format::MetricKind::kNegMse);
    // Until a sender fills them in: no state sent.
    EXPECT_EQ(t.sent_step, 0);
    EXPECT_EQ(t.sent_layout, nullptr);
  }
}

TEST(HelloSlotsTest, ASpawnedWorkerMayOfferItsFlagsAndARemoteOneWhatAWorkerCan) {
  WorkerSpec local;
  local.segment = "ckpt-1-w0";
  local.device.slots = 4;
  local.device.fusion_width = 8;
  EXPECT_EQ(local.MaxHelloSlots(), 32);
  local.device.slots = 256;
  local.device.fusion_width = 1024;
  EXPECT_EQ(local.MaxHelloSlots(), kMaxHelloSlots);
  WorkerSpec remote;  // no segment: connected over TCP
  EXPECT_EQ(remote.MaxHelloSlots(), int64_t{256} * 1024);
}

}  // namespace
}  // namespace ckpt::scheduler
