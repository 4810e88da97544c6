// MemberRecord: the scheduling record of one member, kept in the `state` field
// of its head (store::Store::SetMemberState), and its one encoder and decoder.
//
// Stored form: a JSON object, written only by EncodeMemberRecord:
//   {"v": 3,                 format version
//    "index": 7,             position in the population (seeds its data order
//                            and initial weights; never parsed from the name)
//    "interval": 3,          intervals trained
//    "last_exploit": 2,      `interval` at its last exploit, 0 when never
//    "score": 0.81 | null,   validation score at `interval`; null when none
//                            (NaN), so any finite score, negative included,
//                            reads back as written
//    "status": "running" | "done" | "stopped" | "failed",
//    "failures": 0,          FAILED intervals in a row
//    "test_score": 0.87 | null,  the experiment's metric on the test split
//                            (final evaluation), null until then
//    "ahead": {"of": 3, "score": 0.79 | null}}  only while the member runs
//                            ahead of a synchronous barrier (Experiment): it
//                            started interval of+1 before generation `of`'s
//                            barrier was decided, which ranks it by `score`,
//                            its score at `of`; `interval` is `of` or of+1
//
// Readers: the store's initial state "created" (and "") is a fresh member.
// A record without "v" was written before this codec (version 1): its score -1
// meant none, and it has no index (the caller supplies the member's position).
// Version 2 named the test score "test_acc" (accuracy was the only metric);
// version 3 "test_score", whatever the metric. A version above 3 is refused:
// a newer scheduler wrote it. Anything that is not
// one of these shapes is Corruption naming the experiment and member; decoding
// never throws. Unknown fields are ignored (a newer minor writer may add some:
// "ahead" is one, so a scheduler that does not know it reads the record, and
// only its resume of an undecided barrier differs).
//
// Thread-safety: values and pure functions.
#ifndef CKPT_RECORDS_MEMBER_RECORD_H_
#define CKPT_RECORDS_MEMBER_RECORD_H_

#include <cmath>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"
#include "ckpt/records/status.h"

namespace ckpt::records {

inline constexpr int kMemberRecordVersion = 3;

struct MemberRecord {
  int index = -1;  // -1: not recorded (a version-1 or fresh record)
  int interval = 0;
  int last_exploit = 0;
  double score = std::nan("");
  MemberStatus status = MemberStatus::kIdle;
  int failures = 0;
  double test_score = std::nan("");
  // Running ahead of the barrier of generation `ahead_of` (-1: not), ranked
  // there by `ahead_score`.
  int ahead_of = -1;
  double ahead_score = std::nan("");

  bool ahead() const { return ahead_of >= 0; }

  // Exact comparison (NaN equals NaN), for tests and round trips.
  friend bool operator==(const MemberRecord& a, const MemberRecord& b);
};

std::string EncodeMemberRecord(const MemberRecord& state);

// `exp` and `member` name the record in errors.
StatusOr<MemberRecord> DecodeMemberRecord(std::string_view bytes, const std::string& exp,
                                          const std::string& member);

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_MEMBER_RECORD_H_
