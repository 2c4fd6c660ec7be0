#include "agent/rank_owners.h"

#include <utility>

#include "agent/rank_exit_tracker.h"

namespace stepwatch::agent {

RankOwners::RankOwners(RankOwnersOptions options) : options_(std::move(options)) {
  if (!options_.process_gone) options_.process_gone = ProcessGone;
}

RankOwners::Verdict RankOwners::Claim(absl::string_view job, int rank, pid_t pid, uid_t uid) {
  if (pid == 0) return Verdict::kAccepted;
  Binding* existing = nullptr;
  auto job_it = owners_.find(job);
  if (job_it != owners_.end()) {
    auto rank_it = job_it->second.find(rank);
    if (rank_it != job_it->second.end()) {
      if (rank_it->second.pid == pid) return Verdict::kAccepted;
      // Checked only on a conflict, so the common path makes no system call.
      if (!options_.process_gone(rank_it->second.pid)) return Verdict::kNotOwner;
      existing = &rank_it->second;  // the old process is gone: a restarted rank
    }
  }
  // The bounds hold for a takeover too: a dead owner's rank is not a way around them.
  if (OwnedByProcess(pid) >= options_.max_per_process) return Verdict::kProcessLimit;
  const bool user_full = OwnedByUser(uid) >= options_.max_per_user;
  const bool table_full = existing == nullptr && bindings_ >= options_.max_bindings;
  if (user_full || table_full) {
    if (!SweepAllowed(pid)) return user_full ? Verdict::kUserLimit : Verdict::kFull;
    SweepExited();
    // The sweep may have taken out `existing` (its process is gone) and rehashed the maps.
    existing = nullptr;
    job_it = owners_.find(job);
    const bool still_user_full = OwnedByUser(uid) >= options_.max_per_user;
    if (still_user_full || (existing == nullptr && bindings_ >= options_.max_bindings)) {
      refusals_since_sweep_ = 1;
      refused_pid_ = pid;
      return still_user_full ? Verdict::kUserLimit : Verdict::kFull;
    }
  }
  if (existing != nullptr) {
    Unbind(*existing);
    Bind(existing, pid, uid);
    return Verdict::kAccepted;
  }
  if (job_it == owners_.end()) job_it = owners_.emplace(std::string(job), 0).first;
  Binding& b = job_it->second[rank];
  Bind(&b, pid, uid);
  return Verdict::kAccepted;
}

pid_t RankOwners::Owner(absl::string_view job, int rank) const {
  auto job_it = owners_.find(job);
  if (job_it == owners_.end()) return 0;
  auto rank_it = job_it->second.find(rank);
  return rank_it == job_it->second.end() ? 0 : rank_it->second.pid;
}

size_t RankOwners::OwnedByProcess(pid_t pid) const {
  auto it = per_process_.find(pid);
  return it == per_process_.end() ? 0 : it->second;
}

size_t RankOwners::OwnedByUser(uid_t uid) const {
  auto it = per_user_.find(uid);
  return it == per_user_.end() ? 0 : it->second;
}

void RankOwners::Bind(Binding* b, pid_t pid, uid_t uid) {
  b->pid = pid;
  b->uid = uid;
  ++per_process_[pid];
  ++per_user_[uid];
  ++bindings_;
}

void RankOwners::Unbind(const Binding& b) {
  if (auto it = per_process_.find(b.pid); it != per_process_.end() && --it->second == 0) {
    per_process_.erase(it);
  }
  if (auto it = per_user_.find(b.uid); it != per_user_.end() && --it->second == 0) {
    per_user_.erase(it);
  }
  --bindings_;
}

bool RankOwners::SweepAllowed(pid_t pid) {
  if (refusals_since_sweep_ == 0 || refusals_since_sweep_ >= kRefusalsPerSweep ||
      pid != refused_pid_) {
    refusals_since_sweep_ = 0;
    return true;
  }
  ++refusals_since_sweep_;
  return false;
}

void RankOwners::SweepExited() {
  absl::flat_hash_map<pid_t, bool> gone;  // one check per distinct pid
  for (auto job_it = owners_.begin(); job_it != owners_.end();) {
    auto& ranks = job_it->second;
    for (auto rank_it = ranks.begin(); rank_it != ranks.end();) {
      auto [it, inserted] = gone.emplace(rank_it->second.pid, false);
      if (inserted) it->second = options_.process_gone(rank_it->second.pid);
      if (it->second) {
        Unbind(rank_it->second);
        ranks.erase(rank_it++);
      } else {
        ++rank_it;
      }
    }
    if (ranks.empty()) {
      owners_.erase(job_it++);
    } else {
      ++job_it;
    }
  }
}

}  // namespace stepwatch::agent
