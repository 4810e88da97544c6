// The store's input limits (docs/LIMITS.md), each at its value and one past:
// a real RocksDB in a temporary directory.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ckpt/store/store.h"
#include "test_util.h"

namespace ckpt::store::testing {
namespace {

class StoreLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(TestOptions(dir_.Sub("db"))); }

  void Reopen(StoreOptions options) {
    store_.reset();
    auto s = Store::Open(options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }

  void Population(const std::vector<std::string>& members) {
    ASSERT_TRUE(store_->CreateExperiment("e", R"({"policy":"pbt"})").ok());
    for (const auto& m : members) ASSERT_TRUE(store_->CreateMember("e", m, {{"lr", 0.1}}).ok());
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

// docs/LIMITS.md: a state of exactly max_blob_bytes commits; one byte more
// is refused, naming the member, the size and the limit.
TEST_F(StoreLimitsTest, BlobSizeAtAndPastTheLimit) {
  std::string blob = MakeBlob(1, 1024, 10);
  for (size_t limit : {blob.size(), blob.size() - 1}) {
    StoreOptions o = TestOptions(dir_.Sub(limit == blob.size() ? "at" : "past"));
    o.max_blob_bytes = limit;
    Reopen(o);
    Population({"a"});
    CommitRequest req;
    req.exp = "e";
    req.member = "a";
    req.blob = blob.data();
    req.blob_size = blob.size();
    req.step = 10;
    auto v = store_->CommitResult(req);
    if (limit == blob.size()) {
      EXPECT_TRUE(v.ok()) << v.status().ToString();
    } else {
      ASSERT_FALSE(v.ok());
      EXPECT_TRUE(v.status().IsInvalidArgument()) << v.status().ToString();
      EXPECT_NE(v.status().message().find("blob of " + std::to_string(blob.size()) +
                                          " bytes exceeds max_blob_bytes " + std::to_string(limit)),
                std::string::npos)
          << v.status().ToString();
    }
  }
}

// docs/LIMITS.md: experiment and member ids of 128 bytes are stored; 129 are
// refused.
TEST_F(StoreLimitsTest, IdLengthAtAndPastTheLimit) {
  const std::string at(128, 'e');
  EXPECT_TRUE(store_->CreateExperiment(at, "{}").ok());
  EXPECT_TRUE(store_->CreateMember(at, std::string(128, 'm'), {{"lr", 0.1}}).ok());
  Status s = store_->CreateExperiment(at + "e", "{}");
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("must be 1..128 bytes"), std::string::npos) << s.ToString();
  s = store_->CreateMember(at, std::string(129, 'm'), {{"lr", 0.1}});
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
}

}  // namespace
}  // namespace ckpt::store::testing
