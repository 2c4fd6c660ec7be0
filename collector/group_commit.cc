#include "collector/group_commit.h"

#include <utility>

#include "absl/synchronization/notification.h"

namespace stepwatch::collector {

GroupCommitter::GroupCommitter(SyncFn sync, absl::Duration interval)
    : sync_(std::move(sync)), interval_(interval) {
  thread_ = std::thread([this] { Run(); });
}

GroupCommitter::~GroupCommitter() { Stop(); }

void GroupCommitter::Then(Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      if (waiting_.empty()) oldest_request_ = clock_.MonotonicNow();
      waiting_.push_back(std::move(done));
      return;
    }
  }
  done(absl::CancelledError("the journal was closed before its sync"));
}

absl::Status GroupCommitter::Wait() {
  absl::Notification synced;
  absl::Status result;
  Then([&](absl::Status st) {
    result = std::move(st);
    synced.Notify();
  });
  synced.WaitForNotification();
  return result;
}

void GroupCommitter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t GroupCommitter::syncs() const {
  absl::MutexLock lock(&mu_);
  return syncs_;
}

uint64_t GroupCommitter::failed_syncs() const {
  absl::MutexLock lock(&mu_);
  return failed_syncs_;
}

size_t GroupCommitter::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_.size();
}

bool GroupCommitter::NextGroup(std::vector<Done>* group) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !waiting_.empty(); };
  mu_.Await(absl::Condition(&ready));
  // The requests that arrive meanwhile join this group.
  // On the monotonic clock: a wall clock stepped back must not hold every acknowledgement.
  const absl::Duration due = oldest_request_ + interval_;
  for (absl::Duration left = due - clock_.MonotonicNow(); !stopping_ && left > absl::ZeroDuration();
       left = due - clock_.MonotonicNow()) {
    clock_.AwaitFor(&mu_, absl::Condition(&stopping_), left);
  }
  group->swap(waiting_);
  return !stopping_;
}

void GroupCommitter::Run() {
  while (true) {
    std::vector<Done> group;
    if (!NextGroup(&group)) {
      for (Done& done : group) done(absl::CancelledError("the journal was closed before its sync"));
      return;
    }
    // Outside mu_: requests made during the sync queue for the next one.
    absl::Status st = sync_();
    {
      absl::MutexLock lock(&mu_);
      ++syncs_;
      if (!st.ok()) ++failed_syncs_;
    }
    for (Done& done : group) done(st);
  }
}

}  // namespace stepwatch::collector
