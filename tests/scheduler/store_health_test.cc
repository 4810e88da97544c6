// StoreHealth (scheduler/src/store_health.h) over a real RocksDB store in a
// temp dir and a real io_context: the probe after a refused write, Stop, a
// store that refuses every write, and the memory sizing threshold. A real
// full disk is chaos.disk_full's; a real failing disk is
// PbtRunTest.AStoreThatFailsForGood...'s.
#include "store_health.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <vector>

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

void NotBroken(const Status& s) { ADD_FAILURE() << "on_broken ran: " << s.ToString(); }

TEST(StoreHealthTest, ARefusedWriteOfAStoreThatTakesWritesIsTheWritersFault) {
  TempDir dir;
  auto st = OpenStore(dir);
  boost::asio::io_context io;
  StoreHealth h(
      st.get(), dir.Sub("store"), &io, [] {}, NotBroken);
  EXPECT_FALSE(h.BrokenForGood());
  EXPECT_TRUE(h.broken().ok());
}

// A store that refuses every write (here a read-only view, whose Recover()
// is FailedPrecondition like a broken writer's): on_broken runs once, with
// the store's error.
TEST(StoreHealthTest, AStoreThatRefusesEveryWriteIsBrokenForGoodOnce) {
  TempDir dir;
  OpenStore(dir).reset();  // create it
  store::StoreOptions so;
  so.path = dir.Sub("store");
  auto ro = store::Store::OpenReadOnly(so);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  boost::asio::io_context io;
  std::vector<Status> broken;
  StoreHealth h(
      ro->get(), dir.Sub("store"), &io, [] { ADD_FAILURE() << "on_writable ran"; },
      [&](const Status& s) { broken.push_back(s); });
  EXPECT_TRUE(h.BrokenForGood());
  EXPECT_TRUE(h.BrokenForGood());
  ASSERT_EQ(broken.size(), 1u);
  EXPECT_EQ(broken[0].code(), StatusCode::kFailedPrecondition) << broken[0].ToString();
  EXPECT_NE(broken[0].message().find(dir.Sub("store")), std::string::npos) << broken[0].ToString();
  EXPECT_EQ(h.broken().ToString(), broken[0].ToString());
}

// A probe while waiting for space that finds the store broken ends the wait
// through on_broken, not on_writable.
TEST(StoreHealthTest, AProbeThatFindsTheStoreBrokenRunsOnBroken) {
  TempDir dir;
  OpenStore(dir).reset();
  store::StoreOptions so;
  so.path = dir.Sub("store");
  auto ro = store::Store::OpenReadOnly(so);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  boost::asio::io_context io;
  int broken = 0;
  StoreHealth h(
      ro->get(), dir.Sub("store"), &io, [] { ADD_FAILURE() << "on_writable ran"; },
      [&](const Status&) { ++broken; });
  h.WaitForSpace("a commit refused");
  io.run();
  EXPECT_EQ(broken, 1);
  EXPECT_FALSE(h.waiting_for_space());
}

TEST(StoreHealthTest, AStoreThatTakesWritesAgainEndsTheWaitOnceAfterTheFirstProbe) {
  TempDir dir;
  auto st = OpenStore(dir);
  boost::asio::io_context io;
  int writable = 0;
  StoreHealth h(
      st.get(), dir.Sub("store"), &io, [&] { ++writable; }, NotBroken);
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
  StoreHealth h(
      st.get(), dir.Sub("store"), &io, [&] { ++writable; }, NotBroken);
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
  StoreHealth h(
      st.get(), dir.Sub("store"), &io, [] {}, NotBroken);
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
