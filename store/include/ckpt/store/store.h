// ckpt::store::Store: the embedded RocksDB checkpoint store of a population.
//
// A Store keeps, per experiment, its members, every retained version of every
// member's state (a manifest pointing at a content-addressed checkpoint blob),
// the lineage between versions and an audit log of events. No training
// interval ever round-trips through a checkpoint file: results are committed
// from memory and blobs are read back in place (PinnedBlob).
//
// Column families (docs/ARCHITECTURE.md "Store schema"); ids are ASCII [A-Za-z0-9._:-],
// 1..128 bytes, so the separator 0x00 never appears inside one:
//   experiments  key exp
//                value JSON {config, status, created_unix_ms}
//   members      key exp 0x00 member
//                value JSON head {version, state, last_score, hparams, step, blob, ...}
//   checkpoints  key exp 0x00 member 0x00 u64be(version)
//                value JSON manifest (see Manifest)
//   blobs        key 16-byte BlobId (XXH3-128 of the value, big-endian)
//                value the checkpoint blob, kept in RocksDB's integrated blob files
//                (with StoreOptions::blob_log, the default: only blobs stored
//                before it, or while it was off)
//   blob_log     key 16-byte BlobId
//                value u64le segment, offset, length of its record in the blob
//                log (<path>/blob-log/*.seg); the family exists once a store was
//                opened with StoreOptions::blob_log
//   refs         key 16-byte BlobId
//                value i64le reference count, merge operator "ckpt.RefCountAdd"
//   events       key exp 0x00 u64be(seq)
//                value JSON event
//
// Reference counting: a blob's count is the number of manifests that *hold* it
// (Manifest::holds_blob). A commit, exploit, restore or import adds one
// reference in the same WriteBatch as the manifest; retention releasing a
// manifest's blob, or deleting a manifest that still holds one, removes one.
// When a count reaches 0 the blob and its ref key are deleted in that same
// batch. Blob ids are global: identical bytes in two experiments share a blob.
//
// Retention runs inside every commit, exploit, restore, import and unpin, in
// the same WriteBatch. A version keeps its blob while any of these holds:
//   - it is its member's head;
//   - it is among the member's last `keep_last_n` versions;
//   - it is among the experiment's best `keep_best_k` trained versions by score
//     (metric kScoreMetric, higher is better: a policy minimizing a loss
//     commits score = -loss);
//   - it is pinned.
// Otherwise its blob reference is released. The manifest itself (metadata: step,
// metrics, hyperparameters, parent) stays while it is the parent of another
// manifest and `keep_lineage` is on, so Lineage() of every surviving version can
// be followed back to its start; a manifest with no blob and no child is deleted,
// which may in turn free its parent.
//
// Durability: every write is one atomic WriteBatch. Interval writes (CommitResult,
// Exploit, SetMemberState, AppendEvent) are unsynced unless
// StoreOptions::sync_interval_commits: a process crash loses nothing that returned
// OK (the WAL is in the OS page cache), a power loss may lose the last ones.
// Control writes (experiments, member creation, Restore, Import, Pin/Unpin,
// DeleteExperiment) are synced.
// With StoreOptions::blob_log a write that stores new bytes first appends them
// to the blob log; a synced write fdatasyncs what the log holds unsynced
// before its WriteBatch is written (and synced), so that no synced WAL names
// bytes that are not on disk: an acknowledged synced commit survives a power loss
// whole, and a crash at any point in between leaves at most an unnamed record
// (garbage: collected, never read). Unsynced, a process crash loses nothing
// that returned OK (both are in the page cache); a power loss may lose the
// last commits, and may leave a recovered one whose record did not reach the
// disk: reading it fails (Corruption / IOError naming the blob, which Verify
// reports), as a damaged blob does, and the member falls back to an older
// version.
//
// Stores from before the blob log (states in RocksDB's blob files, no
// blob_log family) open with the default StoreOptions::blob_log as they are:
// every state they hold stays readable where it lies, keeps its reference
// count, can be exploited, restored, exported, released by retention and
// collected like any other, and Verify checks it; new states go to the blob
// log (a state committed again with the same bytes moves there). The first
// writer open adds the empty blob_log family, from then on a ckpt built before
// the blob log refuses the store ("Column families not opened: blob_log"); a
// read-only view changes nothing. Opened with blob_log = false, a store with a
// blob log keeps reading it and puts new states in RocksDB's blob files.
//
// Thread-safety: every method may be called from any thread (except a
// read-only view's Refresh). Writes are serialized by one mutex; reads go to
// RocksDB (and map blob log segments) directly and may run in parallel with
// a write (they see the state before or after it). One process
// owns a store directory (RocksDB's LOCK file); other processes inspect it with
// OpenReadOnly.
//
// Failed writes: a write that fails leaves nothing of itself on disk (one
// WriteBatch), but the in-memory retention index may be ahead of the disk, so
// the Store refuses further writes:
//   - a full disk (RocksDB's NoSpace, from this write's WAL append or from an
//     earlier flush or compaction): ResourceExhausted, naming the store path
//     and what was being written. The store is recoverable: every later write
//     (and Recover()) first calls RocksDB's DB::Resume(), which flushes the
//     memtables and clears the error, then reloads the index from disk; while
//     there is still no space it returns ResourceExhausted again and nothing
//     changes. Once space is freed, writes go on where the disk left off.
//     RocksDB's own recovery from NoSpace (its SstFileManager polling the
//     free space) is turned off: it waits for the space of a whole memtable,
//     which a nearly full disk may never get back, and answers Resume() with
//     Busy meanwhile. Nothing resumes in the background and no retry loop
//     runs here: the caller decides when to try again (e.g. with backoff).
//   - a compaction failing on a damaged blob file (Corruption) is not a write
//     failure: it is set aside (TakeBackgroundErrors) and writes go on.
//   - any other failure: every later write returns it; reopen the store.
// Reads keep working in both cases.
#ifndef CKPT_STORE_STORE_H_
#define CKPT_STORE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/checksum.h"

namespace ckpt::store {

// The least SizeForWorkingSet() sizes the blob cache to.
inline constexpr uint64_t kMinWorkingSetBytes = uint64_t{4} << 20;
// The least SizeForWorkingSet() sizes the blobs memtable to: each flush is a
// new blob file and a background job, so a memtable of a few states would
// flush every few commits (at 2,000 LeNet-5 commits/s, hundreds of flushes a
// second); 16 MiB is 32 of them.
inline constexpr uint64_t kMinBlobMemtableBytes = uint64_t{16} << 20;

// The metric CommitRequest::metrics carries the score in; higher is better.
inline constexpr const char kScoreMetric[] = "score";

// Why a version exists (Manifest::reason).
inline constexpr const char kReasonTrained[] = "trained";
inline constexpr const char kReasonExploit[] = "exploit";
inline constexpr const char kReasonRestore[] = "restore";
inline constexpr const char kReasonImport[] = "import";

struct StoreOptions {
  // Directory of the RocksDB database. Required.
  std::string path;
  // Create the database (and its column families) when missing. Default: true.
  bool create_if_missing = true;
  // fsync the WAL on CommitResult, Exploit, SetMemberState and AppendEvent.
  // Default: false (a process crash loses nothing; a power loss may lose the
  // last intervals, which are retrained).
  bool sync_interval_commits = false;
  // Largest blob accepted by CommitResult / Import (InvalidArgument above).
  // Default: 1 GiB.
  size_t max_blob_bytes = size_t{1} << 30;
  // Versions per member whose blob is kept, counting the head. Default: 3. REQUIRES: >= 1.
  int keep_last_n = 3;
  // Best trained versions per experiment (by kScoreMetric) whose blob is kept. Default: 5.
  int keep_best_k = 5;
  // Keep the manifests (not the blobs) that surviving versions descend from, so
  // Lineage() reaches back to each member's start. Default: true.
  bool keep_lineage = true;
  // Capacity of the in-memory blob cache (RocksDB LRU, filled by reads and by
  // memtable flushes, i.e. with freshly committed results). A cached blob is
  // read with no copy and no system call; others cost a file read plus one
  // copy inside RocksDB. Size it to the population's head states. 0 disables
  // it. This is the cache's ceiling: SizeForWorkingSet() shrinks it to what the
  // population needs. Default: 256 MiB.
  size_t blob_cache_bytes = size_t{256} << 20;
  // Ceiling of the blobs family's memtable (RocksDB write_buffer_size): every
  // committed state sits in memory until a flush writes it to a blob file, so
  // this is resident memory of the process. SizeForWorkingSet() lowers it for a
  // small population. REQUIRES: >= 1 MiB. Default: 64 MiB.
  size_t blob_memtable_bytes = size_t{64} << 20;
  // Keep state bytes in the store's own blob log instead of RocksDB's blob
  // files: each new blob is appended once to a segment file under
  // <path>/blob-log (header with length, blob id and XXH3 checksums, then the
  // bytes), synced before the WAL record that names it when the write is
  // synced, and the blob_log family keeps its 24-byte location. A state then
  // goes through the page cache once (RocksDB's blob files take it twice: in
  // the WAL, then in the blob file at the flush, and copy it into a
  // memtable). Reads map the record (no copy); the blob cache serves only
  // blobs from before. A store written without it opens with it (its blobs
  // stay readable where they are; new ones go to the log), and a store with
  // a blob log opens without it (its log stays readable; new blobs go to
  // RocksDB): see "Stores from before the blob log" above. A binary from
  // before the blob log refuses a store that has one (RocksDB: "Column
  // families not opened: blob_log"). Default: true.
  bool blob_log = true;
  // The size at which the blob log starts a new segment. Default: 64 MiB.
  uint64_t blob_log_segment_bytes = uint64_t{64} << 20;
  // Compact() rewrites the live records of each segment (but the active one)
  // whose live bytes are below this fraction of its size, then deletes it. A
  // segment with no live record is deleted without waiting for Compact().
  // Default: 0.5.
  double blob_log_gc_live_fraction = 0.5;
  // Test seam: called at named points of a write ("commit.before_write",
  // "commit.after_write", "exploit.before_write", "retention.release",
  // "blob.before_sync", "blob.after_sync"), e.g. to raise SIGKILL there in a
  // crash test. Default: none.
  std::function<void(std::string_view point)> kill_point;
};

struct ExperimentInfo {
  std::string id;
  std::string config_json;  // verbatim, as given to CreateExperiment
  std::string status;       // "created", "running", "paused", "done", "stopped", ...
  int64_t created_unix_ms = 0;
};

// A member's head: its current version and scheduling state.
struct MemberHead {
  std::string member;
  int64_t version = 0;  // 0: created, nothing committed yet
  std::string state;    // free-form scheduler state; "created" at creation
  // Score of the version the head holds (trained: its own; exploit/restore:
  // the parent version's); NaN when none.
  double last_score = std::numeric_limits<double>::quiet_NaN();
  std::map<std::string, double> hparams;
  int64_t step = 0;
  std::optional<BlobId> blob;  // none while version == 0
  int64_t updated_unix_ms = 0;
};

struct VersionRef {
  std::string member;
  int64_t version = 0;
  friend bool operator==(const VersionRef& a, const VersionRef& b) {
    return a.member == b.member && a.version == b.version;
  }
};

// One version of a member.
struct Manifest {
  std::string member;
  int64_t version = 0;
  BlobId blob;
  uint64_t bytes = 0;
  int64_t step = 0;
  std::map<std::string, double> metrics;  // non-finite values read back as NaN
  std::map<std::string, double> hparams;
  // trained: the member's previous version (none for its first); exploit: the
  // donor's head; restore: the restored version; import: none.
  std::optional<VersionRef> parent;
  std::string reason;  // kReasonTrained, kReasonExploit, kReasonRestore, kReasonImport
  int64_t unix_ms = 0;
  bool pinned = false;
  // false once retention released the blob (the manifest is kept for lineage).
  bool holds_blob = true;

  // metrics[kScoreMetric] or NaN.
  double score() const;
};

// An interval result to commit.
struct CommitRequest {
  std::string exp;
  std::string member;
  // Optimistic concurrency: the head version the result was trained from.
  // Aborted when the member's head is no longer this version.
  int64_t expected_head_version = 0;
  // The checkpoint blob (ckpt::format layout), read in place: not owned, only
  // needs to live for the duration of the call.
  const void* blob = nullptr;
  size_t blob_size = 0;
  int64_t step = 0;
  std::map<std::string, double> metrics;  // include kScoreMetric to take part in best-K
  std::map<std::string, double> hparams;
  // Event to log with the commit: a JSON object, or empty for a default one.
  // The store sets "type" (when absent), "exp", "member", "version", "unix_ms".
  std::string event_json;
  // Optional: the caller's own ParseCheckpoint of exactly `blob` (the same
  // address and size) with every checksum verified, which the store then
  // takes as its validation instead of parsing and hashing the bytes again
  // (the scheduler's result check has just done both). A view of other bytes,
  // or one parsed without verifying, is refused with InvalidArgument.
  // REQUIRES: the bytes have not changed since that parse.
  const format::CheckpointView* verified = nullptr;
  // Optional: set to the committed blob's id (BlobId::Of(blob)) on success.
  BlobId* committed_blob = nullptr;
};

// The bytes of a blob as RocksDB hands them out, not copied again: pinned in
// the blob cache when the blob is cached, otherwise in the buffer RocksDB read
// the blob file (or memtable) into; a blob in the blob log is a read-only
// mapping of its record (the page cache's pages, no copy), which stays valid
// after garbage collection deleted its segment. Valid until destroyed, or
// until Refresh() of the read-only view it came from; movable, not copyable.
class PinnedBlob {
 public:
  PinnedBlob();
  ~PinnedBlob();
  PinnedBlob(PinnedBlob&&) noexcept;
  PinnedBlob& operator=(PinnedBlob&&) noexcept;
  PinnedBlob(const PinnedBlob&) = delete;
  PinnedBlob& operator=(const PinnedBlob&) = delete;

  const uint8_t* data() const;
  size_t size() const;
  const BlobId& id() const { return id_; }

  struct Impl;

 private:
  friend class StoreImpl;
  std::unique_ptr<Impl> impl_;
  BlobId id_;
};

struct Event {
  uint64_t seq = 0;  // per experiment, from 1, increasing
  std::string json;
};

// What Verify found. ok() when `problems` is empty.
struct VerifyReport {
  uint64_t blobs_checked = 0;
  uint64_t bytes_checked = 0;
  uint64_t manifests_checked = 0;
  // One line per problem, naming the blob / manifest and what is wrong.
  std::vector<std::string> problems;
  bool ok() const { return problems.empty(); }
};

struct FamilyStats {
  std::string name;
  uint64_t keys = 0;
  uint64_t logical_bytes = 0;  // keys + values as stored (blobs: their sizes)
  uint64_t sst_bytes = 0;      // "rocksdb.total-sst-files-size"
  // blobs family: "rocksdb.total-blob-file-size" plus the blob log's segments.
  uint64_t blob_file_bytes = 0;
};

struct StoreStats {
  std::vector<FamilyStats> families;  // experiments, members, checkpoints, blobs, refs, events
  uint64_t experiments = 0;
  uint64_t members = 0;
  uint64_t manifests = 0;          // every manifest, released or not
  uint64_t manifests_holding = 0;  // those holding a blob reference
  uint64_t blobs = 0;
  uint64_t blob_bytes = 0;  // sum of distinct blob sizes
  uint64_t events = 0;
  // The blob log (StoreOptions::blob_log): its segment files, their bytes,
  // and the bytes of the records that blobs hold (headers included).
  uint64_t blob_log_segments = 0;
  uint64_t blob_log_bytes = 0;
  uint64_t blob_log_live_bytes = 0;
};

// The store. Create with Store::Open or Store::OpenReadOnly.
class Store {
 public:
  virtual ~Store() = default;

  // Opens (creating when options.create_if_missing) the store at options.path
  // for writing, and sweeps retention once with the given options.
  // Unavailable, naming the path, when another process holds it;
  // InvalidArgument for bad options; IOError / Corruption from RocksDB.
  static StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);

  // Opens a read-only view of the store at options.path, which another
  // process may be writing: a consistent image as of the open (every batch
  // acknowledged by then, none half). It is a RocksDB read-only instance, not
  // a secondary one, because secondary instances do not support the blob
  // files the blobs family uses. Writes return FailedPrecondition. While a
  // writer runs, a blob read may fail with IOError when the writer's garbage
  // collection deleted its file since the open: Refresh() and retry.
  // NotFound when there is no store at the path.
  static StatusOr<std::unique_ptr<Store>> OpenReadOnly(const StoreOptions& options);

  // Read-only view: reopens it on the store's current state; invalidates
  // PinnedBlobs read from it. REQUIRES: no other call on the view in flight.
  // Writer: OK, nothing to do.
  virtual Status Refresh() = 0;

  // ---- experiments ----

  // Creates experiment `id` with status "created" (synced). AlreadyExists when
  // present; InvalidArgument for a bad id or config that is not valid JSON.
  virtual Status CreateExperiment(const std::string& id, const std::string& config_json) = 0;
  // NotFound when absent.
  virtual StatusOr<ExperimentInfo> GetExperiment(const std::string& id) = 0;
  // Every experiment, by id.
  virtual StatusOr<std::vector<ExperimentInfo>> ListExperiments() = 0;
  // Sets the status string (synced). NotFound when absent.
  virtual Status SetExperimentStatus(const std::string& id, const std::string& status) = 0;
  // Deletes the experiment, its members, manifests and events, and releases
  // their blob references (synced). NotFound when absent.
  virtual Status DeleteExperiment(const std::string& id) = 0;

  // ---- members ----

  // Creates a member at version 0, state "created", no blob (synced).
  // NotFound when the experiment is absent; AlreadyExists when the member is present.
  virtual Status CreateMember(const std::string& exp, const std::string& member,
                              const std::map<std::string, double>& hparams) = 0;
  // Creates several members in one synced batch; all or none (AlreadyExists
  // naming the first present one).
  virtual Status CreateMembers(
      const std::string& exp,
      const std::map<std::string, std::map<std::string, double>>& hparams_by_member) = 0;
  // NotFound when the experiment or member is absent.
  virtual StatusOr<MemberHead> GetMember(const std::string& exp, const std::string& member) = 0;
  // Every member of `exp`, by member id. NotFound when the experiment is absent.
  virtual StatusOr<std::vector<MemberHead>> ListMembers(const std::string& exp) = 0;
  // Sets the head's state string (unsynced unless sync_interval_commits). NotFound when absent.
  virtual Status SetMemberState(const std::string& exp, const std::string& member,
                                const std::string& state) = 0;

  // ---- versions ----

  // Validates the blob (ckpt::format::ParseCheckpoint with checksums, or the
  // caller's verified parse of it: CommitRequest::verified), then in
  // one WriteBatch: the blob (when new), one reference, manifest (reason
  // "trained", parent = previous head version), head (version+1, last_score,
  // hparams, step), the event, and retention. Returns the new version.
  // Aborted when the head is not expected_head_version; Corruption naming the
  // member when the blob does not parse; InvalidArgument for an empty blob or
  // one above max_blob_bytes; NotFound for an unknown experiment/member.
  virtual StatusOr<int64_t> CommitResult(const CommitRequest& request) = 0;

  // PBT exploit, metadata only: a new version of `dst` pointing at the blob of
  // `src`'s head (no bytes read or copied), with `hparams`, reason "exploit",
  // parent = (src, src's head version); logs `event_json` as CommitResult does.
  // Returns dst's new version. FailedPrecondition when src has no version yet;
  // InvalidArgument when dst == src; NotFound for unknown ids.
  virtual StatusOr<int64_t> Exploit(const std::string& exp, const std::string& dst,
                                    const std::string& src,
                                    const std::map<std::string, double>& hparams,
                                    const std::string& event_json) = 0;

  // Makes past `version` of `member` its head again as a new version (same blob,
  // parent = (member, version), reason "restore"; synced), and logs
  // `event_json` (the caller's account of why: a JSON object, "" for none) in
  // the same WriteBatch, so that no crash leaves a restore without its event;
  // the store sets "type" (when absent: "restore"), "member", "reason",
  // "blob", "version" (the new one) and "restored_version". Returns the new
  // version. NotFound when the version is absent; FailedPrecondition when
  // retention released its blob; InvalidArgument when `event_json` is not a
  // JSON object.
  virtual StatusOr<int64_t> Restore(const std::string& exp, const std::string& member,
                                    int64_t version, const std::string& event_json) = 0;

  // Imports a blob as `member`'s new head (reason "import", no parent,
  // hparams as given, step from the blob's metadata; synced). Returns the new
  // version. Same validation and codes as CommitResult.
  virtual StatusOr<int64_t> Import(const std::string& exp, const std::string& member,
                                   const void* blob, size_t blob_size,
                                   const std::map<std::string, double>& hparams) = 0;

  // Pins / unpins a version so retention keeps its blob (synced). NotFound when
  // absent; Pin: FailedPrecondition when its blob was already released.
  virtual Status Pin(const std::string& exp, const std::string& member, int64_t version) = 0;
  virtual Status Unpin(const std::string& exp, const std::string& member, int64_t version) = 0;

  // NotFound when absent (never existed or deleted by retention).
  virtual StatusOr<Manifest> GetManifest(const std::string& exp, const std::string& member,
                                         int64_t version) = 0;
  // Manifests of `member` still stored, oldest first. NotFound when the member is absent.
  virtual StatusOr<std::vector<Manifest>> ListVersions(const std::string& exp,
                                                       const std::string& member) = 0;
  // The member's head manifest, then its parent, its parent's parent, ...
  // across members, as far as manifests are stored. Empty when the member
  // has no version yet. NotFound when the member is absent.
  virtual StatusOr<std::vector<Manifest>> Lineage(const std::string& exp,
                                                  const std::string& member) = 0;

  // ---- blobs ----

  // Reads a blob in place. With `verify` (the default) checks that its bytes
  // hash to `id` and parse as a checkpoint; on failure returns Corruption
  // naming the blob (and the tensor, where one is at fault). NotFound when absent.
  virtual StatusOr<PinnedBlob> ReadBlob(const BlobId& id, bool verify = true) = 0;
  // ReadBlob of the member's head blob. NotFound when the member has no version.
  virtual StatusOr<PinnedBlob> ReadHeadBlob(const std::string& exp, const std::string& member,
                                            bool verify = true) = 0;

  // ---- events ----

  // Appends a JSON object to the experiment's event log (unsynced unless
  // sync_interval_commits); the store sets "exp" and "unix_ms". Returns its
  // sequence number. InvalidArgument when not a JSON object; NotFound when the
  // experiment is absent.
  virtual StatusOr<uint64_t> AppendEvent(const std::string& exp, const std::string& json) = 0;
  // Events with seq >= from_seq, oldest first, at most `limit`.
  virtual StatusOr<std::vector<Event>> ListEvents(const std::string& exp, uint64_t from_seq,
                                                  size_t limit) = 0;

  // ---- maintenance ----

  // Reads every blob from disk (through a read-only view without blob cache,
  // so cached copies cannot hide a bad file) and re-checks its content hash
  // and tensor checksums (a blob in the blob log: its record's header and
  // payload checksums first; no segment is deleted meanwhile), checks that
  // every manifest holding a blob finds it, and that every blob_log location
  // is referenced,
  // and that every reference count equals the number of manifests holding the
  // blob. Problems go into the report; the Status is an error only when the
  // check itself could not run.
  virtual StatusOr<VerifyReport> Verify() = 0;
  // Counts and bytes per column family.
  virtual StatusOr<StoreStats> Stats() = 0;
  // Flushes memtables to SST and blob files (writer only; read-only: OK).
  virtual Status Flush() = 0;
  // Sizes the memory the store keeps for states to a working set of
  // `head_bytes` (the sum of the heads' blob sizes the caller will read back,
  // e.g. population x state size):
  //   - the blob cache becomes 1.25 x head_bytes, at least kMinWorkingSetBytes
  //     (unless StoreOptions::blob_cache_bytes is lower);
  //     when that is more than StoreOptions::blob_cache_bytes it becomes
  //     kMinWorkingSetBytes: heads are read back in about the order they were
  //     written, and an LRU smaller than that cycle misses on every read;
  //     and then new blobs stop entering the cache, neither at the flush that
  //     writes them nor on a read that misses: each would cost a copy and an
  //     allocation, and be evicted before its next read (back under the
  //     ceiling, both fill it again);
  //   - the blobs memtable becomes head_bytes / 4, at least
  //     kMinBlobMemtableBytes and at most StoreOptions::blob_memtable_bytes
  //     (the ceiling wins when it is lower).
  // Takes effect at once (the cache evicts down to its new capacity; the next
  // memtable is the new size). May be called again as the working set
  // changes. Writer only (read-only: OK, no change).
  virtual Status SizeForWorkingSet(uint64_t head_bytes) = 0;
  // Current capacity of the blob cache and target size of the blobs memtable.
  virtual uint64_t blob_cache_capacity() const = 0;
  virtual uint64_t blob_memtable_bytes() const = 0;
  // Bytes the blob cache holds now (0 without one).
  virtual uint64_t blob_cache_usage() const = 0;
  // Compacts every family, forcing blob garbage collection, so the space of
  // deleted blobs is returned to the file system (writer only). Without it, a
  // blob file is deleted only once none of its blobs is referenced: live
  // blobs are not relocated during ordinary compactions (they would be
  // rewritten about once more each), so a file that a few old blobs keep
  // (pinned versions, stopped members' heads) keeps its space until this runs.
  // The blob log likewise: each segment (but the active one) less than
  // StoreOptions::blob_log_gc_live_fraction live has its live records copied
  // to the active segment (synced), their locations moved in one synced
  // batch, and is deleted; a segment with a live record that fails its
  // checksum is left as it is (Verify names it). Not while a Verify runs.
  virtual Status Compact() = 0;
  // Makes the store accept writes again after a no-space failure (see "Failed
  // writes" above): OK when writes are accepted (also when nothing had
  // failed); ResourceExhausted while the disk is still full (call again
  // later); the failure itself after any other failed write (reopen);
  // FailedPrecondition on a read-only view. Every write does the same first,
  // so calling it is optional: it lets a caller probe without writing.
  virtual Status Recover() = 0;
  // Errors of RocksDB's background work that the store set aside so that
  // writes go on, since the last call (at most 100 kept): a compaction that
  // failed reading a damaged blob or table file (Corruption). The compaction
  // left its inputs as they were and is tried again later; the damaged blob
  // itself is reported by Verify and refused by verified reads. One line
  // each, naming the store and the RocksDB error. Empty on a read-only view.
  virtual std::vector<std::string> TakeBackgroundErrors() = 0;
};

// Which code computes the CRC32C that RocksDB puts on every WAL and blob-file
// record in this process: "isa-l" (ckpt's, through ISA-L: store/src/crc32c_isal.cc),
// or "rocksdb" (the library's own table loop) when ckpt's does not take its
// place. The bytes on disk are the same with either. Thread-safe.
const char* Crc32cImplementation();

// RocksDB's CRC32C: `crc` (0 to start) extended over data[0, n).
using Crc32cFn = uint32_t (*)(uint32_t crc, const char* data, size_t n);
struct Crc32cFunctions {
  Crc32cFn bound = nullptr;    // the one RocksDB's calls bind to in this process
  Crc32cFn library = nullptr;  // librocksdb's own loop; nullptr when not found
};
// For tests and benchmarks, which compare the two. Thread-safe.
Crc32cFunctions RocksDbCrc32cFunctions();

}  // namespace ckpt::store

#endif  // CKPT_STORE_STORE_H_
