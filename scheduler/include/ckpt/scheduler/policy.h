// Hyperparameter-optimization policies behind one interface: PBT (Jaderberg et
// al. 2017), random search, successive halving and HyperBand (Li et al. 2018;
// async: ASHA, Li et al. 2020, in each bracket).
//
// A policy sees members' progress and scores and answers what each member does
// next: continue, exploit a donor (copy its weights, metadata only) and explore
// (new hyperparameters), or stop. Decisions are pure functions of the policy's
// inputs and the experiment seed, so a resumed or repeated run decides the same.
//
// Synchronous policies decide once per generation, when every active member has
// finished interval g (Decide with every member); asynchronous ones decide for
// one member when its own interval ends (Decide with that member only).
//
// Thread-safety: const methods; one policy may be shared.
#ifndef CKPT_SCHEDULER_POLICY_H_
#define CKPT_SCHEDULER_POLICY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/records/config.h"

namespace ckpt::scheduler {

using HParams = std::map<std::string, double>;

// What a policy knows of one member.
struct MemberProgress {
  std::string member;
  int index = 0;           // position in the population, for seeding
  int intervals_done = 0;  // trained intervals
  int last_exploit = 0;    // intervals_done at its last exploit (0: never)
  double score = 0;        // latest validation score; NaN when none
  HParams hparams;
  bool active = true;  // false once stopped or failed
};

// One committed interval of a member: what it trained with and scored.
struct Observation {
  int index = 0;     // the member's position in the population
  int interval = 0;  // the interval it completed (1-based)
  HParams hparams;
  double score = 0;  // validation score; NaN when none

  // NaN scores compare equal (a history read back equals the one kept).
  friend bool operator==(const Observation& a, const Observation& b) {
    return a.index == b.index && a.interval == b.interval && a.hparams == b.hparams &&
           (a.score == b.score || (a.score != a.score && b.score != b.score));
  }
};

// Every interval committed so far, keyed (interval, member index), so that it
// iterates in the same order however results arrived; an interval trained
// again (a damaged head's fallback) replaces its earlier entry. The
// Experiment keeps it from its commits and, on resume, from the store's
// "trained" events (LoadHistory): a resumed run sees what an uninterrupted
// one sees. Sync policies read only intervals <= the generation they decide,
// since members running ahead may have committed later ones.
using History = std::map<std::pair<int, int>, Observation>;

// How sure a synchronous barrier must be of a member before it may start its
// next interval early (Policy::RunAheadMargins): at least `above` of the
// members that finished the generation rank above it and at least `below`
// rank below it (RanksBefore), however the unfinished ones end.
struct RunAheadMargins {
  int above = 0;
  int below = 0;
};

struct Decision {
  enum class Kind { kContinue, kExploit, kStop };
  Kind kind = Kind::kContinue;
  std::string donor;  // kExploit
  HParams hparams;    // kExploit: the explored hyperparameters
  std::string why;    // for the event log
};

class Policy {
 public:
  virtual ~Policy() = default;

  // Builds the policy of `config.policy`. InvalidArgument for an unknown kind.
  static StatusOr<std::unique_ptr<Policy>> Create(const records::ExperimentConfig& config);

  virtual bool synchronous() const = 0;

  // Decisions for `members` (sync: every member, all at interval `generation`;
  // async: the one member whose interval just ended, with `population` its
  // peers' latest progress), with `history` every interval committed so far.
  // Returns a decision per member name; members not in the map continue.
  virtual std::map<std::string, Decision> Decide(int generation,
                                                 const std::vector<MemberProgress>& members,
                                                 const std::vector<MemberProgress>& population,
                                                 const History& history) const = 0;

  // Hyperparameters for `member` as it starts its first interval, from
  // `history` (resample = "tpe"); nullopt keeps those it was created with
  // (the default).
  virtual std::optional<HParams> Propose(const MemberProgress& member,
                                         const History& history) const;

  // Sync policies: what makes `member` (finished interval `generation`)
  // certain to continue at that generation's barrier and to be no one's donor,
  // with `active` members taking part (those finished and those still running;
  // fewer if some fail): once the margins hold among the finished ones, the
  // member may start its next interval before the barrier and the barrier
  // decides the same (Experiment). nullopt: it must wait (the default). A
  // function of the member's intervals_done and last_exploit only (callers
  // ask once per pair).
  virtual std::optional<RunAheadMargins> RunAhead(int generation, const MemberProgress& member,
                                                  int active) const;
};

// One HyperBand bracket (Li et al. 2018, Algorithm 1; R = intervals,
// r = min_intervals): it starts `n` configurations (the paper's n, for a
// population of the paper's size) and at rungs[i] keeps counts[i + 1] of its
// counts[i] (floor(n * eta^-(i+1))); rungs.back() is the last interval.
struct HyperbandBracket {
  int s = 0;
  int n = 0;
  std::vector<int> rungs;   // r_i in intervals, i = 0..s: floor(R * eta^(i - s))
  std::vector<int> counts;  // n_i = floor(n * eta^-i)
};

// The brackets of `config.policy` (s = s_max down, `brackets` of them; all when
// 0). REQUIRES: the config parsed (records::MaxHyperbandBrackets fits).
std::vector<HyperbandBracket> HyperbandBrackets(const records::ExperimentConfig& config);

// Which bracket (position in HyperbandBrackets) each member index runs in:
// the population shared in proportion to the brackets' n (largest
// remainder; a population of the paper's size gets the paper's n), every
// bracket at least one member, in index order from the most aggressive.
std::vector<int> HyperbandAssignment(const std::vector<HyperbandBracket>& brackets, int population);

// Samples a member's initial hyperparameters from the search space (plus the
// fixed ones), deterministically from (seed, index).
HParams SampleInitial(const records::ExperimentConfig& config, int index);

// Explore step of PBT: each searched hyperparameter is resampled with
// probability resample_probability, else multiplied by one of the perturb
// factors (clamped to the space; choice: a neighbouring value).
// `proposal` (may be null): where resampled values come from instead of the
// search space (a TPE proposal).
HParams Explore(const records::ExperimentConfig& config, const HParams& from, uint64_t rng_seed,
                const HParams* proposal = nullptr);

// 64-bit mix of several values (SplitMix64), for per-decision seeds.
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c = 0);

// Whether member `a` with `score_a` ranks before `b` with `score_b`: higher
// score first, NaN last, ties by member name (a strict total order).
bool RanksBefore(double score_a, const std::string& a, double score_b, const std::string& b);
inline bool RanksBefore(const MemberProgress& a, const MemberProgress& b) {
  return RanksBefore(a.score, a.member, b.score, b.member);
}

// Orders members by score, best first (RanksBefore).
std::vector<const MemberProgress*> RankByScore(const std::vector<MemberProgress>& members);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_POLICY_H_
