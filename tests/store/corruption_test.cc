// Single-byte flips in a stored blob, made in the RocksDB blob file on disk,
// are caught by Verify and by every verified read.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "ckpt/store/store.h"
#include "test_util.h"

namespace ckpt::store::testing {
namespace {

// Finds `needle` in the files named *.blob under `dir`; returns the file and offset.
bool FindInBlobFiles(const std::string& dir, const std::string& needle, std::string* file,
                     size_t* offset) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".blob") continue;
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
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.path().extension() == ".blob") std::filesystem::resize_file(entry.path(), 0);
  }
  auto opened = Store::Open(TestOptions(path));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto report = (*opened)->Verify();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_FALSE(report->ok());
  EXPECT_NE(report->problems[0].find("e/m v1"), std::string::npos) << report->problems[0];
}

}  // namespace
}  // namespace ckpt::store::testing
