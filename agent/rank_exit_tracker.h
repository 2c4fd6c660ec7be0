// Tells a finished job from a hung one. Both stop sending steps; only in the first have the
// training processes exited. The tracker remembers, per (job, rank), the pid that sent the rank's
// last step (SO_PASSCRED) and, when asked, reports each (job, rank) whose process is gone, once.
// Several ranks may share one pid (a simulator sending for many ranks): each is reported.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

// True when process `pid` no longer runs: kill(pid, 0) fails with ESRCH, or /proc/<pid>/stat shows
// a zombie (exited, not yet reaped by its parent). A process of another user (EPERM) is running.
bool ProcessGone(pid_t pid);

struct RankExitTrackerOptions {
  // Most (job, rank) entries held; beyond it the least recently seen entry is forgotten.
  size_t max_tracked = 65536;
  // Entries whose rank sent nothing for this long are forgotten without a report: a process that
  // has been silent that long is not ending a job right now, and its pid may be reused.
  absl::Duration forget_after = absl::Hours(6);
  // Whether a process is gone; nullptr means ProcessGone.
  std::function<bool(pid_t)> process_gone;
};

class RankExitTracker {
 public:
  explicit RankExitTracker(RankExitTrackerOptions options = {});

  // Records that `pid` sent a step for (job, rank). `now_unix_nanos` may be on any clock, the one
  // Check() is given (the agent uses the monotonic one, so that a wall-clock step neither forgets
  // entries nor keeps them). pid 0 (unknown sender) is ignored. Thread-safe
  // and cheap: no system call, no allocation for a (job, rank) already tracked.
  void Observe(absl::string_view job, int rank, pid_t pid, int64_t now_unix_nanos)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Checks every tracked pid (one check per distinct pid) and returns the (job, rank) entries whose
  // process is gone; they are forgotten, so each exit is reported once. A later step for the same
  // (job, rank) tracks it again. Also forgets entries unseen for forget_after. The reports carry
  // `exited_unix_nanos` (the wall time; default `now_unix_nanos`). Thread-safe.
  std::vector<v1::RankExit> Check(int64_t now_unix_nanos,
                                  std::optional<int64_t> exited_unix_nanos = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Entries held now.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  // Jobs with at least one rank whose sender was running at the last Check(): a job that has
  // stopped stepping but whose processes live (hung, or in a long checkpoint).
  std::vector<std::string> JobsWithLiveSenders() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    pid_t pid = 0;
    int64_t last_seen_unix_nanos = 0;
  };
  using Ranks = absl::flat_hash_map<int, Entry>;

  // Forgets the least recently seen entry.
  void EvictOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RankExitTrackerOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Ranks> jobs_ ABSL_GUARDED_BY(mu_);
  size_t size_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stepwatch::agent
