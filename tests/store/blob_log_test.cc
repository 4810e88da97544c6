// The store's blob log (StoreOptions::blob_log): a torn tail cut at open,
// Verify finding a damaged record, garbage collection returning a dropped
// version's bytes and keeping a damaged one, the blob cache left to RocksDB's
// blob files, stores from before the blob log, and SIGKILL at the blob log's
// kill points.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/store/store.h"
#include "test_util.h"

namespace ckpt::store::testing {
namespace {

namespace fs = std::filesystem;

StoreOptions LogOptions(const std::string& path) {
  StoreOptions o;
  o.path = path;
  o.blob_log = true;
  o.blob_log_segment_bytes = uint64_t{64} << 10;
  o.keep_last_n = 1;
  o.keep_best_k = 0;
  return o;
}

// The blob log's segment files, by name, with their sizes.
std::map<std::string, uint64_t> Segments(const std::string& path) {
  std::map<std::string, uint64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path + "/blob-log", ec)) {
    if (e.path().extension() == ".seg") out[e.path().filename().string()] = fs::file_size(e.path());
  }
  return out;
}

std::string ReadAll(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class BlobLogTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = dir_.Sub("db"); }

  std::unique_ptr<Store> Open(const StoreOptions& o) {
    auto s = Store::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  void Populate(Store* s, const std::vector<std::string>& members) {
    ASSERT_TRUE(s->CreateExperiment("e", "{}").ok());
    std::map<std::string, std::map<std::string, double>> hp;
    for (const auto& m : members) hp[m] = {{"lr", 0.1}};
    ASSERT_TRUE(s->CreateMembers("e", hp).ok());
  }

  // Commits `blob` as member's next version; returns the version.
  int64_t Commit(Store* s, const std::string& member, const std::string& blob,
                 const std::string& exp = "e") {
    auto head = s->GetMember(exp, member);
    EXPECT_TRUE(head.ok());
    CommitRequest r;
    r.exp = exp;
    r.member = member;
    r.expected_head_version = head->version;
    r.blob = blob.data();
    r.blob_size = blob.size();
    r.step = head->step + 1;
    auto v = s->CommitResult(r);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : -1;
  }

  TempDir dir_;
  std::string path_;
};

TEST_F(BlobLogTest, CommittedStatesGoToTheLogNotToRocksDbBlobFiles) {
  auto s = Open(LogOptions(path_));
  Populate(s.get(), {"a"});
  const std::string blob = MakeBlob(1, 4096);
  Commit(s.get(), "a", blob);
  ASSERT_TRUE(s->Flush().ok());
  auto read = s->ReadHeadBlob("e", "a");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(read->data()), read->size()), blob);
  auto segments = Segments(path_);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments.begin()->second, blob.size() + 48);
  for (const auto& e : fs::directory_iterator(path_)) {
    EXPECT_NE(e.path().extension(), ".blob") << "a state went to a RocksDB blob file";
  }
}

TEST_F(BlobLogTest, TornTailOfTheLastSegmentIsCutAtOpen) {
  const std::string first = MakeBlob(1, 2048);
  const std::string second = MakeBlob(2, 2048);
  {
    auto s = Open(LogOptions(path_));
    Populate(s.get(), {"a", "b"});
    Commit(s.get(), "a", first);
    Commit(s.get(), "b", second);
  }
  auto segments = Segments(path_);
  ASSERT_EQ(segments.size(), 1u);
  const std::string file = path_ + "/blob-log/" + segments.begin()->first;
  const uint64_t whole = segments.begin()->second;
  // A crash in the middle of an append: a whole record's header, then half its
  // payload; and a crash in the middle of a header.
  const std::string third = MakeBlob(3, 2048);
  const std::string bytes = ReadAll(file);
  std::string torn_payload = bytes + bytes.substr(0, 48 + 100);
  for (const std::string& torn : {torn_payload, bytes + bytes.substr(0, 20)}) {
    WriteAll(file, torn);
    auto s = Open(LogOptions(path_));
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(fs::file_size(file), whole) << "the torn tail was not cut";
    auto a = s->ReadHeadBlob("e", "a");
    auto b = s->ReadHeadBlob("e", "b");
    ASSERT_TRUE(a.ok() && b.ok());
    auto report = s->Verify();
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok()) << report->problems.front();
  }
  // New records go after the whole ones.
  auto s = Open(LogOptions(path_));
  Commit(s.get(), "a", third);
  s.reset();
  s = Open(LogOptions(path_));
  auto a = s->ReadHeadBlob("e", "a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a->data()), a->size()), third);
  auto report = s->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

TEST_F(BlobLogTest, VerifyFindsADamagedRecordInASegment) {
  const std::string blob = MakeBlob(7, 4096);
  const std::string other = MakeBlob(8, 4096);
  {
    auto s = Open(LogOptions(path_));
    Populate(s.get(), {"a", "b"});
    Commit(s.get(), "a", blob);
    Commit(s.get(), "b", other);
  }
  auto segments = Segments(path_);
  ASSERT_EQ(segments.size(), 1u);
  const std::string file = path_ + "/blob-log/" + segments.begin()->first;
  std::string bytes = ReadAll(file);
  const size_t at = bytes.find(blob);
  ASSERT_NE(at, std::string::npos);
  bytes[at + blob.size() / 2] ^= 0x40;
  WriteAll(file, bytes);
  auto s = Open(LogOptions(path_));
  auto report = s->Verify();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 1u);
  const std::string id = BlobId::Of(blob.data(), blob.size()).Hex();
  EXPECT_NE(report->problems[0].find(id), std::string::npos) << report->problems[0];
  EXPECT_NE(report->problems[0].find("checksum"), std::string::npos) << report->problems[0];
  EXPECT_NE(report->problems[0].find("e/a v1"), std::string::npos) << report->problems[0];
  auto read = s->ReadHeadBlob("e", "a");
  EXPECT_TRUE(read.status().IsCorruption()) << read.status().ToString();
  EXPECT_TRUE(s->ReadHeadBlob("e", "b").ok());
  // A damaged header is named too.
  bytes[at - 48 + 9] ^= 0x01;
  WriteAll(file, bytes);
  report = s->Verify();
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_NE(report->problems[0].find("header"), std::string::npos) << report->problems[0];
}

TEST_F(BlobLogTest, TheSameBytesAgainAreWrittenOnlyToReplaceADamagedRecord) {
  StoreOptions o = LogOptions(path_);
  o.keep_last_n = 3;
  auto s = Open(o);
  Populate(s.get(), {"a", "b"});
  const std::string blob = MakeBlob(5, 4096);
  Commit(s.get(), "a", blob);
  const auto once = Segments(path_);
  Commit(s.get(), "b", blob);
  Commit(s.get(), "a", blob);
  EXPECT_EQ(Segments(path_), once) << "a deduplicated commit wrote the state again";
  // A damaged record is replaced by the next commit of the same bytes.
  const std::string file = path_ + "/blob-log/" + once.begin()->first;
  std::string bytes = ReadAll(file);
  const size_t at = bytes.find(blob);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 100] ^= 0x08;
  WriteAll(file, bytes);
  EXPECT_TRUE(s->ReadHeadBlob("e", "a").status().IsCorruption());
  Commit(s.get(), "b", blob);
  EXPECT_EQ(fs::file_size(file), 2 * (blob.size() + 48));
  auto a = s->ReadHeadBlob("e", "a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto report = s->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

TEST_F(BlobLogTest, DroppedVersionsBytesAreReclaimed) {
  StoreOptions o = LogOptions(path_);
  auto s = Open(o);
  Populate(s.get(), {"a", "b"});
  // About 16 KiB each: four to a 64 KiB segment.
  Commit(s.get(), "b", MakeBlob(100, 4096));
  ASSERT_TRUE(s->Pin("e", "b", 1).ok());
  for (int i = 0; i < 40; ++i) Commit(s.get(), "a", MakeBlob(200 + i, 4096));
  // keep_last_n = 1: every segment but the one with b's pinned v1, a's head and
  // the active one lost its last blob and is gone already.
  auto before = s->Stats();
  ASSERT_TRUE(before.ok());
  EXPECT_LE(before->blob_log_segments, 3u);
  EXPECT_LE(Segments(path_).size(), 3u);
  // b moves on and unpins v1, whose segment then has no live blob and goes.
  Commit(s.get(), "b", MakeBlob(101, 4096));
  ASSERT_TRUE(s->Unpin("e", "b", 1).ok());
  // b's head stays in a segment whose other records (a's) are all dropped:
  // a third of it live, under blob_log_gc_live_fraction, so Compact() copies
  // b's head to the active segment and deletes it.
  for (int i = 0; i < 8; ++i) Commit(s.get(), "a", MakeBlob(300 + i, 4096));
  auto mid = s->Stats();
  ASSERT_TRUE(mid.ok());
  const auto mid_segments = Segments(path_);
  ASSERT_GE(mid_segments.size(), 2u);
  ASSERT_TRUE(s->Compact().ok());
  auto after = s->Stats();
  ASSERT_TRUE(after.ok());
  EXPECT_LT(after->blob_log_bytes + 16000, mid->blob_log_bytes);
  EXPECT_FALSE(fs::exists(path_ + "/blob-log/" + mid_segments.begin()->first))
      << "the oldest segment, a third live, was not collected";
  EXPECT_EQ(after->blob_log_live_bytes, mid->blob_log_live_bytes);
  auto report = s->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
  EXPECT_TRUE(s->ReadHeadBlob("e", "b").ok());
  EXPECT_TRUE(s->ReadHeadBlob("e", "a").ok());
  // And after a reopen.
  s.reset();
  s = Open(o);
  report = s->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
  auto reopened = s->Stats();
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(reopened->blob_log_live_bytes, after->blob_log_live_bytes);
}

// The blob cache serves RocksDB's blob files: a state in the blob log is read
// from its mapped record, so committing and reading states leaves the cache
// empty even when it could hold them all (RocksDB's blob files:
// StoreTest.ACacheThatCannotHoldTheHeadsIsNotFilled).
TEST_F(BlobLogTest, StatesInTheLogStayOutOfTheBlobCache) {
  auto s = Open(LogOptions(path_));
  Populate(s.get(), {"a", "b", "c"});
  ASSERT_TRUE(s->SizeForWorkingSet(uint64_t{1} << 20).ok());
  ASSERT_GT(s->blob_cache_capacity(), uint64_t{1} << 20);
  std::map<std::string, std::string> blobs;
  uint64_t seed = 1;
  for (const char* m : {"a", "b", "c"}) {
    blobs[m] = MakeBlob(seed++, 4096);
    Commit(s.get(), m, blobs[m]);
  }
  ASSERT_TRUE(s->Flush().ok());
  for (int round = 0; round < 2; ++round) {
    for (const auto& [m, bytes] : blobs) {
      auto read = s->ReadHeadBlob("e", m);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(read->data()), read->size()), bytes);
    }
  }
  EXPECT_EQ(s->blob_cache_usage(), 0u) << "a state of the blob log went into the blob cache";
}

// A live record that fails its checksum when garbage collection would copy it
// (for RocksDB's blob files:
// StoreCorruptionTest.DamagedBlobInCompactionDoesNotStopWrites): Compact()
// moves the intact records, keeps the segment with the damaged one, and succeeds; writes go on,
// Verify names the blob and its version, the member falls back to an intact version, and once
// retention drops the damaged record its segment goes and the store verifies clean.
TEST_F(BlobLogTest, DamagedRecordInGarbageCollectionIsKeptAndWritesGoOn) {
  StoreOptions o = LogOptions(path_);
  o.keep_last_n = 2;
  o.blob_log_gc_live_fraction = 0.9;
  // About 16 KiB each: three to a 64 KiB segment. The first holds a v1, a v2
  // and b v1; b v1 goes when b reaches v3.
  const std::string damaged = MakeBlob(2, 4096);
  {
    auto s = Open(o);
    Populate(s.get(), {"a", "b"});
    Commit(s.get(), "a", MakeBlob(1, 4096));
    Commit(s.get(), "a", damaged);
    for (uint64_t seed = 3; seed <= 6; ++seed) Commit(s.get(), "b", MakeBlob(seed, 4096));
  }
  const auto segments = Segments(path_);
  ASSERT_GE(segments.size(), 2u);
  const std::string first = path_ + "/blob-log/" + segments.begin()->first;
  std::string bytes = ReadAll(first);
  const size_t at = bytes.find(damaged);
  ASSERT_NE(at, std::string::npos) << "a v2 is not in the first segment";
  bytes[at + damaged.size() / 2] ^= 0x20;
  WriteAll(first, bytes);

  auto s = Open(o);
  Status compacted = s->Compact();
  EXPECT_TRUE(compacted.ok()) << compacted.ToString();
  EXPECT_TRUE(fs::exists(first)) << "the segment of a damaged record was deleted";
  Commit(s.get(), "b", MakeBlob(7, 4096));
  auto report = s->Verify();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 1u);
  const std::string id = BlobId::Of(damaged.data(), damaged.size()).Hex();
  EXPECT_NE(report->problems[0].find(id), std::string::npos) << report->problems[0];
  EXPECT_NE(report->problems[0].find("e/a v2"), std::string::npos) << report->problems[0];
  EXPECT_TRUE(s->ReadHeadBlob("e", "a").status().IsCorruption());

  auto restored = s->Restore("e", "a", 1, "");
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  ASSERT_TRUE(s->ReadHeadBlob("e", "a").ok());
  Commit(s.get(), "a", MakeBlob(8, 4096));
  Commit(s.get(), "a", MakeBlob(9, 4096));
  auto released = s->GetManifest("e", "a", 2);
  EXPECT_TRUE(!released.ok() || !released->holds_blob);
  compacted = s->Compact();
  EXPECT_TRUE(compacted.ok()) << compacted.ToString();
  EXPECT_FALSE(fs::exists(first)) << "the segment stayed once its damaged record was dropped";
  report = s->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
  for (const char* m : {"a", "b"}) EXPECT_TRUE(s->ReadHeadBlob("e", m).ok()) << m;
}

TEST_F(BlobLogTest, AStoreFromBeforeTheLogOpensWithItAndBack) {
  const std::string old_blob = MakeBlob(1, 4096);
  StoreOptions legacy = LogOptions(path_);
  legacy.blob_log = false;
  legacy.keep_last_n = 2;
  {
    auto s = Open(legacy);
    Populate(s.get(), {"a", "b"});
    Commit(s.get(), "a", old_blob);
    Commit(s.get(), "b", old_blob);
  }
  EXPECT_FALSE(fs::exists(path_ + "/blob-log"));
  {
    // A read-only view of a store without the blob_log family.
    auto view = Store::OpenReadOnly(legacy);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_TRUE((*view)->ReadHeadBlob("e", "a").ok());
  }
  StoreOptions with_log = legacy;
  with_log.blob_log = true;
  const std::string new_blob = MakeBlob(2, 4096);
  {
    auto s = Open(with_log);
    auto a = s->ReadHeadBlob("e", "a");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    Commit(s.get(), "a", new_blob);
    // The old blob, brought again: it moves into the log.
    Commit(s.get(), "b", old_blob);
    EXPECT_EQ(Segments(path_).size(), 1u);
    auto report = s->Verify();
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok()) << report->problems.front();
  }
  EXPECT_EQ(Segments(path_).begin()->second, new_blob.size() + old_blob.size() + size_t{2} * 48);
  {
    auto s = Open(legacy);
    auto a = s->ReadHeadBlob("e", "a");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(a->data()), a->size()), new_blob);
    Commit(s.get(), "a", MakeBlob(3, 4096));
    auto report = s->Verify();
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok()) << report->problems.front();
  }
}

// A store written before the blob log was the default: states in RocksDB's
// blob files, no blob_log family (StoreOptions::blob_log = false, the old
// default), three members of three versions each, a's first pinned.
class LegacyStoreTest : public BlobLogTest {
 protected:
  void SetUp() override {
    BlobLogTest::SetUp();
    StoreOptions legacy;
    legacy.path = path_;
    legacy.blob_log = false;
    legacy.keep_last_n = 3;
    {
      auto s = Open(legacy);
      ASSERT_NE(s, nullptr);
      Populate(s.get(), {"a", "b", "c"});
      for (int round = 0; round < 3; ++round) {
        for (const char* m : {"a", "b", "c"}) CommitNew(s.get(), m);
      }
      ASSERT_TRUE(s->Pin("e", "a", 1).ok());
      ASSERT_TRUE(s->Flush().ok());
    }
    ASSERT_FALSE(fs::exists(path_ + "/blob-log"));
    ASSERT_GT(BlobFileBytes(), 0u) << "the legacy store put no state in RocksDB's blob files";
    defaults_.path = path_;  // the blob log, as every binary now opens a store
    defaults_.keep_last_n = 3;
  }

  // Commits a new state as member's next version; returns its size.
  uint64_t CommitNew(Store* s, const std::string& member) {
    const std::string blob = MakeBlob(seed_++, 4096);
    states_[{member, Commit(s, member, blob)}] = blob;
    return blob.size();
  }

  // The bytes of RocksDB's blob files.
  uint64_t BlobFileBytes() const {
    uint64_t bytes = 0;
    for (const auto& e : fs::directory_iterator(path_)) {
      if (e.path().extension() == ".blob") bytes += fs::file_size(e.path());
    }
    return bytes;
  }

  // Reads every version committed that still holds its blob and compares its
  // bytes; returns how many.
  int ReadEvery(Store* s) {
    int held = 0;
    for (const auto& [key, bytes] : states_) {
      auto m = s->GetManifest("e", key.first, key.second);
      if (!m.ok() || !m->holds_blob) continue;
      auto read = s->ReadBlob(m->blob);
      EXPECT_TRUE(read.ok()) << key.first << " v" << key.second << ": " << read.status().ToString();
      if (!read.ok()) continue;
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(read->data()), read->size()), bytes)
          << key.first << " v" << key.second;
      ++held;
    }
    return held;
  }

  static void ExpectVerifiesClean(Store* s) {
    auto report = s->Verify();
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_TRUE(report->ok()) << report->problems.front();
  }

  StoreOptions defaults_;
  // Every version committed, and its bytes.
  std::map<std::pair<std::string, int64_t>, std::string> states_;
  uint64_t seed_ = 1;
};

// Opened with the default options, every state the legacy store holds reads
// back, an exploit shares an old state, retention releases old states, new
// states go to the blob log, and after a reopen, and in a read-only view, all
// of it still reads and verifies.
TEST_F(LegacyStoreTest, OpensWithTheDefaultAndReadsEveryState) {
  {
    auto s = Open(defaults_);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(ReadEvery(s.get()), 9);
    // c takes a's head, a state from before: metadata only.
    auto exploited = s->Exploit("e", "c", "a", {{"lr", 0.2}}, "");
    ASSERT_TRUE(exploited.ok()) << exploited.status().ToString();
    states_[{"c", *exploited}] = states_[{"a", 3}];
    // Two new states each for a and b: they go to the log, and retention
    // releases a's v2 and b's v1 and v2 (a's v1 is pinned).
    uint64_t new_bytes = 0;
    for (int round = 0; round < 2; ++round) {
      for (const char* m : {"a", "b"}) new_bytes += CommitNew(s.get(), m) + 48;
    }
    const auto segments = Segments(path_);
    ASSERT_EQ(segments.size(), 1u) << "new states did not go to the blob log";
    EXPECT_EQ(segments.begin()->second, new_bytes);
    EXPECT_FALSE(s->GetManifest("e", "b", 1).ok() && s->GetManifest("e", "b", 1)->holds_blob);
    // a v1 (pinned) and v3-v5, b v3-v5, c v2-v4 (v4: the exploit).
    EXPECT_EQ(ReadEvery(s.get()), 10);
    ExpectVerifiesClean(s.get());
  }
  {
    auto s = Open(defaults_);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(ReadEvery(s.get()), 10);
    CommitNew(s.get(), "c");  // c v5, releasing c v2
    ExpectVerifiesClean(s.get());
  }
  auto view = Store::OpenReadOnly(defaults_);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(ReadEvery(view->get()), 10);
}

// Opened with the default options, an old state is restored (metadata only,
// the restored version reads the old bytes), and once retention releases the
// other old states, Compact() takes their space out of RocksDB's blob files
// while the pinned and restored one stays readable and the store verifies.
TEST_F(LegacyStoreTest, RestoresAndCollectsItsOldStatesWithTheDefault) {
  auto s = Open(defaults_);
  ASSERT_NE(s, nullptr);
  auto restored = s->Restore("e", "b", 2, "");
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  const std::string old_state = states_[{"b", 2}];
  states_[{"b", *restored}] = old_state;
  {
    auto head = s->ReadHeadBlob("e", "b");  // released before the store closes
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(head->data()), head->size()), old_state);
  }
  // Three new states each: every old state but a v1 (pinned) and b v2 (b's
  // restored head, one of its last three) is released.
  for (int round = 0; round < 3; ++round) {
    for (const char* m : {"a", "c"}) CommitNew(s.get(), m);
  }
  CommitNew(s.get(), "b");
  CommitNew(s.get(), "b");
  EXPECT_FALSE(Segments(path_).empty()) << "new states did not go to the blob log";
  // a v1 (pinned), v4-v6; b v4 (b v2's state), v5, v6; c v4-v6.
  EXPECT_EQ(ReadEvery(s.get()), 10);
  const uint64_t before = BlobFileBytes();
  ASSERT_TRUE(s->Compact().ok());
  // Nine old states were in the blob files; two stay.
  EXPECT_LT(BlobFileBytes(), before / 2) << "Compact() left the released old states' space";
  EXPECT_EQ(ReadEvery(s.get()), 10);
  ExpectVerifiesClean(s.get());
  s.reset();
  s = Open(defaults_);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(ReadEvery(s.get()), 10);
  ExpectVerifiesClean(s.get());
}

// The blob log's kill points, in the process tests' child: the store, opened
// again, has every version acknowledged before the kill and verifies clean.
TEST_F(BlobLogTest, SigkillAtTheBlobLogsKillPointsLosesNothingAcknowledged) {
  struct Case {
    const char* point;
    int64_t a_after;
  };
  // The child commits a twice (its first write with a blob is a's v1).
  const Case cases[] = {{"blob.before_sync", 0},
                        {"blob.after_sync", 0},
                        {"commit.before_write", 0},
                        {"commit.after_write", 1}};
  // The child's mode goes through the environment; the suite's own is kept.
  const char* suite_mode = std::getenv(kBlobLogVariable);
  const std::string saved = suite_mode != nullptr ? suite_mode : "";
  for (const char* mode : {"1", "sync"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.point) + " blob log " + mode);
      TempDir dir;
      const std::string path = dir.Sub("db");
      setenv(kBlobLogVariable, mode, 1);
      Child child({CKPT_STORE_TEST_CHILD, "kill-at", path, c.point});
      auto lines = child.ReadAllLines();
      const int status = child.Wait();
      if (suite_mode != nullptr) {
        setenv(kBlobLogVariable, saved.c_str(), 1);
      } else {
        unsetenv(kBlobLogVariable);
      }
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
      ASSERT_FALSE(lines.empty());
      StoreOptions o = LogOptions(path);
      auto s = Open(o);
      ASSERT_NE(s, nullptr);
      auto a = s->GetMember("crash", "a");
      ASSERT_TRUE(a.ok());
      EXPECT_EQ(a->version, c.a_after);
      if (a->version > 0) {
        EXPECT_TRUE(s->ReadHeadBlob("crash", "a").ok());
      }
      auto report = s->Verify();
      ASSERT_TRUE(report.ok());
      EXPECT_TRUE(report->ok()) << report->problems.front();
      // The store goes on: a record the kill left unnamed is garbage.
      Commit(s.get(), "a", MakeBlob(9, 1024), "crash");
    }
  }
}

}  // namespace
}  // namespace ckpt::store::testing
