// A worker that hangs while it starts (stopped before it attaches to its ring,
// so it has no heartbeat yet) is found by the start deadline, killed and
// replaced; found by ckpt-chaos (worker_sigstop on a worker being restarted:
// the run went on on the other worker and the stopped one was never noticed;
// with one worker the run hung for good).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../integration/process_util.h"

namespace ckpt {
namespace {

using std::chrono::milliseconds;
using testing::Child;
using testing::ChildrenOf;

TEST(StartHangTest, WorkerStoppedWhileStartingIsReplaced) {
  const std::string dir = testing::TempDir("starthang");
  ASSERT_FALSE(dir.empty());
  const std::string config = dir + "/sh.toml";
  std::ofstream(config) << "name = \"sh\"\nseed = 3\nmetrics = \"\"\n"
                        << "[data]\nbatch_size = 16\neval_size = 200\n"
                        << "[population]\nsize = 2\nsteps_per_interval = 4\nintervals = 1\n"
                        << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.1\n"
                        << "[supervision]\nrestart_backoff_s = 0.1\nheartbeat_timeout_s = 2\n"
                        << "[[devices]]\ndevice = \"cpu\"\ncount = 1\nslots = 1\n"
                        << "fusion = \"plain\"\n";
  // The scheduler and its worker in a process group of their own, whose
  // leader's parent (this test) is in the same session: a group that is never
  // orphaned. In an orphaned one (the test's own, where a runner detached it,
  // as ctest run from a background job here did), the exit of any process of
  // the group makes the kernel send SIGHUP to a group with a stopped member
  // (POSIX): the stopped worker died at once and the start deadline was
  // never reached ("killed by signal 1", 2 of 2 full runs under ctest -j2).
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  Child c({CKPT_SCHEDULER_BIN, "run", config, "--store", dir + "/store", "--quiet"}, dir + "/log",
          env, [] { return setpgid(0, 0) == 0; });
  // The only worker, stopped as soon as it exists: long before it has loaded
  // LibTorch and attached to its ring.
  pid_t stopped = 0;
  for (int i = 0; i < 20000 && stopped == 0 && c.Running(); ++i) {
    auto kids = ChildrenOf(c.pid());
    if (!kids.empty() && kill(kids[0], SIGSTOP) == 0) stopped = kids[0];
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  ASSERT_NE(stopped, 0) << c.Log();
  ASSERT_TRUE(c.WaitFor(milliseconds(180000))) << "the run hung on the stopped worker\n" << c.Log();
  const int st = c.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c.Log();
  EXPECT_NE(c.Log().find("did not say HELLO within 30 s of its start"), std::string::npos)
      << c.Log();
  EXPECT_NE(c.Log().find("experiment sh: done"), std::string::npos) << c.Log();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckpt
