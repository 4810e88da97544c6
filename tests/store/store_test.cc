// The Store API against a real RocksDB in a temporary directory.
#include "ckpt/store/store.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_util.h"

namespace ckpt::store::testing {
namespace {

using json = nlohmann::json;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }

  void Reopen(StoreOptions options) {
    store_.reset();
    auto s = Store::Open(options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void Reopen() { Reopen(TestOptions(dir_.Sub("db"))); }

  void Population(const std::vector<std::string>& members) {
    ASSERT_TRUE(store_->CreateExperiment("e", R"({"policy":"pbt"})").ok());
    for (const auto& m : members) ASSERT_TRUE(store_->CreateMember("e", m, {{"lr", 0.1}}).ok());
  }

  // Commits MakeBlob(seed) to `member` from its current head; returns the version.
  int64_t Commit(const std::string& member, uint64_t seed, double score,
                 std::string* blob_out = nullptr) {
    auto head = store_->GetMember("e", member);
    EXPECT_TRUE(head.ok()) << head.status().ToString();
    std::string blob = MakeBlob(seed, 256, head->step + 10);
    CommitRequest req;
    req.exp = "e";
    req.member = member;
    req.expected_head_version = head->version;
    req.blob = blob.data();
    req.blob_size = blob.size();
    req.step = head->step + 10;
    req.metrics = {{kScoreMetric, score}, {"loss", 1.0 / (1.0 + score)}};
    req.hparams = {{"lr", 0.1}};
    req.event_json = R"({"interval": 1})";
    auto v = store_->CommitResult(req);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    if (blob_out) *blob_out = blob;
    return v.ok() ? *v : -1;
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, ExperimentsAndMembersSurviveReopen) {
  Population({"a", "b"});
  ASSERT_TRUE(store_->SetExperimentStatus("e", "running").ok());
  ASSERT_TRUE(store_->SetMemberState("e", "b", "training").ok());
  Reopen();
  auto exp = store_->GetExperiment("e");
  ASSERT_TRUE(exp.ok());
  EXPECT_EQ(exp->config_json, R"({"policy":"pbt"})");
  EXPECT_EQ(exp->status, "running");
  auto list = store_->ListExperiments();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  auto members = store_->ListMembers("e");
  ASSERT_TRUE(members.ok());
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[0].member, "a");
  EXPECT_EQ((*members)[0].state, "created");
  EXPECT_EQ((*members)[0].version, 0);
  EXPECT_TRUE(std::isnan((*members)[0].last_score));
  EXPECT_EQ((*members)[0].hparams.at("lr"), 0.1);
  EXPECT_FALSE((*members)[0].blob.has_value());
  EXPECT_EQ((*members)[1].state, "training");
}

TEST_F(StoreTest, RejectsBadIdsDuplicatesAndBadConfig) {
  EXPECT_TRUE(store_->CreateExperiment("bad id", "{}").IsInvalidArgument());
  EXPECT_TRUE(store_->CreateExperiment(std::string("a\0b", 3), "{}").IsInvalidArgument());
  EXPECT_TRUE(store_->CreateExperiment("e", "{not json").IsInvalidArgument());
  ASSERT_TRUE(store_->CreateExperiment("e", "{}").ok());
  EXPECT_EQ(store_->CreateExperiment("e", "{}").code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(store_->CreateMember("nope", "m", {}).IsNotFound());
  ASSERT_TRUE(store_->CreateMember("e", "m", {}).ok());
  EXPECT_EQ(store_->CreateMember("e", "m", {}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->CreateMembers("e", {{"n", {}}, {"m", {}}}).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(store_->GetMember("e", "n").status().IsNotFound());  // all or none
  EXPECT_TRUE(store_->GetMember("e", "zz").status().IsNotFound());
  EXPECT_TRUE(store_->GetExperiment("zz").status().IsNotFound());
}

TEST_F(StoreTest, CommitResultAdvancesHeadAndRecordsManifestAndEvent) {
  Population({"a"});
  std::string blob1, blob2;
  EXPECT_EQ(Commit("a", 1, 3.5, &blob1), 1);
  EXPECT_EQ(Commit("a", 2, 4.5, &blob2), 2);
  auto head = store_->GetMember("e", "a");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->version, 2);
  EXPECT_EQ(head->last_score, 4.5);
  EXPECT_EQ(head->step, 20);
  EXPECT_EQ(*head->blob, BlobId::Of(blob2.data(), blob2.size()));

  auto m = store_->GetManifest("e", "a", 2);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->reason, kReasonTrained);
  EXPECT_EQ(m->bytes, blob2.size());
  EXPECT_EQ(m->score(), 4.5);
  ASSERT_TRUE(m->parent.has_value());
  EXPECT_EQ(*m->parent, (VersionRef{"a", 1}));
  EXPECT_GT(m->unix_ms, 0);
  auto first = store_->GetManifest("e", "a", 1);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->parent.has_value());

  auto events = store_->ListEvents("e", 0, 100);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].seq, 1u);
  json ev = json::parse((*events)[1].json);
  EXPECT_EQ(ev["type"], "commit");
  EXPECT_EQ(ev["member"], "a");
  EXPECT_EQ(ev["version"], 2);
  EXPECT_EQ(ev["interval"], 1);
}

TEST_F(StoreTest, CommitFromStaleHeadIsAborted) {
  Population({"a"});
  Commit("a", 1, 1.0);
  std::string blob = MakeBlob(2);
  CommitRequest req;
  req.exp = "e";
  req.member = "a";
  req.expected_head_version = 0;
  req.blob = blob.data();
  req.blob_size = blob.size();
  auto v = store_->CommitResult(req);
  EXPECT_TRUE(v.status().IsAborted()) << v.status().ToString();
  EXPECT_EQ(store_->GetMember("e", "a")->version, 1);
}

TEST_F(StoreTest, CorruptResultIsRejectedNamingTheMember) {
  Population({"a"});
  std::string blob = MakeBlob(7);
  blob[blob.size() - 5] ^= 0x10;
  CommitRequest req;
  req.exp = "e";
  req.member = "a";
  req.blob = blob.data();
  req.blob_size = blob.size();
  auto v = store_->CommitResult(req);
  ASSERT_TRUE(v.status().IsCorruption()) << v.status().ToString();
  EXPECT_NE(v.status().message().find("e/a"), std::string::npos);
  EXPECT_NE(v.status().message().find("tensor"), std::string::npos);
  EXPECT_EQ(store_->GetMember("e", "a")->version, 0);
  auto stats = store_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->blobs, 0u);

  req.blob_size = 0;
  EXPECT_TRUE(store_->CommitResult(req).status().IsInvalidArgument());
}

// CommitRequest::verified: the caller's verified parse of the very bytes
// stands for the store's own; a view of other bytes, or of these bytes
// parsed without verifying, is refused (and nothing is committed).
TEST_F(StoreTest, CommitTakesTheCallersVerifiedParseOfTheSameBytesOnly) {
  Population({"a"});
  std::string blob = MakeBlob(3, 256, 10);
  auto view = format::ParseCheckpoint(blob.data(), blob.size());
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  CommitRequest req;
  req.exp = "e";
  req.member = "a";
  req.blob = blob.data();
  req.blob_size = blob.size();
  req.step = 10;

  // A copy of the same bytes elsewhere: not the view's bytes.
  std::string copy = blob;
  req.blob = copy.data();
  req.verified = &*view;
  auto v = store_->CommitResult(req);
  ASSERT_TRUE(v.status().IsInvalidArgument()) << v.status().ToString();
  EXPECT_NE(v.status().message().find("e/a"), std::string::npos) << v.status().ToString();
  EXPECT_NE(v.status().message().find("other bytes"), std::string::npos);
  // The same address with fewer bytes.
  req.blob = blob.data();
  req.blob_size = blob.size() - 64;
  EXPECT_TRUE(store_->CommitResult(req).status().IsInvalidArgument());
  req.blob_size = blob.size();
  // Parsed without verifying the tensors.
  format::ReadOptions header_only;
  header_only.verify_checksums = false;
  auto unverified = format::ParseCheckpoint(blob.data(), blob.size(), header_only);
  ASSERT_TRUE(unverified.ok());
  req.verified = &*unverified;
  v = store_->CommitResult(req);
  ASSERT_TRUE(v.status().IsInvalidArgument()) << v.status().ToString();
  EXPECT_NE(v.status().message().find("without verifying"), std::string::npos);
  EXPECT_EQ(store_->GetMember("e", "a")->version, 0);

  // The verified view of these bytes: committed, the id reported, the step
  // taken from the request and the bytes read back as they were.
  req.verified = &*view;
  BlobId id;
  req.committed_blob = &id;
  v = store_->CommitResult(req);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1);
  EXPECT_EQ(id, BlobId::Of(blob.data(), blob.size()));
  auto head = store_->GetMember("e", "a");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head->blob, id);
  EXPECT_EQ(head->step, 10);
  auto back = store_->ReadHeadBlob("e", "a");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(back->data()), back->size()), blob);
}

TEST_F(StoreTest, OversizedResultIsRejected) {
  StoreOptions o = TestOptions(dir_.Sub("db"));
  o.max_blob_bytes = 1000;
  Reopen(o);
  Population({"a"});
  std::string blob = MakeBlob(1, 1024);
  CommitRequest req;
  req.exp = "e";
  req.member = "a";
  req.blob = blob.data();
  req.blob_size = blob.size();
  EXPECT_TRUE(store_->CommitResult(req).status().IsInvalidArgument());
}

TEST_F(StoreTest, ExploitSharesDonorBlob) {
  Population({"a", "b"});
  std::string donor_blob;
  Commit("a", 1, 9.0, &donor_blob);
  Commit("b", 2, 1.0);
  auto before = store_->Stats();
  ASSERT_TRUE(before.ok());
  auto v = store_->Exploit("e", "b", "a", {{"lr", 0.05}}, R"({"why":"truncation"})");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 2);
  auto after = store_->Stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->blobs, before->blobs);
  EXPECT_EQ(after->blob_bytes, before->blob_bytes);

  auto m = store_->GetManifest("e", "b", 2);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->blob, BlobId::Of(donor_blob.data(), donor_blob.size()));
  EXPECT_EQ(m->reason, kReasonExploit);
  EXPECT_EQ(*m->parent, (VersionRef{"a", 1}));
  EXPECT_EQ(m->hparams.at("lr"), 0.05);
  auto head = store_->GetMember("e", "b");
  EXPECT_EQ(head->last_score, 9.0);
  EXPECT_EQ(head->hparams.at("lr"), 0.05);
  auto read = store_->ReadHeadBlob("e", "b");
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(read->data()), read->size()), donor_blob);

  auto events = store_->ListEvents("e", 3, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  json ev = json::parse((*events)[0].json);
  EXPECT_EQ(ev["type"], "exploit");
  EXPECT_EQ(ev["donor"], "a");
  EXPECT_EQ(ev["why"], "truncation");

  EXPECT_TRUE(store_->Exploit("e", "b", "b", {}, "").status().IsInvalidArgument());
  ASSERT_TRUE(store_->CreateMember("e", "c", {}).ok());
  EXPECT_EQ(store_->Exploit("e", "b", "c", {}, "").status().code(),
            StatusCode::kFailedPrecondition);
  auto report = store_->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

TEST_F(StoreTest, RestoreMakesPastVersionTheHeadAsNewVersion) {
  Population({"a"});
  std::string blob1;
  Commit("a", 1, 5.0, &blob1);
  Commit("a", 2, 1.0);
  auto v = store_->Restore("e", "a", 1, "");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 3);
  auto head = store_->GetMember("e", "a");
  EXPECT_EQ(head->version, 3);
  EXPECT_EQ(head->last_score, 5.0);
  EXPECT_EQ(*head->blob, BlobId::Of(blob1.data(), blob1.size()));
  auto m = store_->GetManifest("e", "a", 3);
  EXPECT_EQ(m->reason, kReasonRestore);
  EXPECT_EQ(*m->parent, (VersionRef{"a", 1}));
  EXPECT_TRUE(store_->Restore("e", "a", 42, "").status().IsNotFound());
  // The restored head trains on from there.
  EXPECT_EQ(Commit("a", 3, 6.0), 4);
  EXPECT_EQ(*store_->GetManifest("e", "a", 4)->parent, (VersionRef{"a", 3}));
}

TEST_F(StoreTest, RestoreLogsTheCallersEventWithTheStoresFields) {
  Population({"a"});
  Commit("a", 1, 5.0);
  Commit("a", 2, 1.0);
  const uint64_t before = store_->ListEvents("e", 0, 100)->size();
  // Not a JSON object: refused before anything is written.
  auto bad = store_->Restore("e", "a", 1, "[1]");
  EXPECT_TRUE(bad.status().IsInvalidArgument()) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("not a JSON object"), std::string::npos);
  EXPECT_EQ(store_->GetMember("e", "a")->version, 2);
  EXPECT_EQ(store_->ListEvents("e", 0, 100)->size(), before);

  auto v = store_->Restore("e", "a", 1,
                           R"({"type":"corrupt_state","damage":"blob 12ab: bad","version":0})");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  auto events = store_->ListEvents("e", 0, 100);
  ASSERT_EQ(events->size(), before + 1);
  json ev = json::parse(events->back().json);
  EXPECT_EQ(ev["type"], "corrupt_state");
  EXPECT_EQ(ev["damage"], "blob 12ab: bad");
  EXPECT_EQ(ev["member"], "a");
  EXPECT_EQ(ev["reason"], kReasonRestore);
  EXPECT_EQ(ev["version"], *v);  // the store's, over the caller's
  EXPECT_EQ(ev["restored_version"], 1);
  EXPECT_EQ(ev["exp"], "e");

  // Without one, the store's own restore event.
  ASSERT_TRUE(store_->Restore("e", "a", 2, "").ok());
  ev = json::parse(store_->ListEvents("e", 0, 100)->back().json);
  EXPECT_EQ(ev["type"], "restore");
  EXPECT_EQ(ev["restored_version"], 2);
}

TEST_F(StoreTest, ImportStartsAVersionWithoutParent) {
  Population({"a"});
  std::string blob = MakeBlob(11, 64, 77);
  auto v = store_->Import("e", "a", blob.data(), blob.size(), {{"lr", 0.3}});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  auto m = store_->GetManifest("e", "a", *v);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->reason, kReasonImport);
  EXPECT_FALSE(m->parent.has_value());
  EXPECT_EQ(m->step, 77);
  EXPECT_EQ(store_->GetMember("e", "a")->hparams.at("lr"), 0.3);
}

TEST_F(StoreTest, LineageFollowsParentsAcrossMembers) {
  Population({"a", "b"});
  Commit("b", 1, 1.0);                                                  // b v1
  Commit("b", 2, 8.0);                                                  // b v2
  Commit("a", 3, 2.0);                                                  // a v1
  ASSERT_TRUE(store_->Exploit("e", "a", "b", {{"lr", 0.2}}, "").ok());  // a v2 <- b v2
  Commit("a", 4, 9.0);                                                  // a v3
  auto lineage = store_->Lineage("e", "a");
  ASSERT_TRUE(lineage.ok()) << lineage.status().ToString();
  std::vector<std::pair<std::string, int64_t>> chain;
  for (const auto& m : *lineage) chain.emplace_back(m.member, m.version);
  std::vector<std::pair<std::string, int64_t>> want = {{"a", 3}, {"a", 2}, {"b", 2}, {"b", 1}};
  EXPECT_EQ(chain, want);
  auto versions = store_->ListVersions("e", "a");
  ASSERT_TRUE(versions.ok());
  ASSERT_EQ(versions->size(), 3u);
  EXPECT_EQ(versions->front().version, 1);
  ASSERT_TRUE(store_->CreateMember("e", "c", {}).ok());
  EXPECT_TRUE(store_->Lineage("e", "c")->empty());
}

TEST_F(StoreTest, ReadBlobReturnsTheBytesAndVerifies) {
  Population({"a"});
  std::string blob;
  Commit("a", 5, 1.0, &blob);
  ASSERT_TRUE(store_->Flush().ok());
  for (bool verify : {true, false}) {
    auto read = store_->ReadBlob(BlobId::Of(blob.data(), blob.size()), verify);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(read->data()), read->size()), blob);
  }
  EXPECT_TRUE(store_->ReadBlob(BlobId{1, 2}).status().IsNotFound());
  ASSERT_TRUE(store_->CreateMember("e", "b", {}).ok());
  EXPECT_TRUE(store_->ReadHeadBlob("e", "b").status().IsNotFound());
}

TEST_F(StoreTest, EventsAreSequencedPerExperimentAndSurviveReopen) {
  Population({"a"});
  ASSERT_TRUE(store_->CreateExperiment("f", "{}").ok());
  EXPECT_EQ(*store_->AppendEvent("e", R"({"type":"ready","member":"a"})"), 1u);
  EXPECT_EQ(*store_->AppendEvent("f", R"({"x":1})"), 1u);
  EXPECT_EQ(*store_->AppendEvent("e", R"({"x":2})"), 2u);
  EXPECT_TRUE(store_->AppendEvent("e", "[1,2]").status().IsInvalidArgument());
  EXPECT_TRUE(store_->AppendEvent("nope", "{}").status().IsNotFound());
  Reopen();
  EXPECT_EQ(*store_->AppendEvent("e", R"({"x":3})"), 3u);
  auto events = store_->ListEvents("e", 2, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].seq, 2u);
  EXPECT_EQ(json::parse((*events)[0].json)["type"], "note");
  EXPECT_EQ(json::parse((*events)[1].json)["x"], 3);
  EXPECT_EQ(store_->ListEvents("e", 0, 1)->size(), 1u);
  EXPECT_EQ(store_->ListEvents("f", 0, 10)->size(), 1u);
}

TEST_F(StoreTest, ReadOnlyViewSeesTheWriterAfterRefresh) {
  Population({"a"});
  Commit("a", 1, 1.0);
  auto view = Store::OpenReadOnly(TestOptions(dir_.Sub("db")));
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ((*view)->GetMember("e", "a")->version, 1);
  Commit("a", 2, 2.0);
  EXPECT_EQ((*view)->GetMember("e", "a")->version, 1);  // an image as of the open
  ASSERT_TRUE((*view)->Refresh().ok());
  EXPECT_EQ((*view)->GetMember("e", "a")->version, 2);
  auto blob = (*view)->ReadHeadBlob("e", "a");  // from the WAL image
  EXPECT_TRUE(blob.ok()) << blob.status().ToString();
  ASSERT_TRUE(store_->Flush().ok());
  ASSERT_TRUE((*view)->Refresh().ok());
  blob = (*view)->ReadHeadBlob("e", "a");  // from a blob file
  EXPECT_TRUE(blob.ok()) << blob.status().ToString();
  EXPECT_EQ((*view)->CreateExperiment("x", "{}").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*view)->AppendEvent("e", "{}").status().code(), StatusCode::kFailedPrecondition);
  auto report = (*view)->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
  EXPECT_TRUE(Store::OpenReadOnly(TestOptions(dir_.Sub("none"))).status().IsNotFound());
}

TEST_F(StoreTest, SecondOpenInThisProcessIsUnavailable) {
  auto again = Store::Open(TestOptions(dir_.Sub("db")));
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(again.status().IsUnavailable()) << again.status().ToString();
  EXPECT_NE(again.status().message().find(dir_.Sub("db")), std::string::npos);
}

TEST_F(StoreTest, StatsCountFamilies) {
  Population({"a", "b"});
  Commit("a", 1, 1.0);
  Commit("b", 2, 2.0);
  ASSERT_TRUE(store_->Exploit("e", "a", "b", {}, "").ok());
  ASSERT_TRUE(store_->Flush().ok());
  auto stats = store_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->experiments, 1u);
  EXPECT_EQ(stats->members, 2u);
  EXPECT_EQ(stats->manifests, 3u);
  EXPECT_EQ(stats->blobs, 2u);
  EXPECT_EQ(stats->blob_bytes, 2 * MakeBlob(1).size());
  EXPECT_EQ(stats->events, 3u);
  ASSERT_EQ(stats->families.size(), 6u);
  EXPECT_EQ(stats->families[3].name, "blobs");
  EXPECT_GE(stats->families[3].blob_file_bytes, stats->blob_bytes);
}

TEST_F(StoreTest, ConcurrentCommitsToDistinctMembers) {
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i) names.push_back("m" + std::to_string(i));
  Population(names);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        std::string blob = MakeBlob(t * 100 + i);
        CommitRequest req;
        req.exp = "e";
        req.member = names[t];
        req.expected_head_version = i;
        req.blob = blob.data();
        req.blob_size = blob.size();
        req.metrics = {{kScoreMetric, t * 10.0 + i}};
        EXPECT_TRUE(store_->CommitResult(req).ok());
        EXPECT_TRUE(store_->ReadHeadBlob("e", names[t]).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& n : names) EXPECT_EQ(store_->GetMember("e", n)->version, 10);
  auto report = store_->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->problems.front();
}

// The blob cache and the blobs memtable follow the working set the caller
// announces, between their floors and the StoreOptions ceilings; a
// small memtable flushes on its own, and every state still reads back.
TEST_F(StoreTest, SizeForWorkingSetBoundsTheCacheAndTheMemtable) {
  EXPECT_EQ(store_->blob_cache_capacity(), StoreOptions{}.blob_cache_bytes);
  EXPECT_EQ(store_->blob_memtable_bytes(), StoreOptions{}.blob_memtable_bytes);
  ASSERT_TRUE(store_->SizeForWorkingSet(uint64_t{200} << 20).ok());  // fits the cache
  EXPECT_EQ(store_->blob_cache_capacity(), uint64_t{250} << 20);
  EXPECT_EQ(store_->blob_memtable_bytes(), uint64_t{50} << 20);
  // Past both ceilings: the memtable stops at its ceiling; a cache that cannot
  // hold the heads' cycle would never hit, so it drops to the floor.
  ASSERT_TRUE(store_->SizeForWorkingSet(uint64_t{10} << 30).ok());
  EXPECT_EQ(store_->blob_cache_capacity(), kMinWorkingSetBytes);
  EXPECT_EQ(store_->blob_memtable_bytes(), StoreOptions{}.blob_memtable_bytes);
  ASSERT_TRUE(store_->SizeForWorkingSet(0).ok());  // the floor
  EXPECT_EQ(store_->blob_cache_capacity(), kMinWorkingSetBytes);
  EXPECT_EQ(store_->blob_memtable_bytes(), kMinBlobMemtableBytes);
  const uint64_t thirty_lenets = 30 * 500000;
  ASSERT_TRUE(store_->SizeForWorkingSet(thirty_lenets).ok());
  EXPECT_EQ(store_->blob_cache_capacity(), thirty_lenets + thirty_lenets / 4);
  EXPECT_EQ(store_->blob_memtable_bytes(), kMinBlobMemtableBytes);

  // 24 states of 1 MiB overflow the 16 MiB memtable: RocksDB flushes them to
  // a blob file without being asked (with the 64 MiB default it would not).
  Population({"a"});
  std::vector<std::string> blobs;
  for (int i = 0; i < 24; ++i) {
    auto head = store_->GetMember("e", "a");
    ASSERT_TRUE(head.ok());
    blobs.push_back(MakeBlob(100 + i, 256 * 1024, head->step + 1));
    CommitRequest req;
    req.exp = "e";
    req.member = "a";
    req.expected_head_version = head->version;
    req.blob = blobs.back().data();
    req.blob_size = blobs.back().size();
    req.step = head->step + 1;
    req.metrics = {{kScoreMetric, 0.1 * i}};
    ASSERT_TRUE(store_->CommitResult(req).ok());
  }
  uint64_t blob_file_bytes = 0;
  for (int i = 0; i < 500 && blob_file_bytes == 0; ++i) {
    auto stats = store_->Stats();
    ASSERT_TRUE(stats.ok());
    for (const auto& f : stats->families) {
      if (f.name == "blobs") blob_file_bytes = f.blob_file_bytes;
    }
    if (blob_file_bytes == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(blob_file_bytes, 0u) << "the 16 MiB memtable never flushed";
  auto versions = store_->ListVersions("e", "a");
  ASSERT_TRUE(versions.ok());
  int read = 0;
  for (const auto& m : *versions) {
    if (!m.holds_blob) continue;
    auto pinned = store_->ReadBlob(m.blob);
    ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(pinned->data()), pinned->size()),
              blobs[m.version - 1]);
    ++read;
  }
  EXPECT_GE(read, 3);  // keep_last_n
}

// Past the cache's ceiling new blobs stay out of the cache, neither put in at
// the flush that writes them nor on a read that misses; back under it, the
// flush fills it again. The cache serves RocksDB's blob files only (the blob
// log maps its records: BlobLogTest.StatesInTheLogStayOutOfTheBlobCache).
TEST_F(StoreTest, ACacheThatCannotHoldTheHeadsIsNotFilled) {
  StoreOptions rocksdb_blob_files = TestOptions(dir_.Sub("rocksdb"));
  rocksdb_blob_files.blob_log = false;
  Reopen(rocksdb_blob_files);
  Population({"a", "b", "c"});
  ASSERT_TRUE(store_->SizeForWorkingSet(uint64_t{10} << 30).ok());
  std::map<std::string, std::string> blobs;
  uint64_t seed = 1;
  for (const char* m : {"a", "b", "c"}) Commit(m, seed++, 0.1, &blobs[m]);
  ASSERT_TRUE(store_->Flush().ok());
  for (const auto& [m, bytes] : blobs) {
    auto pinned = store_->ReadHeadBlob("e", m, /*verify=*/true);
    ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(pinned->data()), pinned->size()), bytes);
  }
  EXPECT_EQ(store_->blob_cache_usage(), 0u) << "blobs went into a cache set to hold none";

  ASSERT_TRUE(store_->SizeForWorkingSet(uint64_t{1} << 20).ok());
  Commit("a", seed++, 0.2);
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_GT(store_->blob_cache_usage(), 0u) << "the flush did not fill the cache again";
}

TEST(StoreOptionsTest, TinyMemtableIsRefusedByName) {
  TempDir dir;
  StoreOptions o = TestOptions(dir.Sub("db"));
  o.blob_memtable_bytes = 1000;
  auto s = Store::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().ToString().find("blob_memtable_bytes"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::store::testing
