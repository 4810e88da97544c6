// Single-byte flips in a stored blob, made on disk in the blob log's segment
// or the RocksDB blob file that holds it, are caught by Verify and by every
// verified read.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "ckpt/store/store.h"
#include "test_util.h"

namespace ckpt::store::testing {
namespace {

// True for RocksDB's blob files and the blob log's segments
// (StoreOptions::blob_log, TestOptions' default unless
// CKPT_STORE_TEST_BLOB_LOG=off).
bool HoldsBlobs(const std::filesystem::path& file) {
  return file.extension() == ".blob" || file.extension() == ".seg";
}

// Finds `needle` in the files holding blobs under `dir`; returns the file and offset.
bool FindInBlobFiles(const std::string& dir, const std::string& needle, std::string* file,
                     size_t* offset) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!HoldsBlobs(entry.path())) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t at = content.find(needle);
    if (at != std::string::npos) {
      *file = entry.path().string();
      *offset = at;
      return true;
    }
  }
  return false;
}

void FlipByte(const std::string& file, size_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(c);
  f.flush();
  ASSERT_TRUE(f.good());
}

// With blob_cache_bytes = 0 every read goes to the blob file; with the default
// cache a read may be served from memory (the bytes as committed), so the
// flip must be caught by Verify, which reads the disk, and by a fresh reader.
class StoreCorruptionTest : public ::testing::TestWithParam<bool> {};

TEST_P(StoreCorruptionTest, EveryFlippedByteIsCaughtByVerifyAndByRead) {
  const bool cached = GetParam();
  TempDir dir;
  const std::string path = dir.Sub("db");
  StoreOptions options = TestOptions(path);
  if (!cached) options.blob_cache_bytes = 0;
  auto opened = Store::Open(options);
  ASSERT_TRUE(opened.ok());
  Store* store = opened->get();
  ASSERT_TRUE(store->CreateExperiment("e", "{}").ok());
  ASSERT_TRUE(store->CreateMember("e", "m7", {}).ok());
  const std::string blob = MakeBlob(3, 2048);
  CommitRequest req;
  req.exp = "e";
  req.member = "m7";
  req.blob = blob.data();
  req.blob_size = blob.size();
  ASSERT_TRUE(store->CommitResult(req).ok());
  ASSERT_TRUE(store->Flush().ok());
  const BlobId id = BlobId::Of(blob.data(), blob.size());

  std::string file;
  size_t base = 0;
  ASSERT_TRUE(FindInBlobFiles(path, blob, &file, &base));
  auto parsed = format::ParseCheckpoint(blob.data(), blob.size());
  ASSERT_TRUE(parsed.ok());
  const size_t header = parsed->header_bytes();

  // The length prefix, the JSON header (including its padding), every tensor,
  // and a stride through the whole blob.
  std::vector<size_t> positions = {0,
                                   3,
                                   7,
                                   8,
                                   9,
                                   header / 2,
                                   header - 2,
                                   header - 1,
                                   header,
                                   header + 1,
                                   blob.size() / 2,
                                   blob.size() - 64,
                                   blob.size() - 1};
  for (size_t p = 11; p < blob.size(); p += blob.size() / 16) positions.push_back(p);
  StoreOptions fresh = TestOptions(path);
  fresh.blob_cache_bytes = 0;
  for (size_t pos : positions) {
    SCOPED_TRACE("byte " + std::to_string(pos) + " of " + std::to_string(blob.size()));
    FlipByte(file, base + pos);
    auto view = Store::OpenReadOnly(fresh);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    for (Store* reader : {store, view->get()}) {
      if (cached && reader == store) continue;
      auto read = reader->ReadBlob(id);
      EXPECT_TRUE(read.status().IsCorruption()) << read.status().ToString();
      EXPECT_NE(read.status().message().find(id.Hex()), std::string::npos);
      if (pos >= header) {
        EXPECT_NE(read.status().message().find("tensor"), std::string::npos)
            << read.status().message();
      }
      auto head = reader->ReadHeadBlob("e", "m7");
      EXPECT_TRUE(head.status().IsCorruption());
      EXPECT_NE(head.status().message().find("e/m7"), std::string::npos);
    }
    auto report = store->Verify();
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_EQ(report->problems.size(), 1u);
    EXPECT_NE(report->problems[0].find(id.Hex()), std::string::npos);
    EXPECT_NE(report->problems[0].find("e/m7"), std::string::npos);
    FlipByte(file, base + pos);
    ASSERT_TRUE(store->ReadBlob(id).ok());
  }
  auto report = store->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
  EXPECT_EQ(report->blobs_checked, 1u);
  EXPECT_EQ(report->bytes_checked, blob.size());
}

INSTANTIATE_TEST_SUITE_P(BlobCache, StoreCorruptionTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Cached" : "Uncached");
                         });

TEST(StoreVerifyTest, ReportsAManifestWhoseBlobIsMissing) {
  // A blob file deleted behind the store's back: the manifest that points at
  // it is named.
  TempDir dir;
  const std::string path = dir.Sub("db");
  {
    auto opened = Store::Open(TestOptions(path));
    ASSERT_TRUE(opened.ok());
    ASSERT_TRUE((*opened)->CreateExperiment("e", "{}").ok());
    ASSERT_TRUE((*opened)->CreateMember("e", "m", {}).ok());
    const std::string blob = MakeBlob(9);
    CommitRequest req;
    req.exp = "e";
    req.member = "m";
    req.blob = blob.data();
    req.blob_size = blob.size();
    ASSERT_TRUE((*opened)->CommitResult(req).ok());
    ASSERT_TRUE((*opened)->Flush().ok());
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
    if (HoldsBlobs(entry.path())) std::filesystem::resize_file(entry.path(), 0);
  }
  auto opened = Store::Open(TestOptions(path));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto report = (*opened)->Verify();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_FALSE(report->ok());
  EXPECT_NE(report->problems[0].find("e/m v1"), std::string::npos) << report->problems[0];
}

// A damaged blob in a blob file that blob garbage collection relocates: the
// compaction fails on the blob's CRC. It used to leave RocksDB with a
// background error that refused every later write (and every reopen's first
// write). Now the failed compaction is set aside (TakeBackgroundErrors),
// commits go on, Verify names the damaged blob, the member falls back to its
// newest intact version, and once retention releases the damaged blob the
// compaction drops it without reading it: the store verifies clean again.
// RocksDB's blob files only; a damaged record in the blob log's garbage
// collection: BlobLogTest.DamagedRecordInGarbageCollectionIsKeptAndWritesGoOn.
TEST(StoreCorruptionTest, DamagedBlobInCompactionDoesNotStopWrites) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  StoreOptions options = TestOptions(path);
  options.blob_log = false;
  options.blob_cache_bytes = 0;
  options.keep_last_n = 2;
  options.keep_best_k = 0;
  std::string damaged_blob;
  BlobId damaged_id;
  {
    auto opened = Store::Open(options);
    ASSERT_TRUE(opened.ok());
    Store* store = opened->get();
    ASSERT_TRUE(store->CreateExperiment("e", "{}").ok());
    ASSERT_TRUE(store->CreateMembers("e", {{"a", {}}, {"b", {}}}).ok());
    std::map<std::string, int64_t> heads = {{"a", 0}, {"b", 0}};
    uint64_t seed = 100;
    auto commit = [&](const std::string& member, std::string* kept = nullptr) {
      const std::string blob = MakeBlob(seed++, 4096, heads[member] + 1);
      CommitRequest req;
      req.exp = "e";
      req.member = member;
      req.expected_head_version = heads[member];
      req.blob = blob.data();
      req.blob_size = blob.size();
      auto v = store->CommitResult(req);
      if (v.ok()) heads[member] = *v;
      if (kept) *kept = blob;
      return v.status();
    };
    ASSERT_TRUE(commit("a").ok());
    ASSERT_TRUE(commit("b").ok());
    ASSERT_TRUE(commit("a", &damaged_blob).ok());  // a v2: to be damaged
    ASSERT_TRUE(commit("b").ok());
    ASSERT_TRUE(store->Flush().ok());
    damaged_id = BlobId::Of(damaged_blob.data(), damaged_blob.size());

    std::string file;
    size_t at = 0;
    ASSERT_TRUE(FindInBlobFiles(path, damaged_blob, &file, &at));
    FlipByte(file, at + damaged_blob.size() / 2);

    // Blob GC relocates every blob (Compact forces it): the damaged one fails.
    Status compacted = store->Compact();
    EXPECT_TRUE(compacted.IsCorruption()) << compacted.ToString();
    std::vector<std::string> errors = store->TakeBackgroundErrors();
    ASSERT_FALSE(errors.empty());
    EXPECT_NE(errors[0].find(path), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("Corruption"), std::string::npos) << errors[0];
    EXPECT_TRUE(store->TakeBackgroundErrors().empty()) << "taken once";

    // Writes go on.
    Status s = commit("b");
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto report = store->Verify();
    ASSERT_TRUE(report.ok());
    ASSERT_EQ(report->problems.size(), 1u);
    EXPECT_NE(report->problems[0].find(damaged_id.Hex()), std::string::npos);
    EXPECT_NE(report->problems[0].find("e/a v2"), std::string::npos) << report->problems[0];
    EXPECT_TRUE(store->ReadHeadBlob("e", "a").status().IsCorruption());

    // The member falls back to its newest intact version and trains on:
    // retention (keep_last_n 2) releases the damaged blob.
    auto restored = store->Restore("e", "a", 1, "");
    ASSERT_TRUE(restored.ok()) << restored.status().ToString();
    heads["a"] = *restored;
    ASSERT_TRUE(store->ReadHeadBlob("e", "a").ok());
    for (int i = 0; i < 2; ++i) {
      s = commit("a");
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    auto released = store->GetManifest("e", "a", 2);
    EXPECT_TRUE(!released.ok() || !released->holds_blob);
    ASSERT_TRUE(store->Flush().ok());
    compacted = store->Compact();
    EXPECT_TRUE(compacted.ok()) << compacted.ToString();
    EXPECT_TRUE(store->TakeBackgroundErrors().empty());
    report = store->Verify();
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok()) << report->problems.front();
  }
  // Reopened: writable at once, clean.
  auto reopened = Store::Open(options);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  ASSERT_TRUE((*reopened)->SetMemberState("e", "a", "after").ok());
  auto report = (*reopened)->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

// Content addressing meets damage: a member that fell back from a damaged
// head retrains to the very same bytes. The commit must not reuse the damaged
// copy on disk (found by ckpt-chaos: the member fell back and retrained
// forever, each new head the damaged blob again).
TEST(StoreCorruptionTest, CommittingTheSameBytesReplacesADamagedStoredCopy) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  StoreOptions options = TestOptions(path);
  options.blob_cache_bytes = 0;
  auto opened = Store::Open(options);
  ASSERT_TRUE(opened.ok());
  Store* store = opened->get();
  ASSERT_TRUE(store->CreateExperiment("e", "{}").ok());
  ASSERT_TRUE(store->CreateMember("e", "a", {}).ok());
  const std::string first = MakeBlob(1, 2048, 1);
  const std::string second = MakeBlob(2, 2048, 2);
  CommitRequest req;
  req.exp = "e";
  req.member = "a";
  req.blob = first.data();
  req.blob_size = first.size();
  ASSERT_TRUE(store->CommitResult(req).ok());  // v1
  req.expected_head_version = 1;
  req.blob = second.data();
  req.blob_size = second.size();
  ASSERT_TRUE(store->CommitResult(req).ok());  // v2
  ASSERT_TRUE(store->Flush().ok());
  std::string file;
  size_t at = 0;
  ASSERT_TRUE(FindInBlobFiles(path, second, &file, &at));
  FlipByte(file, at + second.size() / 2);
  ASSERT_TRUE(store->ReadHeadBlob("e", "a").status().IsCorruption());

  // Fall back to v1 (v3), retrain to the same bytes as v2 (v4).
  ASSERT_TRUE(store->Restore("e", "a", 1, "").ok());
  req.expected_head_version = 3;
  auto v = store->CommitResult(req);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 4);
  auto head = store->ReadHeadBlob("e", "a");
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(head->data()), head->size()), second);
  // v2 holds the same blob id: it reads intact too now.
  auto report = store->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

}  // namespace
}  // namespace ckpt::store::testing
