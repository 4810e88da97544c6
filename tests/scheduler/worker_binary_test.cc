// FindWorkerBinary: the ckpt-worker a scheduler starts, resolved before
// anything starts, and a clear error when it is not there (a scheduler with a
// worker binary that cannot run used to restart it with back-off for ever).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "ckpt/scheduler/scheduler.h"

namespace ckpt::scheduler {
namespace {

namespace fs = std::filesystem;

// Sets an environment variable for a scope (unsets it for nullopt), then
// restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class WorkerBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // In the build tree, not TMPDIR: /dev/shm (this binary's TMPDIR) may be
    // mounted noexec, where nothing is executable.
    dir_ = (fs::current_path() / ("worker_binary_test_" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/bin");
    fs::create_directories(dir_ + "/empty");
    worker_ = dir_ + "/bin/ckpt-worker";
    std::ofstream(worker_) << "#!/bin/sh\nexit 0\n";
    ASSERT_EQ(chmod(worker_.c_str(), 0755), 0);
    std::ofstream(dir_ + "/bin/plain") << "not a program\n";
    ASSERT_EQ(chmod((dir_ + "/bin/plain").c_str(), 0644), 0);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void ExpectError(const StatusOr<std::string>& found, bool not_found,
                          const std::string& says) {
    ASSERT_FALSE(found.ok()) << *found;
    EXPECT_EQ(found.status().IsNotFound(), not_found) << found.status().ToString();
    EXPECT_NE(found.status().message().find(says), std::string::npos)
        << found.status().ToString() << "\nshould say: " << says;
  }

  std::string dir_;
  std::string worker_;
};

TEST_F(WorkerBinaryTest, AConfiguredPathIsCheckedAndReturnedNormalised) {
  auto found = FindWorkerBinary(dir_ + "/empty/../bin/ckpt-worker");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, worker_);
}

TEST_F(WorkerBinaryTest, AMissingConfiguredPathIsNotFoundNamingItAndWhereItWasSet) {
  ExpectError(
      FindWorkerBinary(dir_ + "/bin/nothing"), true,
      "worker binary (--worker or [workers] binary) " + dir_ + "/bin/nothing does not exist");
}

TEST_F(WorkerBinaryTest, ADirectoryOrAFileWithoutExecutePermissionIsRefused) {
  ExpectError(FindWorkerBinary(dir_ + "/bin"), false, dir_ + "/bin is a directory");
  ExpectError(FindWorkerBinary(dir_ + "/bin/plain"), false,
              dir_ + "/bin/plain is not executable: Permission denied");
}

TEST_F(WorkerBinaryTest, ABareNameIsLookedUpOnPathInOrder) {
  ScopedEnv path("PATH", dir_ + "/empty:" + dir_ + "/bin");
  auto found = FindWorkerBinary("ckpt-worker");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, worker_);
  ExpectError(FindWorkerBinary("ckpt-worker-nowhere"), true,
              "(--worker or [workers] binary) ckpt-worker-nowhere is not on PATH");
  // A file on PATH that cannot be executed is skipped, as execvp does.
  ExpectError(FindWorkerBinary("plain"), true, "plain is not on PATH");
}

TEST_F(WorkerBinaryTest, WithoutAConfiguredPathCkptWorkerThenPathAreUsed) {
  {
    ScopedEnv env("CKPT_WORKER", dir_ + "/bin/gone");
    ExpectError(FindWorkerBinary(""), true,
                "worker binary (CKPT_WORKER) " + dir_ + "/bin/gone does not exist");
    // The configured path wins over the environment.
    auto found = FindWorkerBinary(worker_);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    EXPECT_EQ(*found, worker_);
  }
  // No ckpt-worker beside this test program (build/tests/scheduler): PATH.
  ScopedEnv env("CKPT_WORKER", std::nullopt);
  {
    ScopedEnv path("PATH", dir_ + "/bin");
    auto found = FindWorkerBinary("");
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    EXPECT_EQ(*found, worker_);
  }
  ScopedEnv path("PATH", dir_ + "/empty");
  ExpectError(FindWorkerBinary(""), true,
              "nor on PATH; give its path with --worker, [workers] binary or CKPT_WORKER");
}

}  // namespace
}  // namespace ckpt::scheduler
