// ckpt::format::RegularFile: opens what a path names without following a
// final symbolic link or blocking on a FIFO, refuses anything but a regular
// file of bounded size, and reads the file it checked.
#include "ckpt/format/regular_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

namespace ckpt::format {
namespace {

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/regular_file_test_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::string dir_;
};

void ExpectRefused(const StatusOr<RegularFile>& f, const std::string& path,
                   const std::string& reason) {
  ASSERT_FALSE(f.ok()) << path;
  EXPECT_TRUE(f.status().IsInvalidArgument()) << f.status().ToString();
  EXPECT_NE(f.status().message().find("'" + path + "'"), std::string::npos)
      << f.status().ToString();
  EXPECT_NE(f.status().message().find(reason), std::string::npos) << f.status().ToString();
}

TEST_F(RegularFileTest, ReadsAGoodFileWholeAndByPrefix) {
  const std::string path = Write("model.pt", std::string("PK\3\4") + "rest of the archive");
  auto f = RegularFile::Open(path, 1024, "TorchScript file");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->size(), 23u);
  auto head = f->ReadPrefix(4);
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, std::string("PK\3\4"));
  auto all = f->ReadAll();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, std::string("PK\3\4") + "rest of the archive");
  auto whole = ReadRegularFile(path, 23);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->size(), 23u);
  auto empty = ReadRegularFile(Write("empty", ""), 0);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->empty());
}

TEST_F(RegularFileTest, ReadsTheFileItCheckedEvenIfThePathIsReplaced) {
  const std::string path = Write("model.pt", "checked bytes");
  auto f = RegularFile::Open(path, 1024);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::string other = Write("other", "swapped in after the check");
  ASSERT_EQ(std::rename(other.c_str(), path.c_str()), 0);
  auto all = f->ReadAll();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, "checked bytes");
}

TEST_F(RegularFileTest, RefusesASymbolicLinkEvenToAGoodFile) {
  const std::string target = Write("model.pt", "PK\3\4");
  const std::string link = dir_ + "/link.pt";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ExpectRefused(RegularFile::Open(link, 1024, "TorchScript file"), link, "symbolic link");
  EXPECT_FALSE(ReadRegularFile(link, 1024).ok());
}

TEST_F(RegularFileTest, RefusesAFifoWithoutBlocking) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto opened = std::async(std::launch::async, [&] { return RegularFile::Open(fifo, 1024); });
  if (opened.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Unblock the open so that the test ends, then fail.
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    FAIL() << "opening a FIFO blocked";
  }
  ExpectRefused(opened.get(), fifo, "not a regular file (it is a FIFO)");
  // A symbolic link to a FIFO: refused as a link, not waited on.
  const std::string link = dir_ + "/fifo_link";
  ASSERT_EQ(symlink(fifo.c_str(), link.c_str()), 0);
  ExpectRefused(RegularFile::Open(link, 1024), link, "symbolic link");
}

TEST_F(RegularFileTest, RefusesDevicesAndDirectories) {
  ExpectRefused(RegularFile::Open("/dev/null", 1024), "/dev/null",
                "not a regular file (it is a character device)");
  ExpectRefused(RegularFile::Open("/dev/zero", 1024), "/dev/zero", "character device");
  ExpectRefused(RegularFile::Open(dir_, 1024), dir_, "not a regular file (it is a directory)");
}

TEST_F(RegularFileTest, RefusesAFileLargerThanTheLimit) {
  const std::string path = Write("big.pt", std::string(1001, 'x'));
  ExpectRefused(RegularFile::Open(path, 1000), path, "1001 bytes; the limit is 1000");
  EXPECT_TRUE(RegularFile::Open(path, 1001).ok());
  // A sparse file claims its size without using the disk: refused by fstat's
  // size alone, nothing read.
  const std::string sparse = dir_ + "/sparse.pt";
  const int fd = ::open(sparse.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, off_t{3} << 30), 0);
  ::close(fd);
  ExpectRefused(RegularFile::Open(sparse, uint64_t{2} << 30), sparse, "the limit is 2147483648");
}

TEST_F(RegularFileTest, RefusesAFileThatGrowsPastTheLimitWhileRead) {
  const std::string path = Write("growing.pt", "12345");
  auto f = RegularFile::Open(path, 10);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::ofstream(path, std::ios::binary | std::ios::app) << std::string(20, 'x');
  auto all = f->ReadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_TRUE(all.status().IsInvalidArgument()) << all.status().ToString();
  EXPECT_NE(all.status().message().find("grew past the limit of 10 bytes"), std::string::npos)
      << all.status().ToString();
}

TEST_F(RegularFileTest, AMissingFileIsNotFoundNamingThePath) {
  const std::string missing = dir_ + "/missing.pt";
  auto m = RegularFile::Open(missing, 1024, "TorchScript file");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().IsNotFound()) << m.status().ToString();
  EXPECT_NE(m.status().message().find("TorchScript file '" + missing + "': no such file"),
            std::string::npos)
      << m.status().ToString();
}

// As root (CI runs as root, and root reads a mode-0 file) the open is made
// by a child process that first becomes the unprivileged user 65534.
TEST_F(RegularFileTest, AnUnreadableFileIsAnIOErrorWithTheSystemsReason) {
  const std::string locked = Write("locked.pt", "PK\3\4");
  ASSERT_EQ(chmod(locked.c_str(), 0), 0);
  const auto open_locked = [&]() -> Status {
    auto l = RegularFile::Open(locked, 1024);
    return l.ok() ? Status::OK() : l.status();
  };
  if (geteuid() != 0) {
    const Status s = open_locked();
    EXPECT_TRUE(s.IsIOError()) << s.ToString();
    EXPECT_NE(s.message().find("Permission denied"), std::string::npos) << s.ToString();
    return;
  }
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);  // the file is reached, then refused
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    const Status s = open_locked();
    std::fprintf(stderr, "child: %s\n", s.ToString().c_str());
    if (s.ok()) _exit(1);
    _exit(s.IsIOError() && s.message().find("Permission denied") != std::string::npos ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: opened, 2: another error (the child printed it), 3: could not become user 65534";
}

// OpenBeneath (the service's model files): no symbolic link anywhere on the
// way, nothing outside the directory, with openat2 and with the walk that
// replaces it on kernels without it. RegularFile::Open, by contrast, follows
// a link in a directory above the file (the swap this closes).
TEST_F(RegularFileTest, OpenBeneathFollowsNoLinkAndStaysInside) {
  std::filesystem::create_directories(dir_ + "/models/sub");
  std::filesystem::create_directories(dir_ + "/outside");
  Write("models/sub/good.pt", "PK\3\4 good");
  Write("outside/evil.pt", "PK\3\4 evil");
  ASSERT_EQ(symlink((dir_ + "/outside").c_str(), (dir_ + "/models/swapped").c_str()), 0);
  ASSERT_EQ(symlink("sub/good.pt", (dir_ + "/models/alias.pt").c_str()), 0);
  EXPECT_TRUE(RegularFile::Open(dir_ + "/models/swapped/evil.pt", 1024).ok());
  const std::string models = dir_ + "/models";
  for (auto resolver : {RegularFile::Resolver::kOpenat2, RegularFile::Resolver::kWalk}) {
    const std::string which = resolver == RegularFile::Resolver::kWalk ? "walk" : "openat2";
    auto good = RegularFile::OpenBeneath(models, "sub/good.pt", 1024, "TorchScript file", resolver);
    ASSERT_TRUE(good.ok()) << which << ": " << good.status().ToString();
    std::string pieces;
    ASSERT_TRUE(good->ReadInPieces([&](std::string_view p) { pieces += p; }).ok());
    EXPECT_EQ(pieces, "PK\3\4 good");
    for (const char* rel : {"swapped/evil.pt", "alias.pt"}) {
      auto f = RegularFile::OpenBeneath(models, rel, 1024, "TorchScript file", resolver);
      ASSERT_FALSE(f.ok()) << which << ": " << rel;
      EXPECT_TRUE(f.status().IsInvalidArgument()) << f.status().ToString();
      EXPECT_NE(f.status().message().find(std::string("'") + rel + "' beneath " + models),
                std::string::npos)
          << f.status().ToString();
      EXPECT_NE(f.status().message().find("symbolic link"), std::string::npos)
          << which << ": " << f.status().ToString();
    }
    auto up = RegularFile::OpenBeneath(models, "sub/../../outside/evil.pt", 1024, "file", resolver);
    ASSERT_FALSE(up.ok()) << which;
    EXPECT_NE(up.status().message().find("leads out of " + models), std::string::npos)
        << which << ": " << up.status().ToString();
    auto missing = RegularFile::OpenBeneath(models, "sub/none.pt", 1024, "file", resolver);
    EXPECT_TRUE(missing.status().IsNotFound()) << which << ": " << missing.status().ToString();
  }
  EXPECT_TRUE(RegularFile::OpenBeneath(models, "/etc/passwd", 1024).status().IsInvalidArgument());
}

}  // namespace
}  // namespace ckpt::format
