#include "refcount_merge.h"

#include <string>

#include "keys.h"

namespace ckpt::store {
namespace {

class RefCountAdd : public rocksdb::AssociativeMergeOperator {
 public:
  bool Merge(const rocksdb::Slice& key, const rocksdb::Slice* existing_value,
             const rocksdb::Slice& value, std::string* new_value,
             rocksdb::Logger* logger) const override {
    int64_t base = 0;
    int64_t delta = 0;
    if (existing_value != nullptr && !keys::DecodeCount(existing_value->ToStringView(), &base)) {
      return false;
    }
    if (!keys::DecodeCount(value.ToStringView(), &delta)) return false;
    *new_value = keys::EncodeCount(base + delta);
    return true;
  }
  const char* Name() const override { return "ckpt.RefCountAdd"; }
};

}  // namespace

std::shared_ptr<rocksdb::MergeOperator> NewRefCountMergeOperator() {
  return std::make_shared<RefCountAdd>();
}

}  // namespace ckpt::store
