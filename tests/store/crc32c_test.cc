// The CRC32C that RocksDB puts on its WAL and blob-file records is ckpt's
// (ISA-L, store/src/crc32c_isal.cc), and it is RocksDB's own bit for bit: the
// library's loop, found past this executable with dlsym(RTLD_NEXT), gives the
// same value for every length, alignment and starting value tried.
#include <dlfcn.h>
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

namespace rocksdb::crc32c {
uint32_t Extend(uint32_t init_crc, const char* data, size_t n);  // util/crc32c.h
}  // namespace rocksdb::crc32c

namespace ckpt::store {
namespace {

using ExtendFn = uint32_t (*)(uint32_t, const char*, size_t);
constexpr const char* kExtendSymbol = "_ZN7rocksdb6crc32c6ExtendEjPKcm";

ExtendFn RocksDbsOwn() { return reinterpret_cast<ExtendFn>(dlsym(RTLD_NEXT, kExtendSymbol)); }

TEST(StoreCrc32c, RocksDbCallsCkptsThroughItsLinkageTable) {
  EXPECT_STREQ(Crc32cImplementation(), "isa-l");
  // What the dynamic linker binds RocksDB's calls to.
  EXPECT_EQ(dlsym(RTLD_DEFAULT, kExtendSymbol), reinterpret_cast<void*>(&rocksdb::crc32c::Extend));
  ExtendFn own = RocksDbsOwn();
  ASSERT_NE(own, nullptr) << "librocksdb defines no " << kExtendSymbol
                          << ": linked statically, ckpt's CRC32C would not be used";
  EXPECT_NE(reinterpret_cast<void*>(own), reinterpret_cast<void*>(&rocksdb::crc32c::Extend));
}

TEST(StoreCrc32c, KnownAnswers) {
  // RFC 3720 (iSCSI), B.4: the check value of "123456789", and 32 zero bytes.
  EXPECT_EQ(rocksdb::crc32c::Extend(0, "123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(rocksdb::crc32c::Extend(0, zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(rocksdb::crc32c::Extend(0, nullptr, 0), 0u);
  // Extending in two pieces is the value of the whole.
  EXPECT_EQ(rocksdb::crc32c::Extend(rocksdb::crc32c::Extend(0, "1234", 4), "56789", 5),
            0xE3069283u);
}

TEST(StoreCrc32c, IsRocksDbsOwnBitForBit) {
  ExtendFn own = RocksDbsOwn();
  ASSERT_NE(own, nullptr);
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
      ASSERT_EQ(rocksdb::crc32c::Extend(init, p, len), own(init, p, len))
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
