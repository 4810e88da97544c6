// The merge operator of the refs column family: values are i64 little-endian
// reference counts and a merge operand is a signed delta, so a commit adds a
// reference with a blind write instead of a read-modify-write.
//
// Thread-safety: stateless; shared by RocksDB threads.
#ifndef CKPT_STORE_SRC_REFCOUNT_MERGE_H_
#define CKPT_STORE_SRC_REFCOUNT_MERGE_H_

#include <rocksdb/merge_operator.h>

#include <memory>

namespace ckpt::store {

// Name "ckpt.RefCountAdd"; the existing count (0 when absent) plus every delta.
// A malformed value or operand fails the merge (RocksDB reports Corruption).
std::shared_ptr<rocksdb::MergeOperator> NewRefCountMergeOperator();

}  // namespace ckpt::store

#endif  // CKPT_STORE_SRC_REFCOUNT_MERGE_H_
