// Binds each (job, rank) to the process that reports it, so that another local process cannot
// forge a running rank's steps (a fake straggler, a hidden stall). The owner is the first process
// that reported the rank; while it runs, events for that rank from any other pid are refused. When
// it is gone (a restarted rank), the next reporter takes over.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace stepwatch::agent {

struct RankOwnersOptions {
  // Most (job, rank) bindings held. When full, bindings of exited processes are swept; if none
  // has exited, new (job, rank) pairs are refused: a flood of invented ranks cannot evict the
  // bindings of real ones.
  size_t max_bindings = 65536;
  // Whether a process is gone; nullptr means ProcessGone (rank_exit_tracker.h).
  std::function<bool(pid_t)> process_gone;
};

// Not thread-safe: the ingest server's receive thread owns it.
class RankOwners {
 public:
  enum class Verdict { kAccepted, kNotOwner, kFull };

  explicit RankOwners(RankOwnersOptions options = {});

  // Whether `pid` may report (job, rank) now; binds it when the rank is new or its owner is gone.
  // pid 0 (sender unknown) is accepted without binding.
  Verdict Claim(absl::string_view job, int rank, pid_t pid);

  // The pid bound to (job, rank), 0 when none.
  pid_t Owner(absl::string_view job, int rank) const;
  // (job, rank) bindings held.
  size_t size() const { return bindings_; }

 private:
  void SweepExited();

  RankOwnersOptions options_;
  // Keyed by job, then rank: one string per job, not per rank.
  absl::flat_hash_map<std::string, absl::flat_hash_map<int, pid_t>> owners_;
  size_t bindings_ = 0;
};

}  // namespace stepwatch::agent
