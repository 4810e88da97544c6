// The CRC32C that RocksDB puts on its WAL and blob-file records is ckpt's
// (ISA-L, store/src/crc32c_isal.cc), and it is RocksDB's own bit for bit: the
// library's loop, found past this executable, gives the same value for every
// length, alignment and starting value tried.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/store/store.h"
#include "test_util.h"

namespace ckpt::store {
namespace {

TEST(StoreCrc32c, RocksDbCallsCkptsThroughItsLinkageTable) {
  EXPECT_STREQ(Crc32cImplementation(), "isa-l");
  const Crc32cFunctions f = RocksDbCrc32cFunctions();
  ASSERT_NE(f.bound, nullptr);
  ASSERT_NE(f.library, nullptr) << "librocksdb defines no rocksdb::crc32c::Extend of its own "
                                   "past this executable: linked statically, its calls would "
                                   "not reach ckpt's";
  EXPECT_NE(f.bound, f.library);
}

TEST(StoreCrc32c, KnownAnswers) {
  const Crc32cFn crc = RocksDbCrc32cFunctions().bound;
  ASSERT_NE(crc, nullptr);
  // RFC 3720 (iSCSI), B.4: the check value of "123456789", and 32 zero bytes.
  EXPECT_EQ(crc(0, "123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc(0, zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc(0, nullptr, 0), 0u);
  // Extending in two pieces is the value of the whole.
  EXPECT_EQ(crc(crc(0, "1234", 4), "56789", 5), 0xE3069283u);
}

TEST(StoreCrc32c, IsRocksDbsOwnBitForBit) {
  const Crc32cFunctions f = RocksDbCrc32cFunctions();
  ASSERT_NE(f.bound, nullptr);
  ASSERT_NE(f.library, nullptr);
  std::mt19937_64 rng(20261206);
  std::vector<char> buf(600'000 + 64);
  for (char& c : buf) c = static_cast<char>(rng());
  std::vector<size_t> lengths = {0,     1,     2,     3,      7,       8,       9,      15,   16,
                                 17,    31,    32,    33,     63,      64,      65,     127,  128,
                                 255,   256,   257,   1023,   1024,    4095,    4096,   4097, 32767,
                                 32768, 32769, 65536, 131072, 500'000, 500'832, 600'000};
  for (int i = 0; i < 200; ++i) lengths.push_back(rng() % 70'000);
  int checked = 0;
  for (size_t len : lengths) {
    for (size_t offset : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{13}}) {
      const uint32_t init = (checked % 3 == 0) ? 0u : static_cast<uint32_t>(rng());
      const char* p = buf.data() + offset;
      ASSERT_EQ(f.bound(init, p, len), f.library(init, p, len))
          << "length " << len << ", offset " << offset << ", starting value " << init;
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(lengths.size()) * 5);
}

TEST(StoreCrc32c, AStoreSaysInItsLogWhichCodeComputesIt) {
  testing::TempDir dir;
  {
    auto s = Store::Open(testing::TestOptions(dir.path()));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->CreateExperiment("e", R"({"name":"e"})").ok());
  }
  std::ifstream log(dir.path() + "/LOG");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("the CRC32C of WAL and blob-file records is computed by isa-l"),
            std::string::npos)
      << text.str().substr(0, 2000);
}

}  // namespace
}  // namespace ckpt::store
