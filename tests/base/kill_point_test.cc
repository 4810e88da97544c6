#include "ckpt/base/kill_point.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <set>
#include <string>

namespace ckpt::base {
namespace {

TEST(KillPointTest, ParsesPointAndCount) {
  auto at = ParseKillAt("commit.after_write:4");
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  EXPECT_EQ(at->point, "commit.after_write");
  EXPECT_EQ(at->n, 4);
  // The last colon ends the point.
  at = ParseKillAt("a:b:12");
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  EXPECT_EQ(at->point, "a:b");
  EXPECT_EQ(at->n, 12);
}

TEST(KillPointTest, RefusesWhatIsNotPointColonCount) {
  for (const char* bad : {"commit.after_write", "commit.after_write:", ":3", "p:0", "p:-1", "p:+2",
                          "p: 2", "p:2 ", "p:2x", "p:1e3", "p:99999999999999999999", ""}) {
    auto at = ParseKillAt(bad);
    ASSERT_FALSE(at.ok()) << bad;
    EXPECT_TRUE(at.status().IsInvalidArgument()) << bad;
    EXPECT_EQ(at.status().message(),
              std::string("CKPT_KILL_AT=") + bad + " is not POINT:N (N >= 1)");
  }
}

// Sets CKPT_KILL_AT (or unsets it, for nullopt) for one scope.
class ScopedKillAt {
 public:
  explicit ScopedKillAt(const std::optional<std::string>& value) {
    if (const char* old = getenv(kKillAtVariable)) old_ = old;
    Set(value);
  }
  ~ScopedKillAt() { Set(old_); }

 private:
  static void Set(const std::optional<std::string>& value) {
    if (value) {
      setenv(kKillAtVariable, value->c_str(), 1);
    } else {
      unsetenv(kKillAtVariable);
    }
  }
  std::optional<std::string> old_;
};

TEST(KillPointTest, EnvironmentUnsetOrEmptyArmsNothing) {
  {
    ScopedKillAt env(std::nullopt);
    auto at = KillAtFromEnvironment();
    ASSERT_TRUE(at.ok());
    EXPECT_FALSE(at->has_value());
  }
  {
    ScopedKillAt env("");
    auto at = KillAtFromEnvironment();
    ASSERT_TRUE(at.ok());
    EXPECT_FALSE(at->has_value());
  }
  {
    ScopedKillAt env("worker.decode:2");
    auto at = KillAtFromEnvironment();
    ASSERT_TRUE(at.ok());
    ASSERT_TRUE(at->has_value());
    EXPECT_EQ((*at)->point, kill_points::kWorkerDecode);
    EXPECT_EQ((*at)->n, 2);
  }
  {
    ScopedKillAt env("worker.decode");
    EXPECT_TRUE(KillAtFromEnvironment().status().IsInvalidArgument());
  }
}

TEST(KillPointTest, PointNamesAreDistinctAndParseBack) {
  namespace kp = kill_points;
  const std::set<std::string> names = {
      kp::kCommitBeforeWrite,  kp::kCommitAfterWrite,   kp::kImportBeforeWrite,
      kp::kImportAfterWrite,   kp::kExploitBeforeWrite, kp::kExploitAfterWrite,
      kp::kRestoreBeforeWrite, kp::kRestoreAfterWrite,  kp::kPinBeforeWrite,
      kp::kPinAfterWrite,      kp::kDeleteBeforeWrite,  kp::kDeleteAfterWrite,
      kp::kRetentionRelease,   kp::kSchedulerCommitted, kp::kSchedulerExploited,
      kp::kWorkerDecode,       kp::kWorkerTrain,        kp::kWorkerEncode,
      kp::kWorkerResultSent,   kp::kWorkerShutdown};
  EXPECT_EQ(names.size(), 20u);
  for (const std::string& name : names) {
    auto at = ParseKillAt(name + ":1");
    ASSERT_TRUE(at.ok()) << name;
    EXPECT_EQ(at->point, name);
  }
  EXPECT_EQ(std::set<std::string>(kp::kWorkerPoints.begin(), kp::kWorkerPoints.end()).size(), 4u);
}

}  // namespace
}  // namespace ckpt::base
