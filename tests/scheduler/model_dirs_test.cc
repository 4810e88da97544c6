// The service's allowed_model_dirs: parsed from its configuration file, and
// records::CheckModelFileAllowed, the rule a submitted TorchScript path must
// pass (resolved, inside an allowed directory, named without links or "..").
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/format/model_names.h"
#include "ckpt/records/allowed_paths.h"
#include "ckpt/records/config.h"
#include "ckpt/scheduler/service.h"

namespace ckpt::scheduler {
namespace {

namespace fs = std::filesystem;

class ModelDirsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    // Resolved, so that expectations compare with what the rule prints.
    dir_ = fs::weakly_canonical(std::string(tmp != nullptr ? tmp : "/tmp") + "/model_dirs_test_" +
                                std::to_string(getpid()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/models/sub");
    std::ofstream(dir_ + "/models/good.pt") << "PK\3\4";
    std::ofstream(dir_ + "/models/sub/nested.pt") << "PK\3\4";
    std::ofstream(dir_ + "/outside.pt") << "PK\3\4";
  }
  void TearDown() override { fs::remove_all(dir_); }

  Status Check(const std::string& path, const std::vector<std::string>& dirs) {
    return records::CheckModelFileAllowed("torchscript:" + path, dirs, "exp.toml");
  }
  void ExpectRefused(const std::string& path, const std::vector<std::string>& dirs,
                     const std::string& resolved, const std::string& why) {
    Status s = Check(path, dirs);
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    const std::string& m = s.message();
    EXPECT_NE(m.find("exp.toml: model.spec"), std::string::npos) << m;
    EXPECT_NE(m.find("'" + path + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("resolves to " + resolved), std::string::npos) << m;
    EXPECT_NE(m.find("allowed_model_dirs [" + dir_ + "/models]"), std::string::npos) << m;
    EXPECT_NE(m.find(why), std::string::npos) << m;
  }

  std::string dir_;
};

TEST_F(ModelDirsTest, AFileInsideAnAllowedDirectoryIsAccepted) {
  const std::vector<std::string> dirs = {dir_ + "/models"};
  EXPECT_TRUE(Check(dir_ + "/models/good.pt", dirs).ok())
      << Check(dir_ + "/models/good.pt", dirs).ToString();
  EXPECT_TRUE(Check(dir_ + "/models/sub/nested.pt", dirs).ok());
  // A missing file is for the file check (ParseExperimentConfig) to name.
  EXPECT_TRUE(Check(dir_ + "/models/missing.pt", dirs).ok());
  // A trailing slash on the allowed directory changes nothing.
  EXPECT_TRUE(Check(dir_ + "/models/good.pt", {dir_ + "/models/"}).ok());
  // Models that are not files are not judged.
  EXPECT_TRUE(records::CheckModelFileAllowed("lenet5", {}, "exp.toml").ok());
  EXPECT_TRUE(records::CheckModelFileAllowed("[{\"type\": \"flatten\"}]", {}, "x").ok());
}

TEST_F(ModelDirsTest, AFileOutsideIsRefusedNamingFileResolvedPathAndDirectories) {
  const std::vector<std::string> dirs = {dir_ + "/models"};
  ExpectRefused(dir_ + "/outside.pt", dirs, dir_ + "/outside.pt", "outside them");
  ExpectRefused("/dev/shm/model.pt", dirs, "/dev/shm/model.pt", "outside them");
  // The directory itself is not a file inside it.
  ExpectRefused(dir_ + "/models", dirs, dir_ + "/models", "outside them");
  // A sibling whose name starts like the allowed one.
  fs::create_directories(dir_ + "/models2");
  ExpectRefused(dir_ + "/models2/x.pt", dirs, dir_ + "/models2/x.pt", "outside them");
}

TEST_F(ModelDirsTest, DotDotAndSymbolicLinksCannotEscape) {
  const std::vector<std::string> dirs = {dir_ + "/models"};
  ExpectRefused(dir_ + "/models/../outside.pt", dirs, dir_ + "/outside.pt", "outside them");
  ExpectRefused(dir_ + "/models/sub/../../outside.pt", dirs, dir_ + "/outside.pt", "outside them");
  // A link inside the directory to a file or a directory outside it.
  ASSERT_EQ(symlink((dir_ + "/outside.pt").c_str(), (dir_ + "/models/link.pt").c_str()), 0);
  ExpectRefused(dir_ + "/models/link.pt", dirs, dir_ + "/outside.pt", "outside them");
  ASSERT_EQ(symlink("/dev/shm", (dir_ + "/models/shm").c_str()), 0);
  ExpectRefused(dir_ + "/models/shm/x.pt", dirs, "/dev/shm/x.pt", "outside them");
}

TEST_F(ModelDirsTest, APathThroughALinkOrDotDotMustBeWrittenResolved) {
  // Inside, but the worker would open it through a link or ".." that could
  // be changed meanwhile: refused with the path to write instead.
  const std::vector<std::string> dirs = {dir_ + "/models"};
  ExpectRefused(dir_ + "/models/sub/../good.pt", dirs, dir_ + "/models/good.pt",
                "name the file by that resolved path");
  ASSERT_EQ(symlink("good.pt", (dir_ + "/models/latest.pt").c_str()), 0);
  ExpectRefused(dir_ + "/models/latest.pt", dirs, dir_ + "/models/good.pt",
                "name the file by that resolved path");
  // A relative path depends on the scheduler's directory.
  Status s = Check("models/good.pt", dirs);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("relative path"), std::string::npos) << s.ToString();
}

TEST_F(ModelDirsTest, AnAllowedDirectoryReachedThroughALinkIsResolved) {
  ASSERT_EQ(symlink((dir_ + "/models").c_str(), (dir_ + "/models-link").c_str()), 0);
  const std::vector<std::string> dirs = {dir_ + "/models-link"};
  EXPECT_TRUE(Check(dir_ + "/models/good.pt", dirs).ok())
      << Check(dir_ + "/models/good.pt", dirs).ToString();
}

TEST_F(ModelDirsTest, NoAllowedDirectoryRefusesEveryTorchScriptModel) {
  Status s = Check(dir_ + "/models/good.pt", {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("allowed_model_dirs [none]"), std::string::npos) << s.ToString();
}

// docs/LIMITS.md: a TorchScript file of kMaxTorchScriptFileBytes passes the
// scheduler's check; one byte more is refused from fstat's size alone (sparse
// files: nothing is read but the first 4 bytes).
TEST_F(ModelDirsTest, TorchScriptFileSizeAtAndPastTheLimit) {
  const std::string toml_head = "name = \"t1\"\n[model]\nspec = \"torchscript:";
  const std::string toml_tail =
      "\"\n[population]\nsize = 2\nsteps_per_interval = 2\nintervals = 1\n"
      "[search_space.lr]\ntype = \"choice\"\nvalues = [0.1]\n";
  for (const uint64_t size :
       {format::kMaxTorchScriptFileBytes, format::kMaxTorchScriptFileBytes + 1}) {
    const std::string path = dir_ + "/models/sparse" + std::to_string(size) + ".pt";
    { std::ofstream(path, std::ios::binary) << "PK\3\4"; }
    fs::resize_file(path, size);
    std::string toml = toml_head;
    toml += path;
    toml += toml_tail;
    auto c = records::ParseExperimentConfig(toml, "exp.toml");
    if (size == format::kMaxTorchScriptFileBytes) {
      EXPECT_TRUE(c.ok()) << c.status().ToString();
    } else {
      ASSERT_FALSE(c.ok());
      EXPECT_NE(c.status().message().find("model.spec (exp.toml line 3): TorchScript file '" +
                                          path + "' is 2147483649 bytes; the limit is 2147483648"),
                std::string::npos)
          << c.status().ToString();
    }
    fs::remove(path);
  }
}

TEST(ServiceModelDirsTest, DefaultIsTheStoresModelsDirectoryAndEntriesMustBeAbsolute) {
  auto c = ParseServiceConfig("store = \"/var/lib/ckpt/store\"\n", "svc.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->allowed_model_dirs, std::vector<std::string>{"/var/lib/ckpt/store/models"});
  EXPECT_EQ(ControlOptionsFor(*c).allowed_model_dirs,
            std::vector<std::string>{"/var/lib/ckpt/store/models"});
  c = ParseServiceConfig("allowed_model_dirs = [\"/srv/models\", \"/opt/m\"]\n", "svc.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->allowed_model_dirs, (std::vector<std::string>{"/srv/models", "/opt/m"}));
  c = ParseServiceConfig("allowed_model_dirs = []\n", "svc.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->allowed_model_dirs.empty());
  c = ParseServiceConfig("allowed_model_dirs = [\"models\"]\n", "svc.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("allowed_model_dirs (svc.toml line 1)"), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("absolute"), std::string::npos) << c.status().ToString();
}

// allowed_data_dirs: records::CheckDataPathAllowed, the model rule applied to
// [data] path (a tensor file inside; an IDX directory inside or the directory
// itself; the built-in data sets always).
TEST_F(ModelDirsTest, DataPathsFollowTheSameRule) {
  fs::create_directories(dir_ + "/data/idx");
  std::ofstream(dir_ + "/data/d.safetensors") << "x";
  std::ofstream(dir_ + "/secret") << "x";
  ASSERT_EQ(symlink((dir_ + "/secret").c_str(), (dir_ + "/data/link.safetensors").c_str()), 0);
  ASSERT_EQ(symlink("d.safetensors", (dir_ + "/data/alias.safetensors").c_str()), 0);
  const std::vector<std::string> dirs = {dir_ + "/data"};
  auto check = [&](const std::string& path, format::DatasetFormat f) {
    records::ExperimentConfig c;
    c.data_format = f;
    c.dataset_path = path;
    return records::CheckDataPathAllowed(c, dirs, "exp.toml");
  };
  const auto st = format::DatasetFormat::kSafetensors;
  const auto idx = format::DatasetFormat::kIdx;
  EXPECT_TRUE(check(dir_ + "/data/d.safetensors", st).ok());
  EXPECT_TRUE(check(dir_ + "/data/idx", idx).ok());
  EXPECT_TRUE(check(dir_ + "/data/", idx).ok()) << check(dir_ + "/data/", idx).ToString();
  EXPECT_TRUE(check("/usr/share/datasets/fashion-mnist", idx).ok());
  auto refused = [&](const std::string& path, format::DatasetFormat f, const std::string& why) {
    Status s = check(path, f);
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    const std::string& m = s.message();
    EXPECT_NE(m.find("exp.toml: data.path"), std::string::npos) << m;
    EXPECT_NE(m.find("'" + path + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("allowed_data_dirs [" + dir_ + "/data]"), std::string::npos) << m;
    EXPECT_NE(m.find(why), std::string::npos) << m;
  };
  refused(dir_ + "/secret", st, "resolves to " + dir_ + "/secret, which is outside them");
  refused(dir_ + "/data/link.safetensors", st,
          "resolves to " + dir_ + "/secret, which is outside them");
  refused(dir_ + "/data/../secret", st, "which is outside them");
  refused(dir_ + "/data", st, "which is outside them");  // a tensor file is not the directory
  refused(dir_ + "/data/alias.safetensors", st, "through a symbolic link");
  refused("data/d.safetensors", st, "relative path");
  refused("/usr/share/datasets/fashion-mnist", st, "outside them");
  Status none = records::CheckDataPathAllowed(
      [&] {
        records::ExperimentConfig c;
        c.data_format = st;
        c.dataset_path = dir_ + "/data/d.safetensors";
        return c;
      }(),
      {}, "exp.toml");
  EXPECT_NE(none.message().find("allowed_data_dirs [none]"), std::string::npos) << none.ToString();
}

TEST(ServiceDataDirsTest, DefaultIsTheStoresDataDirectoryAndEntriesMustBeAbsolute) {
  auto c = ParseServiceConfig("store = \"/var/lib/ckpt/store\"\n", "svc.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->allowed_data_dirs, std::vector<std::string>{"/var/lib/ckpt/store/data"});
  EXPECT_EQ(ControlOptionsFor(*c).allowed_data_dirs,
            std::vector<std::string>{"/var/lib/ckpt/store/data"});
  c = ParseServiceConfig("allowed_data_dirs = [\"/srv/data\"]\n", "svc.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->allowed_data_dirs, std::vector<std::string>{"/srv/data"});
  c = ParseServiceConfig("\nallowed_data_dirs = [\"data\"]\n", "svc.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("allowed_data_dirs (svc.toml line 2)"), std::string::npos)
      << c.status().ToString();
}

}  // namespace
}  // namespace ckpt::scheduler
