#include "agent/rank_owners.h"

#include <utility>

#include "agent/rank_exit_tracker.h"

namespace stepwatch::agent {

RankOwners::RankOwners(RankOwnersOptions options) : options_(std::move(options)) {
  if (!options_.process_gone) options_.process_gone = ProcessGone;
}

RankOwners::Verdict RankOwners::Claim(absl::string_view job, int rank, pid_t pid) {
  if (pid == 0) return Verdict::kAccepted;
  auto job_it = owners_.find(job);
  if (job_it != owners_.end()) {
    auto rank_it = job_it->second.find(rank);
    if (rank_it != job_it->second.end()) {
      if (rank_it->second == pid) return Verdict::kAccepted;
      // Checked only on a conflict, so the common path makes no system call.
      if (!options_.process_gone(rank_it->second)) return Verdict::kNotOwner;
      rank_it->second = pid;  // the old process is gone: a restarted rank
      return Verdict::kAccepted;
    }
  }
  if (bindings_ >= options_.max_bindings) {
    SweepExited();
    if (bindings_ >= options_.max_bindings) return Verdict::kFull;
    job_it = owners_.find(job);
  }
  if (job_it == owners_.end()) job_it = owners_.emplace(std::string(job), 0).first;
  job_it->second.emplace(rank, pid);
  ++bindings_;
  return Verdict::kAccepted;
}

pid_t RankOwners::Owner(absl::string_view job, int rank) const {
  auto job_it = owners_.find(job);
  if (job_it == owners_.end()) return 0;
  auto rank_it = job_it->second.find(rank);
  return rank_it == job_it->second.end() ? 0 : rank_it->second;
}

void RankOwners::SweepExited() {
  absl::flat_hash_map<pid_t, bool> gone;  // one check per distinct pid
  for (auto job_it = owners_.begin(); job_it != owners_.end();) {
    auto& ranks = job_it->second;
    for (auto rank_it = ranks.begin(); rank_it != ranks.end();) {
      auto [it, inserted] = gone.emplace(rank_it->second, false);
      if (inserted) it->second = options_.process_gone(rank_it->second);
      if (it->second) {
        ranks.erase(rank_it++);
        --bindings_;
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
