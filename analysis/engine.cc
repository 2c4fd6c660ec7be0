// The engine facade: Engine forwards to Engine::Impl (analysis/engine_impl.h), which ingests
// samples and readings into the registry and the step window (analysis/engine_ingest.cc) and runs
// the detectors of analysis/detectors/detectors.cc over them. Here: the time-driven Advance and the
// end of jobs, ranks and nodes. Detection lives in the detectors.
#include "analysis/engine.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "analysis/detector.h"
#include "analysis/engine_impl.h"
#include "analysis/registry.h"
#include "analysis/timing.h"

namespace stepwatch::analysis {

void Engine::Impl::Advance(int64_t now) {
  now_ = std::max(now_, now);
  for (auto& [name, job] : registry_.mutable_jobs()) ExpirePending(*job, now);
  // Each detector over every job, then over every GPU: jobs do not depend on one another once
  // their steps completed, and GPUs read only what steps left in the registry.
  clock_.Timed(on_advance_, [&](size_t i) {
    for (auto& [name, job] : registry_.mutable_jobs()) {
      detectors_[i]->OnAdvance(View(*job), now, job->states[i].get());
    }
  });
  clock_.Timed(on_gpu_, [&](size_t i) {
    for (const auto& [key, g] : registry_.gpus()) {
      detectors_[i]->OnAdvanceGpu(View(), g, now, g.states[i].get());
    }
  });
}

std::optional<FinishedJob> Engine::Impl::MarkRankExited(absl::string_view name, int rank, int pid,
                                                        int64_t nanos) {
  JobRecord* job = registry_.FindJob(name);
  if (job == nullptr) return std::nullopt;
  if (rank < 0 || rank >= job->world_size) return std::nullopt;
  if (!job->ranks[rank].present) return std::nullopt;
  RankInfo& r = job->ranks.Mutable(rank);
  // The rank's last step came from another process (restarted): that one still runs.
  if (pid != 0 && r.pid != 0 && pid != r.pid) return std::nullopt;
  if (!r.exited) {
    r.exited = true;
    r.exited_nanos = nanos;
    ++job->exited_ranks;
  }
  if (job->exited_ranks < job->present_ranks) return std::nullopt;
  // Every rank that reported has exited: the job finished rather than stalled. It is removed at
  // once, so no stall or underutilization finding outlives it (a hang keeps its processes).
  FinishedJob done;
  done.job = job->name;
  done.ranks = job->present_ranks;
  done.last_step = job->max_step;
  done.last_snapshot = Snapshot(*job);
  JobFindings(*job, &done.last_findings);
  RemoveJob(name);
  return done;
}

void Engine::Impl::RemoveJob(absl::string_view name) {
  auto& jobs = registry_.mutable_jobs();
  auto it = jobs.find(name);
  if (it == jobs.end()) return;
  registry_.UnindexJob(*it->second);
  for (const auto& [key, g] : registry_.gpus()) {
    if (g.job != name) continue;
    for (size_t i : on_gpu_) detectors_[i]->OnGpuReleased(View(), g, g.states[i].get());
  }
  registry_.DisownGpus(name);
  jobs.erase(it);
}

std::optional<FinishedJob> Engine::Impl::ReleaseRanksOn(absl::string_view job,
                                                        absl::string_view node,
                                                        int64_t unix_nanos) {
  std::vector<int> ranks;
  if (const auto* on_node = registry_.RanksOn(std::string(node))) {
    // Ordered by (job, rank): only this job's entries are visited, however many names a batch
    // releases and however many ranks the node holds.
    const std::string name(job);
    for (auto it = on_node->lower_bound({name, std::numeric_limits<int>::min()});
         it != on_node->end() && it->first == name; ++it) {
      ranks.push_back(it->second);
    }
  }
  // Copied first: the last exit removes the job, and with it these entries.
  for (int rank : ranks) {
    std::optional<FinishedJob> done = MarkRankExited(job, rank, /*pid=*/0, unix_nanos);
    if (done.has_value()) return done;
  }
  return std::nullopt;
}

void Engine::Impl::RemoveNode(absl::string_view node) {
  std::string n(node);
  if (const auto* ranks = registry_.RanksOn(n)) {
    for (const auto& [job_name, rank] : *ranks) {
      JobRecord* job = registry_.FindJob(job_name);
      if (job == nullptr || !job->ranks[rank].present) continue;
      for (size_t i = 0; i < detectors_.size(); ++i) {
        detectors_[i]->OnRankRemoved(View(*job), rank, job->states[i].get());
      }
      registry_.EraseRank(*job, rank);
    }
  }
  registry_.EraseNode(n);
}

Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Engine::~Engine() = default;
absl::Status Engine::AddStep(const StepEvent& sample) { return impl_->AddStep(sample); }
absl::Status Engine::AddValidatedStep(const StepEvent& sample) {
  return impl_->AddValidatedStep(sample);
}
void Engine::AddGpu(const GpuSample& reading) { impl_->AddGpu(reading); }
void Engine::AddHost(const HostSample& reading) { impl_->AddHost(reading); }
void Engine::Advance(int64_t now_unix_nanos) { impl_->Advance(now_unix_nanos); }
std::vector<JobSnapshot> Engine::Jobs() const { return impl_->Jobs(); }
std::optional<JobSnapshot> Engine::Job(absl::string_view job) const { return impl_->Job(job); }
std::vector<RankSnapshot> Engine::Ranks(absl::string_view job) const {
  return impl_->Ranks(job, 0, INT32_MAX);
}
std::vector<RankSnapshot> Engine::Ranks(absl::string_view job, int first, int end) const {
  return impl_->Ranks(job, first, end);
}
std::vector<Finding> Engine::Findings() const { return impl_->Findings(); }
void Engine::RemoveJob(absl::string_view job) { impl_->RemoveJob(job); }
std::optional<FinishedJob> Engine::MarkRankExited(absl::string_view job, int rank, int pid,
                                                  int64_t unix_nanos) {
  return impl_->MarkRankExited(job, rank, pid, unix_nanos);
}
std::optional<FinishedJob> Engine::ReleaseRanksOn(absl::string_view job, absl::string_view node,
                                                  int64_t unix_nanos) {
  return impl_->ReleaseRanksOn(job, node, unix_nanos);
}
void Engine::RemoveNode(absl::string_view node) { impl_->RemoveNode(node); }
bool Engine::RankReportedFrom(absl::string_view job, int rank, absl::string_view node) const {
  return impl_->RankReportedFrom(job, rank, node);
}
size_t Engine::JobCount() const { return impl_->JobCount(); }
std::optional<RankHolder> Engine::RankHolderOf(absl::string_view job, int rank) const {
  return impl_->RankHolderOf(job, rank);
}
std::optional<JobHolding> Engine::JobHoldingOf(absl::string_view job) const {
  return impl_->JobHoldingOf(job);
}
bool Engine::NodeHoldsRankOf(absl::string_view job, absl::string_view node) const {
  return impl_->NodeHoldsRankOf(job, node);
}
std::optional<int> Engine::KnownRanks(absl::string_view job) const {
  return impl_->KnownRanks(job);
}
bool Engine::RankKnown(absl::string_view job, int rank) const {
  return impl_->RankKnown(job, rank);
}
const EngineOptions& Engine::options() const { return impl_->options(); }
std::string Engine::SerializeScalingHistory() const { return impl_->SerializeScalingHistory(); }
absl::Status Engine::LoadScalingHistory(absl::string_view data) {
  return impl_->LoadScalingHistory(data);
}
std::map<std::string, DetectorTiming> Engine::DetectorTimings() const {
  return impl_->DetectorTimings();
}

}  // namespace stepwatch::analysis
