// Whole-process tests of ckpt-tool's service commands (submit, status, watch,
// pause, resume, stop, workers, top) against a real `ckpt-scheduler serve` on
// a temporary socket and store, with real workers training Fashion-MNIST;
// `top` and `watch` in a real terminal (tmux); permission checks as an
// unprivileged user (setpriv).
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../integration/process_util.h"
#include "tool_process.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;

using testing::Process;
using testing::Result;
using testing::Slurp;

size_t Lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

bool WaitUntil(const std::function<bool()>& done, milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(200));
  }
  return done();
}

// A small experiment: `intervals` of `steps` steps for `population` members.
std::string ExperimentToml(const std::string& name, int intervals, int population = 2,
                           int steps = 4) {
  std::ostringstream os;
  os << "name = \"" << name << "\"\nseed = 5\n"
     << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
     << "[data]\nbatch_size = 16\neval_size = 200\n"
     << "[population]\nsize = " << population << "\nsteps_per_interval = " << steps
     << "\nintervals = " << intervals << "\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.1\n"
     << "[policy]\nkind = \"pbt\"\nmode = \"sync\"\nquantile = 0.5\n";
  return os.str();
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("client");
    ASSERT_FALSE(dir_.empty());
    // The unprivileged user of the permission test must reach the socket's
    // directory (and nothing else of the test's).
    chmod(dir_.c_str(), 0755);
    socket_ = dir_ + "/run/control.sock";
  }
  void TearDown() override {
    if (serve_ && !serve_->Exited()) {
      for (pid_t w : testing::ChildrenOf(serve_->pid())) kill(w, SIGKILL);
    }
    serve_.reset();
    if (HasFailure()) return;  // keep the logs
    fs::remove_all(dir_);
  }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Starts `serve` on a store and socket under dir_ and waits until
  // `ckpt-tool status` answers.
  void StartServe(const std::string& control = "") {
    const std::string config =
        Write("service.toml", "store = \"" + dir_ + "/store\"\nruntime_directory = \"" + dir_ +
                                  "/run\"\nmetrics = \"\"\nlog_progress = false\ngrace_s = 5\n"
                                  "[control]\n" +
                                  control +
                                  "\n[[devices]]\ndevice = \"cpu\"\nslots = 2\n"
                                  "fusion = \"plain\"\n");
    serve_ = std::make_unique<Process>(
        std::vector<std::string>{CKPT_SCHEDULER_BIN, "serve", "--config", config}, dir_ + "/serve");
    ASSERT_TRUE(WaitUntil([&] { return serve_->Exited() || Tool({"status"}).code == 0; },
                          milliseconds(120000)))
        << serve_->Log();
    ASSERT_FALSE(serve_->Exited()) << serve_->Log();
  }

  // Runs ckpt-tool on the test's socket; `prefix` runs it through another
  // program (setpriv).
  Result Tool(const std::vector<std::string>& args, const std::vector<std::string>& prefix = {}) {
    std::vector<std::string> argv = prefix;
    argv.push_back(CKPT_TOOL_BIN);
    argv.push_back("--socket");
    argv.push_back(socket_);
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, dir_ + "/tool-" + std::to_string(runs_++));
    return p.Wait();
  }

  json StatusJson(const std::string& experiment = "") {
    Result r =
        experiment.empty() ? Tool({"status", "--json"}) : Tool({"status", experiment, "--json"});
    EXPECT_EQ(r.code, 0) << r.err;
    json j = json::parse(r.out, nullptr, false);
    EXPECT_TRUE(j.is_object()) << r.out;
    return j;
  }

  // Intervals the experiment committed; -1 while the service does not know
  // it yet (a submit in another process may not have reached it).
  // Tasks the service's workers hold (`workers --json`, summed busy); -1
  // when the answer does not parse.
  int64_t BusyTasks() {
    Result r = Tool({"workers", "--json"});
    json j = json::parse(r.out, nullptr, false);
    if (r.code != 0 || !j.contains("workers")) return -1;
    int64_t busy = 0;
    for (const auto& w : j["workers"]) busy += w.value("busy", int64_t{0});
    return busy;
  }

  int64_t MemberIntervals(const std::string& experiment) {
    Result r = Tool({"status", experiment, "--json"});
    if (r.code != 0) return -1;
    json j = json::parse(r.out, nullptr, false);
    return j.contains("experiment") ? j["experiment"].value("member_intervals", int64_t{-1}) : -1;
  }

  // A bad file is refused here, with the key and its line, and nothing is sent.
  void CheckBadFileRefused() {
    const std::string bad = Write("bad.toml", "name = \"bad\"\n[population]\nsize = 0\n");
    Result r = Tool({"submit", bad});
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("population.size"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("line 3"), std::string::npos) << r.err;
    EXPECT_TRUE(StatusJson()["experiments"].empty()) << "a refused file reached the service";
  }

  // Submits "live", a run that outlasts the test, and checks the service's
  // status with it.
  void SubmitLiveAndCheckService() {
    Result r = Tool({"submit", Write("live.toml", ExperimentToml("live", 100000))});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("submitted live"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("watch live"), std::string::npos) << r.out;

    // The service: version, host, uptime, store, workers, the experiment.
    r = Tool({"status"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("ckpt-scheduler 0.1.0 on "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("store " + dir_ + "/store"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("workers 1"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("live [running]"), std::string::npos) << r.out;
    json all = StatusJson();
    EXPECT_EQ(all["service"]["version"], "0.1.0");
    EXPECT_EQ(all["service"]["socket"], socket_);
    EXPECT_GE(all["service"]["uptime_s"].get<double>(), 0.0);
    ASSERT_EQ(all["experiments"].size(), 1u);
    EXPECT_EQ(all["experiments"][0]["id"], "live");
  }

  // Once "live" committed 2 intervals: its progress line and every member.
  void CheckLiveStatus() {
    ASSERT_TRUE(WaitUntil([&] { return MemberIntervals("live") >= 2; }, milliseconds(180000)))
        << serve_->Log();
    Result r = Tool({"status", "live"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("live: training interval"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("experiment live: running, 2 members"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("m000"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("m001"), std::string::npos) << r.out;
  }

  // Workers: host, device, slots, state, samples/s, memory.
  void CheckWorkers() {
    Result r = Tool({"workers"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("samples/s"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("cpu"), std::string::npos) << r.out;
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    EXPECT_NE(r.out.find(host), std::string::npos) << r.out;
    r = Tool({"workers", "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    json workers = json::parse(r.out, nullptr, false);
    ASSERT_EQ(workers["workers"].size(), 1u) << r.out;
    EXPECT_EQ(workers["workers"][0]["device"], "cpu");
    EXPECT_EQ(workers["workers"][0]["capacity"], 2);
    EXPECT_TRUE(workers["workers"][0]["ready"].get<bool>());
    // Memory, from the worker's STATS (one a second): its resident set; no
    // device allocator on a CPU; no NVML figures for a CPU worker.
    json worker;
    ASSERT_TRUE(WaitUntil(
        [&] {
          r = Tool({"workers", "--json"});
          worker = json::parse(r.out, nullptr, false)["workers"][0];
          return worker.value("rss_bytes", int64_t{0}) > 0;
        },
        milliseconds(30000)))
        << r.out;
    EXPECT_GT(worker["rss_bytes"].get<int64_t>(), int64_t{10} << 20) << worker.dump();
    EXPECT_LT(worker["rss_bytes"].get<int64_t>(), int64_t{64} << 30) << worker.dump();
    EXPECT_EQ(worker["device_memory_bytes"], 0) << worker.dump();
    EXPECT_TRUE(worker["gpu_utilization"].is_null()) << worker.dump();
    EXPECT_TRUE(worker["gpu_memory_used_bytes"].is_null()) << worker.dump();
    r = Tool({"workers"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("rss"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" MiB"), std::string::npos) << "no resident memory shown:\n" << r.out;
  }

  // Pause: no new intervals start (while another experiment trains); resume:
  // they do again.
  void CheckPauseAndResume() {
    Result r = Tool({"pause", "live"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "live: paused\n");
    EXPECT_EQ(StatusJson("live")["experiment"]["status"], "paused");
    // The intervals in flight land: no worker holds a task any more (its busy
    // count and the experiment's interval count change in one event).
    ASSERT_TRUE(WaitUntil([&] { return BusyTasks() == 0; }, milliseconds(120000))) << serve_->Log();
    const int64_t paused_at = MemberIntervals("live");
    // Nothing starts while paused, though the worker is free and the
    // dispatcher runs: another experiment is trained from start to end on the
    // same worker meanwhile (a condition to wait on, not a span of time).
    r = Tool({"submit", "--wait", Write("probe.toml", ExperimentToml("probe", 2))});
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("experiment probe: done, 2 members"), std::string::npos) << r.out;
    EXPECT_EQ(MemberIntervals("live"), paused_at) << "a paused experiment trained";
    EXPECT_EQ(BusyTasks(), 0) << "a paused experiment dispatched";
    r = Tool({"resume", "live", "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out, nullptr, false)["done"], "resumed") << r.out;
    ASSERT_TRUE(
        WaitUntil([&] { return MemberIntervals("live") > paused_at; }, milliseconds(120000)))
        << serve_->Log();
  }

  // An experiment that does not exist: exit 1, one line naming those that do.
  void CheckUnknownExperimentRefused() {
    for (const std::string verb : {"status", "watch", "pause", "resume", "stop"}) {
      Result r = Tool({verb, "nope"});
      EXPECT_EQ(r.code, 1) << verb << ": " << r.err;
      EXPECT_EQ(Lines(r.err), 1u) << r.err;
      EXPECT_NE(r.err.find("experiment 'nope' not found (experiments: live, probe)"),
                std::string::npos)
          << verb << ": " << r.err;
    }
  }

  // Stop ends "live"; watch then returns at once with exit 1 (it did not
  // finish); a second stop is refused.
  void CheckStopEndsIt() {
    Result r = Tool({"stop", "live"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(StatusJson("live")["experiment"]["status"], "stopped");
    r = Tool({"watch", "live"});
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find("experiment live: stopped"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("ended stopped"), std::string::npos) << r.err;
    r = Tool({"stop", "live"});
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("has ended"), std::string::npos) << r.err;
  }

  // Usage: every verb has --help; a missing argument is exit 2.
  void CheckUsage() {
    for (const std::string verb :
         {"submit", "status", "watch", "pause", "resume", "stop", "workers", "top"}) {
      Result r = Tool({verb, "--help"});
      EXPECT_EQ(r.code, 0) << verb;
      EXPECT_NE(r.out.find(verb), std::string::npos) << r.out;
    }
    for (const std::string verb : {"submit", "watch", "pause", "resume", "stop"}) {
      Result r = Tool({verb});
      EXPECT_EQ(r.code, 2) << verb << ": " << r.err;
    }
  }

  std::string dir_, socket_;
  std::unique_ptr<Process> serve_;
  int runs_ = 0;
};

TEST_F(ClientTest, EveryVerbDrivesTheRunningService) {
  StartServe();
  CheckBadFileRefused();
  SubmitLiveAndCheckService();
  if (HasFatalFailure()) return;
  CheckLiveStatus();
  if (HasFatalFailure()) return;
  CheckWorkers();
  if (HasFatalFailure()) return;
  CheckPauseAndResume();
  if (HasFatalFailure()) return;
  CheckUnknownExperimentRefused();
  CheckStopEndsIt();
  if (HasFatalFailure()) return;
  CheckUsage();
  EXPECT_FALSE(serve_->Exited()) << serve_->Log();
}

TEST_F(ClientTest, SubmitWaitExitsZeroWhenDoneAndOneWhenStopped) {
  StartServe();
  Result done = Tool({"submit", "--wait", Write("short.toml", ExperimentToml("short", 2))});
  EXPECT_EQ(done.code, 0) << done.out << done.err;
  EXPECT_NE(done.out.find("short: done interval 2/2"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("experiment short: done, 2 members"), std::string::npos) << done.out;

  // Two clients at once: one waits on an experiment the other stops.
  Process wait({CKPT_TOOL_BIN, "--socket", socket_, "submit", "--wait",
                Write("long.toml", ExperimentToml("long", 100000))},
               dir_ + "/wait");
  ASSERT_TRUE(WaitUntil([&] { return MemberIntervals("long") >= 1 || wait.Exited(); },
                        milliseconds(120000)))
      << wait.Log();
  Result stop = Tool({"stop", "long"});
  EXPECT_EQ(stop.code, 0) << stop.err;
  ASSERT_TRUE(WaitUntil([&] { return wait.Exited(); }, milliseconds(60000)));
  Result waited = wait.Wait();
  EXPECT_EQ(waited.code, 1) << waited.out << waited.err;
  EXPECT_NE(waited.err.find("experiment long ended stopped"), std::string::npos) << waited.err;

  // --json: the experiment's name, then one summary per change.
  Result j = Tool({"submit", "--json", Write("third.toml", ExperimentToml("third", 1))});
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_EQ(json::parse(j.out, nullptr, false)["experiment"], "third") << j.out;
  Result w = Tool({"watch", "third", "--json"});
  EXPECT_EQ(w.code, 0) << w.err;
  std::istringstream lines(w.out);
  std::string line, last;
  while (std::getline(lines, line)) {
    ASSERT_TRUE(json::parse(line, nullptr, false).is_object()) << line;
    last = line;
  }
  EXPECT_EQ(json::parse(last)["status"], "done") << w.out;
}

TEST_F(ClientTest, NoServiceOrNoPermissionSaysWhatToDo) {
  // Nothing at the socket.
  Result r = Tool({"status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("no ckpt-scheduler answers at " + socket_ +
                       ": is the service running? `systemctl status ckpt-scheduler`"),
            std::string::npos)
      << r.err;

  // A socket directory of another group (0750): an unprivileged user cannot
  // even reach the socket.
  group* users = getgrnam("users");
  ASSERT_NE(users, nullptr) << "Debian's group 'users' is missing";
  const gid_t users_gid = users->gr_gid;
  StartServe("allowed_groups = [\"users\"]\n");
  const std::string run = dir_ + "/run";
  ASSERT_EQ(chown(run.c_str(), 0, users_gid), 0);
  ASSERT_EQ(chmod(run.c_str(), 0750), 0);
  ASSERT_EQ(chown(socket_.c_str(), 0, users_gid), 0);  // 0660, as the service makes it
  const std::vector<std::string> nobody = {"setpriv", "--reuid=65534", "--regid=65534",
                                           "--clear-groups"};
  r = Tool({"status"}, nobody);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("permission denied on " + socket_ + ": add yourself to group users"),
            std::string::npos)
      << r.err;
  // In the group (its primary group here; the service also reads the
  // group's members from /etc/group): allowed.
  r = Tool({"status"},
           {"setpriv", "--reuid=65534", "--regid=" + std::to_string(users_gid), "--clear-groups"});
  EXPECT_EQ(r.code, 0) << r.err;

  // A socket anyone may open, of a service that does not allow this user:
  // the service refuses it, saying which group to join.
  ASSERT_EQ(chmod(run.c_str(), 0755), 0);
  ASSERT_EQ(chmod(socket_.c_str(), 0666), 0);
  r = Tool({"status"}, nobody);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_EQ(Lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("permission denied: uid 65534"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("add yourself to group users"), std::string::npos) << r.err;
  EXPECT_FALSE(serve_->Exited()) << serve_->Log();
}

TEST_F(ClientTest, AClientKilledMidWatchLeavesTheServiceUnaffected) {
  StartServe();
  ASSERT_EQ(Tool({"submit", Write("live.toml", ExperimentToml("live", 100000))}).code, 0);
  Process watch({CKPT_TOOL_BIN, "--socket", socket_, "watch", "live"}, dir_ + "/watch");
  ASSERT_TRUE(WaitUntil([&] { return watch.Out().find("live: training") != std::string::npos; },
                        milliseconds(120000)))
      << watch.Log();
  kill(watch.pid(), SIGKILL);
  EXPECT_EQ(watch.Wait().code, 128 + SIGKILL);
  const int64_t at_kill = MemberIntervals("live");
  ASSERT_TRUE(
      WaitUntil([&] { return MemberIntervals("live") >= at_kill + 2; }, milliseconds(120000)))
      << serve_->Log();
  EXPECT_EQ(Tool({"stop", "live"}).code, 0);
  EXPECT_FALSE(serve_->Exited()) << serve_->Log();
}

// ---- a real terminal: tmux ----

class Tmux {
 public:
  // Each Tmux runs its own server: a server whose last session just ended
  // exits on its own, and a new session on that socket races the exit.
  Tmux(const std::string& dir, const std::string& name) : socket_(dir + "/" + name + ".sock") {}
  ~Tmux() { Run({"kill-server"}); }
  Result Run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"tmux", "-S", socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, socket_ + "-" + std::to_string(n_++));
    return p.Wait();
  }
  // What a person sees in the pane.
  std::string Screen() { return Run({"capture-pane", "-p", "-t", "t"}).out; }
  bool Alive() { return Run({"has-session", "-t", "t"}).code == 0; }

 private:
  std::string socket_;
  int n_ = 0;
};

TEST_F(ClientTest, TopAndWatchInARealTerminal) {
  if (system("tmux -V >/dev/null 2>&1") != 0) GTEST_SKIP() << "tmux is not installed";
  StartServe();
  ASSERT_EQ(Tool({"submit", Write("live.toml", ExperimentToml("live", 100000))}).code, 0);
  ASSERT_TRUE(WaitUntil([&] { return MemberIntervals("live") >= 1; }, milliseconds(120000)));

  Tmux tmux(dir_, "top");
  const std::string tool = std::string(CKPT_TOOL_BIN) + " --socket " + socket_;
  // remain-on-exit off: the session ends when top does.
  ASSERT_EQ(tmux.Run({"new-session", "-d", "-s", "t", "-x", "160", "-y", "40", tool + " top"}).code,
            0);
  std::string screen;
  ASSERT_TRUE(WaitUntil(
      [&] {
        screen = tmux.Screen();
        return screen.find("live [running]") != std::string::npos;
      },
      milliseconds(30000)))
      << screen;
  EXPECT_NE(screen.find("ckpt-scheduler 0.1.0 on "), std::string::npos) << screen;
  EXPECT_NE(screen.find("live: training interval"), std::string::npos) << screen;
  EXPECT_NE(screen.find("samples/s"), std::string::npos) << screen;
  EXPECT_NE(screen.find("q quit"), std::string::npos) << screen;
  // It refreshes: the uptime moves.
  const std::string first = screen.substr(0, screen.find('\n'));
  ASSERT_TRUE(WaitUntil([&] { return tmux.Screen().substr(0, first.size()) != first; },
                        milliseconds(60000)))
      << first;
  // q quits and the terminal is given back.
  ASSERT_EQ(tmux.Run({"send-keys", "-t", "t", "q"}).code, 0);
  EXPECT_TRUE(WaitUntil([&] { return !tmux.Alive(); }, milliseconds(10000))) << tmux.Screen();

  // watch redraws its table in place: one progress line on the screen however
  // many refreshes went by.
  Tmux watch_tmux(dir_, "watch");
  Result started = watch_tmux.Run(
      {"new-session", "-d", "-s", "t", "-x", "160", "-y", "40", tool + " watch live; sleep 60"});
  ASSERT_EQ(started.code, 0) << started.err;
  ASSERT_TRUE(WaitUntil(
      [&] {
        screen = watch_tmux.Screen();
        return screen.find("experiment live: running") != std::string::npos;
      },
      milliseconds(30000)))
      << screen;
  // The last progress line on the screen; it changes with each redraw that
  // has new figures (the rate moves with the wall time).
  const auto last_progress = [](const std::string& s) {
    const size_t at = s.rfind("live: training");
    return at == std::string::npos ? std::string() : s.substr(at, s.find('\n', at) - at);
  };
  // Redrawn at least once since (no span of time stands in for a refresh:
  // on a loaded machine 3.5 s may hold none, and the check below would pass
  // on a watch that appends).
  const std::string first_progress = last_progress(screen);
  ASSERT_TRUE(WaitUntil(
      [&] {
        screen = watch_tmux.Screen();
        const std::string now = last_progress(screen);
        return !now.empty() && now != first_progress;
      },
      milliseconds(60000)))
      << first_progress << "\n"
      << screen;
  size_t progress_lines = 0;
  for (size_t at = screen.find("live: training"); at != std::string::npos;
       at = screen.find("live: training", at + 1)) {
    ++progress_lines;
  }
  EXPECT_EQ(progress_lines, 1u) << screen;
  EXPECT_NE(screen.find("member   status"), std::string::npos) << screen;
  // Stopping the experiment ends watch (exit 1: it did not finish).
  EXPECT_EQ(Tool({"stop", "live"}).code, 0);
  EXPECT_TRUE(
      WaitUntil([&] { return watch_tmux.Screen().find("ended stopped") != std::string::npos; },
                milliseconds(30000)))
      << watch_tmux.Screen();

  // Without a terminal, top prints plain frames.
  Result plain = Tool({"top", "-n", "2"});
  EXPECT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out.find('\033'), std::string::npos) << "escape codes in plain output";
  size_t frames = 0;
  for (size_t at = plain.out.find("ckpt-scheduler 0.1.0"); at != std::string::npos;
       at = plain.out.find("ckpt-scheduler 0.1.0", at + 1)) {
    ++frames;
  }
  EXPECT_EQ(frames, 2u) << plain.out;
}

}  // namespace
}  // namespace ckpt
