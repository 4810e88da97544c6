// StoreHealth (scheduler/src/store_health.h) over a real RocksDB store in a
// temp dir and a real io_context: the probe after a refused write, Stop, and
// the memory sizing threshold. A real full disk is chaos.disk_full's.
#include "store_health.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>

#include "store/test_util.h"

namespace ckpt::scheduler {
namespace {

using store::testing::TempDir;

std::unique_ptr<store::Store> OpenStore(const TempDir& dir) {
  store::StoreOptions so;
  so.path = dir.Sub("store");
  auto s = store::Store::Open(so);
  CKPT_CHECK(s.ok());
  return std::move(*s);
}

TEST(StoreHealthTest, AStoreThatTakesWritesAgainEndsTheWaitOnceAfterTheFirstProbe) {
  TempDir dir;
  auto st = OpenStore(dir);
  boost::asio::io_context io;
  int writable = 0;
  StoreHealth h(st.get(), dir.Sub("store"), &io, [&] { ++writable; });
  EXPECT_FALSE(h.waiting_for_space());
  const auto t0 = std::chrono::steady_clock::now();
  h.WaitForSpace("a commit refused");
  h.WaitForSpace("a second refusal while waiting");  // no second probe
  EXPECT_TRUE(h.waiting_for_space());
  io.run();  // returns when the probe has run and armed nothing more
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(h.waiting_for_space());
  EXPECT_EQ(writable, 1);
  EXPECT_GE(waited, 0.9) << "the first probe is 1 s after the refusal";
}

TEST(StoreHealthTest, StopCancelsTheProbe) {
  TempDir dir;
  auto st = OpenStore(dir);
  boost::asio::io_context io;
  int writable = 0;
  StoreHealth h(st.get(), dir.Sub("store"), &io, [&] { ++writable; });
  h.WaitForSpace("a commit refused");
  h.Stop();
  io.run();
  EXPECT_EQ(writable, 0);
  h.WaitForSpace("after Stop");  // ignored: nothing armed
  EXPECT_EQ(io.poll(), 0u);
}

TEST(StoreHealthTest, MemoryFollowsTheHeadStatesOnlyWhenTheyGrowByMoreThanAQuarter) {
  TempDir dir;
  auto st = OpenStore(dir);
  boost::asio::io_context io;
  StoreHealth h(st.get(), dir.Sub("store"), &io, [] {});
  const uint64_t mib = uint64_t{1} << 20;
  // The store makes its blob cache 1.25 x the head states (store.h).
  h.SizeForHeadStates(8 * mib);
  EXPECT_EQ(st->blob_cache_capacity(), 10 * mib);
  h.SizeForHeadStates(10 * mib);  // +25%: not more than a quarter, no resize
  EXPECT_EQ(st->blob_cache_capacity(), 10 * mib);
  h.SizeForHeadStates(32 * mib);
  EXPECT_EQ(st->blob_cache_capacity(), 40 * mib);
}

}  // namespace
}  // namespace ckpt::scheduler
