// The gradient table's child processes. Each system's push + pull reps of a
// row run in a fresh process, this binary again with
// --grad_child=SYSTEM,MB,S,REPS, holding its servers and client, so that
// neither system runs in the heap the other left. The child prints one line
// on stdout, which RunGradChild parses:
//   reps T1 T2 ...        the seconds of each timed rep, or
//   error CODE MESSAGE    an absl::StatusCode and its message.
//
// Thread-safety: plain functions.

#ifndef BNPS_BENCH_GRAD_CHILD_H_
#define BNPS_BENCH_GRAD_CHILD_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace bnps::bench {

// Untimed reps at the start of each grad child: the first connects and
// faults in the buffers.
inline constexpr int kGradWarmup = 2;
// How long one grad child may take, start to exit.
inline constexpr absl::Duration kGradChildBudget = absl::Seconds(90);

// The grad table's parameters for `mb` MB (2^20 bytes): (key, elements), at
// most 1M floats each.
std::vector<std::pair<std::string, int64_t>> GradKeys(int mb);

// One system's push + pull reps of `mb` MB over `shards` servers, all in this
// process (a grad child: nothing of the other system is here), after
// kGradWarmup untimed ones. bnps: S shard servers (sync, one worker); a rep
// is PushGradients(step) of all GradKeys (shared, as the trainer pushes) and
// PullParametersInto(step + 1) (applied at once; into the same buffers every
// rep, as the echo's reader reuses its message). echo: S echo servers,
// EchoPushPull. Returns the seconds of each timed rep; the reps stop early
// near kGradChildBudget (DEADLINE_EXCEEDED if none was timed); the first
// failing rep's status.
absl::StatusOr<std::vector<double>> GradReps(bool bnps, int mb, int shards,
                                             int reps);

// Body of `--grad_child=SYSTEM,MB,S,REPS`: prints the line above and returns
// 0, or returns 2 with one line on stderr if `spec` is malformed.
int GradChildMain(const std::string& spec);

// Runs this binary (/proc/self/exe) with --grad_child=spec and this
// process's --heap_keep_mb, and returns the rep times it printed, or the
// error it printed. The child is killed (by its PID) if it outlives
// kGradChildBudget: DEADLINE_EXCEEDED. INTERNAL if it printed neither.
absl::StatusOr<std::vector<double>> RunGradChild(const std::string& spec);

}  // namespace bnps::bench

#endif  // BNPS_BENCH_GRAD_CHILD_H_
