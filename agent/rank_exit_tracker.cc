#include "agent/rank_exit_tracker.h"

#include <errno.h>
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stepwatch::agent {
namespace {

// The state letter of /proc/<pid>/stat ("R", "S", "Z", ...), or '\0' when unreadable. The pid is
// in the agent's own pid namespace (the kernel translates SO_PASSCRED pids into it), so this is
// the agent's /proc, not the --host-root one.
char ProcessState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return '\0';
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // "pid (comm) S ...": comm may contain spaces and parentheses, so look after the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return '\0';
  return text[close + 2];
}

}  // namespace

bool ProcessGone(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  // Exited but not yet reaped by its parent: it runs no more code.
  const char state = ProcessState(pid);
  return state == 'Z' || state == 'X';
}

RankExitTracker::RankExitTracker(RankExitTrackerOptions options) : options_(std::move(options)) {}

void RankExitTracker::Observe(absl::string_view job, int rank, pid_t pid, int64_t now_unix_nanos) {
  if (pid <= 0 || options_.max_tracked == 0) return;
  absl::MutexLock lock(&mu_);
  auto jit = jobs_.find(job);
  if (jit != jobs_.end()) {
    auto rit = jit->second.find(rank);
    if (rit != jit->second.end()) {
      rit->second.pid = pid;
      rit->second.last_seen_unix_nanos = now_unix_nanos;
      return;
    }
  }
  if (size_ >= options_.max_tracked) {
    EvictOldest();
    jit = jobs_.find(job);  // eviction may have erased it
  }
  if (jit == jobs_.end()) jit = jobs_.emplace(std::string(job), Ranks()).first;
  jit->second[rank] = Entry{pid, now_unix_nanos};
  ++size_;
}

void RankExitTracker::EvictOldest() {
  // Forget the oldest eighth in one pass, so that a flood of new ranks costs one scan per
  // max_tracked / 8 insertions rather than one per insertion.
  std::vector<int64_t> seen;
  seen.reserve(size_);
  for (const auto& [job, ranks] : jobs_) {
    for (const auto& [rank, e] : ranks) seen.push_back(e.last_seen_unix_nanos);
  }
  if (seen.empty()) return;
  const size_t k = std::min(seen.size() - 1, seen.size() / 8);
  std::nth_element(seen.begin(), seen.begin() + k, seen.end());
  const int64_t cutoff = seen[k];
  for (auto jit = jobs_.begin(); jit != jobs_.end();) {
    Ranks& ranks = jit->second;
    for (auto rit = ranks.begin(); rit != ranks.end();) {
      if (rit->second.last_seen_unix_nanos <= cutoff) {
        ranks.erase(rit++);
        --size_;
      } else {
        ++rit;
      }
    }
    if (ranks.empty()) {
      jobs_.erase(jit++);
    } else {
      ++jit;
    }
  }
}

std::vector<v1::RankExit> RankExitTracker::Check(int64_t now_unix_nanos,
                                                 std::optional<int64_t> exited_unix_nanos) {
  const int64_t forget_before = now_unix_nanos - absl::ToInt64Nanoseconds(options_.forget_after);
  // Ranks of one process share its verdict: one check per pid, made without the lock so that the
  // ingest thread never waits on /proc.
  absl::flat_hash_map<pid_t, bool> gone;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [job, ranks] : jobs_) {
      for (const auto& [rank, e] : ranks) gone.emplace(e.pid, false);
    }
  }
  bool any_gone = false;
  for (auto& [pid, is_gone] : gone) {
    is_gone = options_.process_gone ? options_.process_gone(pid) : ProcessGone(pid);
    any_gone = any_gone || is_gone;
  }
  std::vector<v1::RankExit> out;
  absl::MutexLock lock(&mu_);
  for (auto jit = jobs_.begin(); jit != jobs_.end();) {
    Ranks& ranks = jit->second;
    for (auto rit = ranks.begin(); rit != ranks.end();) {
      const Entry& e = rit->second;
      bool drop = e.last_seen_unix_nanos < forget_before;
      if (!drop && any_gone) {
        // A pid first seen after the checks above is not in `gone`: checked next time.
        auto git = gone.find(e.pid);
        if (git != gone.end() && git->second) {
          v1::RankExit& x = out.emplace_back();
          x.set_job(jit->first);
          x.set_rank(rit->first);
          x.set_pid(e.pid);
          x.set_exited_unix_nanos(exited_unix_nanos.value_or(now_unix_nanos));
          drop = true;
        }
      }
      if (drop) {
        ranks.erase(rit++);
        --size_;
      } else {
        ++rit;
      }
    }
    if (ranks.empty()) {
      jobs_.erase(jit++);
    } else {
      ++jit;
    }
  }
  std::sort(out.begin(), out.end(), [](const v1::RankExit& a, const v1::RankExit& b) {
    return std::make_pair(a.job(), a.rank()) < std::make_pair(b.job(), b.rank());
  });
  return out;
}

size_t RankExitTracker::size() const {
  absl::MutexLock lock(&mu_);
  return size_;
}

std::vector<std::string> RankExitTracker::JobsWithLiveSenders() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> jobs;
  jobs.reserve(jobs_.size());
  for (const auto& entry : jobs_) jobs.push_back(entry.first);
  return jobs;
}

}  // namespace stepwatch::agent
