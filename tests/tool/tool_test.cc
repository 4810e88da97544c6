// Whole-process tests of ckpt-tool: the real binary on stores made by real
// `ckpt-scheduler run` and `serve` processes (real workers, Fashion-MNIST),
// Graphviz and gnuplot for the pictures, and real PyTorch for the interop.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/format/checkpoint.h"
#include "ckpt/format/checksum.h"
#include "ckpt/scheduler/control_client.h"
#include "ckpt/store/store.h"
#include "tool_process.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;

constexpr const char kDataset[] = "/usr/share/datasets/fashion-mnist";

// ---- processes ----

using testing::Process;
using testing::Result;
using testing::Slurp;

std::string TempDir(const std::string& tag) {
  const char* t = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(t != nullptr && *t != '\0' ? t : "/tmp") + "/ckpt-tool-" + tag + "-XXXXXX";
  char* p = mkdtemp(tmpl.data());
  return p != nullptr ? std::string(p) : std::string();
}

int g_runs = 0;

// The value of a store call that must succeed (a copy: a range-for over a
// temporary StatusOr's value would dangle).
template <typename T>
T Get(StatusOr<T> s) {
  if (!s.ok()) {
    ADD_FAILURE() << s.status().ToString();
    return T{};
  }
  return std::move(s).value();
}

Result RunProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  static const std::string dir = TempDir("logs");
  Process p(argv, dir + "/run" + std::to_string(g_runs++), env);
  return p.Wait();
}

Result Tool(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
  args.insert(args.begin(), CKPT_TOOL_BIN);
  return RunProcess(args, env);
}

std::string Show(const Result& r) {
  return "exit " + std::to_string(r.code) + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

json ParseJson(const Result& r) {
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << Show(r);
  return j;
}

size_t Lines(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

bool HavePython() {
  static const bool ok =
      RunProcess({CKPT_TOOL_TEST_PYTHON, "-c", "import torch, safetensors"}).code == 0;
  return ok;
}

bool HaveProgram(const std::string& name) {
  return RunProcess({"/bin/sh", "-c", "command -v " + name}).code == 0;
}

// ---- stores ----

std::string ExperimentToml(const std::string& name, int intervals, const std::string& policy,
                           int steps = 40) {
  std::ostringstream os;
  os << "name = \"" << name << "\"\nseed = 7\nmetrics = \"\"\n"
     << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
     << "[data]\ndataset = \"fashion-mnist\"\npath = \"" << kDataset
     << "\"\nbatch_size = 32\neval_size = 500\n"
     << "[population]\nsize = 4\nsteps_per_interval = " << steps << "\nintervals = " << intervals
     << "\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.005\nmax = 0.2\n"
     << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.95\n"
     << "[policy]\nkind = \"" << policy << "\"\n";
  if (policy == "pbt") os << "mode = \"sync\"\nquantile = 0.25\nready_intervals = 1\n";
  os << "[[devices]]\ndevice = \"cpu\"\nslots = 2\nfusion = \"plain\"\nintra_op_threads = 1\n";
  return os.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The store of one short real run (4 members, 3 synchronous PBT generations,
// exploits, a final evaluation), made once per ctest run under a file lock.
const std::string& SharedRunStore() {
  static const std::string path = [] {
    const std::string base = std::string(CKPT_TOOL_TEST_DIR) + "/shared_run";
    fs::create_directories(CKPT_TOOL_TEST_DIR);
    int fd = open((std::string(CKPT_TOOL_TEST_DIR) + "/shared_run.lock").c_str(), O_CREAT | O_RDWR,
                  0644);
    flock(fd, LOCK_EX);
    if (!fs::exists(base + "/complete")) {
      fs::remove_all(base);
      fs::create_directories(base);
      WriteFile(base + "/tiny.toml", ExperimentToml("tiny", 3, "pbt"));
      Result r = RunProcess(
          {CKPT_SCHEDULER_BIN, "run", base + "/tiny.toml", "--store", base + "/store", "--quiet"});
      if (r.code == 0) {
        WriteFile(base + "/complete", "");
      } else {
        ADD_FAILURE() << "ckpt-scheduler run failed: " << Show(r);
      }
    }
    flock(fd, LOCK_UN);
    close(fd);
    return base + "/store";
  }();
  return path;
}

std::unique_ptr<store::Store> OpenReadOnly(const std::string& path) {
  store::StoreOptions o;
  o.path = path;
  o.create_if_missing = false;
  auto s = store::Store::OpenReadOnly(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// Everything a command could change, as text, to compare before and after.
std::string Snapshot(const std::string& path) {
  auto s = OpenReadOnly(path);
  if (!s) return "unreadable";
  std::ostringstream os;
  for (const auto& e : Get(s->ListExperiments())) {
    os << e.id << " " << e.status << "\n";
    for (const auto& h : Get(s->ListMembers(e.id))) {
      os << " " << h.member << " v" << h.version << " " << (h.blob ? h.blob->Hex() : "-") << " "
         << h.state << "\n";
      for (const auto& m : Get(s->ListVersions(e.id, h.member))) {
        os << "  " << m.version << " " << m.reason << " " << m.holds_blob << m.pinned << "\n";
      }
    }
    os << " events " << s->ListEvents(e.id, 1, 1 << 20)->size() << "\n";
  }
  return os.str();
}

std::string CopyStore(const std::string& from, const std::string& dir) {
  const std::string to = dir + "/store-copy";
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
  fs::remove(to + "/LOCK");
  return to;
}

struct PngSize {
  uint32_t width = 0, height = 0;
};

bool ReadPngSize(const std::string& path, PngSize* size) {
  std::string b = Slurp(path);
  static const char kSig[] = "\x89PNG\r\n\x1a\n";
  if (b.size() < 24 || b.compare(0, 8, kSig, 8) != 0 || b.compare(12, 4, "IHDR") != 0) return false;
  auto be = [&](size_t o) {
    return (uint32_t{static_cast<uint8_t>(b[o])} << 24) |
           (uint32_t{static_cast<uint8_t>(b[o + 1])} << 16) |
           (uint32_t{static_cast<uint8_t>(b[o + 2])} << 8) | static_cast<uint8_t>(b[o + 3]);
  };
  size->width = be(16);
  size->height = be(20);
  return true;
}

// The root element's attributes of an SVG file, as Python's XML parser reads them.
Result ParseSvg(const std::string& path) {
  return RunProcess({"/usr/bin/python3", "-c",
                     "import sys, json, xml.etree.ElementTree as E; r = E.parse(sys.argv[1])"
                     ".getroot(); print(json.dumps({'tag': r.tag, 'width': r.get('width'), "
                     "'height': r.get('height'), 'elements': sum(1 for _ in r.iter())}))",
                     path});
}

class ToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = SharedRunStore();
    ASSERT_TRUE(fs::exists(store_ + "/CURRENT")) << "no run store at " << store_;
    tmp_ = TempDir("t");
    ASSERT_FALSE(tmp_.empty());
    reader_ = OpenReadOnly(store_);
    ASSERT_NE(reader_, nullptr);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(tmp_);
  }

  Result T(std::vector<std::string> args) {
    args.insert(args.begin(), {"--store", store_});
    return Tool(args);
  }

  // A member version created by an exploit, and its donor.
  store::Manifest SomeExploit() {
    for (const auto& h : Get(reader_->ListMembers("tiny"))) {
      for (const auto& m : Get(reader_->ListVersions("tiny", h.member))) {
        if (m.reason == store::kReasonExploit) return m;
      }
    }
    ADD_FAILURE() << "the run made no exploit";
    return store::Manifest{};
  }

  std::string store_;
  std::string tmp_;
  std::unique_ptr<store::Store> reader_;
};

// ---- ls, show, lineage, diff, events, stats, verify ----

TEST_F(ToolTest, LsListsTheExperimentAsTextAndJson) {
  Result text = T({"ls"});
  ASSERT_EQ(text.code, 0) << Show(text);
  EXPECT_NE(text.out.find("EXPERIMENT"), std::string::npos);
  EXPECT_NE(text.out.find("tiny"), std::string::npos);
  EXPECT_NE(text.out.find("done"), std::string::npos);
  EXPECT_NE(text.out.find("3/3"), std::string::npos) << text.out;

  Result r = T({"ls", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  ASSERT_EQ(j["experiments"].size(), 1u);
  const json& e = j["experiments"][0];
  EXPECT_EQ(e["id"], "tiny");
  EXPECT_EQ(e["status"], "done");
  EXPECT_EQ(e["members"], 4);
  EXPECT_EQ(e["intervals_done"], 3);
  EXPECT_EQ(e["intervals"], 3);
  double best = -1;
  std::string best_member;
  for (const auto& h : Get(reader_->ListMembers("tiny"))) {
    if (h.last_score > best) {
      best = h.last_score;
      best_member = h.member + "@" + std::to_string(h.version);
    }
  }
  EXPECT_DOUBLE_EQ(e["best_score"].get<double>(), best);
  EXPECT_EQ(e["best_member"], best_member);

  // Without --store, ./var, where `ckpt-scheduler run` keeps its store.
  fs::copy(store_, tmp_ + "/var", fs::copy_options::recursive);
  Result here = RunProcess(
      {"/bin/sh", "-c",
       "cd '" + tmp_ + "' && CKPT_SOCKET=" + tmp_ + "/none " + CKPT_TOOL_BIN + " ls --json"});
  ASSERT_EQ(here.code, 0) << Show(here);
  EXPECT_EQ(ParseJson(here)["store"], "var");
  EXPECT_EQ(ParseJson(here)["experiments"], j["experiments"]);
}

TEST_F(ToolTest, LsMembersSortedByScoreMatchTheStore) {
  Result r = T({"ls", "tiny", "--sort", "score", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  ASSERT_EQ(j["members"].size(), 4u);
  std::map<std::string, store::MemberHead> heads;
  for (auto& h : Get(reader_->ListMembers("tiny"))) heads[h.member] = h;
  double previous = 2;
  for (const auto& m : j["members"]) {
    const store::MemberHead& h = heads.at(m["member"].get<std::string>());
    EXPECT_EQ(m["version"], h.version);
    EXPECT_EQ(m["step"], h.step);
    EXPECT_DOUBLE_EQ(m["score"].get<double>(), h.last_score);
    EXPECT_EQ(m["state"], "done");
    EXPECT_EQ(m["blob"], h.blob->Hex());
    EXPECT_EQ(m["hparams"].size(), h.hparams.size());
    for (const auto& [k, v] : h.hparams) EXPECT_DOUBLE_EQ(m["hparams"][k].get<double>(), v);
    EXPECT_LE(m["score"].get<double>(), previous);
    previous = m["score"].get<double>();
  }
  Result text = T({"ls", "tiny", "--sort", "step"});
  ASSERT_EQ(text.code, 0) << Show(text);
  EXPECT_EQ(Lines(text.out), 2u + 4u) << text.out;  // title, header, one line per member
  for (const auto& [name, h] : heads) EXPECT_NE(text.out.find(name), std::string::npos);
}

TEST_F(ToolTest, ShowGivesManifestAndTensorsOfTheBlob) {
  const store::MemberHead head = *reader_->GetMember("tiny", "m001");
  Result r = T({"show", "tiny/m001", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  EXPECT_EQ(j["version"], head.version);
  EXPECT_EQ(j["head"], true);
  EXPECT_EQ(j["blob"], head.blob->Hex());
  EXPECT_EQ(j["checkpoint"]["model_spec"], "lenet5");
  EXPECT_EQ(j["checkpoint"]["optimizer"], "sgd");
  auto blob = reader_->ReadBlob(*head.blob);
  ASSERT_TRUE(blob.ok());
  auto view = format::ParseCheckpoint(blob->data(), blob->size());
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(j["tensors"].size(), view->tensors().size());
  for (size_t i = 0; i < view->tensors().size(); ++i) {
    const auto& t = view->tensors()[i];
    EXPECT_EQ(j["tensors"][i]["name"], t.name);
    EXPECT_EQ(j["tensors"][i]["shape"], t.shape);
    EXPECT_EQ(j["tensors"][i]["bytes"], t.nbytes);
    EXPECT_EQ(j["tensors"][i]["xxh3"], HexU64(t.checksum));
  }
  Result v1 = T({"show", "tiny/m001@1"});
  ASSERT_EQ(v1.code, 0) << Show(v1);
  EXPECT_NE(v1.out.find("tiny/m001@1"), std::string::npos);
  EXPECT_NE(v1.out.find("trained from a fresh initialisation"), std::string::npos) << v1.out;
  EXPECT_NE(v1.out.find("conv1.weight"), std::string::npos);
  EXPECT_NE(v1.out.find("[6, 1, 5, 5]"), std::string::npos);
}

TEST_F(ToolTest, ShowNamesTheDonorOfAnExploit) {
  store::Manifest x = SomeExploit();
  ASSERT_TRUE(x.parent.has_value());
  const std::string ref = "tiny/" + x.member + "@" + std::to_string(x.version);
  Result r = T({"show", ref, "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  EXPECT_EQ(j["reason"], "exploit");
  EXPECT_EQ(j["parent"]["member"], x.parent->member);
  EXPECT_EQ(j["parent"]["version"], x.parent->version);
  Result text = T({"show", ref});
  EXPECT_NE(text.out.find("exploit: weights of " + x.parent->member + "@" +
                          std::to_string(x.parent->version)),
            std::string::npos)
      << text.out;
}

TEST_F(ToolTest, LineageFollowsExploitsBackToTheFirstVersion) {
  store::Manifest x = SomeExploit();
  auto lineage = reader_->Lineage("tiny", x.member);
  ASSERT_TRUE(lineage.ok());
  Result r = T({"lineage", "tiny/" + x.member, "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  ASSERT_EQ(j["chain"].size(), lineage->size());
  bool crossed = false;
  for (size_t i = 0; i < lineage->size(); ++i) {
    EXPECT_EQ(j["chain"][i]["member"], (*lineage)[i].member);
    EXPECT_EQ(j["chain"][i]["version"], (*lineage)[i].version);
    EXPECT_EQ(j["chain"][i]["reason"], (*lineage)[i].reason);
    crossed = crossed || (*lineage)[i].reason == "exploit";
  }
  EXPECT_TRUE(crossed);
  EXPECT_EQ(j["chain"].back()["parent"], nullptr);
  Result text = T({"lineage", "tiny/" + x.member});
  ASSERT_EQ(text.code, 0) << Show(text);
  EXPECT_EQ(Lines(text.out), 2 + lineage->size()) << text.out;
  EXPECT_NE(text.out.find("exploit"), std::string::npos);
}

TEST_F(ToolTest, LineageGraphRendersWithGraphviz) {
  if (!HaveProgram("dot")) GTEST_SKIP() << "Graphviz `dot` is not installed (scripts/setup-deps)";
  Result dot = T({"lineage", "tiny", "--dot"});
  ASSERT_EQ(dot.code, 0) << Show(dot);
  size_t exploits = 0;
  for (const auto& h : Get(reader_->ListMembers("tiny"))) {
    for (const auto& m : Get(reader_->ListVersions("tiny", h.member))) {
      exploits += m.reason == "exploit";
      EXPECT_NE(dot.out.find("\"" + m.member + "@" + std::to_string(m.version) + "\""),
                std::string::npos);
    }
  }
  ASSERT_GT(exploits, 0u);
  size_t red = 0;
  for (size_t p = dot.out.find("label=exploit"); p != std::string::npos;
       p = dot.out.find("label=exploit", p + 1)) {
    ++red;
  }
  EXPECT_EQ(red, exploits) << dot.out;
  WriteFile(tmp_ + "/g.dot", dot.out);
  Result check = RunProcess({"/bin/sh", "-c", "dot -Tcanon " + tmp_ + "/g.dot > /dev/null"});
  EXPECT_EQ(check.code, 0) << Show(check);

  Result svg = T({"lineage", "tiny/" + SomeExploit().member, "--svg", tmp_ + "/g.svg", "--png",
                  tmp_ + "/g.png"});
  ASSERT_EQ(svg.code, 0) << Show(svg);
  Result xml = ParseSvg(tmp_ + "/g.svg");
  ASSERT_EQ(xml.code, 0) << Show(xml);
  json x = json::parse(xml.out);
  EXPECT_EQ(x["tag"], "{http://www.w3.org/2000/svg}svg");
  EXPECT_GT(x["elements"].get<int>(), 20);
  PngSize png;
  ASSERT_TRUE(ReadPngSize(tmp_ + "/g.png", &png));
  // Graphviz draws SVG in points and PNG at 96 dpi: the same picture.
  const double w_pt = std::stod(x["width"].get<std::string>());
  EXPECT_NEAR(png.width, w_pt * 96 / 72, 2.0);
}

TEST_F(ToolTest, PlotDrawsScoresAndHyperparametersWithGnuplot) {
  if (!HaveProgram("gnuplot")) GTEST_SKIP() << "gnuplot is not installed (scripts/setup-deps)";
  size_t exploit_events = 0;
  for (const auto& e : Get(reader_->ListEvents("tiny", 1, 1000))) {
    exploit_events += json::parse(e.json).value("type", "") == "exploit";
  }
  Result svg = T({"plot", "tiny", "-o", tmp_ + "/p.svg", "--json"});
  ASSERT_EQ(svg.code, 0) << Show(svg);
  json j = ParseJson(svg);
  EXPECT_EQ(j["panels"], 3);  // score, lr, momentum
  EXPECT_EQ(j["exploits"], exploit_events);
  EXPECT_EQ(j["points"], 4 * 3 + exploit_events);
  Result xml = ParseSvg(tmp_ + "/p.svg");
  ASSERT_EQ(xml.code, 0) << Show(xml);
  json x = json::parse(xml.out);
  EXPECT_EQ(x["width"], "1000");
  EXPECT_EQ(x["height"], "780");
  const std::string text = Slurp(tmp_ + "/p.svg");
  for (const char* label : {"validation accuracy", "momentum", "m000", "m003", "exploit"}) {
    EXPECT_NE(text.find(label), std::string::npos) << label;
  }

  Result png =
      T({"plot", "tiny", "-o", tmp_ + "/p.png", "--width", "800", "--panel-height", "200"});
  ASSERT_EQ(png.code, 0) << Show(png);
  PngSize size;
  ASSERT_TRUE(ReadPngSize(tmp_ + "/p.png", &size));
  EXPECT_EQ(size.width, 800u);
  EXPECT_EQ(size.height, 600u);
}

TEST_F(ToolTest, DiffOfAnExploitAndItsDonorIsZero) {
  store::Manifest x = SomeExploit();
  Result r = T({"diff", "tiny/" + x.member + "@" + std::to_string(x.version),
                "tiny/" + x.parent->member + "@" + std::to_string(x.parent->version), "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  EXPECT_EQ(j["same_blob"], true);
  ASSERT_EQ(j["tensors"].size(), 20u);
  for (const auto& t : j["tensors"]) EXPECT_EQ(t["l2_diff"].get<double>(), 0.0) << t;
  // The exploit explored the donor's hyperparameters: they differ.
  bool differ = false;
  for (const auto& h : j["hparams"]) differ = differ || h["a"] != h["b"];
  EXPECT_TRUE(differ) << j["hparams"];
}

TEST_F(ToolTest, DiffGivesTheL2NormOfEachTensorsDifference) {
  Result r = T({"diff", "tiny/m000", "tiny/m001", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  auto a = reader_->ReadHeadBlob("tiny", "m000");
  auto b = reader_->ReadHeadBlob("tiny", "m001");
  ASSERT_TRUE(a.ok() && b.ok());
  auto va = format::ParseCheckpoint(a->data(), a->size());
  auto vb = format::ParseCheckpoint(b->data(), b->size());
  ASSERT_TRUE(va.ok() && vb.ok());
  ASSERT_EQ(j["tensors"].size(), va->tensors().size());
  for (const auto& t : j["tensors"]) {
    const auto* x = va->Find(t["name"].get<std::string>());
    const auto* y = vb->Find(t["name"].get<std::string>());
    ASSERT_TRUE(x != nullptr && y != nullptr);
    double sum = 0;
    for (int64_t i = 0; i < x->numel(); ++i) {
      float p, q;
      std::memcpy(&p, x->data + 4 * i, 4);
      std::memcpy(&q, y->data + 4 * i, 4);
      sum += (static_cast<double>(q) - p) * (static_cast<double>(q) - p);
    }
    EXPECT_NEAR(t["l2_diff"].get<double>(), std::sqrt(sum), 1e-9 * (1 + std::sqrt(sum)))
        << t["name"];
  }
  Result text = T({"diff", "tiny/m000", "tiny/m001"});
  ASSERT_EQ(text.code, 0) << Show(text);
  EXPECT_NE(text.out.find("HYPERPARAMETER"), std::string::npos);
  EXPECT_NE(text.out.find("fc1.weight"), std::string::npos);
}

TEST_F(ToolTest, EventsListTheDecisionLog) {
  auto events = reader_->ListEvents("tiny", 1, 1000);
  ASSERT_TRUE(events.ok());
  Result r = T({"events", "tiny", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  ASSERT_EQ(j["events"].size(), events->size());
  size_t exploits = 0;
  for (size_t i = 0; i < events->size(); ++i) {
    json e = json::parse((*events)[i].json);
    EXPECT_EQ(j["events"][i]["seq"], (*events)[i].seq);
    EXPECT_EQ(j["events"][i]["type"], e["type"]);
    exploits += e["type"] == "exploit";
  }
  Result only = T({"events", "tiny", "--type", "exploit"});
  ASSERT_EQ(only.code, 0) << Show(only);
  EXPECT_EQ(Lines(only.out), exploits) << only.out;
  EXPECT_NE(only.out.find("donor="), std::string::npos);
  // --follow on an ended experiment prints everything (JSON lines) and returns.
  Result follow = T({"events", "tiny", "--follow", "--json"});
  ASSERT_EQ(follow.code, 0) << Show(follow);
  EXPECT_EQ(Lines(follow.out), events->size());
}

TEST_F(ToolTest, StatsCountWhatTheStoreHoldsAndWhatSharingSaves) {
  auto st = reader_->Stats();
  ASSERT_TRUE(st.ok());
  Result r = T({"stats", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  EXPECT_EQ(j["experiments"], st->experiments);
  EXPECT_EQ(j["members"], st->members);
  EXPECT_EQ(j["manifests"], st->manifests);
  EXPECT_EQ(j["blobs"], st->blobs);
  EXPECT_EQ(j["blob_bytes"], st->blob_bytes);
  EXPECT_EQ(j["families"].size(), st->families.size());
  // Exploits point at their donors' blobs: more references than blobs.
  EXPECT_GT(j["blob_references"].get<uint64_t>(), st->blobs);
  EXPECT_EQ(j["bytes_saved_by_sharing"].get<uint64_t>(),
            j["referenced_bytes"].get<uint64_t>() - st->blob_bytes);
  Result text = T({"stats"});
  ASSERT_EQ(text.code, 0) << Show(text);
  EXPECT_NE(text.out.find("saved by sharing"), std::string::npos);
}

TEST_F(ToolTest, VerifyPassesOnAGoodStore) {
  Result r = T({"verify"});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_EQ(r.out.rfind("ok: ", 0), 0u) << r.out;
  Result e = T({"verify", "tiny", "--json"});
  ASSERT_EQ(e.code, 0) << Show(e);
  json j = ParseJson(e);
  EXPECT_EQ(j["ok"], true);
  EXPECT_GT(j["blobs_checked"].get<int>(), 0);
}

TEST_F(ToolTest, VerifyNamesABlobCorruptedOnDisk) {
  const std::string copy = CopyStore(store_, tmp_);
  // Flip one byte inside the tensor data of m002's head blob where it lies:
  // the blob log's segment (the default), or a RocksDB blob file.
  const store::MemberHead head = *reader_->GetMember("tiny", "m002");
  auto blob = reader_->ReadBlob(*head.blob);
  ASSERT_TRUE(blob.ok());
  const std::string bytes(reinterpret_cast<const char*>(blob->data()), blob->size());
  bool flipped = false;
  for (const auto& entry : fs::recursive_directory_iterator(copy)) {
    if (entry.path().extension() != ".seg" && entry.path().extension() != ".blob") continue;
    std::string file = Slurp(entry.path().string());
    size_t at = file.find(bytes);
    if (at == std::string::npos) continue;
    file[at + bytes.size() / 2] ^= 0x5a;
    WriteFile(entry.path().string(), file);
    flipped = true;
  }
  ASSERT_TRUE(flipped) << "m002's blob is not stored verbatim in a segment or blob file";
  const std::string before = Snapshot(copy);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--store", copy, "verify"},
        std::vector<std::string>{"--store", copy, "verify", "tiny"}}) {
    Result r = Tool(args);
    EXPECT_EQ(r.code, 1) << Show(r);
    EXPECT_NE(r.out.find(head.blob->Hex()), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("tiny/m002@" + std::to_string(head.version)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("FAILED"), std::string::npos) << r.out;
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
  }
  Result j = Tool({"--store", copy, "verify", "--json"});
  EXPECT_EQ(j.code, 1);
  EXPECT_EQ(ParseJson(j)["ok"], false);
  EXPECT_EQ(Snapshot(copy), before);
}

// ---- export ----

TEST_F(ToolTest, ExportTopKWritesTheBestMembers) {
  Result r = T({"export", "tiny", "--top", "2", "-o", tmp_ + "/top", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  ASSERT_EQ(j["exports"].size(), 2u);
  std::vector<store::MemberHead> heads = *reader_->ListMembers("tiny");
  std::sort(heads.begin(), heads.end(),
            [](const auto& a, const auto& b) { return a.last_score > b.last_score; });
  for (size_t i = 0; i < 2; ++i) {
    const json& e = j["exports"][i];
    EXPECT_EQ(e["member"], heads[i].member);
    EXPECT_EQ(e["rank"], i + 1);
    // The file is a valid checkpoint holding the head's tensors, plus what a
    // user needs to run the model.
    const std::string file = Slurp(e["file"].get<std::string>());
    auto view = format::ParseCheckpoint(file.data(), file.size());
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    auto blob = reader_->ReadBlob(*heads[i].blob);
    auto stored = format::ParseCheckpoint(blob->data(), blob->size());
    ASSERT_EQ(view->tensors().size(), stored->tensors().size());
    for (const auto& t : stored->tensors()) {
      const auto* u = view->Find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_EQ(u->checksum, t.checksum) << t.name;
    }
    EXPECT_EQ(view->meta().extra.at("ckpt.num_classes"), "10");
    // Per channel, as JSON lists (one channel here).
    const json mean = json::parse(view->meta().extra.at("ckpt.input_mean"));
    const json sd = json::parse(view->meta().extra.at("ckpt.input_std"));
    ASSERT_EQ(mean.size(), 1u);
    ASSERT_EQ(sd.size(), 1u);
    EXPECT_NEAR(mean[0].get<double>(), 0.2856, 1e-3);
    EXPECT_NEAR(sd[0].get<double>(), 0.3530, 1e-3);
    EXPECT_EQ(json::parse(view->meta().extra.at("ckpt.input_scale"))[0].get<double>(),
              1 / (255 * sd[0].get<double>()));
    EXPECT_EQ(view->meta().extra.at("ckpt.input_dtype"), "uint8");
    EXPECT_EQ(view->meta().extra.at("ckpt.input_shape"), "[1,28,28]");
    EXPECT_EQ(view->meta().extra.at("ckpt.target"), "classes");
    EXPECT_EQ(e["num_outputs"], 10);
  }
}

// The accuracy ckpt's final evaluation reported for a member version.
double ReportedTestAccuracy(store::Store* s, const std::string& member, int64_t version) {
  for (const auto& e : Get(s->ListEvents("tiny", 1, 1000))) {
    json j = json::parse(e.json);
    if (j.value("type", "") != "final_eval") continue;
    for (const auto& r : j["results"]) {
      if (r["member"] == member && r["version"] == version) return r["test_accuracy"].get<double>();
    }
  }
  return -1;
}

TEST_F(ToolTest, ExportsLoadInPyTorchAndReproduceTheReportedAccuracy) {
  if (!HavePython()) {
    GTEST_SKIP() << CKPT_TOOL_TEST_PYTHON << " lacks torch or safetensors (scripts/setup-deps)";
  }
  const store::MemberHead head = *reader_->GetMember("tiny", "m002");
  const double test_score = ReportedTestAccuracy(reader_.get(), "m002", head.version);
  ASSERT_GE(test_score, 0) << "no final evaluation of m002";
  for (const char* file : {"m.pt", "m.safetensors"}) {
    Result r = T({"export", "tiny/m002", "-o", tmp_ + "/" + file});
    ASSERT_EQ(r.code, 0) << Show(r);
  }
  Result opt = T({"export", "tiny/m002@" + std::to_string(head.version), "-o", tmp_ + "/opt.pt",
                  "--optimizer"});
  ASSERT_EQ(opt.code, 0) << Show(opt);
  auto blob = reader_->ReadBlob(*head.blob);
  ASSERT_TRUE(blob.ok());
  WriteFile(tmp_ + "/stored.blob",
            std::string(reinterpret_cast<const char*>(blob->data()), blob->size()));
  Result py = RunProcess({CKPT_TOOL_TEST_PYTHON, CKPT_TOOL_INTEROP_PY, "check-export", "--pt",
                          tmp_ + "/m.pt", "--pt-opt", tmp_ + "/opt.pt", "--safetensors",
                          tmp_ + "/m.safetensors", "--blob", tmp_ + "/stored.blob", "--dataset",
                          kDataset, "--test-acc", std::to_string(test_score)});
  ASSERT_EQ(py.code, 0) << Show(py);
  json j = json::parse(py.out);
  EXPECT_LE(j["logits_max_diff"].get<double>(), 1e-5);
  EXPECT_LE(j["samples_differing"].get<int>(), 2) << py.out;
  // The README's example says the same, from each kind of export.
  for (const char* file : {"m.pt", "m.safetensors", "opt.pt"}) {
    Result ex = RunProcess({CKPT_TOOL_TEST_PYTHON, CKPT_TOOL_EXAMPLE_PY, tmp_ + "/" + file});
    ASSERT_EQ(ex.code, 0) << Show(ex);
    const size_t at = ex.out.find("test accuracy ");
    ASSERT_NE(at, std::string::npos) << ex.out;
    EXPECT_NEAR(std::stod(ex.out.substr(at + 14)), j["test_acc"].get<double>(), 1e-9) << ex.out;
  }
}

// ---- import ----

TEST_F(ToolTest, ImportOfAnExportIsANewVersionWithTheSameTensors) {
  const std::string copy = CopyStore(store_, tmp_);
  ASSERT_EQ(T({"export", "tiny/m000", "-o", tmp_ + "/m0.safetensors"}).code, 0);
  const store::MemberHead before = *reader_->GetMember("tiny", "m003");
  Result r =
      Tool({"--store", copy, "import", tmp_ + "/m0.safetensors", "--to", "tiny/m003", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  EXPECT_EQ(j["version"], before.version + 1);
  auto s = OpenReadOnly(copy);
  auto m = s->GetManifest("tiny", "m003", before.version + 1);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->reason, "import");
  EXPECT_FALSE(m->parent.has_value());
  auto a = reader_->ReadHeadBlob("tiny", "m000");
  auto b = s->ReadHeadBlob("tiny", "m003");
  ASSERT_TRUE(a.ok() && b.ok());
  auto va = format::ParseCheckpoint(a->data(), a->size());
  auto vb = format::ParseCheckpoint(b->data(), b->size());
  ASSERT_TRUE(va.ok() && vb.ok());
  for (const auto& t : va->tensors()) EXPECT_EQ(vb->Find(t.name)->checksum, t.checksum) << t.name;
  EXPECT_EQ(vb->meta().step, va->meta().step);
  // The member keeps its own data order.
  auto own = reader_->ReadHeadBlob("tiny", "m003");
  EXPECT_EQ(vb->meta().data_seed,
            format::ParseCheckpoint(own->data(), own->size())->meta().data_seed);
}

TEST_F(ToolTest, ImportRefusesBadFilesAndChangesNothing) {
  if (!HavePython()) {
    GTEST_SKIP() << CKPT_TOOL_TEST_PYTHON << " lacks torch or safetensors (scripts/setup-deps)";
  }
  const std::string copy = CopyStore(store_, tmp_);
  const std::string before = Snapshot(copy);
  ASSERT_EQ(RunProcess({CKPT_TOOL_TEST_PYTHON, CKPT_TOOL_INTEROP_PY, "bad-shape", "--out",
                        tmp_ + "/bad.safetensors"})
                .code,
            0);
  const std::string marker = tmp_ + "/code-ran";
  ASSERT_EQ(RunProcess({CKPT_TOOL_TEST_PYTHON, CKPT_TOOL_INTEROP_PY, "pickled-code", "--out",
                        tmp_ + "/evil.pt", "--marker", marker})
                .code,
            0);
  ASSERT_EQ(T({"export", "tiny/m000", "-o", tmp_ + "/good.safetensors"}).code, 0);
  ASSERT_EQ(T({"export", "tiny/m000", "-o", tmp_ + "/good.pt"}).code, 0);
  const std::string good = Slurp(tmp_ + "/good.safetensors");
  WriteFile(tmp_ + "/truncated.safetensors", good.substr(0, good.size() - 100));
  std::string flipped = good;
  flipped[flipped.size() - 1000] ^= 1;
  WriteFile(tmp_ + "/flipped.safetensors", flipped);
  const std::string pt = Slurp(tmp_ + "/good.pt");
  WriteFile(tmp_ + "/truncated.pt", pt.substr(0, pt.size() / 2));
  WriteFile(tmp_ + "/garbage.pt", std::string(5000, 'x'));

  struct Case {
    std::string file;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"bad.safetensors", "tensor conv1.weight: " + tmp_ +
                              "/bad.safetensors has shape [6, 1, 3, 3], experiment tiny "
                              "(model lenet5, optimizer sgd) expects [6, 1, 5, 5]"},
      {"evil.pt", "pickled code or objects are refused"},
      {"truncated.safetensors", "truncated.safetensors"},
      {"flipped.safetensors", "checksum"},
      {"truncated.pt", "not a readable .pt archive"},
      {"garbage.pt", "not a readable .pt archive"},
      {"missing.pt", "no such file"},
  };
  for (const auto& c : cases) {
    Result r = Tool({"--store", copy, "import", tmp_ + "/" + c.file, "--to", "tiny/m001"});
    EXPECT_EQ(r.code, 1) << c.file << "\n" << Show(r);
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.file << "\n" << r.err;
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  EXPECT_FALSE(fs::exists(marker)) << "the pickled code ran";
  EXPECT_EQ(Snapshot(copy), before);
}

TEST_F(ToolTest, StateTrainedInPythonImportsAndTrainsOnInCkpt) {
  if (!HavePython()) {
    GTEST_SKIP() << CKPT_TOOL_TEST_PYTHON << " lacks torch or safetensors (scripts/setup-deps)";
  }
  // A run stopped after its first generation (SIGKILL at the 4th commit).
  const std::string toml = tmp_ + "/resume.toml";
  const std::string store = tmp_ + "/store";
  WriteFile(toml, ExperimentToml("resume", 3, "random", 20));
  Result first = RunProcess({CKPT_SCHEDULER_BIN, "run", toml, "--store", store, "--quiet"},
                            {"CKPT_KILL_AT=scheduler.committed:4"});
  ASSERT_EQ(first.code, 128 + SIGKILL) << Show(first);
  int64_t head_version = 0, head_step = 0;
  {
    auto s = OpenReadOnly(store);
    auto h = s->GetMember("resume", "m000");
    ASSERT_TRUE(h.ok());
    ASSERT_GE(h->version, 1);
    head_version = h->version;
    head_step = h->step;
  }
  ASSERT_EQ(
      Tool({"--store", store, "export", "resume/m000", "-o", tmp_ + "/m0.pt", "--optimizer"}).code,
      0);
  Result py = RunProcess({CKPT_TOOL_TEST_PYTHON, CKPT_TOOL_INTEROP_PY, "train-further", "--pt-opt",
                          tmp_ + "/m0.pt", "--dataset", kDataset, "--steps", "30", "--out",
                          tmp_ + "/trained.pt", "--out-safetensors", tmp_ + "/trained.safetensors",
                          "--out-state-dict", tmp_ + "/state_dict.pt"});
  ASSERT_EQ(py.code, 0) << Show(py);
  json trained = json::parse(py.out);
  EXPECT_LT(trained["last_loss"].get<double>(), trained["first_loss"].get<double>() + 1.0);
  Result imp =
      Tool({"--store", store, "import", tmp_ + "/trained.pt", "--to", "resume/m000", "--json"});
  ASSERT_EQ(imp.code, 0) << Show(imp);
  const int64_t imported = ParseJson(imp)["version"].get<int64_t>();
  EXPECT_EQ(imported, head_version + 1);
  Result imp2 = Tool(
      {"--store", store, "import", tmp_ + "/trained.safetensors", "--to", "resume/m001", "--json"});
  ASSERT_EQ(imp2.code, 0) << Show(imp2);
  EXPECT_EQ(ParseJson(imp2)["step"].get<int64_t>(), head_step + 30);
  // torch.save(model.state_dict()) (an OrderedDict with _metadata): the model
  // only, the optimizer state starts from zeros.
  Result imp3 =
      Tool({"--store", store, "import", tmp_ + "/state_dict.pt", "--to", "resume/m002", "--json"});
  ASSERT_EQ(imp3.code, 0) << Show(imp3);
  EXPECT_EQ(ParseJson(imp3)["optimizer_state"], "zeroed");
  {
    // The imported weights are Python's, bit for bit.
    auto s = OpenReadOnly(store);
    auto b = s->ReadHeadBlob("resume", "m000");
    ASSERT_TRUE(b.ok());
    auto v = format::ParseCheckpoint(b->data(), b->size());
    const auto* w = v->Find("conv1.weight");
    double sum = 0;
    for (int64_t i = 0; i < w->numel(); ++i) {
      float f;
      std::memcpy(&f, w->data + 4 * i, 4);
      sum += f;
    }
    EXPECT_NEAR(sum, trained["conv1_weight_sum"].get<double>(), 1e-4);
  }
  // The same command resumes the run: the imported state trains on.
  Result second = RunProcess({CKPT_SCHEDULER_BIN, "run", toml, "--store", store, "--quiet"});
  ASSERT_EQ(second.code, 0) << Show(second);
  auto s = OpenReadOnly(store);
  auto versions = s->ListVersions("resume", "m000");
  ASSERT_TRUE(versions.ok());
  const store::Manifest* next = nullptr;
  for (const auto& m : *versions) {
    if (m.version == imported + 1) next = &m;
  }
  ASSERT_NE(next, nullptr) << "m000 did not train after the import";
  EXPECT_EQ(next->reason, "trained");
  ASSERT_TRUE(next->parent.has_value());
  EXPECT_EQ(next->parent->member, "m000");
  EXPECT_EQ(next->parent->version, imported);
  EXPECT_EQ(next->step, head_step + 20);
  EXPECT_GT(next->score(), 0.3);
  EXPECT_EQ(s->GetExperiment("resume")->status, "done");
}

// ---- restore, pin, unpin, gc ----

TEST_F(ToolTest, RestorePinAndUnpinOnTheStore) {
  const std::string copy = CopyStore(store_, tmp_);
  const store::MemberHead head = *reader_->GetMember("tiny", "m001");
  Result r = Tool({"--store", copy, "restore", "tiny/m001@2", "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  EXPECT_EQ(j["version"], head.version + 1);
  EXPECT_EQ(j["via"], "store");
  {
    auto s = OpenReadOnly(copy);
    auto m = s->GetManifest("tiny", "m001", head.version + 1);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->reason, "restore");
    EXPECT_EQ(m->parent->version, 2);
    EXPECT_EQ(m->blob, s->GetManifest("tiny", "m001", 2)->blob);
    auto events = s->ListEvents("tiny", 1, 1000);
    ASSERT_GE(events->size(), 2u);
    // One event, ckpt-tool's, in the restore's own write.
    const json ev = json::parse(events->back().json);
    EXPECT_EQ(ev["type"], "restore");
    EXPECT_EQ(ev["by"], "ckpt-tool");
    EXPECT_EQ(ev["restored_version"], 2);
    EXPECT_FALSE(ev.contains("from_version"));
    EXPECT_EQ(ev["version"], head.version + 1);
    EXPECT_NE(json::parse((*events)[events->size() - 2].json)["type"], "restore");
  }
  const std::string v2 = "tiny/m001@2";
  Result p = Tool({"--store", copy, "pin", v2});
  ASSERT_EQ(p.code, 0) << Show(p);
  EXPECT_TRUE(OpenReadOnly(copy)->GetManifest("tiny", "m001", 2)->pinned);
  Result u = Tool({"--store", copy, "unpin", v2});
  ASSERT_EQ(u.code, 0) << Show(u);
  EXPECT_EQ(u.out, "unpinned " + v2 + "\n");
  EXPECT_FALSE(OpenReadOnly(copy)->GetManifest("tiny", "m001", 2)->pinned);
  // A version retention deleted cannot be restored: exit 1, nothing changed.
  const std::string before = Snapshot(copy);
  Result gone = Tool({"--store", copy, "restore", "tiny/m001@1000"});
  EXPECT_EQ(gone.code, 1) << Show(gone);
  EXPECT_EQ(Snapshot(copy), before);
}

TEST_F(ToolTest, GcDryRunPredictsWhatGcReleases) {
  const std::string copy = CopyStore(store_, tmp_);
  const std::string before = Snapshot(copy);
  Result dry =
      Tool({"--store", copy, "gc", "--dry-run", "--keep-last", "1", "--keep-best", "1", "--json"});
  ASSERT_EQ(dry.code, 0) << Show(dry);
  EXPECT_EQ(Snapshot(copy), before);
  json d = ParseJson(dry);
  ASSERT_GT(d["released"].size(), 0u);
  Result gc = Tool({"--store", copy, "gc", "--keep-last", "1", "--keep-best", "1", "--json"});
  ASSERT_EQ(gc.code, 0) << Show(gc);
  json g = ParseJson(gc);
  EXPECT_EQ(g["released"], d["released"]);
  EXPECT_EQ(g["blobs_freed_bytes"], d["blobs_freed_bytes"]);
  auto s = OpenReadOnly(copy);
  for (const auto& r : g["released"]) {
    const std::string v = r["version"].get<std::string>();  // tiny/m001@2
    const std::string member = v.substr(5, v.find('@') - 5);
    auto m = s->GetManifest("tiny", member, std::stoll(v.substr(v.find('@') + 1)));
    if (m.ok()) {
      EXPECT_FALSE(m->holds_blob) << v;
    }
  }
  EXPECT_EQ(Tool({"--store", copy, "verify"}).code, 0);
}

// ---- a store from before the blob log ----

// The bytes of the files under `dir` whose name ends in `ext`.
uint64_t BytesOfFiles(const std::string& dir, const std::string& ext) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.path().extension() == ext) bytes += fs::file_size(e.path());
  }
  return bytes;
}

// A store written by `ckpt-scheduler run --no-blob-log` (states in RocksDB's
// blob files, as every store was before the blob log became the default)
// stays usable by ckpt-tool, which opens it with the default: verify,
// export, restore, import (whose new state goes to the blob log) and gc, and
// every head reads back afterwards.
TEST_F(ToolTest, AStoreWrittenWithoutTheBlobLogWorksWithTheDefault) {
  const std::string store = tmp_ + "/old";
  WriteFile(tmp_ + "/old.toml", ExperimentToml("old", 2, "pbt"));
  Result run = RunProcess({CKPT_SCHEDULER_BIN, "run", tmp_ + "/old.toml", "--store", store,
                           "--quiet", "--no-blob-log"});
  ASSERT_EQ(run.code, 0) << Show(run);
  ASSERT_FALSE(fs::exists(store + "/blob-log")) << "--no-blob-log made a blob log";
  Result verify = Tool({"--store", store, "verify"});
  EXPECT_EQ(verify.code, 0) << Show(verify);
  ASSERT_EQ(Tool({"--store", store, "export", "old/m000", "-o", tmp_ + "/m0.safetensors"}).code, 0);
  // m001's oldest version that still holds its state, restored as its head.
  int64_t kept = -1;
  for (const auto& m : Get(OpenReadOnly(store)->ListVersions("old", "m001"))) {
    if (m.holds_blob && kept < 0) kept = m.version;
  }
  ASSERT_GE(kept, 0);
  Result restore =
      Tool({"--store", store, "restore", "old/m001@" + std::to_string(kept), "--json"});
  ASSERT_EQ(restore.code, 0) << Show(restore);
  Result import =
      Tool({"--store", store, "import", tmp_ + "/m0.safetensors", "--to", "old/m003", "--json"});
  ASSERT_EQ(import.code, 0) << Show(import);
  EXPECT_GT(BytesOfFiles(store + "/blob-log", ".seg"), 0u)
      << "the import's state is not in the log";
  {
    auto s = OpenReadOnly(store);
    ASSERT_NE(s, nullptr);
    auto exported = s->ReadHeadBlob("old", "m000");
    auto imported = s->ReadHeadBlob("old", "m003");
    ASSERT_TRUE(exported.ok() && imported.ok());
    auto a = format::ParseCheckpoint(exported->data(), exported->size());
    auto b = format::ParseCheckpoint(imported->data(), imported->size());
    ASSERT_TRUE(a.ok() && b.ok());
    for (const auto& t : a->tensors()) EXPECT_EQ(b->Find(t.name)->checksum, t.checksum) << t.name;
    auto restored = s->GetMember("old", "m001");
    ASSERT_TRUE(restored.ok() && restored->blob.has_value());
    EXPECT_TRUE(*restored->blob == s->GetManifest("old", "m001", kept)->blob);
  }
  Result gc = Tool({"--store", store, "gc", "--keep-last", "1", "--keep-best", "1", "--json"});
  ASSERT_EQ(gc.code, 0) << Show(gc);
  EXPECT_GT(ParseJson(gc)["released"].size(), 0u);
  verify = Tool({"--store", store, "verify"});
  EXPECT_EQ(verify.code, 0) << Show(verify);
  auto s = OpenReadOnly(store);
  ASSERT_NE(s, nullptr);
  for (const auto& h : Get(s->ListMembers("old"))) {
    EXPECT_TRUE(s->ReadHeadBlob("old", h.member).ok()) << h.member;
  }
}

// ---- a running scheduler ----

// Connects `client` to the control socket of `serve`, trying for up to a
// minute; fails at once if serve exits.
void ConnectToServe(const std::string& socket, Process& serve,
                    std::unique_ptr<scheduler::ControlClient>* client) {
  for (int i = 0; i < 600 && !*client; ++i) {
    scheduler::ControlClientOptions o;
    o.socket_path = socket;
    auto c = scheduler::ControlClient::Connect(o);
    if (c.ok()) *client = std::move(*c);
    if (!*client) std::this_thread::sleep_for(milliseconds(100));
    ASSERT_FALSE(serve.Exited()) << serve.Log();
  }
}

// The head of `member` of experiment "live", read from the store (open
// read-only only for the read).
StatusOr<store::MemberHead> LiveHeadOf(const std::string& store, const std::string& member) {
  auto s = OpenReadOnly(store);
  return s ? s->GetMember("live", member) : StatusOr<store::MemberHead>(Status::Internal("x"));
}

// The version of the head of "live"/`member` once it is `version` or later
// (polled for up to 2 minutes); -1 if it does not get there.
int64_t WaitForLiveVersion(const std::string& store, const std::string& member, int64_t version) {
  for (int i = 0; i < 1200; ++i) {
    auto h = LiveHeadOf(store, member);
    if (h.ok() && h->version >= version) return h->version;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return int64_t{-1};
}

// Version `restored` of live/m000 is a restore of version `kept`, and the
// member's next interval (`steps` steps) trained on from it.
void ExpectRestoredAndTrainedOn(const std::string& store, int64_t kept, int64_t restored, int steps,
                                const Process& serve) {
  auto s = OpenReadOnly(store);
  auto old = s->GetManifest("live", "m000", kept);
  auto rm = s->GetManifest("live", "m000", restored);
  auto next = s->GetManifest("live", "m000", restored + 1);
  ASSERT_TRUE(rm.ok() && next.ok()) << serve.Log();
  EXPECT_EQ(rm->reason, "restore");
  ASSERT_TRUE(rm->parent.has_value());
  EXPECT_EQ(rm->parent->version, kept);
  if (old.ok()) {
    EXPECT_EQ(rm->blob, old->blob);
  }
  // The member's next interval starts from the restored state.
  EXPECT_EQ(next->reason, "trained");
  ASSERT_TRUE(next->parent.has_value());
  EXPECT_EQ(next->parent->version, restored);
  EXPECT_EQ(next->step, rm->step + steps);
}

// Whether `p`'s output holds `text` within a minute.
bool WaitForOutput(const Process& p, const std::string& text) {
  bool found = false;
  for (int i = 0; i < 600 && !found; ++i) {
    found = p.Log().find(text) != std::string::npos;
    if (!found) std::this_thread::sleep_for(milliseconds(100));
  }
  return found;
}

TEST_F(ToolTest, RestoreThroughTheRunningSchedulerTakesEffectAtTheNextInterval) {
  // Intervals long enough (a second or so) for the tool to pin the head it saw.
  constexpr int kLiveSteps = 100;
  const std::string store = tmp_ + "/store";
  const std::string socket = tmp_ + "/run/control.sock";
  WriteFile(tmp_ + "/service.toml", "store = \"" + store + "\"\nruntime_directory = \"" + tmp_ +
                                        "/run\"\nmetrics = \"\"\nlog_progress = false\n"
                                        "[[devices]]\ndevice = \"cpu\"\nslots = 2\n"
                                        "fusion = \"plain\"\n"
                                        // The test's client stays idle while the
                                        // member trains (38 s on a loaded host):
                                        // the default 30 s would close it.
                                        "[control]\nclient_idle_timeout_s = 3600\n");
  Process serve({CKPT_SCHEDULER_BIN, "serve", "--config", tmp_ + "/service.toml"}, tmp_ + "/serve");
  std::unique_ptr<scheduler::ControlClient> client;
  ConnectToServe(socket, serve, &client);
  if (HasFatalFailure()) return;
  ASSERT_NE(client, nullptr) << serve.Log();
  // Random search: no exploit replaces a member's head but training.
  auto id = client->Submit(ExperimentToml("live", 200, "random", kLiveSteps), "tool_test");
  ASSERT_TRUE(id.ok()) << id.status().ToString();

  // The head is never released; retention keeps the last three versions.
  const int64_t kept = WaitForLiveVersion(store, "m000", 1);
  ASSERT_GE(kept, 1) << serve.Log();
  // Pinned through the scheduler, so retention keeps it while m000 trains on.
  Result pin = Tool({"--socket", socket, "pin", "live/m000@" + std::to_string(kept), "--json"});
  ASSERT_EQ(pin.code, 0) << Show(pin);
  EXPECT_EQ(ParseJson(pin)["via"], "scheduler");
  ASSERT_GE(WaitForLiveVersion(store, "m000", kept + 3), kept + 3) << serve.Log();

  // Read commands work while the scheduler holds the store.
  Result ls = Tool({"--store", store, "ls", "live", "--json"});
  ASSERT_EQ(ls.code, 0) << Show(ls);
  EXPECT_EQ(ParseJson(ls)["members"].size(), 4u);
  Result show = Tool({"--store", store, "show", "live/m000@" + std::to_string(kept)});
  ASSERT_EQ(show.code, 0) << Show(show);
  // The store is the scheduler's: a direct write is refused with a clear error.
  Result direct = Tool({"--store", store, "unpin", "live/m000@" + std::to_string(kept)},
                       {"CKPT_SOCKET=" + tmp_ + "/none"});
  EXPECT_EQ(direct.code, 1) << Show(direct);
  EXPECT_NE(direct.err.find("held by a running scheduler"), std::string::npos) << direct.err;

  // A follower sees the events as they are committed, the restore among them.
  Process follow({CKPT_TOOL_BIN, "--store", store, "events", "live", "--follow", "--json"},
                 tmp_ + "/follow");
  Result r = Tool({"--socket", socket, "restore", "live/m000@" + std::to_string(kept), "--json"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = ParseJson(r);
  EXPECT_EQ(j["via"], "scheduler");
  const int64_t restored = j["version"].get<int64_t>();
  EXPECT_GT(restored, kept + 3);
  // With --store and $CKPT_SOCKET naming the scheduler of that store, the
  // tool goes through the scheduler too.
  Result unpin = Tool({"--store", store, "unpin", "live/m000@" + std::to_string(kept), "--json"},
                      {"CKPT_SOCKET=" + socket});
  ASSERT_EQ(unpin.code, 0) << Show(unpin);
  EXPECT_EQ(ParseJson(unpin)["via"], "scheduler");

  ASSERT_GT(WaitForLiveVersion(store, "m000", restored + 1), restored) << serve.Log();
  ExpectRestoredAndTrainedOn(store, kept, restored, kLiveSteps, serve);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(WaitForOutput(follow, "\"type\":\"restore\"")) << follow.Log();
  kill(follow.pid(), SIGINT);
  Result followed_out = follow.Wait();
  EXPECT_EQ(followed_out.code, 0) << Show(followed_out);
  json first_line = json::parse(followed_out.out.substr(0, followed_out.out.find('\n')), nullptr,
                                /*allow_exceptions=*/false);
  EXPECT_EQ(first_line["seq"], 1) << followed_out.out;
  ASSERT_TRUE(client->Shutdown("test over").ok());
  Result end = serve.Wait();
  EXPECT_EQ(end.code, 0) << Show(end);
}

// ---- bad input ----

TEST_F(ToolTest, UsageErrorsExitTwoWithOneLine) {
  const std::string before = Snapshot(store_);
  const std::vector<std::vector<std::string>> cases = {
      {"frobnicate"},
      {"ls", "--no-such-flag"},
      {"show"},
      {"show", "tiny"},
      {"show", "tiny/"},
      {"show", "tiny/m000@"},
      {"show", "tiny/m000@abc"},
      {"show", "tiny/m000@-1"},
      {"show", "tiny/m000@0"},
      {"show", "tiny/m000@99999999999999999999"},
      {"show", "ti ny/m000"},
      {"lineage", "tiny"},
      {"diff", "tiny/m000"},
      {"ls", "tiny", "--sort", "age"},
      {"export", "tiny/m000", "-o", "x.txt"},
      {"restore", "tiny/m000"},
      {"plot", "tiny", "-o", "x.pdf"},
  };
  for (const auto& args : cases) {
    Result r = T(args);
    EXPECT_EQ(r.code, 2) << args[0] << " " << (args.size() > 1 ? args[1] : "") << "\n" << Show(r);
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("ckpt-tool: ", 0), 0u) << r.err;
  }
  EXPECT_EQ(Snapshot(store_), before);
  Result help = Tool({"export", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--optimizer"), std::string::npos);
}

TEST_F(ToolTest, WhatIsNotThereExitsOneWithOneLine) {
  const std::string dir = tmp_ + "/not-a-store";
  fs::create_directories(dir);
  WriteFile(dir + "/CURRENT", "garbage\n");
  // A socket file nobody listens on (its server is gone).
  const std::string dead = tmp_ + "/dead.sock";
  {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, dead.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--store", store_, "show", "tiny/m000@100000"}, "tiny/m000@100000 not found"},
      {{"--store", store_, "show", "tiny/m999"}, "member m999 of experiment tiny not found"},
      {{"--store", store_, "ls", "nope"}, "experiment nope not found"},
      {{"--store", store_, "events", "nope"}, "experiment nope not found"},
      {{"--store", dir, "ls"}, "is not a"},
      {{"--store", tmp_ + "/missing", "ls"}, "no such directory"},
      {{"--socket", dead, "restore", "tiny/m000@1"}, dead},
      {{"--socket", tmp_ + "/nothing.sock", "ls"}, "nothing.sock"},
  };
  for (const auto& [args, says] : cases) {
    Result r = Tool(args);
    EXPECT_EQ(r.code, 1) << args.back() << "\n" << Show(r);
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  }
  EXPECT_EQ(Slurp(dir + "/CURRENT"), "garbage\n");
  EXPECT_EQ(fs::directory_iterator(dir)->path().filename(), "CURRENT");
}

}  // namespace
}  // namespace ckpt
