// A full disk: the store on a small tmpfs (mounted by the test in a private
// mount namespace of its own child process) filled up with a ballast file.
// Commits fail with ResourceExhausted naming the store and what was being
// written, nothing committed is lost or damaged, and once the ballast is
// removed the store resumes without a reopen.
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/store/store.h"
#include "test_util.h"

namespace ckpt::store::testing {
namespace {

constexpr const char kInNamespaceEnv[] = "CKPT_NO_SPACE_TEST_IN_NAMESPACE";

// Fills the file system of `path` with the file `path` until it is full.
// Returns the bytes written.
uint64_t FillWithBallast(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  std::vector<char> chunk(1 << 16, 'x');
  uint64_t written = 0;
  size_t size = chunk.size();
  while (size > 0) {
    ssize_t n = write(fd, chunk.data(), size);
    if (n > 0) {
      written += static_cast<uint64_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      size /= 2;  // ENOSPC: fill the last pages with smaller writes
    }
  }
  close(fd);
  return written;
}

// Re-runs this test in a child process in a private mount namespace (as
// root), where the test body mounts its tmpfs. Returns true in that child,
// where the body should run; false in the parent, after checking the child's
// outcome, or when the machine cannot (`*skip` says why).
bool RunInPrivateMountNamespace(const std::string& test_name, std::string* skip) {
  if (std::getenv(kInNamespaceEnv) != nullptr) {
    if (unshare(CLONE_NEWNS) != 0) {
      *skip = std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
      return false;
    }
    // Mounts made here must not propagate back to the parent namespace.
    if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      *skip = std::string("making / private in the new mount namespace: ") + std::strerror(errno);
      return false;
    }
    return true;
  }
  if (geteuid() != 0) {
    *skip = "mounting a tmpfs in a private mount namespace needs root";
    return false;
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  setenv(kInNamespaceEnv, "1", 1);
  Child child({self, "--gtest_filter=" + test_name});
  unsetenv(kInNamespaceEnv);
  child.CloseStdin();
  std::string out;
  for (const auto& line : child.ReadAllLines()) out += line + "\n";
  const int status = child.Wait();
  if (out.find("[  SKIPPED ] 1 test") != std::string::npos) {
    *skip = "the child skipped:\n" + out;
    return false;
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the test in its own mount namespace failed (status " << status << "):\n"
      << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
  return false;
}

std::string LogTail(const std::string& file) {
  std::ifstream in(file);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > 6000 ? all.substr(all.size() - 6000) : all;
}

std::string Listing(const std::string& dir) {
  std::string out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::error_code ec;
    out += e.path().filename().string() + " " + std::to_string(e.file_size(ec)) + "\n";
  }
  return out;
}

CommitRequest Request(const std::string& member, int64_t head, const std::string& blob) {
  CommitRequest r;
  r.exp = "e";
  r.member = member;
  r.expected_head_version = head;
  r.blob = blob.data();
  r.blob_size = blob.size();
  r.step = head + 1;
  r.metrics = {{kScoreMetric, static_cast<double>(head)}};
  return r;
}

// A store on a tmpfs that the test fills, and the heads of its members "a"
// and "b" of experiment "e" as the test committed them.
struct StoreOnTmpfs {
  std::string mnt;   // the tmpfs
  std::string path;  // the store, in it
  Store* store = nullptr;
  std::map<std::string, int64_t> heads = {{"a", 0}, {"b", 0}};
  std::map<std::pair<std::string, int64_t>, std::string> committed;
  uint64_t seed = 1;

  // Commits a fresh 64 KiB blob on `member`'s head.
  Status Commit(const std::string& member) {
    std::string blob = MakeBlob(seed++, size_t{64} * 1024, heads[member] + 1);
    auto v = store->CommitResult(Request(member, heads[member], blob));
    if (v.ok()) {
      heads[member] = *v;
      committed[{member, *v}] = std::move(blob);
    }
    return v.status();
  }
  // The i-th of a run of commits that alternate between a and b.
  Status CommitNth(int i) { return Commit(i % 2 ? "b" : "a"); }
};

// Fills the disk with ballast and commits until a commit fails: it fails as
// a full disk does, naming the store and what was being written.
void ExpectCommitsRunOutOfSpace(StoreOnTmpfs* s) {
  ASSERT_GT(FillWithBallast(s->mnt + "/ballast"), 0u);
  // Commits go on into the memtable and the WAL's last page until a write
  // hits the full disk.
  Status failed;
  for (int i = 0; i < 400 && failed.ok(); ++i) failed = s->CommitNth(i);
  ASSERT_TRUE(failed.IsResourceExhausted()) << failed.ToString();
  EXPECT_NE(failed.message().find(s->path), std::string::npos) << failed.ToString();
  EXPECT_NE(failed.message().find("no space"), std::string::npos) << failed.ToString();
  // It names what was being written.
  EXPECT_NE(failed.message().find("trained of e/"), std::string::npos) << failed.ToString();
}

// Still full (RocksDB may have deleted a WAL file since: fill that too):
// every write says so, reads work, nothing changes.
void ExpectFullDiskRefusesWrites(StoreOnTmpfs* s) {
  FillWithBallast(s->mnt + "/ballast2");
  EXPECT_TRUE(s->Commit("a").IsResourceExhausted());
  EXPECT_TRUE(s->store->SetMemberState("e", "b", "x").IsResourceExhausted());
  EXPECT_TRUE(s->store->Recover().IsResourceExhausted());
  for (const auto& [member, version] : s->heads) {
    auto head = s->store->GetMember("e", member);
    ASSERT_TRUE(head.ok());
    EXPECT_EQ(head->version, version) << member;
  }
}

// Space is freed: the store resumes, commits and verifies. RocksDB's own
// recovery may be running (Recover() says ResourceExhausted meanwhile); it
// polls every few seconds, so allow it a minute.
void ExpectResumesOnceSpaceIsFreed(StoreOnTmpfs* s) {
  ASSERT_TRUE(std::filesystem::remove(s->mnt + "/ballast"));
  std::filesystem::remove(s->mnt + "/ballast2");
  Status recovered = s->store->Recover();
  for (int i = 0; i < 600 && recovered.IsResourceExhausted(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    recovered = s->store->Recover();
  }
  ASSERT_TRUE(recovered.ok()) << recovered.ToString() << "\nRocksDB's LOG:\n"
                              << LogTail(s->path + "/LOG") << "\nfiles:\n"
                              << Listing(s->path);
  for (int i = 0; i < 6; ++i) {
    Status st = s->CommitNth(i);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ASSERT_TRUE(s->store->SetMemberState("e", "b", "after").ok());
  auto report = s->store->Verify();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

// Reopened: the heads and every blob still kept read back intact.
void ExpectReopenedIntact(const std::string& path) {
  auto reopened = Store::Open(TestOptions(path));
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  Store* store = reopened->get();
  auto report = store->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
  for (const std::string member : {"a", "b"}) {
    auto versions = store->ListVersions("e", member);
    ASSERT_TRUE(versions.ok());
    for (const Manifest& m : *versions) {
      if (!m.holds_blob) continue;
      auto blob = store->ReadBlob(m.blob);
      ASSERT_TRUE(blob.ok()) << member << " v" << m.version << ": " << blob.status().ToString();
    }
    auto head = store->GetMember("e", member);
    ASSERT_TRUE(head.ok());
    EXPECT_EQ(head->step, head->version) << member << ": versions are consecutive";
  }
  EXPECT_EQ(store->GetMember("e", "b")->state, "after");
  reopened->reset();
}

TEST(StoreNoSpaceTest, CommitsFailWithNoSpaceAndGoOnOnceSpaceIsFreed) {
  std::string skip;
  if (!RunInPrivateMountNamespace("StoreNoSpaceTest.CommitsFailWithNoSpaceAndGoOnOnceSpaceIsFreed",
                                  &skip)) {
    if (!skip.empty()) GTEST_SKIP() << skip;
    return;
  }
  TempDir dir;
  StoreOnTmpfs s;
  s.mnt = dir.Sub("tmpfs");
  std::filesystem::create_directories(s.mnt);
  ASSERT_EQ(mount("tmpfs", s.mnt.c_str(), "tmpfs", 0, "size=24m"), 0)
      << "mount tmpfs on " << s.mnt << ": " << std::strerror(errno);
  s.path = s.mnt + "/db";
  {
    StoreOptions options = TestOptions(s.path);
    options.blob_memtable_bytes = size_t{2} << 20;  // flushes happen while the disk is full too
    auto opened = Store::Open(options);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    s.store = opened->get();
    ASSERT_TRUE(s.store->CreateExperiment("e", "{}").ok());
    ASSERT_TRUE(s.store->CreateMembers("e", {{"a", {}}, {"b", {}}}).ok());

    // Committed before the disk fills: every one must survive.
    for (int i = 0; i < 10; ++i) {
      Status st = s.CommitNth(i);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    ExpectCommitsRunOutOfSpace(&s);
    if (HasFatalFailure()) return;
    ExpectFullDiskRefusesWrites(&s);
    if (HasFatalFailure()) return;
    ExpectResumesOnceSpaceIsFreed(&s);
    if (HasFatalFailure()) return;
  }
  ExpectReopenedIntact(s.path);
  if (HasFatalFailure()) return;
  umount2(s.mnt.c_str(), MNT_DETACH);
}

}  // namespace
}  // namespace ckpt::store::testing
