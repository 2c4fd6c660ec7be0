// Group commit: one sync of a write-ahead file for every writer that asked in a short interval.
//
// A writer appends its record, then asks the committer for durability (Then or Wait). An owned
// thread runs the sync `interval` after the oldest request that waits, so that every request made
// meanwhile shares it, and resolves every request made before that sync started with its status:
// a request made before a sync starts is for a write that had completed, so that sync covers it.
// A failed sync fails every request it covered; Stop fails the requests no sync has covered yet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace stepwatch::collector {

class GroupCommitter {
 public:
  // Makes every write completed so far durable (e.g. fdatasync of the file).
  using SyncFn = std::function<absl::Status()>;
  // Told the status of the sync that covered the request; runs on the committer's thread, or on
  // the caller's when the committer has stopped. It must not call back into the committer.
  using Done = absl::AnyInvocable<void(absl::Status)>;

  // Starts the committer's thread. `interval`: how long a request waits for others to join its
  // sync (the latency it adds; syncs are at least that far apart unless one takes longer).
  GroupCommitter(SyncFn sync, absl::Duration interval);
  ~GroupCommitter();  // Stop()
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Calls `done` once a sync that started after this call has ended, with that sync's status;
  // Cancelled when the committer stopped first.
  void Then(Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // Then, waiting on this thread.
  absl::Status Wait() ABSL_LOCKS_EXCLUDED(mu_);

  // Finishes the sync under way (if any), fails the requests it does not cover and joins the
  // thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Syncs run, and those that failed.
  uint64_t syncs() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t failed_syncs() const ABSL_LOCKS_EXCLUDED(mu_);
  // Requests no sync has started for.
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until requests wait and the oldest has waited `interval`, and takes them; false (with
  // the requests left) once stopping.
  bool NextGroup(std::vector<Done>* group) ABSL_LOCKS_EXCLUDED(mu_);

  const SyncFn sync_;
  const absl::Duration interval_;
  const RealClock clock_;
  mutable absl::Mutex mu_;
  std::vector<Done> waiting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Measured on clock_'s monotonic time.
  absl::Duration oldest_request_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  uint64_t syncs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_syncs_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace stepwatch::collector
