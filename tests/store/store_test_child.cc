// Child process of the store's process tests (crash consistency, two openers).
//
//   store_test_child crash-loop PATH SEED   commit/exploit in a loop; after each
//                                           call returns, print "C|E member version blobhex"
//   store_test_child kill-at PATH POINT     run a fixed sequence (commit, commit,
//                                           exploit, restore) with SIGKILL raised
//                                           at kill point POINT; prints what returned
//   store_test_child try-open PATH          print Open's status; exit 0 ok, 3 Unavailable, 1 other
//   store_test_child hold PATH              open, print "held", keep it until stdin closes
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "ckpt/store/store.h"
#include "test_util.h"

namespace ckpt::store::testing {
namespace {

constexpr char kExp[] = "crash";

// One line per write(2) of fewer than PIPE_BUF bytes: atomic on a pipe.
void Report(const std::string& line) {
  std::string l = line + "\n";
  ssize_t n = write(1, l.data(), l.size());
  (void)n;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "store_test_child: %s\n", s.ToString().c_str());
  return 1;
}

Status EnsurePopulation(Store* store, const std::vector<std::string>& members) {
  if (!store->GetExperiment(kExp).ok()) {
    CKPT_RETURN_IF_ERROR(store->CreateExperiment(kExp, "{\"test\":\"crash\"}"));
  }
  std::map<std::string, std::map<std::string, double>> missing;
  for (const auto& m : members) {
    if (!store->GetMember(kExp, m).ok()) missing[m] = {{"lr", 0.1}};
  }
  if (!missing.empty()) CKPT_RETURN_IF_ERROR(store->CreateMembers(kExp, missing));
  return Status::OK();
}

StoreOptions CrashOptions(const std::string& path) {
  StoreOptions o = TestOptions(path);
  o.keep_last_n = 3;
  o.keep_best_k = 2;
  return o;
}

int CrashLoop(const std::string& path, uint64_t seed) {
  auto opened = Store::Open(CrashOptions(path));
  if (!opened.ok()) return Fail(opened.status());
  Store* store = opened->get();
  const std::vector<std::string> members = {"m0", "m1", "m2", "m3"};
  Status s = EnsurePopulation(store, members);
  if (!s.ok()) return Fail(s);
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0;; ++i) {
    const std::string& member = members[rng() % members.size()];
    auto head = store->GetMember(kExp, member);
    if (!head.ok()) return Fail(head.status());
    if (head->version > 0 && rng() % 5 == 0) {
      const std::string& dst = members[rng() % members.size()];
      if (dst == member) continue;
      auto v = store->Exploit(kExp, dst, member, {{"lr", 0.05}}, "");
      if (!v.ok()) return Fail(v.status());
      auto m = store->GetManifest(kExp, dst, *v);
      if (!m.ok()) return Fail(m.status());
      Report("E " + dst + " " + std::to_string(*v) + " " + m->blob.Hex());
      continue;
    }
    // Sizes from 1 KB to ~1 MB so kills land in small and large writes alike.
    size_t floats = 256 + rng() % (256 * 1024);
    std::string blob = MakeBlob(rng(), floats, head->step + 100);
    CommitRequest req;
    req.exp = kExp;
    req.member = member;
    req.expected_head_version = head->version;
    req.blob = blob.data();
    req.blob_size = blob.size();
    req.step = head->step + 100;
    req.metrics = {{kScoreMetric, static_cast<double>(rng() % 1000) / 10.0}};
    req.hparams = {{"lr", 0.1}};
    auto v = store->CommitResult(req);
    if (!v.ok()) return Fail(v.status());
    Report("C " + member + " " + std::to_string(*v) + " " +
           BlobId::Of(blob.data(), blob.size()).Hex());
  }
}

int KillAt(const std::string& path, const std::string& point) {
  StoreOptions o = TestOptions(path);
  o.keep_last_n = 1;
  o.keep_best_k = 0;
  o.kill_point = [point](std::string_view p) {
    if (p == point) raise(SIGKILL);
  };
  auto opened = Store::Open(o);
  if (!opened.ok()) return Fail(opened.status());
  Store* store = opened->get();
  Status s = EnsurePopulation(store, {"a", "b"});
  if (!s.ok()) return Fail(s);
  Report("ready");
  for (int i = 0; i < 2; ++i) {
    auto head = store->GetMember(kExp, "a");
    if (!head.ok()) return Fail(head.status());
    std::string blob = MakeBlob(1000 + head->version, 1024, head->step + 1);
    CommitRequest req;
    req.exp = kExp;
    req.member = "a";
    req.expected_head_version = head->version;
    req.blob = blob.data();
    req.blob_size = blob.size();
    req.step = head->step + 1;
    auto v = store->CommitResult(req);
    if (!v.ok()) return Fail(v.status());
    Report("committed a " + std::to_string(*v));
  }
  auto v = store->Exploit(kExp, "b", "a", {{"lr", 0.2}}, "");
  if (!v.ok()) return Fail(v.status());
  Report("exploited b " + std::to_string(*v));
  // A restore of b's head, with the caller's event (the scheduler's fall-back
  // from a damaged head logs one so).
  v = store->Restore(kExp, "b", *v, R"({"type":"corrupt_state","damage":"test"})");
  if (!v.ok()) return Fail(v.status());
  Report("restored b " + std::to_string(*v));
  return 0;
}

int TryOpen(const std::string& path) {
  auto opened = Store::Open(TestOptions(path));
  Report(opened.ok() ? std::string("OK") : opened.status().ToString());
  if (opened.ok()) return 0;
  return opened.status().IsUnavailable() ? 3 : 1;
}

int Hold(const std::string& path) {
  auto opened = Store::Open(TestOptions(path));
  if (!opened.ok()) return Fail(opened.status());
  Report("held");
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}

}  // namespace
}  // namespace ckpt::store::testing

int main(int argc, char** argv) {
  using namespace ckpt::store::testing;
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "crash-loop" && argc == 4)
    return CrashLoop(argv[2], std::strtoull(argv[3], nullptr, 10));
  if (mode == "kill-at" && argc == 4) return KillAt(argv[2], argv[3]);
  if (mode == "try-open" && argc == 3) return TryOpen(argv[2]);
  if (mode == "hold" && argc == 3) return Hold(argv[2]);
  std::fprintf(stderr, "usage: store_test_child crash-loop|kill-at|try-open|hold PATH [ARG]\n");
  return 2;
}
