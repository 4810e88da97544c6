// An experiment's records in the store: creating them, deriving the members'
// scheduling state from them at start, and ExperimentIo over the store
// (private to ckpt::scheduler).
//
// Crash safety: an interval's commit (blob, manifest, head, event) is one
// WriteBatch; the member's state record follows it, and an exploit's state
// record follows the exploit. A crash between the two is reconciled here from
// the head manifest, which is always the newer: a trained head whose
// "interval" metric is past the record's wins, an exploit head means the
// exploit of the record's interval happened.
//
// Thread-safety: as store::Store (any thread); a StoreExperimentIo is used by
// the one thread that drives its Experiment.
#ifndef CKPT_SCHEDULER_EXPERIMENT_STORE_H_
#define CKPT_SCHEDULER_EXPERIMENT_STORE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/metrics/metrics.h"
#include "ckpt/records/config.h"
#include "ckpt/store/store.h"
#include "experiment.h"

namespace ckpt::scheduler {

// "m007": member `index` of a population of `population`, zero-padded to at
// least 3 digits, so names sort in index order.
std::string MemberName(int index, int population);

// Creates the experiment (config JSON {"toml": source}, with "submitter_uid"
// when `submitter` is set), its members with their initial hyperparameters
// (SampleInitial) and their first state records (index, interval 0). Errors:
// the store's.
Status CreateExperimentRecords(store::Store* store, const records::ExperimentConfig& config,
                               std::optional<uint32_t> submitter = std::nullopt);

// The "submitter_uid" of a stored configuration record; unset when it has
// none (or is not the scheduler's JSON).
std::optional<uint32_t> StoredSubmitter(std::string_view config_json);

// The members of `config.name` in population order, with their state as the
// store has it. Corruption naming the experiment and member when a state
// record does not decode; the store's errors otherwise.
StatusOr<std::vector<Member>> LoadMembers(store::Store* store,
                                          const records::ExperimentConfig& config);

// The intervals `members` committed, from the experiment's "trained" events
// (each logged in its commit's write, with the hyperparameters it trained
// with): what Experiment's history held when the run stopped. Events without
// hyperparameters (written before they were logged) or of unknown members are
// skipped. Corruption naming the event when one does not decode; the store's
// errors otherwise.
StatusOr<History> LoadHistory(store::Store* store, const records::ExperimentConfig& config,
                              const std::vector<Member>& members);

// The one door through which the scheduler writes a member's state record
// (records::EncodeMemberRecord): the records of a new experiment, the
// experiment's own writes (StoreExperimentIo::SaveState) and the record that
// follows a committed result on a worker handle's receiver thread.
// `metrics` (may be null) gets the write's latency. Errors: the store's.
Status WriteMemberRecord(store::Store* store, const std::string& exp, const std::string& member,
                         const records::MemberRecord& record, metrics::Metrics* metrics);

class StoreExperimentIo : public ExperimentIo {
 public:
  // `kill_point` may be empty; `metrics` (may be null) gets each write's
  // latency. The store and metrics must outlive this.
  StoreExperimentIo(store::Store* store, std::string exp,
                    std::function<void(std::string_view)> kill_point,
                    metrics::Metrics* metrics = nullptr);

  StatusOr<int64_t> Exploit(const std::string& member, const std::string& donor,
                            const HParams& hparams, const std::string& event_json) override;
  Status SaveState(const std::string& member, const records::MemberRecord& state) override;
  Status AppendEvent(const std::string& json) override;
  Status SetStatus(records::ExperimentStatus status) override;
  void KillPoint(std::string_view point) override;
  StatusOr<GoodVersion> NewestGoodVersion(const std::string& member, int64_t bad_version) override;
  StatusOr<int64_t> Restore(const std::string& member, int64_t version,
                            const std::string& event_json) override;

 private:
  store::Store* const store_;
  const std::string exp_;
  const std::function<void(std::string_view)> kill_point_;
  metrics::Metrics* const metrics_;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_EXPERIMENT_STORE_H_
