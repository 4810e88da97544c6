// Helpers for tests whose workers connect to the scheduler over TCP
// (tests/slurm: workers as a Slurm job; tests/netns: workers in other network
// namespaces): an experiment file, shell commands, the scheduler's published
// listen address, the store's committed heads and audit log.
#ifndef CKPT_TESTS_SLURM_REMOTE_RUN_H_
#define CKPT_TESTS_SLURM_REMOTE_RUN_H_

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/store/store.h"
#include "process_util.h"
#include "run_heads.h"

namespace ckpt::testing {

// The experiment of these tests: sync PBT (deterministic: the final heads do
// not depend on which worker trained what), lenet5 on Fashion-MNIST, on CPU.
// `workers_table` is the `[workers]` table's body ("" = no table: spawned
// local workers over shared memory, the reference run).
inline std::string RemoteRunConfig(const std::string& name, int population, int intervals,
                                   const std::string& workers_table, int steps_per_interval = 6) {
  std::ostringstream os;
  os << "name = \"" << name << "\"\nseed = 77\nmetrics = \"\"\n"
     << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
     << "[data]\nbatch_size = 16\neval_size = 200\n"
     << "[population]\nsize = " << population << "\nsteps_per_interval = " << steps_per_interval
     << "\nintervals = " << intervals << "\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.2\n"
     << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.95\n"
     << "[policy]\nkind = \"pbt\"\nmode = \"sync\"\nquantile = 0.34\nready_intervals = 1\n"
     << "[[devices]]\ndevice = \"cpu\"\ncount = 2\nslots = 2\nfusion = \"plain\"\n"
     << "intra_op_threads = 1\n";
  if (!workers_table.empty()) os << "[workers]\n" << workers_table;
  return os.str();
}

// The flags every connecting worker of these tests gets, so that it trains
// as the reference run's spawned workers do (plain, one thread per slot).
inline std::vector<std::string> WorkerTrainingFlags() {
  return {"--device", "cpu", "--slots", "2", "--fusion", "plain", "--intra-op-threads", "1"};
}

// Runs `bash -c command`; returns its exit code (128+signal when killed) and
// its stdout and stderr, interleaved, in *out.
inline int Sh(const std::string& command, std::string* out = nullptr) {
  std::string wrapped = "bash -c '";
  for (char c : command) {
    if (c == '\'') {
      wrapped += "'\\''";
    } else {
      wrapped += c;
    }
  }
  wrapped += "' 2>&1";
  FILE* p = popen(wrapped.c_str(), "r");
  if (p == nullptr) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  int st = pclose(p);
  if (out) *out = text;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

inline std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// Waits until the scheduler has written its listen address to
// <store>/workers.addr; "" when it exited first or 60 s passed.
inline std::string WaitForWorkersAddr(Child& scheduler, const std::string& store) {
  const std::string path = store + "/workers.addr";
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    std::string addr;
    if (in && std::getline(in, addr) && !Trim(addr).empty()) return Trim(addr);
    if (!scheduler.Running()) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

// Waits until `c` has logged at least `n` results; false when it exited first
// or `limit` passed.
inline bool WaitForResults(Child& c, int n,
                           std::chrono::milliseconds limit = std::chrono::minutes(5)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (ResultsLogged(c) >= n) return true;
    if (!c.Running()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// What a scheduler run with CKPT_TRACE=1 logged about its workers, in log
// order: TRAIN records sent ("worker W: sent TRAIN task T EXP/MEMBER: ..."),
// RESULTs received ("worker W: got RESULT task T"), connections ("worker W
// (NAME) connected from IP:PORT") and losses ("worker W (NAME) lost: WHY").
struct TraceLine {
  enum Kind { kConnected, kSent, kResult, kLost } kind;
  int worker = -1;
  int64_t task = -1;
  std::string text;  // kSent: the member; kConnected: the peer's IP; kLost: why
};

inline std::vector<TraceLine> ParseTrace(const std::string& log) {
  static const std::regex kSentRe(R"(worker ([0-9]+): sent TRAIN task ([0-9]+) [^/ ]+/([^: ]+):)");
  static const std::regex kResultRe(R"(worker ([0-9]+): got RESULT task ([0-9]+))");
  static const std::regex kConnectedRe(
      R"(worker ([0-9]+) \([^)]*\) connected from ([^ ]+):[0-9]+)");
  static const std::regex kLostRe(R"(worker ([0-9]+) \([^)]*\) lost: (.*))");
  std::vector<TraceLine> out;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, kSentRe)) {
      out.push_back({TraceLine::kSent, std::stoi(m[1]), std::stoll(m[2]), m[3]});
    } else if (std::regex_search(line, m, kResultRe)) {
      out.push_back({TraceLine::kResult, std::stoi(m[1]), std::stoll(m[2]), ""});
    } else if (std::regex_search(line, m, kConnectedRe)) {
      out.push_back({TraceLine::kConnected, std::stoi(m[1]), -1, m[2]});
    } else if (std::regex_search(line, m, kLostRe)) {
      out.push_back({TraceLine::kLost, std::stoi(m[1]), -1, m[2]});
    }
  }
  return out;
}

// The scheduler's index of the worker that connected from `ip`; -1 if none.
inline int WorkerConnectedFrom(const std::vector<TraceLine>& trace, const std::string& ip) {
  for (const auto& t : trace) {
    if (t.kind == TraceLine::kConnected && t.text == ip) return t.worker;
  }
  return -1;
}

inline int CountTrace(const std::vector<TraceLine>& trace, TraceLine::Kind kind, int worker) {
  int n = 0;
  for (const auto& t : trace) n += t.kind == kind && t.worker == worker;
  return n;
}

// What a finished run left in its store: every member's head, every version's
// blob (member -> version -> blob id), the audit log, and whether the store
// verifies. REQUIRES: no scheduler has the store open.
struct StoreSnapshot {
  std::map<std::string, Head> heads;
  std::map<std::string, std::map<int64_t, std::string>> versions;
  std::vector<std::string> events;  // each event's JSON
  std::string verify_problem;       // "" when the store verifies
};

inline StoreSnapshot ReadStore(const std::string& path, const std::string& exp) {
  StoreSnapshot out;
  store::StoreOptions o;
  o.path = path;
  auto s = store::Store::Open(o);
  EXPECT_TRUE(s.ok()) << path << ": " << s.status().ToString();
  if (!s.ok()) return out;
  auto members = (*s)->ListMembers(exp);
  EXPECT_TRUE(members.ok()) << members.status().ToString();
  if (!members.ok()) return out;
  for (const auto& m : *members) {
    out.heads[m.member] = Head{m.version, m.step, m.blob ? m.blob->Hex() : "", m.hparams};
    auto versions = (*s)->ListVersions(exp, m.member);
    EXPECT_TRUE(versions.ok()) << versions.status().ToString();
    if (!versions.ok()) continue;
    for (const auto& v : *versions) out.versions[m.member][v.version] = v.blob.Hex();
  }
  auto events = (*s)->ListEvents(exp, 0, 1000000);
  EXPECT_TRUE(events.ok()) << events.status().ToString();
  if (events.ok()) {
    for (const auto& e : *events) out.events.push_back(e.json);
  }
  auto report = (*s)->Verify();
  if (!report.ok()) {
    out.verify_problem = report.status().ToString();
  } else if (!report->ok()) {
    out.verify_problem = report->problems.empty() ? "verify failed" : report->problems[0];
  }
  return out;
}

inline int CountEvents(const StoreSnapshot& s, const std::string& type) {
  int n = 0;
  for (const auto& e : s.events) {
    if (e.find("\"type\":\"" + type + "\"") != std::string::npos) ++n;
  }
  return n;
}

// The commits in a run's audit log ("trained" and "exploit" events; the log
// is never trimmed by retention, unlike old versions).
struct Commits {
  std::map<std::pair<std::string, int64_t>, std::string> blob;  // (member, version) -> blob id
  std::map<std::pair<std::string, int64_t>, int> trained;       // (member, interval) -> commits
  std::map<int, int> trained_by_worker;                         // worker index -> commits
};

inline Commits ReadCommits(const StoreSnapshot& s) {
  Commits c;
  for (const auto& e : s.events) {
    const auto j = nlohmann::json::parse(e, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    const std::string type = j.value("type", "");
    if (type != "trained" && type != "exploit") continue;
    const std::string member = j.value("member", "");
    c.blob[{member, j.value("version", int64_t{-1})}] = j.value("blob", "");
    if (type == "trained") {
      ++c.trained[{member, j.value("interval", int64_t{-1})}];
      ++c.trained_by_worker[j.value("worker", -1)];
    }
  }
  return c;
}

// Every (member, interval) of the run trained and committed exactly once:
// nothing committed was lost (and trained again), nothing was committed twice.
inline void ExpectEachIntervalTrainedOnce(const Commits& c, const StoreSnapshot& s, int intervals) {
  for (const auto& [member, head] : s.heads) {
    for (int i = 1; i <= intervals; ++i) {
      auto it = c.trained.find({member, i});
      EXPECT_EQ(it == c.trained.end() ? 0 : it->second, 1)
          << member << " interval " << i << " committed that many times";
    }
  }
  EXPECT_EQ(c.trained.size(), s.heads.size() * static_cast<size_t>(intervals));
}

// Runs `scheduler run config` with spawned local workers to the end: the
// undisturbed reference of a TCP run. Returns its exit code.
inline int RunReference(const std::string& scheduler, const std::string& config,
                        const std::string& store, const std::string& log) {
  Child c({scheduler, "run", config, "--store", store, "--quiet", "--grace-ms", "5000"}, log);
  if (!c.WaitFor(std::chrono::minutes(5))) {
    ADD_FAILURE() << "the reference run did not finish in 5 minutes:\n" << c.Log();
    return -1;
  }
  int st = c.Wait();
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ADD_FAILURE() << c.Log();
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Each head of `run` is the reference run's, member for member (version,
// step, blob): what an undisturbed run would have committed.
inline void ExpectHeadsAsReference(const StoreSnapshot& run, const StoreSnapshot& reference) {
  for (const auto& [member, head] : reference.heads) {
    auto it = run.heads.find(member);
    ASSERT_NE(it, run.heads.end()) << member;
    EXPECT_TRUE(it->second == head)
        << member << ": v" << it->second.version << " step " << it->second.step << " blob "
        << it->second.blob << " vs the reference's v" << head.version << " step " << head.step
        << " blob " << head.blob;
  }
}

// A TCP run of the experiment above and its undisturbed reference, for the
// tests that attack a worker link on loopback (tests/attack,
// forged_result_test).
struct RemoteRunPlan {
  StoreSnapshot reference;  // the reference run's store; no heads when it failed
  std::string secret;       // <dir>/experiment.secret (the scheduler creates it)
  std::string config;       // <dir>/tcp.toml: remote workers only, on 127.0.0.1:0
  std::string store;        // <dir>/store, for the TCP run
};

// Runs the reference (<dir>/reference.toml, spawned local workers, store
// <dir>/reference, log <dir>/reference.log) to the end and writes the TCP
// run's config.
inline RemoteRunPlan PlanRemoteRun(const std::string& dir, const std::string& scheduler,
                                   const std::string& name, int population, int intervals,
                                   int steps_per_interval) {
  RemoteRunPlan plan;
  const std::string reference_config = dir + "/reference.toml";
  std::ofstream(reference_config) << RemoteRunConfig(name, population, intervals, "",
                                                     steps_per_interval);
  if (RunReference(scheduler, reference_config, dir + "/reference", dir + "/reference.log") == 0) {
    plan.reference = ReadStore(dir + "/reference", name);
  }
  plan.secret = dir + "/experiment.secret";
  plan.config = dir + "/tcp.toml";
  std::ofstream(plan.config) << RemoteRunConfig(
      name, population, intervals,
      "listen = \"127.0.0.1:0\"\nsecret_file = \"" + plan.secret + "\"\nlocal = false\n",
      steps_per_interval);
  plan.store = dir + "/store";
  return plan;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_SLURM_REMOTE_RUN_H_
