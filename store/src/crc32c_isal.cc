// The CRC32C that RocksDB computes over every WAL record and blob-file record,
// taken by ISA-L (Debian's libisal) instead of RocksDB's table-driven loop.
//
// Why: Debian's librocksdb is built portable, without SSE4.2, so its CRC32C is
// `ExtendImpl<Slow_CRC32>`, 8 bytes per step through lookup tables: 1.37 GB/s
// on an AMD EPYC of family 25 (Zen 4), 365 us for a LeNet-5 state of 0.5 MB,
// against ISA-L's 50 GB/s (PCLMUL/AVX-512 folding) on the same core. A commit
// of a state runs it twice over the state's bytes (its WAL record, then its
// blob-file record at the flush), so at 2,000 commits/s the table loop alone
// would need about 1.5 cores (bench/RESULTS.md).
//
// How: ckpt links the shared librocksdb, whose own calls to
// rocksdb::crc32c::Extend (the WAL writer and reader, the blob log writer and
// reader, block checksums) go through its procedure linkage table. This file
// defines that function in the executable; the linker exports a symbol that a
// linked shared library also defines, so the dynamic linker binds every one of
// those calls here, as it binds libc's calls to a malloc an executable defines.
// Same polynomial (Castagnoli), same convention (the running value inverted on
// the way in and out), so the bytes on disk are the ones RocksDB's own code
// writes and reads: a store written by either reads with the other.
// `StoreCrc32c.IsRocksDbsOwnBitForBit` compares the two on random buffers
// (RocksDB's own found past this executable, RocksDbCrc32cFunctions), and
// `StoreCrc32c.RocksDbCallsCkptsThroughItsLinkageTable` that this one is the
// one RocksDB calls.
//
// Only Extend is replaced; RocksDB's Crc32cCombine and IsFastCrc32Supported
// (whose "Not supported" in the LOG speaks of its own loop) stay the
// library's. When the executable does not export the symbol (a store linked
// into a shared object of its own), RocksDB keeps its loop and
// Crc32cImplementation() says so.
#include <dlfcn.h>
#include <isa-l/crc.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "ckpt/store/store.h"

namespace rocksdb::crc32c {

// The declaration of RocksDB's util/crc32c.h, which Debian does not install:
// the CRC32C of data[0, n) continuing from init_crc (0 to start).
uint32_t Extend(uint32_t init_crc, const char* data, size_t n);

__attribute__((visibility("default"))) uint32_t Extend(uint32_t init_crc, const char* data,
                                                       size_t n) {
  // ISA-L keeps the running value inverted, RocksDB the final one: invert on
  // the way in and out. Its length is an int: buffers past 1 GiB go in pieces.
  constexpr size_t kPiece = size_t{1} << 30;
  uint32_t crc = ~init_crc;
  auto* p = reinterpret_cast<unsigned char*>(const_cast<char*>(data));  // ISA-L reads only
  while (n > 0) {
    const size_t len = n < kPiece ? n : kPiece;
    crc = crc32_iscsi(p, static_cast<int>(len), crc);
    p += len;
    n -= len;
  }
  return ~crc;
}

}  // namespace rocksdb::crc32c

namespace ckpt::store {

Crc32cFunctions RocksDbCrc32cFunctions() {
  // RocksDB's calls bind to the definition the dynamic linker finds first
  // (this one when the executable exports it); the library's own is the
  // next one past this executable.
  constexpr const char* kExtend = "_ZN7rocksdb6crc32c6ExtendEjPKcm";
  Crc32cFunctions f;
  f.bound = reinterpret_cast<Crc32cFn>(dlsym(RTLD_DEFAULT, kExtend));
  f.library = reinterpret_cast<Crc32cFn>(dlsym(RTLD_NEXT, kExtend));
  return f;
}

const char* Crc32cImplementation() {
  return RocksDbCrc32cFunctions().bound == &rocksdb::crc32c::Extend ? "isa-l" : "rocksdb";
}

}  // namespace ckpt::store
