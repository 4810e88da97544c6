// The service's counters are values, not only presence: a real `ckpt-scheduler
// serve` (real workers, store and Fashion-MNIST) is SIGKILLed by its own kill
// point in the middle of an experiment and started again; it resumes the
// experiment, and once it is done what its /metrics counts (samples trained,
// exploits, member failures by reason) must equal what the store's event log
// holds for the events that process wrote: nothing from before the restart
// counted again, nothing of its own left out.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../integration/process_util.h"
#include "ckpt/ipc/failure_code.h"
#include "ckpt/records/events.h"
#include "ckpt/scheduler/control_client.h"
#include "ckpt/store/store.h"
#include "control_test_util.h"
#include "exposition.h"
#include "http_get.h"

extern char** environ;

namespace ckpt {
namespace {

using std::chrono::milliseconds;
using testing::Child;
using testing::ChildrenOf;

constexpr int kPopulation = 4;
constexpr int kIntervals = 6;
constexpr int kSteps = 4;
constexpr int kBatch = 16;

// What the event log says happened, from event `after_seq` on.
struct Logged {
  int64_t trained = 0;
  int64_t exploits = 0;
  std::map<ipc::FailureCode, int64_t> failures;
  uint64_t last_seq = 0;
};

Logged ReadLog(const std::string& store_path, const std::string& exp, uint64_t after_seq) {
  Logged out;
  store::StoreOptions o;
  o.path = store_path;
  auto store = store::Store::OpenReadOnly(o);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return out;
  auto events = (*store)->ListEvents(exp, after_seq + 1, size_t{1} << 20);
  EXPECT_TRUE(events.ok()) << events.status().ToString();
  if (!events.ok()) return out;
  out.last_seq = after_seq;
  for (const auto& e : *events) {
    out.last_seq = e.seq;
    auto decoded = records::DecodeEvent(e.json, exp + " event " + std::to_string(e.seq));
    EXPECT_TRUE(decoded.ok()) << e.json;
    if (!decoded.ok()) continue;
    if (std::holds_alternative<records::TrainedEvent>(*decoded)) ++out.trained;
    if (std::holds_alternative<records::ExploitEvent>(*decoded)) ++out.exploits;
    if (const auto* f = std::get_if<records::FailedEvent>(&*decoded)) ++out.failures[f->code];
  }
  return out;
}

double Value(const testing::Exposition& e, const std::string& family,
             const testing::LabelSet& labels) {
  auto it = e.find(family);
  if (it == e.end()) return 0;  // a counter never incremented has no series
  const testing::ExpositionSample* s = it->second.Find(family, labels);
  return s != nullptr ? s->value : 0;
}

// The service's configuration: its store and runtime directory under `dir`,
// metrics on 127.0.0.1:`port`, one CPU device of 2 slots.
std::string ServiceToml(const std::string& dir, const std::string& store, int port) {
  std::ostringstream config;
  config << "store = \"" << store << "\"\nruntime_directory = \"" << dir << "/run\"\n"
         << "metrics = \"127.0.0.1:" << port << "\"\ngrace_s = 5\nlog_progress = false\n"
         << "[workers]\nrestart_backoff_s = 0.1\nmax_member_failures = 40\n"
         << "[[devices]]\ndevice = \"cpu\"\nslots = 2\nfusion = \"plain\"\nintra_op_threads = 1\n";
  return config.str();
}

// Sync PBT: a quarter of the population exploits at every generation. The
// learning rates reach 1e5: with this seed one member's diverges at once
// (non_finite), and it is retried from its head until max_member_failures
// (40) in a row stop it. The first generation waits for it, so the kill
// after the third commit lands among its failures, and most of them come
// from the second process.
std::string ExperimentToml() {
  std::ostringstream exp;
  exp << "name = \"vals\"\nseed = 21\n[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
      << "[data]\nbatch_size = " << kBatch << "\neval_size = 200\n"
      << "[population]\nsize = " << kPopulation << "\nsteps_per_interval = " << kSteps
      << "\nintervals = " << kIntervals << "\n"
      << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 100000.0\n"
      << "[policy]\nkind = \"pbt\"\nmode = \"sync\"\nquantile = 0.25\n";
  return exp.str();
}

int64_t FailureCount(const Logged& l) {
  int64_t n = 0;
  for (const auto& [code, k] : l.failures) n += k;
  return n;
}

// Runs the first `serve` of `service_toml` (the config's runtime directory
// under `dir`), submits `experiment` through `socket`, and waits for it to
// SIGKILL itself after its 3rd commit (and state record).
void RunFirstServeToItsKillPoint(const std::string& binary, const std::string& dir,
                                 const std::string& socket, const std::string& experiment) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back("CKPT_KILL_AT=scheduler.committed:3");
  Child first({binary, "serve", "--config", dir + "/service.toml"}, dir + "/serve-1.log", env);
  auto client =
      testing::ConnectWhenUp(socket, milliseconds(120000), [&first] { return first.Running(); });
  ASSERT_NE(client, nullptr) << first.Log();
  auto submitted = client->Submit(experiment, "serve_metrics_test");
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  ASSERT_TRUE(first.WaitFor(milliseconds(240000))) << "the kill point was not reached\n"
                                                   << first.Log();
  const int st = first.Wait();
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << first.Log();
}

// Whether experiment "vals" stops running within 4 minutes.
bool WaitUntilNotRunning(scheduler::ControlClient* client) {
  bool done = false;
  for (int i = 0; i < 2400 && !done; ++i) {
    auto s = client->ExperimentStatus("vals");
    done = s.ok() && s->status != records::ExperimentStatus::kRunning;
    if (!done) std::this_thread::sleep_for(milliseconds(100));
  }
  return done;
}

// The counters of exposition `e` are the events `after` read from the log.
void ExpectCountersEqualTheLog(const testing::Exposition& e, const Logged& after) {
  EXPECT_EQ(Value(e, "ckpt_trained_samples_total", {{"experiment", "vals"}, {"device", "cpu"}}),
            static_cast<double>(after.trained * kSteps * kBatch));
  EXPECT_EQ(Value(e, "ckpt_exploits_total", {{"experiment", "vals"}}),
            static_cast<double>(after.exploits));
  for (int c = 0; c < ipc::kMemberFailureCodeCount; ++c) {
    const auto code = static_cast<ipc::FailureCode>(c);
    const auto it = after.failures.find(code);
    EXPECT_EQ(Value(e, "ckpt_member_failures_total",
                    {{"experiment", "vals"}, {"reason", ipc::FailureCodeName(code)}}),
              static_cast<double>(it == after.failures.end() ? 0 : it->second))
        << ipc::FailureCodeName(code);
  }
}

TEST(ServeMetricsTest, CountersEqualTheEventLogAcrossARestart) {
  const std::string dir = testing::TempDir("serve-metrics");
  ASSERT_FALSE(dir.empty());
  const std::string binary = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
  const std::string socket = dir + "/run/control.sock";
  const std::string store = dir + "/store";
  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  std::ofstream(dir + "/service.toml") << ServiceToml(dir, store, port);

  // First process: SIGKILLs itself after its 3rd commit (and state record).
  RunFirstServeToItsKillPoint(binary, dir, socket, ExperimentToml());
  if (HasFatalFailure()) return;
  const Logged before = ReadLog(store, "vals", 0);
  ASSERT_GE(before.trained, 3);

  // Second process: resumes the experiment and runs it to the end.
  Child second({binary, "serve", "--config", dir + "/service.toml"}, dir + "/serve-2.log");
  auto client =
      testing::ConnectWhenUp(socket, milliseconds(120000), [&second] { return second.Running(); });
  ASSERT_NE(client, nullptr) << second.Log();
  ASSERT_TRUE(WaitUntilNotRunning(client.get())) << second.Log();
  auto ended = client->ExperimentStatus("vals");
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->status, records::ExperimentStatus::kDone) << second.Log();
  auto page = testing::HttpGet("127.0.0.1", port, "/metrics");
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  auto e = testing::ParseExposition(page->body);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const Logged after = ReadLog(store, "vals", before.last_seq);

  // The second process's counters are the events it wrote.
  ExpectCountersEqualTheLog(*e, after);
  // And the two processes together trained each member-interval once: a
  // commit acknowledged before the kill is not trained again.
  std::printf(
      "before the kill: %lld trained, %lld exploits, %lld failed; after: %lld trained, %lld "
      "exploits, %lld failed\n",
      static_cast<long long>(before.trained), static_cast<long long>(before.exploits),
      static_cast<long long>(FailureCount(before)), static_cast<long long>(after.trained),
      static_cast<long long>(after.exploits), static_cast<long long>(FailureCount(after)));
  EXPECT_GT(after.trained, 0);
  EXPECT_GT(after.exploits, 0);
  EXPECT_GT(FailureCount(after), 0)
      << "no member failed after the restart: the failure counter was not "
         "compared with anything";
  // Failures in a row are counted across the restart (the member record
  // keeps them): the diverging member is stopped after 40 in all.
  EXPECT_EQ(FailureCount(before) + FailureCount(after), 40);

  client.reset();
  kill(second.pid(), SIGTERM);
  EXPECT_TRUE(second.WaitFor(milliseconds(60000))) << second.Log();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckpt
