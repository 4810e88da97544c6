// `ckpt-scheduler check`: the checks `run` makes before it creates anything,
// run alone as a real process. A good file exits 0 with one line and creates
// nothing; a bad one exits 2 with the very error `run` prints for it, and
// neither creates a store.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/format/checkpoint.h"
#include "process_util.h"

extern char** environ;

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// What one run of the program left: its exit code, stdout and stderr.
struct Outcome {
  int code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class CheckCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("check");
    ASSERT_FALSE(dir_.empty());
    scheduler_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& file, const std::string& text) {
    std::string path = dir_ + "/" + file;
    std::ofstream(path) << text;
    return path;
  }

  // An experiment on the installed Fashion-MNIST whose store is <dir>/filestore.
  std::string Toml(const std::string& name, const std::string& model,
                   const std::string& data = "batch_size = 16\n") {
    return "name = \"" + name + "\"\nstore = \"" + dir_ +
           "/filestore\"\nmetrics = \"\"\n[model]\n" + model + "optimizer = \"sgd\"\n[data]\n" +
           data +
           "[population]\nsize = 3\nsteps_per_interval = 2\nintervals = 1\n"
           "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.1\n"
           "[policy]\nkind = \"pbt\"\n[[devices]]\ndevice = \"cpu\"\n";
  }

  // Runs `ckpt-scheduler VERB FILE ARGS...` with stdout and stderr apart.
  Outcome Invoke(const std::string& verb, const std::string& file,
                 const std::vector<std::string>& args = {}) {
    const std::string tag = dir_ + "/" + verb + "-" + std::to_string(invocations_++);
    std::vector<std::string> argv = {scheduler_, verb, file};
    argv.insert(argv.end(), args.begin(), args.end());
    if (verb == "run") argv.push_back("--quiet");
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    const std::string err_path = tag + ".err";
    testing::Child child(argv, tag + ".out", env, [&err_path] {
      const int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      return fd >= 0 && dup2(fd, 2) == 2;
    });
    Outcome o;
    if (!child.WaitFor(milliseconds(120000))) {
      ADD_FAILURE() << verb << " " << file << " did not end in 120 s";
      return o;
    }
    const int st = child.Wait();
    o.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    o.out = child.Log();
    o.err = ReadFile(err_path);
    return o;
  }

  // `check` refuses `file` with exit 2 and the message `run` gives (which
  // holds `needle`), and neither creates the store.
  void ExpectRefusedAsRunRefuses(const std::string& file, const std::string& needle,
                                 const std::vector<std::string>& args = {}) {
    SCOPED_TRACE(file);
    std::vector<std::string> with_store = {"--store", dir_ + "/store"};
    with_store.insert(with_store.end(), args.begin(), args.end());
    const Outcome check = Invoke("check", file, with_store);
    EXPECT_EQ(check.code, 2) << check.out << check.err;
    EXPECT_EQ(check.out, "");
    EXPECT_EQ(check.err.rfind("ckpt-scheduler: ", 0), 0u) << check.err;
    EXPECT_NE(check.err.find(needle), std::string::npos) << check.err;
    EXPECT_FALSE(fs::exists(dir_ + "/store"));
    const Outcome run = Invoke("run", file, with_store);
    EXPECT_EQ(run.code, 2) << run.out << run.err;
    EXPECT_EQ(run.err, check.err);
    EXPECT_FALSE(fs::exists(dir_ + "/store"));
    EXPECT_FALSE(fs::exists(dir_ + "/filestore"));
  }

  std::string dir_;
  std::string scheduler_;
  int invocations_ = 0;
};

// A tensor file of 20 [1, 2, 2] images labelled 0..3.
std::string WriteTensorFile(const std::string& path) {
  std::vector<uint8_t> x(size_t{20} * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i);
  std::vector<int64_t> labels(20);
  for (int i = 0; i < 20; ++i) labels[i] = i % 4;
  format::CheckpointWriter w;
  EXPECT_TRUE(w.AddTensor("train.x", format::DType::kU8, {20, 1, 2, 2}, x.data(), x.size()).ok());
  EXPECT_TRUE(w.AddTensor("train.y", format::DType::kI64, {20}, labels.data(), 160).ok());
  std::ofstream(path, std::ios::binary) << w.Encode();
  return path;
}

TEST_F(CheckCommandTest, AGoodFileExitsZeroWithOneLineAndCreatesNothing) {
  const std::string file = Write("good.toml", Toml("good", "spec = \"lenet5\"\n"));
  const auto before = std::distance(fs::directory_iterator(dir_), fs::directory_iterator());
  Outcome o = Invoke("check", file, {"--store", dir_ + "/store"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "ok: good: 3 members, lenet5, idx:/usr/share/datasets/fashion-mnist\n");
  EXPECT_EQ(o.err, "");
  EXPECT_FALSE(fs::exists(dir_ + "/store"));
  // The file's own store, without --store, is not created either; only the
  // two invocations' captured outputs were added to the directory.
  o = Invoke("check", file);
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_FALSE(fs::exists(dir_ + "/filestore"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), before + 4);
}

TEST_F(CheckCommandTest, ATensorFileAndAJsonLayerListAreNamedInTheLine) {
  const std::string data = WriteTensorFile(dir_ + "/d.safetensors");
  const std::string file = Write(
      "t.toml",
      Toml("tensors", "spec = '[{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 4}]'\n",
           "format = \"safetensors\"\npath = \"" + data + "\"\nval_size = 4\nbatch_size = 4\n"));
  const Outcome o = Invoke("check", file);
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "ok: tensors: 3 members, a JSON layer list, safetensors:" + data + "\n");
}

TEST_F(CheckCommandTest, BadFilesExitTwoWithTheMessageRunGives) {
  // A key the file may not hold: named with its line.
  ExpectRefusedAsRunRefuses(Write("key.toml", Toml("key", "spec = \"lenet5\"\nwidth = 3\n")),
                            "model.width (" + dir_ + "/key.toml line 6)");
  // A tensor file whose labels break [data] classes: the tensor and row.
  const std::string data = WriteTensorFile(dir_ + "/d.safetensors");
  ExpectRefusedAsRunRefuses(Write("labels.toml", Toml("labels", "spec = \"lenet5\"\n",
                                                      "format = \"safetensors\"\npath = \"" + data +
                                                          "\"\nval_size = 4\nclasses = 3\n")),
                            "train.y: label 3 at row 3 is outside [0, 3)");
  // A missing tensor file.
  ExpectRefusedAsRunRefuses(Write("nodata.toml", Toml("nodata", "spec = \"lenet5\"\n",
                                                      "format = \"npz\"\npath = \"" + dir_ +
                                                          "/none.npz\"\nval_size = 4\n")),
                            dir_ + "/none.npz");
  // A layer list whose outputs are not the data's classes: `run` created the
  // store and the experiment before a worker refused it at CONFIGURE.
  ExpectRefusedAsRunRefuses(
      Write("outputs.toml",
            Toml("outputs",
                 "spec = '[{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 3}]'\n")),
      "model.spec (" + dir_ +
          "/outputs.toml line 5): the model's last layer has 3 outputs, but "
          "/usr/share/datasets/fashion-mnist has 10 classes");
  ExpectRefusedAsRunRefuses(Write("shape.toml", Toml("shape", "spec = \"lenet5\"\n",
                                                     "format = \"safetensors\"\npath = \"" + data +
                                                         "\"\nval_size = 4\n")),
                            "model.spec (" + dir_ + "/shape.toml line 5): model spec layer");
  // Model files: missing, and not a TorchScript archive.
  ExpectRefusedAsRunRefuses(
      Write("nomodel.toml", Toml("nomodel", "spec = \"torchscript:" + dir_ + "/missing.pt\"\n")),
      dir_ + "/missing.pt");
  std::ofstream(dir_ + "/text.pt") << "not a zip archive";
  ExpectRefusedAsRunRefuses(
      Write("text.toml", Toml("text", "spec = \"torchscript:" + dir_ + "/text.pt\"\n")),
      "is not a TorchScript archive");
  // The worker options and the store path.
  const std::string good = Write("good.toml", Toml("good", "spec = \"lenet5\"\n"));
  ExpectRefusedAsRunRefuses(good, "needs --secret-file", {"--listen", "127.0.0.1:0"});
  ExpectRefusedAsRunRefuses(good, dir_ + "/no-such-worker", {"--worker", dir_ + "/no-such-worker"});
  ExpectRefusedAsRunRefuses(dir_ + "/absent.toml",
                            "experiment file " + dir_ + "/absent.toml does not exist");
  std::ofstream(dir_ + "/store") << "a file";
  const Outcome check = Invoke("check", good, {"--store", dir_ + "/store"});
  EXPECT_EQ(check.code, 2) << check.out;
  EXPECT_NE(check.err.find("store " + dir_ + "/store exists and is not a directory"),
            std::string::npos)
      << check.err;
  const Outcome run = Invoke("run", good, {"--store", dir_ + "/store"});
  EXPECT_EQ(run.code, 2);
  EXPECT_EQ(run.err, check.err);
  EXPECT_FALSE(fs::exists(dir_ + "/filestore"));
}

}  // namespace
}  // namespace ckpt
