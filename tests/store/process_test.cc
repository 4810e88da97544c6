// Whole-process behaviour of the store: SIGKILL at random moments and at
// named kill points, and two processes opening one store.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "ckpt/store/store.h"
#include "test_util.h"

namespace ckpt::store::testing {
namespace {

using json = nlohmann::json;

const std::string kChild = CKPT_STORE_TEST_CHILD;

struct Reported {
  std::string kind;
  std::string member;
  int64_t version = 0;
  std::string blob_hex;
};

Reported ParseReport(const std::string& line) {
  std::istringstream in(line);
  Reported r;
  in >> r.kind >> r.member >> r.version >> r.blob_hex;
  return r;
}

// Everything the crash child reported must be there, unless retention may have
// dropped it (keep_last_n = 3 in the child); the store must verify clean.
void CheckAfterCrash(Store* store, const std::vector<Reported>& reported, int round) {
  if (store->GetExperiment("crash").status().IsNotFound()) {
    // Killed before the child created its experiment.
    EXPECT_TRUE(reported.empty()) << "round " << round;
    return;
  }
  std::map<std::string, int64_t> last_reported;
  for (const auto& r : reported) {
    last_reported[r.member] = std::max(last_reported[r.member], r.version);
  }
  for (const auto& r : reported) {
    auto head = store->GetMember("crash", r.member);
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    ASSERT_GE(head->version, last_reported[r.member])
        << "round " << round << ": acknowledged version of " << r.member << " lost";
    if (r.version <= head->version - 3) continue;  // may be gone by retention
    auto m = store->GetManifest("crash", r.member, r.version);
    ASSERT_TRUE(m.ok()) << "round " << round << ": " << m.status().ToString();
    EXPECT_TRUE(m->holds_blob);
    EXPECT_EQ(m->blob.Hex(), r.blob_hex)
        << "round " << round << " " << r.member << " v" << r.version;
    auto blob = store->ReadBlob(m->blob);
    EXPECT_TRUE(blob.ok()) << "round " << round << ": " << blob.status().ToString();
  }
  auto report = store->Verify();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  for (const auto& p : report->problems) ADD_FAILURE() << "round " << round << ": " << p;
  // Every head's blob is readable (no manifest points at a missing blob).
  auto members = store->ListMembers("crash");
  ASSERT_TRUE(members.ok());
  for (const auto& h : *members) {
    if (h.version == 0) continue;
    auto blob = store->ReadHeadBlob("crash", h.member);
    EXPECT_TRUE(blob.ok()) << "round " << round << ": " << blob.status().ToString();
  }
}

TEST(StoreProcessTest, SigkillAtRandomMomentsLosesNothingAcknowledged) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kRounds = 24;
  size_t total = 0;
  int rounds_with_commits = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Reported> reported;
    {
      Child child({kChild, "crash-loop", path, std::to_string(rng())});
      bool eof = false;
      std::vector<std::string> lines;
      if (round % 3 != 0) {
        // Two rounds in three kill a child that is known to be writing.
        lines = child.ReadLinesUntil(std::chrono::steady_clock::now() + std::chrono::seconds(30),
                                     &eof, /*first_only=*/true);
        ASSERT_FALSE(lines.empty()) << "child wrote nothing in round " << round;
      }
      // Then 5 ms (often still opening or recovering) to 300 ms more.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(5 + rng() % 295);
      auto more = child.ReadLinesUntil(deadline, &eof);
      lines.insert(lines.end(), more.begin(), more.end());
      ASSERT_FALSE(eof) << "child exited early in round " << round;
      kill(child.pid(), SIGKILL);
      auto rest = child.ReadAllLines();
      lines.insert(lines.end(), rest.begin(), rest.end());
      int status = child.Wait();
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "round " << round;
      for (const auto& l : lines) reported.push_back(ParseReport(l));
    }
    total += reported.size();
    if (!reported.empty()) ++rounds_with_commits;
    StoreOptions o = TestOptions(path);
    o.keep_last_n = 3;
    o.keep_best_k = 2;
    auto store = Store::Open(o);
    ASSERT_TRUE(store.ok()) << "round " << round << ": " << store.status().ToString();
    CheckAfterCrash(store->get(), reported, round);
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(rounds_with_commits, kRounds * 2 / 3);
  std::printf("%d SIGKILLs, %zu acknowledged writes checked, %d rounds with writes\n", kRounds,
              total, rounds_with_commits);
}

struct KillCase {
  const char* point;
  int64_t a_after;  // head of a after the kill, given a at 0
  int64_t b_after;
};

TEST(StoreProcessTest, SigkillAtKillPointsKeepsBatchesAtomic) {
  // The child commits a twice (keep_last_n = 1, so the second commit releases
  // v1's blob), exploits b from a, and restores b's head with an event.
  const KillCase cases[] = {
      {"commit.before_write", 0, 0},  {"commit.after_write", 1, 0},  {"retention.release", 1, 0},
      {"exploit.before_write", 2, 0}, {"exploit.after_write", 2, 1}, {"restore.before_write", 2, 1},
      {"restore.after_write", 2, 2},
  };
  for (const KillCase& c : cases) {
    SCOPED_TRACE(c.point);
    TempDir dir;
    const std::string path = dir.Sub("db");
    Child child({kChild, "kill-at", path, c.point});
    auto lines = child.ReadAllLines();
    int status = child.Wait();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines[0], "ready");
    StoreOptions o = TestOptions(path);
    o.keep_last_n = 1;
    o.keep_best_k = 0;
    auto store = Store::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto a = (*store)->GetMember("crash", "a");
    auto b = (*store)->GetMember("crash", "b");
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->version, c.a_after);
    EXPECT_EQ(b->version, c.b_after);
    auto report = (*store)->Verify();
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok()) << report->problems.front();
    if (b->version > 0) {
      auto bm = (*store)->GetManifest("crash", "b", b->version);
      auto am = (*store)->GetManifest("crash", "a", a->version);
      ASSERT_TRUE(bm.ok() && am.ok());
      EXPECT_EQ(bm->blob, am->blob);
    }
    // Every version's event is in its version's write: one event per version,
    // the restore's the caller's own with the store's fields.
    auto events = (*store)->ListEvents("crash", 0, 100);
    ASSERT_TRUE(events.ok()) << events.status().ToString();
    std::map<std::string, int64_t> per_member;
    for (const auto& e : *events) {
      const json j = json::parse(e.json);
      ++per_member[j.value("member", "")];
      if (j.value("reason", "") != kReasonRestore) continue;
      EXPECT_EQ(j.value("type", ""), "corrupt_state") << e.json;
      EXPECT_EQ(j.value("damage", ""), "test") << e.json;
      EXPECT_EQ(j.value("version", 0), 2) << e.json;
      EXPECT_EQ(j.value("restored_version", 0), 1) << e.json;
    }
    EXPECT_EQ(per_member["a"], c.a_after);
    EXPECT_EQ(per_member["b"], c.b_after);
  }
}

TEST(StoreProcessTest, SecondProcessGetsClearErrorAndFirstIsUnaffected) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  auto store = Store::Open(TestOptions(path));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->CreateExperiment("e", "{}").ok());
  ASSERT_TRUE((*store)->CreateMember("e", "m", {}).ok());

  Child child({kChild, "try-open", path});
  auto lines = child.ReadAllLines();
  int status = child.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("Unavailable"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(path), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("held by another process (pid " + std::to_string(getpid()) + ")"),
            std::string::npos)
      << lines[0];

  // The first process goes on writing and reading.
  std::string blob = MakeBlob(1);
  CommitRequest req;
  req.exp = "e";
  req.member = "m";
  req.blob = blob.data();
  req.blob_size = blob.size();
  auto v = (*store)->CommitResult(req);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  auto read = (*store)->ReadHeadBlob("e", "m");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(read->data()), read->size()), blob);
  auto report = (*store)->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
}

TEST(StoreProcessTest, OpenWhileAnotherProcessHoldsFailsAtOnceThenSucceeds) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  Child holder({kChild, "hold", path});
  bool eof = false;
  auto lines = holder.ReadLinesUntil(std::chrono::steady_clock::now() + std::chrono::seconds(20),
                                     &eof, /*first_only=*/true);
  ASSERT_EQ(lines, std::vector<std::string>{"held"});

  auto start = std::chrono::steady_clock::now();
  auto second = Store::Open(TestOptions(path));
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(second.status().IsUnavailable()) << second.status().ToString();
  EXPECT_NE(second.status().message().find(path), std::string::npos);
  EXPECT_NE(second.status().message().find("held by another process (pid " +
                                           std::to_string(holder.pid()) + ")"),
            std::string::npos)
      << second.status().ToString();
  EXPECT_LT(took, std::chrono::seconds(2));

  // Inspection works while the holder runs.
  auto view = Store::OpenReadOnly(TestOptions(path));
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_TRUE((*view)->ListExperiments().ok());

  holder.CloseStdin();
  int status = holder.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto third = Store::Open(TestOptions(path));
  EXPECT_TRUE(third.ok()) << third.status().ToString();
}

}  // namespace
}  // namespace ckpt::store::testing
