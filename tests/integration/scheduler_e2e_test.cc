// PBT semantics end to end: real `ckpt-scheduler run` and `ckpt-worker`
// processes, a real store, Fashion-MNIST. What the experiment unit tests
// prove on the logic alone is checked here on what the worker actually
// trained (the metadata of the committed blobs) and on the store a run leaves.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckpt/format/checkpoint.h"
#include "ckpt/records/member_record.h"
#include "ckpt/store/store.h"
#include "process_util.h"

namespace ckpt {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using testing::Child;

struct Spec {
  std::string name = "e2e";
  std::string policy = "kind = \"pbt\"\nmode = \"sync\"\nquantile = 0.34\n";
  int population = 6;
  int intervals = 3;
  int steps = 6;
  std::string model = "spec = \"lenet5\"\n";
  std::string space =
      "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.2\n"
      "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.95\n";
  std::string population_extra;
  std::string extra;  // more tables ([hparams], [supervision])
  int workers = 1;
};

std::string Toml(const Spec& s) {
  std::ostringstream os;
  os << "name = \"" << s.name << "\"\nseed = 5\n"
     << "[model]\n"
     << s.model << "optimizer = \"sgd\"\n"
     << "[data]\nbatch_size = 16\neval_size = 200\n"
     << "[population]\nsize = " << s.population << "\nsteps_per_interval = " << s.steps
     << "\nintervals = " << s.intervals << "\n"
     << s.population_extra << s.space << "[policy]\n"
     << s.policy << s.extra << "[[devices]]\ndevice = \"cpu\"\ncount = " << s.workers
     << "\nslots = 2\nfusion = \"plain\"\nintra_op_threads = 1\n";
  return os.str();
}

class SchedulerE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("e2e");
    ASSERT_FALSE(dir_.empty());
    scheduler_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string Write(const std::string& file, const std::string& text) {
    const std::string path = dir_ + "/" + file;
    std::ofstream(path) << text;
    return path;
  }

  std::vector<std::string> Args(const std::string& config, const std::string& store) {
    return {scheduler_, "run",        config, "--store", store, "--quiet", "--restart-backoff-ms",
            "100",      "--grace-ms", "5000"};
  }

  // Runs to the end; returns the exit code, the output in `log`.
  int Run(const std::string& config, const std::string& store, std::string* log,
          const std::vector<std::string>& extra = {}) {
    auto args = Args(config, store);
    args.insert(args.end(), extra.begin(), extra.end());
    Child c(args, dir_ + "/run-" + std::to_string(runs_++) + ".log");
    if (!c.WaitFor(milliseconds(300000))) {
      ADD_FAILURE() << "the scheduler did not finish in 300 s:\n" << c.Log();
      return -1;
    }
    *log = c.Log();
    const int st = c.Wait();
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  store::Store& Open(const std::string& path) {
    store_.reset();
    store::StoreOptions o;
    o.path = path;
    o.create_if_missing = false;
    auto s = store::Store::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    return *store_;
  }

  std::vector<json> Events(store::Store& s, const std::string& exp, const std::string& type) {
    auto ev = s.ListEvents(exp, 0, 1 << 20);
    EXPECT_TRUE(ev.ok());
    std::vector<json> out;
    for (const auto& e : *ev) {
      json j = json::parse(e.json);
      if (j.value("type", "") == type) out.push_back(j);
    }
    return out;
  }

  json State(store::Store& s, const std::string& exp, const std::string& member) {
    auto h = s.GetMember(exp, member);
    EXPECT_TRUE(h.ok());
    return json::parse(h->state);
  }

  std::string dir_;
  std::string scheduler_;
  int runs_ = 0;
  std::unique_ptr<store::Store> store_;
};

// The hyperparameters an exploit chose are the ones the recipient's next
// interval was trained with, as the worker wrote them into the blob; and the
// [hparams] constants reach every trained blob.
TEST_F(SchedulerE2eTest, NextIntervalTrainsWithTheExploitsHparamsAndTheConstants) {
  Spec spec;
  spec.extra = "[hparams]\nweight_decay = 0.0005\n";
  std::string log;
  ASSERT_EQ(Run(Write("e.toml", Toml(spec)), dir_ + "/store", &log), 0) << log;
  store::Store& s = Open(dir_ + "/store");
  const auto exploits = Events(s, "e2e", "exploit");
  ASSERT_FALSE(exploits.empty());
  int checked = 0, blobs = 0;
  for (const auto& ev : exploits) {
    const std::string member = ev["member"];
    auto versions = s.ListVersions("e2e", member);
    ASSERT_TRUE(versions.ok());
    for (size_t i = 0; i < versions->size(); ++i) {
      const auto& v = (*versions)[i];
      if (v.reason != store::kReasonExploit ||
          v.hparams != ev["hparams"].get<std::map<std::string, double>>()) {
        continue;
      }
      // The trained version whose parent is this exploit.
      for (const auto& t : *versions) {
        if (t.reason != store::kReasonTrained || !t.parent || t.parent->version != v.version ||
            !t.holds_blob) {
          continue;
        }
        auto blob = s.ReadBlob(t.blob);
        ASSERT_TRUE(blob.ok()) << blob.status().ToString();
        auto parsed = format::ParseCheckpoint(blob->data(), blob->size());
        ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
        // The worker records every value it trained with: the exploit's, plus
        // its defaults for any the experiment does not set (nesterov, ...).
        const auto& trained = parsed->meta().hparams;
        for (const auto& [k, value] : v.hparams) {
          ASSERT_TRUE(trained.count(k)) << member << " v" << t.version << " lacks " << k;
          EXPECT_EQ(trained.at(k), value) << member << " v" << t.version << " " << k;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0) << "no exploit's next interval kept its blob";
  // Every trained blob still held carries the constant.
  auto members = s.ListMembers("e2e");
  ASSERT_TRUE(members.ok());
  for (const auto& m : *members) {
    auto versions = s.ListVersions("e2e", m.member);
    for (const auto& v : *versions) {
      if (v.reason != store::kReasonTrained || !v.holds_blob) continue;
      auto blob = s.ReadBlob(v.blob);
      ASSERT_TRUE(blob.ok());
      auto parsed = format::ParseCheckpoint(blob->data(), blob->size());
      ASSERT_TRUE(parsed.ok());
      ASSERT_TRUE(parsed->meta().hparams.count("weight_decay")) << m.member;
      EXPECT_DOUBLE_EQ(parsed->meta().hparams.at("weight_decay"), 0.0005);
      ++blobs;
    }
  }
  EXPECT_GE(blobs, 6);
}

// `run --summary-json` writes the final summary programs read (ckpt-bench
// seed): every member once, best first, each with the score and version the
// store holds for it.
TEST_F(SchedulerE2eTest, SummaryJsonListsEveryMemberBestFirstAsTheStoreHoldsThem) {
  Spec spec;
  spec.population = 4;
  spec.intervals = 2;
  spec.steps = 4;
  const std::string path = dir_ + "/summary.json";
  std::string log;
  ASSERT_EQ(Run(Write("e.toml", Toml(spec)), dir_ + "/store", &log, {"--summary-json", path}), 0)
      << log;
  std::ifstream in(path);
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << path << " is not JSON";
  EXPECT_EQ(j["status"], "done");
  EXPECT_EQ(j["population"], 4);
  ASSERT_TRUE(j["members"].is_array());
  ASSERT_EQ(j["members"].size(), 4u) << j.dump();
  store::Store& s = Open(dir_ + "/store");
  std::set<std::string> seen;
  double previous = 2.0;
  for (const auto& m : j["members"]) {
    const std::string member = m["member"];
    EXPECT_TRUE(seen.insert(member).second) << member << " listed twice";
    const double val_score = m["val_score"];
    EXPECT_LE(val_score, previous) << member << " is listed after a worse member";
    previous = val_score;
    auto head = s.GetMember("e2e", member);
    ASSERT_TRUE(head.ok()) << member << ": " << head.status().ToString();
    auto record = records::DecodeMemberRecord(head->state, "e2e", member);
    ASSERT_TRUE(record.ok()) << record.status().ToString();
    EXPECT_DOUBLE_EQ(val_score, record->score) << member;
    EXPECT_EQ(m["version"], head->version) << member;
    EXPECT_EQ(m["intervals_done"], spec.intervals) << member;
  }
  EXPECT_DOUBLE_EQ(j["best_val_score"].get<double>(),
                   j["members"].front()["val_score"].get<double>());
  EXPECT_EQ(j["metric"], "accuracy");
}

// Async PBT end to end, with the scheduler SIGKILLed after a commit and run
// again: exploits happen, nothing committed is lost, every member ends at its
// last interval.
TEST_F(SchedulerE2eTest, AsyncPbtCompletesWithExploitsAndSurvivesSigkill) {
  Spec spec;
  spec.name = "async";
  spec.policy = "kind = \"pbt\"\nmode = \"async\"\nquantile = 0.34\n";
  spec.intervals = 4;
  const std::string config = Write("a.toml", Toml(spec));
  const std::string store_path = dir_ + "/store";
  std::string log;
  setenv("CKPT_KILL_AT", "scheduler.committed:9", 1);
  const int killed = Run(config, store_path, &log);
  unsetenv("CKPT_KILL_AT");
  ASSERT_EQ(killed, 128 + SIGKILL) << log;
  std::map<std::string, int64_t> heads;
  {
    store::Store& s = Open(store_path);
    auto members = s.ListMembers("async");
    ASSERT_TRUE(members.ok());
    for (const auto& m : *members) heads[m.member] = m.version;
    store_.reset();
  }
  ASSERT_EQ(Run(config, store_path, &log), 0) << log;
  store::Store& s = Open(store_path);
  EXPECT_FALSE(Events(s, "async", "exploit").empty());
  // Nothing committed before the kill was lost or trained again: the event
  // log (which retention never trims) has each member's intervals 1..4
  // committed exactly once over both runs, and heads only moved forward.
  std::map<std::pair<std::string, int>, int> trained;
  for (const auto& ev : Events(s, "async", "trained")) {
    trained[{ev["member"].get<std::string>(), ev["interval"].get<int>()}]++;
  }
  for (int i = 0; i < 6; ++i) {
    const std::string m = "m00" + std::to_string(i);
    for (int iv = 1; iv <= 4; ++iv) {
      EXPECT_EQ((trained[{m, iv}]), 1) << m << " interval " << iv;
    }
  }
  for (const auto& [member, version] : heads) {
    EXPECT_GE(s.GetMember("async", member)->version, version) << member;
  }
  auto members = s.ListMembers("async");
  ASSERT_TRUE(members.ok());
  for (const auto& m : *members) {
    const json st = json::parse(m.state);
    EXPECT_EQ(st.value("interval", -1), 4) << m.member << " " << m.state;
    EXPECT_EQ(st.value("status", ""), "done") << m.member;
  }
  auto report = s.Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
  EXPECT_EQ(s.GetExperiment("async")->status, "done");
}

// Successive halving, synchronous: at rung 1 the top third by score goes on
// and the rest is stopped; the kept ones finish.
TEST_F(SchedulerE2eTest, SuccessiveHalvingStopsAllButTheTopThirdAtTheRung) {
  Spec spec;
  spec.name = "sh";
  spec.policy = "kind = \"successive_halving\"\nmode = \"sync\"\neta = 3\nmin_intervals = 1\n";
  spec.intervals = 2;
  std::string log;
  ASSERT_EQ(Run(Write("sh.toml", Toml(spec)), dir_ + "/store", &log), 0) << log;
  store::Store& s = Open(dir_ + "/store");
  // Scores at interval 1, from the trained manifests.
  std::vector<std::pair<double, std::string>> rung;
  auto members = s.ListMembers("sh");
  ASSERT_TRUE(members.ok());
  for (const auto& m : *members) {
    auto versions = s.ListVersions("sh", m.member);
    for (const auto& v : *versions) {
      if (v.reason == store::kReasonTrained && v.metrics.at("interval") == 1) {
        rung.push_back({v.score(), m.member});
      }
    }
  }
  ASSERT_EQ(rung.size(), 6u);
  std::sort(rung.begin(), rung.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::set<std::string> stopped;
  for (const auto& ev : Events(s, "sh", "member_stopped")) stopped.insert(ev["member"]);
  std::set<std::string> expected;
  for (size_t i = 2; i < rung.size(); ++i) expected.insert(rung[i].second);
  EXPECT_EQ(stopped, expected);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(State(s, "sh", rung[i].second).value("interval", -1), 2) << rung[i].second;
  }
  for (const auto& m : expected) {
    const json st = State(s, "sh", m);
    EXPECT_EQ(st.value("status", ""), "stopped") << m;
    EXPECT_EQ(st.value("interval", -1), 1) << m;
  }
}

// Async successive halving (ASHA): members are stopped as they reach the rung
// below the cut of those that reached it so far; the run completes.
TEST_F(SchedulerE2eTest, AsyncSuccessiveHalvingStopsMembersAndCompletes) {
  Spec spec;
  spec.name = "asha";
  spec.policy = "kind = \"successive_halving\"\nmode = \"async\"\neta = 2\nmin_intervals = 1\n";
  spec.intervals = 2;
  std::string log;
  ASSERT_EQ(Run(Write("asha.toml", Toml(spec)), dir_ + "/store", &log), 0) << log;
  store::Store& s = Open(dir_ + "/store");
  const auto stopped = Events(s, "asha", "member_stopped");
  EXPECT_FALSE(stopped.empty());
  EXPECT_LT(stopped.size(), 6u);
  std::set<std::string> names;
  for (const auto& ev : stopped) names.insert(ev["member"]);
  auto members = s.ListMembers("asha");
  for (const auto& m : *members) {
    const json st = json::parse(m.state);
    if (names.count(m.member)) {
      EXPECT_EQ(st.value("status", ""), "stopped");
      EXPECT_EQ(st.value("interval", -1), 1);
    } else {
      EXPECT_EQ(st.value("interval", -1), 2) << m.member;
    }
  }
  EXPECT_EQ(s.GetExperiment("asha")->status, "done");
}

// A member whose training diverges fails, is retried, and is stopped after
// max_member_failures; the others finish.
TEST_F(SchedulerE2eTest, FailingMemberIsRetriedThenStoppedAndTheRunGoesOn) {
  Spec spec;
  spec.name = "fail";
  spec.policy = "kind = \"random\"\nmode = \"sync\"\n";
  spec.population = 4;
  spec.intervals = 2;
  // lr 1e30 makes the loss non-finite at once.
  spec.space = "[search_space.lr]\ntype = \"choice\"\nvalues = [0.05, 1e30]\n";
  spec.extra = "[supervision]\nmax_member_failures = 2\n";
  std::string log;
  ASSERT_EQ(Run(Write("f.toml", Toml(spec)), dir_ + "/store", &log), 0) << log;
  store::Store& s = Open(dir_ + "/store");
  auto members = s.ListMembers("fail");
  ASSERT_TRUE(members.ok());
  int failed = 0, done = 0;
  for (const auto& m : *members) {
    const json st = json::parse(m.state);
    if (m.hparams.at("lr") > 1) {
      ++failed;
      EXPECT_EQ(st.value("status", ""), "failed") << m.member;
      EXPECT_EQ(st.value("failures", 0), 2) << m.member;
      EXPECT_EQ(m.version, 0) << m.member << " has no good version";
    } else {
      ++done;
      EXPECT_EQ(st.value("interval", -1), 2) << m.member;
    }
  }
  ASSERT_GT(failed, 0) << "seed 5 gave no diverging member";
  ASSERT_GT(done, 0) << "seed 5 gave no healthy member";
  EXPECT_EQ(Events(s, "fail", "failed").size(), static_cast<size_t>(2 * failed));
  EXPECT_EQ(s.GetExperiment("fail")->status, "done");
}

// A worker that dies at once is restarted max_restarts times, then given up
// on; the run says so and exits non-zero.
TEST_F(SchedulerE2eTest, WorkerThatKeepsDyingIsGivenUpAndTheRunSaysSo) {
  Spec spec;
  spec.name = "dies";
  spec.extra = "[supervision]\nmax_restarts = 2\nrestart_backoff_s = 0.05\n";
  std::string log;
  const int rc =
      Run(Write("d.toml", Toml(spec)), dir_ + "/store", &log, {"--worker", "/bin/false"});
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("giving up on worker 0 (cpu) after 2 restarts"), std::string::npos) << log;
  EXPECT_NE(log.find("every worker was given up on"), std::string::npos) << log;
  store::Store& s = Open(dir_ + "/store");
  const auto lost = Events(s, "dies", "worker_lost");
  EXPECT_EQ(lost.size(), 3u);  // the first start and two restarts
  EXPECT_TRUE(lost.back().value("given_up", false));
}

// A worker binary that is not there is refused before anything starts: exit
// 2, the message names the path, no store is created (it used to be restarted
// with back-off until max_restarts, an hour with the defaults).
TEST_F(SchedulerE2eTest, MissingWorkerBinaryIsRefusedBeforeAnythingStarts) {
  Spec spec;
  spec.name = "noworker";
  std::string log;
  EXPECT_EQ(Run(Write("n.toml", Toml(spec)), dir_ + "/store", &log,
                {"--worker", dir_ + "/missing/ckpt-worker"}),
            2)
      << log;
  EXPECT_NE(log.find(dir_ + "/missing/ckpt-worker does not exist"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/store"));
}

TEST_F(SchedulerE2eTest, TargetMetricEndsTheExperimentEarly) {
  Spec spec;
  spec.name = "target";
  spec.intervals = 50;
  spec.steps = 20;
  spec.population = 2;
  spec.space = "[search_space.lr]\ntype = \"choice\"\nvalues = [0.05]\n";
  spec.population_extra = "target_metric = 0.2\n";
  std::string log;
  ASSERT_EQ(Run(Write("t.toml", Toml(spec)), dir_ + "/store", &log), 0) << log;
  store::Store& s = Open(dir_ + "/store");
  ASSERT_EQ(Events(s, "target", "target_reached").size(), 1u);
  EXPECT_EQ(s.GetExperiment("target")->status, "done");
  auto members = s.ListMembers("target");
  for (const auto& m : *members) {
    EXPECT_LT(json::parse(m.state).value("interval", 99), 50) << m.member;
  }
}

TEST_F(SchedulerE2eTest, MaxWallTimeEndsTheExperiment) {
  Spec spec;
  spec.name = "wall";
  spec.intervals = 100000;
  spec.population = 2;
  spec.population_extra = "max_wall_s = 2\n";
  std::string log;
  ASSERT_EQ(Run(Write("w.toml", Toml(spec)), dir_ + "/store", &log), 0) << log;
  store::Store& s = Open(dir_ + "/store");
  EXPECT_EQ(Events(s, "wall", "wall_time_reached").size(), 1u);
  EXPECT_EQ(s.GetExperiment("wall")->status, "done");
}

// A model file that cannot be read is refused before anything starts: exit
// 2, the message names model.spec and the path, no store is created.
TEST_F(SchedulerE2eTest, UnreadableModelFileIsRefusedBeforeAnythingStarts) {
  Spec spec;
  spec.model = "spec = \"torchscript:" + dir_ + "/missing.pt\"\n";
  std::string log;
  EXPECT_EQ(Run(Write("m.toml", Toml(spec)), dir_ + "/store", &log), 2) << log;
  EXPECT_NE(log.find("model.spec"), std::string::npos) << log;
  EXPECT_NE(log.find(dir_ + "/missing.pt"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/store"));
  std::ofstream(dir_ + "/text.pt") << "not a zip archive";
  spec.model = "spec = \"torchscript:" + dir_ + "/text.pt\"\n";
  EXPECT_EQ(Run(Write("m2.toml", Toml(spec)), dir_ + "/store", &log), 2) << log;
  EXPECT_NE(log.find("is not a TorchScript archive"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/store"));
}

// A file that passes the early check but that the worker cannot load: the
// worker refuses CONFIGURE and the experiment ends at once as failed, with
// the worker's reason, not member by member.
TEST_F(SchedulerE2eTest, RefusedConfigureFailsTheExperimentAtOnce) {
  std::ofstream(dir_ + "/broken.pt", std::ios::binary)
      << std::string("PK\x03\x04", 4) << "truncated archive";
  Spec spec;
  spec.name = "refused";
  spec.model = "spec = \"torchscript:" + dir_ + "/broken.pt\"\n";
  std::string log;
  EXPECT_EQ(Run(Write("r.toml", Toml(spec)), dir_ + "/store", &log), 1) << log;
  EXPECT_NE(log.find("refused the experiment"), std::string::npos) << log;
  EXPECT_NE(log.find("experiment refused failed"), std::string::npos) << log;
  store::Store& s = Open(dir_ + "/store");
  EXPECT_EQ(s.GetExperiment("refused")->status, "failed");
  EXPECT_EQ(Events(s, "refused", "configure_refused").size(), 1u);
  EXPECT_TRUE(Events(s, "refused", "failed").empty()) << "members failed one by one";
}

}  // namespace
}  // namespace ckpt
