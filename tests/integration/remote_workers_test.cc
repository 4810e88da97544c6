// Workers over TCP, as whole processes: a real `ckpt-scheduler run` that
// spawns no local workers and listens on loopback, and `ckpt-worker --connect`
// processes started by the test. The run ends with the same heads as the same
// experiment over shared memory; a worker with the wrong secret is refused and
// logged while the run goes on; killing a connected worker loses nothing
// committed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "ckpt/ipc/sha256.h"
#include "ckpt/store/store.h"
#include "process_util.h"
#include "run_heads.h"

namespace ckpt {
namespace {

using std::chrono::milliseconds;
using testing::Child;
using testing::Head;
using testing::ResultsLogged;

std::string Config(const std::string& name, int local_workers, int intervals,
                   const std::string& workers_table) {
  std::ostringstream os;
  os << "name = \"" << name << "\"\nseed = 99\n"
     << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
     << "[data]\nbatch_size = 16\neval_size = 200\n"
     << "[population]\nsize = 6\nsteps_per_interval = 6\nintervals = " << intervals << "\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.2\n"
     << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.95\n"
     << "[policy]\nkind = \"pbt\"\nmode = \"sync\"\nquantile = 0.34\nready_intervals = 1\n"
     << "[[devices]]\ndevice = \"cpu\"\ncount = " << local_workers
     << "\nslots = 2\nfusion = \"plain\"\nintra_op_threads = 1\n"
     << workers_table;
  return os.str();
}

class RemoteWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("remote");
    ASSERT_FALSE(dir_.empty());
    scheduler_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
    worker_ = (std::filesystem::path(scheduler_).parent_path() / "ckpt-worker").string();
    secret_ = dir_ + "/secret";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& file, const std::string& text) {
    std::string path = dir_ + "/" + file;
    std::ofstream(path) << text;
    return path;
  }

  // The scheduler's arguments; CKPT_TRACE=1 logs a line per result received.
  std::vector<std::string> RunArgs(const std::string& config, const std::string& store) {
    return {"/usr/bin/env", "CKPT_TRACE=1", scheduler_, "run",        config,
            "--store",      store,          "--quiet",  "--grace-ms", "5000"};
  }

  std::string TcpTable() const {
    return "[workers]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"" + secret_ +
           "\"\nlocal = false\n";
  }

  // Waits for the address the scheduler writes once it listens.
  std::string WaitForAddress(const std::string& store, Child& scheduler) {
    const std::string path = store + "/workers.addr";
    const auto until = std::chrono::steady_clock::now() + milliseconds(60000);
    while (std::chrono::steady_clock::now() < until && scheduler.Running()) {
      std::ifstream in(path);
      std::string addr;
      if (in >> addr && !addr.empty()) return addr;
      std::this_thread::sleep_for(milliseconds(20));
    }
    ADD_FAILURE() << "no " << path << "\n" << scheduler.Log();
    return "";
  }

  std::unique_ptr<Child> StartWorker(const std::string& addr, const std::string& secret,
                                     const std::string& log) {
    return std::make_unique<Child>(
        std::vector<std::string>{worker_, "--connect", addr, "--secret-file", secret, "--device",
                                 "cpu", "--slots", "2", "--fusion", "plain", "--intra-op-threads",
                                 "1", "--connect-timeout-s", "30"},
        dir_ + "/" + log);
  }

  std::map<std::string, Head> Heads(const std::string& store_path, const std::string& exp) {
    return testing::ReadHeads(store_path, exp, /*verify=*/false);
  }

  int CountEvents(const std::string& store_path, const std::string& exp, const std::string& type) {
    store::StoreOptions o;
    o.path = store_path;
    auto s = store::Store::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return -1;
    auto events = (*s)->ListEvents(exp, 0, 100000);
    EXPECT_TRUE(events.ok());
    int n = 0;
    for (const auto& e : *events) {
      if (e.json.find("\"type\":\"" + type + "\"") != std::string::npos) ++n;
    }
    return n;
  }

  // The same experiment over shared memory with two local workers.
  std::map<std::string, Head> CalmHeads(const std::string& name, int intervals) {
    const std::string config = Write(name + "-shm.toml", Config(name, 2, intervals, ""));
    Child c(RunArgs(config, dir_ + "/shm"), dir_ + "/shm.log");
    EXPECT_TRUE(c.WaitFor(milliseconds(300000))) << c.Log();
    const int st = c.Wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c.Log();
    return Heads(dir_ + "/shm", name);
  }

  std::string dir_;
  std::string scheduler_;
  std::string worker_;
  std::string secret_;
};

TEST_F(RemoteWorkersTest, ConnectedWorkersEndAsSharedMemoryAndAWrongSecretIsRefused) {
  const auto calm = CalmHeads("rw", 4);
  ASSERT_EQ(calm.size(), 6u);

  const std::string config = Write("rw-tcp.toml", Config("rw", 1, 4, TcpTable()));
  const std::string store = dir_ + "/tcp";
  Child sched(RunArgs(config, store), dir_ + "/tcp.log");
  const std::string addr = WaitForAddress(store, sched);
  ASSERT_FALSE(addr.empty());
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
  // The scheduler made the secret, private to this user.
  struct stat st {};
  ASSERT_EQ(stat(secret_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(sched.Log().find("listening for workers on " + addr), std::string::npos) << sched.Log();

  auto w1 = StartWorker(addr, secret_, "w1.log");
  auto w2 = StartWorker(addr, secret_, "w2.log");
  // A worker holding another secret is turned away; the run goes on.
  const std::string wrong = Write("wrong-secret", std::string(64, 'x') + "\n");
  ASSERT_EQ(chmod(wrong.c_str(), 0600), 0);
  auto intruder = StartWorker(addr, wrong, "intruder.log");
  // local = false: the scheduler spawned no worker of its own.
  EXPECT_TRUE(testing::ChildrenOf(sched.pid()).empty());
  ASSERT_TRUE(intruder->WaitFor(milliseconds(60000))) << intruder->Log();
  const int ist = intruder->Wait();
  EXPECT_TRUE(WIFEXITED(ist) && WEXITSTATUS(ist) == 1) << intruder->Log();
  EXPECT_NE(intruder->Log().find("is the secret file the scheduler's"), std::string::npos)
      << intruder->Log();

  ASSERT_TRUE(sched.WaitFor(milliseconds(300000))) << sched.Log();
  const int sst = sched.Wait();
  ASSERT_TRUE(WIFEXITED(sst) && WEXITSTATUS(sst) == 0) << sched.Log();
  EXPECT_NE(sched.Log().find("refused a worker connection from 127.0.0.1:"), std::string::npos)
      << sched.Log();
  EXPECT_GT(ResultsLogged(sched), 0);
  // A worker exits 0 after the scheduler's SHUTDOWN. On a busy host one may
  // still be loading when the other has trained everything: it then finds no
  // scheduler and exits 3 (Unavailable), as documented. At least one trained.
  int shut_down = 0;
  for (auto* w : {w1.get(), w2.get()}) {
    ASSERT_TRUE(w->WaitFor(milliseconds(60000))) << w->Log();
    const int wst = w->Wait();
    ASSERT_TRUE(WIFEXITED(wst)) << w->Log();
    if (WEXITSTATUS(wst) == 0) {
      ++shut_down;
    } else {
      EXPECT_EQ(WEXITSTATUS(wst), 3) << w->Log();
      EXPECT_NE(w->Log().find("Unavailable"), std::string::npos) << w->Log();
    }
  }
  EXPECT_GE(shut_down, 1);
  EXPECT_NE(sched.Log().find("(r0) connected from 127.0.0.1:"), std::string::npos) << sched.Log();
  const auto remote = Heads(store, "rw");
  ASSERT_EQ(remote.size(), 6u);
  EXPECT_TRUE(calm == remote);
}

TEST_F(RemoteWorkersTest, KillingAConnectedWorkerLosesNothingCommitted) {
  const auto calm = CalmHeads("kr", 6);
  ASSERT_EQ(calm.size(), 6u);

  const std::string config = Write("kr-tcp.toml", Config("kr", 1, 6, TcpTable()));
  const std::string store = dir_ + "/tcp";
  Child sched(RunArgs(config, store), dir_ + "/tcp.log");
  const std::string addr = WaitForAddress(store, sched);
  ASSERT_FALSE(addr.empty());
  auto w1 = StartWorker(addr, secret_, "w1.log");
  auto w2 = StartWorker(addr, secret_, "w2.log");
  // Kill one worker once both are connected and the run is under way (paced
  // by the scheduler's log, not by time: on a busy host one worker may still
  // be loading when the other has results).
  const auto until = std::chrono::steady_clock::now() + milliseconds(120000);
  while ((ResultsLogged(sched) < 4 || sched.Log().find("(r1) connected") == std::string::npos) &&
         sched.Running() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_NE(sched.Log().find("(r1) connected"), std::string::npos) << sched.Log();
  ASSERT_TRUE(sched.Running()) << "the run ended before the kill; make it longer\n" << sched.Log();
  kill(w1->pid(), SIGKILL);
  w1->Wait();

  ASSERT_TRUE(sched.WaitFor(milliseconds(300000))) << sched.Log();
  const int sst = sched.Wait();
  ASSERT_TRUE(WIFEXITED(sst) && WEXITSTATUS(sst) == 0) << sched.Log();
  ASSERT_TRUE(w2->WaitFor(milliseconds(30000))) << w2->Log();
  EXPECT_EQ(CountEvents(store, "kr", "worker_lost"), 1) << sched.Log();
  const auto rough = Heads(store, "kr");
  ASSERT_EQ(rough.size(), 6u);
  for (const auto& [m, h] : rough) EXPECT_EQ(h.step, 36) << m;
  EXPECT_TRUE(calm == rough);
}

TEST_F(RemoteWorkersTest, AWorkerStartedBeforeTheSchedulerJoinsWhenItListens) {
  // The secret is made by hand here (64 hex digits, 0600), as an operator
  // would before starting either side.
  Write("secret", std::string(32, 'a') + std::string(32, '7') + "\n");
  ASSERT_EQ(chmod(secret_.c_str(), 0600), 0);
  const std::string addr = "127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
  auto w = StartWorker(addr, secret_, "early.log");
  // The worker has tried and is waiting for the scheduler.
  const auto until = std::chrono::steady_clock::now() + milliseconds(60000);
  while (w->Log().find("retrying") == std::string::npos && w->Running() &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_NE(w->Log().find("retrying"), std::string::npos) << w->Log();
  const std::string table =
      "[workers]\nlisten = \"" + addr + "\"\nsecret_file = \"" + secret_ + "\"\nlocal = false\n";
  const std::string config = Write("early.toml", Config("early", 1, 2, table));
  Child sched(RunArgs(config, dir_ + "/tcp"), dir_ + "/tcp.log");
  ASSERT_TRUE(sched.WaitFor(milliseconds(300000))) << sched.Log();
  const int sst = sched.Wait();
  ASSERT_TRUE(WIFEXITED(sst) && WEXITSTATUS(sst) == 0) << sched.Log() << w->Log();
  ASSERT_TRUE(w->WaitFor(milliseconds(30000))) << w->Log();
  const int wst = w->Wait();
  EXPECT_TRUE(WIFEXITED(wst) && WEXITSTATUS(wst) == 0) << w->Log();
  const auto heads = Heads(dir_ + "/tcp", "early");
  ASSERT_EQ(heads.size(), 6u);
  for (const auto& [m, h] : heads) EXPECT_EQ(h.step, 12) << m;
}

// CONFIGURE carries the SHA-256 of the TorchScript file the scheduler read
// when the experiment was submitted. A remote worker whose file of that name
// holds other bytes (here the file is replaced after the submission, before
// the worker opens it) refuses it before loading any of it, naming both
// hashes, and the experiment fails with that reason.
TEST_F(RemoteWorkersTest, AModelFileOtherThanTheSubmittedOneIsRefusedNamingBothHashes) {
  const std::string submitted = std::string("PK\x03\x04", 4) + "the file that was submitted";
  const std::string model = Write("model.pt", submitted);
  std::string toml = Config("ts", 1, 2, TcpTable());
  const std::string lenet = "spec = \"lenet5\"";
  toml.replace(toml.find(lenet), lenet.size(), "spec = \"torchscript:" + model + "\"");
  const std::string config = Write("ts.toml", toml);
  const std::string store = dir_ + "/tcp";
  Child sched(RunArgs(config, store), dir_ + "/tcp.log");
  const std::string addr = WaitForAddress(store, sched);
  ASSERT_FALSE(addr.empty());
  // Listening means the experiment was submitted and its file hashed.
  const std::string other = std::string("PK\x03\x04", 4) + "another file of the same name";
  const std::string swap = Write("model.pt.new", other);
  ASSERT_EQ(std::rename(swap.c_str(), model.c_str()), 0);
  auto w = StartWorker(addr, secret_, "w.log");
  ASSERT_TRUE(sched.WaitFor(milliseconds(120000))) << sched.Log();
  (void)sched.Wait();
  const std::string want = "TorchScript file " + model + " has SHA-256 " + ipc::Sha256Hex(other) +
                           ", not " + ipc::Sha256Hex(submitted);
  EXPECT_NE(sched.Log().find(want), std::string::npos) << want << "\n" << sched.Log();
  EXPECT_EQ((sched.Log() + w->Log()).find("does not load"), std::string::npos)
      << "the worker loaded the file:\n"
      << w->Log();
  EXPECT_TRUE(w->WaitFor(milliseconds(60000))) << w->Log();
}

}  // namespace
}  // namespace ckpt
