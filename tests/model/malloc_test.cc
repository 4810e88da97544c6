// Malloc (allocator.h): ckpt-worker runs glibc's malloc, tuned; an operator
// may preload jemalloc (as is common for RocksDB services), and a worker under
// it must keep its freed pages as it does under glibc's, or its evaluations
// fault their buffers in again every interval. Read from the running worker:
// jemalloc prints its statistics at exit when MALLOC_CONF asks for them
// (glibc's malloc ignores the variable), the arenas' decay among them. This
// test binary itself runs glibc's malloc.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "ckpt/worker/allocator.h"

namespace ckpt::worker {
namespace {

// The worker's stderr from `ckpt-worker --help` with MALLOC_CONF `conf`
// and, when not empty, `preload` loaded ahead of everything.
std::string WorkerHelpStderr(const std::string& conf, const std::string& preload) {
  std::string cmd = "MALLOC_CONF='" + conf + "' ";
  if (!preload.empty()) cmd += "LD_PRELOAD='" + preload + "' ";
  cmd += "'" CKPT_WORKER_BIN "' --help 2>&1 >/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "popen failed";
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  pclose(p);
  return out;
}

bool RanJemalloc(const std::string& err) {
  return err.find("Begin jemalloc statistics") != std::string::npos;
}

TEST(MallocTest, TheWorkerRunsGlibcsMalloc) {
  const std::string err = WorkerHelpStderr("stats_print:true", "");
  EXPECT_FALSE(RanJemalloc(err)) << err.substr(0, 2000);
  EXPECT_EQ(MallocName().rfind("glibc 2.", 0), 0u) << MallocName();
}

// Under a preloaded jemalloc the worker turns its decay off at start; a
// MALLOC_CONF that sets a decay is left as it is.
TEST(MallocTest, AWorkerUnderAPreloadedJemallocKeepsItsPages) {
#ifndef CKPT_JEMALLOC_SO
  GTEST_SKIP() << "no libjemalloc.so.2 at configure time, or a sanitizer build";
#else
  const std::string tuned = WorkerHelpStderr("stats_print:true", CKPT_JEMALLOC_SO);
  ASSERT_TRUE(RanJemalloc(tuned)) << tuned.substr(0, 2000);
  EXPECT_NE(tuned.find("arenas.dirty_decay_ms: -1)"), std::string::npos) << tuned.substr(0, 3000);
  EXPECT_NE(tuned.find("arenas.muzzy_decay_ms: -1)"), std::string::npos) << tuned.substr(0, 3000);
  const std::string set =
      WorkerHelpStderr("stats_print:true,dirty_decay_ms:5000", CKPT_JEMALLOC_SO);
  ASSERT_TRUE(RanJemalloc(set)) << set.substr(0, 2000);
  EXPECT_NE(set.find("arenas.dirty_decay_ms: 5000)"), std::string::npos) << set.substr(0, 3000);
#endif
}

}  // namespace
}  // namespace ckpt::worker
