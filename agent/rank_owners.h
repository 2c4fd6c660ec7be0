// Binds each (job, rank) to the process that reports it, so that another local process cannot
// forge a running rank's steps (a fake straggler, a hidden stall). The owner is the first process
// that reported the rank; while it runs, events for that rank from any other pid are refused. When
// it is gone (a restarted rank), the next reporter takes over.
//
// On a shared node the bindings are also a resource one tenant could take from the others: one
// process may own at most max_per_process of them and one user (uid) at most max_per_user, so that
// a member of the socket's group inventing (job, rank) pairs fills its own share, not the table.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
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
  // Most bindings one live process may own (--max-ranks-per-process): a training process reports
  // one rank, a launcher or simulator a node's worth.
  size_t max_per_process = 4096;
  // Most bindings the processes of one uid may own together (--max-ranks-per-user). With the
  // defaults, four users at their bound fill the table; any fewer leave room for the others.
  size_t max_per_user = 16384;
  // Whether a process is gone; nullptr means ProcessGone (rank_exit_tracker.h).
  std::function<bool(pid_t)> process_gone;
};

// Not thread-safe: the ingest server's receive thread owns it.
class RankOwners {
 public:
  enum class Verdict { kAccepted, kNotOwner, kFull, kProcessLimit, kUserLimit };
  // The uid of a sender whose credentials did not come with its message.
  static constexpr uid_t kUnknownUid = static_cast<uid_t>(-1);

  explicit RankOwners(RankOwnersOptions options = {});

  // Whether `pid` (of user `uid`) may report (job, rank) now; binds it when the rank is new or its
  // owner is gone. pid 0 (sender unknown) is accepted without binding.
  Verdict Claim(absl::string_view job, int rank, pid_t pid, uid_t uid = kUnknownUid);

  // The pid bound to (job, rank), 0 when none.
  pid_t Owner(absl::string_view job, int rank) const;
  // (job, rank) bindings held: in all, of one process, of one user.
  size_t size() const { return bindings_; }
  size_t OwnedByProcess(pid_t pid) const;
  size_t OwnedByUser(uid_t uid) const;

 private:
  struct Binding {
    pid_t pid = 0;
    uid_t uid = kUnknownUid;
  };

  void Bind(Binding* b, pid_t pid, uid_t uid);
  void Unbind(const Binding& b);
  // A sweep reads every binding: under one process's flood of refusals it runs once per
  // kRefusalsPerSweep of them, not once per message; another process's claim may sweep at once.
  // Returns whether one may run now for `pid`.
  bool SweepAllowed(pid_t pid);
  void SweepExited();

  static constexpr uint64_t kRefusalsPerSweep = 4096;

  RankOwnersOptions options_;
  // Keyed by job, then rank: one string per job, not per rank.
  absl::flat_hash_map<std::string, absl::flat_hash_map<int, Binding>> owners_;
  absl::flat_hash_map<pid_t, size_t> per_process_;
  absl::flat_hash_map<uid_t, size_t> per_user_;
  size_t bindings_ = 0;
  // Refusals since the last sweep that freed too little (0: the next one may sweep), and the
  // process refused then.
  uint64_t refusals_since_sweep_ = 0;
  pid_t refused_pid_ = 0;
};

}  // namespace stepwatch::agent
