// What integration tests compare between runs: each member's committed head,
// read from a finished run's store, and the results a traced scheduler
// (CKPT_TRACE=1) has logged so far. Shared by tests/integration, tests/slurm
// and tests/netns.
#ifndef CKPT_TESTS_INTEGRATION_RUN_HEADS_H_
#define CKPT_TESTS_INTEGRATION_RUN_HEADS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>

#include "ckpt/store/store.h"
#include "process_util.h"

namespace ckpt::testing {

// A member's committed head.
struct Head {
  int64_t version = 0;
  int64_t step = 0;
  std::string blob;
  std::map<std::string, double> hparams;
  bool operator==(const Head& o) const {
    return version == o.version && step == o.step && blob == o.blob && hparams == o.hparams;
  }
};

// Every member's head in experiment `exp` of the store at `path`; with
// `verify`, also expects the store to verify. REQUIRES: no scheduler has the
// store open.
inline std::map<std::string, Head> ReadHeads(const std::string& path, const std::string& exp,
                                             bool verify) {
  store::StoreOptions o;
  o.path = path;
  auto s = store::Store::Open(o);
  EXPECT_TRUE(s.ok()) << path << ": " << s.status().ToString();
  std::map<std::string, Head> out;
  if (!s.ok()) return out;
  auto members = (*s)->ListMembers(exp);
  EXPECT_TRUE(members.ok()) << members.status().ToString();
  if (!members.ok()) return out;
  for (const auto& m : *members) {
    out[m.member] = Head{m.version, m.step, m.blob ? m.blob->Hex() : "", m.hparams};
  }
  if (verify) {
    auto report = (*s)->Verify();
    EXPECT_TRUE(report.ok() && report->ok())
        << (report.ok() && !report->problems.empty() ? report->problems[0]
                                                     : std::string("verify failed"));
  }
  return out;
}

// Results a scheduler run with CKPT_TRACE=1 has logged ("got RESULT" lines).
inline int ResultsLogged(const Child& c) {
  const std::string log = c.Log();
  int n = 0;
  for (size_t at = log.find("got RESULT"); at != std::string::npos;
       at = log.find("got RESULT", at + 1)) {
    ++n;
  }
  return n;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_INTEGRATION_RUN_HEADS_H_
