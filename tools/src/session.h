// Session: what one ckpt-tool command works with: the store (a read-only
// view, or the writer when the command changes something and no scheduler
// holds the store) and, for restore/pin/unpin, the running scheduler's
// control client. Resolves where they are from ToolOptions (see tool.h).
//
// Thread-safety: one command on one thread.
#ifndef CKPT_TOOLS_SRC_SESSION_H_
#define CKPT_TOOLS_SRC_SESSION_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "ckpt/records/member_record.h"
#include "ckpt/records/status.h"
#include "ckpt/scheduler/control_client.h"
#include "ckpt/store/store.h"
#include "member_ref.h"
#include "tool.h"

namespace ckpt::tool {

class Session {
 public:
  explicit Session(const ToolOptions& options) : options_(options) {}

  const ToolOptions& options() const { return options_; }

  // The store directory (see ToolOptions::store_path). NotFound naming what
  // was tried when there is none.
  StatusOr<std::string> StorePath();

  // A read-only view of the store, opened on first use. NotFound when the
  // directory is missing or holds no ckpt store.
  StatusOr<store::Store*> Reader();
  // Reopens the read-only view on the store's current state.
  Status RefreshReader();

  // The store opened for writing with `options` (path filled in).
  // FailedPrecondition naming the store when a running scheduler holds it.
  StatusOr<std::unique_ptr<store::Store>> OpenWriter(store::StoreOptions options);

  // The control client of a scheduler serving this store: the explicit
  // --socket (Unavailable / NotFound when it does not answer), else the
  // default socket when it answers and serves the same store; nullptr when
  // there is none.
  StatusOr<scheduler::ControlClient*> Control();

  // The member's manifest at ref.version, or at its head. NotFound naming
  // the reference. REQUIRES: !ref.member.empty().
  StatusOr<store::Manifest> ResolveManifest(const MemberRef& ref);

 private:
  StatusOr<std::unique_ptr<scheduler::ControlClient>> ConnectTo(const std::string& path);

  ToolOptions options_;
  std::optional<std::string> store_path_;
  std::unique_ptr<store::Store> reader_;
  std::unique_ptr<scheduler::ControlClient> control_;
  bool control_resolved_ = false;
};

// $CKPT_SOCKET, else the service's socket (kServiceSocket).
std::string DefaultSocket();

// What the tool reads of an experiment's configuration: the TOML the
// scheduler keeps with it, parsed by the scheduler's own parser without its
// file checks (the dataset and model files may not exist where the tool
// runs). The defaults when the experiment carries no TOML (created by
// something else) or its record is not JSON.
using ExperimentSettings = records::ExperimentConfig;

// Reads `info.config_json` ({"toml": "..."}). Corruption naming the
// experiment when its TOML does not parse.
StatusOr<ExperimentSettings> ReadExperimentSettings(const store::ExperimentInfo& info);

// A member's scheduling record (MemberHead::state, records::DecodeMemberRecord);
// a fresh record when it does not decode (the tool shows what it can).
records::MemberRecord ReadMemberRecord(const store::MemberHead& head);

// What the tool shows of a member: the record's status when it is finished
// (done, stopped, failed), else kDone when it has done `intervals`, else
// kRunning when the experiment (`experiment_status`, as stored) runs, else kIdle.
records::MemberStatus ShownMemberStatus(const records::MemberRecord& record, int intervals,
                                        const std::string& experiment_status);

// Formatting shared by the commands.
std::string FormatScore(double score);                                    // "0.8123" or "-"
std::string FormatHparams(const std::map<std::string, double>& hparams);  // "lr=0.01 momentum=0.9"
std::string FormatNumber(double value);                                   // %.6g
std::string FormatShape(const std::vector<int64_t>& shape);               // "[6, 1, 5, 5]"
std::string FormatTime(int64_t unix_ms);                                  // "2026-12-03T05:40:01Z"
std::string FormatBytes(uint64_t bytes);                                  // "1.2 MiB"
std::string VersionName(const std::string& member, int64_t version);      // "m3@14"

// Writes `text` to `out`; IOError when it fails (a closed pipe).
Status Print(FILE* out, const std::string& text);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_SESSION_H_
