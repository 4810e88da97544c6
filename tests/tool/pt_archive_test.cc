// The zip directory check before LibTorch reads a .pt archive
// (tools/src/pt_archive.h), on archives built here: a record that is
// compressed, or claims more than the file, is refused before the reader
// allocates what it claims; and, with the .pt module, ReadPtFile refuses a
// deflated bomb without holding it (peak RSS measured).
#include "pt_archive.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "peak_rss.h"
#include "pt_io.h"

namespace ckpt::tool {
namespace {

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// An entry of a zip built here: `data` stored as it is, or `zeros` zero
// bytes deflated (streamed through zlib, never held).
struct Entry {
  std::string name;
  std::string data;
  size_t zeros = 0;
  bool deflated = false;
  // Stored entries: the uncompressed size the directory claims, when not 0.
  uint32_t claimed = 0;
};

std::string Deflate(size_t zeros, uint32_t* crc) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  const std::string block(1 << 20, '\0');
  std::string out;
  std::vector<char> buf(1 << 16);
  *crc = crc32(0, nullptr, 0);
  for (size_t left = zeros;;) {
    const size_t n = std::min(left, block.size());
    *crc = crc32(*crc, reinterpret_cast<const Bytef*>(block.data()), static_cast<uInt>(n));
    left -= n;
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(block.data()));
    z.avail_in = static_cast<uInt>(n);
    int r;
    do {
      z.next_out = reinterpret_cast<Bytef*>(buf.data());
      z.avail_out = static_cast<uInt>(buf.size());
      r = deflate(&z, left == 0 ? Z_FINISH : Z_NO_FLUSH);
      out.append(buf.data(), buf.size() - z.avail_out);
    } while (z.avail_out == 0 || (left == 0 && r != Z_STREAM_END));
    if (left == 0) break;
  }
  deflateEnd(&z);
  return out;
}

// A zip archive of `entries` (no ZIP64, no data descriptors).
std::string Zip(const std::vector<Entry>& entries) {
  std::string file, dir;
  for (const Entry& e : entries) {
    uint32_t crc = 0;
    std::string body = e.data;
    uint64_t size = e.data.size();
    if (e.deflated) {
      body = Deflate(e.zeros, &crc);
      size = e.zeros;
    } else {
      crc = crc32(0, reinterpret_cast<const Bytef*>(e.data.data()), static_cast<uInt>(size));
      if (e.claimed != 0) size = e.claimed;
    }
    const uint64_t offset = file.size();
    auto common = [&](std::string* out) {
      PutLe(out, 20, 2);                               // version needed
      PutLe(out, 0, 2);                                // flags
      PutLe(out, e.deflated ? 8 : 0, 2);               // method
      PutLe(out, 0, 4);                                // time, date
      PutLe(out, crc, 4);                              // CRC-32
      PutLe(out, e.deflated ? body.size() : size, 4);  // compressed
      PutLe(out, size, 4);                             // uncompressed
      PutLe(out, e.name.size(), 2);                    // name length
      PutLe(out, 0, 2);                                // extra length
    };
    PutLe(&file, 0x04034b50, 4);
    common(&file);
    file += e.name + body;
    PutLe(&dir, 0x02014b50, 4);
    PutLe(&dir, 20, 2);  // version made by
    common(&dir);
    PutLe(&dir, 0, 6);  // comment length, disk, internal attributes
    PutLe(&dir, 0, 4);  // external attributes
    PutLe(&dir, offset, 4);
    dir += e.name;
  }
  const uint64_t dir_offset = file.size();
  file += dir;
  PutLe(&file, 0x06054b50, 4);
  PutLe(&file, 0, 4);  // disks
  PutLe(&file, entries.size(), 2);
  PutLe(&file, entries.size(), 2);
  PutLe(&file, dir.size(), 4);
  PutLe(&file, dir_offset, 4);
  PutLe(&file, 0, 2);  // comment length
  return file;
}

class PtArchiveTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path =
        ::testing::TempDir() + "/pt_archive_" + std::to_string(getpid()) + "_" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    paths_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const auto& p : paths_) unlink(p.c_str());
  }

 private:
  std::vector<std::string> paths_;
};

// The pickle of an empty dict, protocol 2.
const std::string kEmptyDict("\x80\x02}q\x00.", 6);

TEST_F(PtArchiveTest, StoredRecordsPass) {
  const std::string path =
      Write("stored.pt", Zip({{"archive/data.pkl", kEmptyDict}, {"archive/version", "3\n"}}));
  EXPECT_TRUE(CheckPtRecordsStored(path).ok()) << CheckPtRecordsStored(path).ToString();
}

// A data.pkl of 256 MiB of zeros deflated to a quarter of a megabyte:
// refused by its entry, before anything inflates it.
TEST_F(PtArchiveTest, ACompressedRecordIsRefused) {
  const std::string path =
      Write("bomb.pt",
            Zip({{"archive/data.pkl", "", size_t{256} << 20, true}, {"archive/version", "3\n"}}));
  const Status s = CheckPtRecordsStored(path);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find(path + ": record archive/data.pkl is compressed (zip method 8)"),
            std::string::npos)
      << s.ToString();
}

TEST_F(PtArchiveTest, ARecordClaimingMoreThanTheFileIsRefused) {
  const std::string path =
      Write("claims.pt", Zip({{"archive/data.pkl", kEmptyDict, 0, false, uint32_t{1} << 31},
                              {"archive/version", "3\n"}}));
  const Status s = CheckPtRecordsStored(path);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("record archive/data.pkl claims 2147483648 bytes, more than the"),
            std::string::npos)
      << s.ToString();
}

TEST_F(PtArchiveTest, ADamagedDirectoryIsNotAReadableArchive) {
  const std::string good = Zip({{"archive/data.pkl", kEmptyDict}, {"archive/version", "3\n"}});
  for (const std::string& bytes :
       {std::string(5000, 'x'), good.substr(0, good.size() / 2), good.substr(0, 10)}) {
    const std::string path = Write("damaged.pt", bytes);
    const Status s = CheckPtRecordsStored(path);
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find(path + " is not a readable .pt archive"), std::string::npos)
        << s.ToString();
  }
  // The directory's offset moved past the file's end.
  std::string moved = good;
  moved[moved.size() - 3] = '\x7f';
  const std::string path = Write("moved.pt", moved);
  EXPECT_NE(CheckPtRecordsStored(path).message().find("its zip directory lies outside the file"),
            std::string::npos)
      << CheckPtRecordsStored(path).ToString();
}

#ifdef CKPT_TOOL_PT_MODULE_PATH
using ckpt::tool::test_support::PeakRssBytes;

// Through the .pt module, as `ckpt-tool import` reads: a file torch.save's
// writer made passes the check (ZIP64 end records included), and the bomb is
// refused without the 256 MiB LibTorch's reader allocated and filled for it.
TEST_F(PtArchiveTest, ReadPtFileRefusesADeflatedBombWithoutHoldingIt) {
  setenv("CKPT_TOOL_PT_MODULE", CKPT_TOOL_PT_MODULE_PATH, 1);
  PyValue dict;
  dict.kind = PyValue::Kind::kDict;
  const std::string good = Write("good.pt", "");
  ASSERT_TRUE(WritePtFile(good, dict).ok());
  EXPECT_TRUE(CheckPtRecordsStored(good).ok()) << CheckPtRecordsStored(good).ToString();
  auto read = ReadPtFile(good, size_t{1} << 30);
  ASSERT_TRUE(read.ok()) << read.status().ToString();

  const std::string bomb =
      Write("bomb.pt",
            Zip({{"archive/data.pkl", "", size_t{256} << 20, true}, {"archive/version", "3\n"}}));
  const int64_t before = PeakRssBytes();
  read = ReadPtFile(bomb, size_t{1} << 30);
  const int64_t grown = PeakRssBytes() - before;
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("record archive/data.pkl is compressed"),
            std::string::npos)
      << read.status().ToString();
  EXPECT_LT(grown, int64_t{64} << 20) << "the record inflates to 256 MiB";
}
#endif

}  // namespace
}  // namespace ckpt::tool
