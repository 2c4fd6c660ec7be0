#include "analysis/registry.h"

#include <algorithm>
#include <cstdint>

namespace stepwatch::analysis {

JobRecord* Registry::FindJob(absl::string_view name) {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const JobRecord* Registry::FindJob(absl::string_view name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void Registry::SetRankNode(const std::string& job, int rank, RankInfo& r, const std::string& node) {
  if (r.node == node) return;
  if (!r.node.empty()) nodes_[r.node].erase({job, rank});
  r.node = node;
  if (!node.empty()) nodes_[node].insert({job, rank});
}

void Registry::UnindexJob(const JobRecord& job) {
  for (int i = 0; i < job.world_size; ++i) {
    const RankInfo& r = job.ranks[i];
    if (r.present && !r.node.empty()) nodes_[r.node].erase({job.name, i});
  }
}

void Registry::EraseRank(JobRecord& job, int rank) {
  if (!job.ranks[rank].present) return;
  if (job.ranks[rank].exited) --job.exited_ranks;
  job.ranks.Erase(rank);
  --job.present_ranks;
}

const std::set<std::pair<std::string, int>>* Registry::RanksOn(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? nullptr : &it->second;
}

void Registry::EraseNode(const std::string& node) {
  for (auto it = gpus_.begin(); it != gpus_.end();) {
    it = it->first.first == node ? gpus_.erase(it) : std::next(it);
  }
  hosts_.erase(node);
  nodes_.erase(node);
}

GpuInfo& Registry::UpdateGpu(const GpuSample& reading) {
  GpuInfo& g = gpus_[{reading.node, reading.index}];
  g.last = reading;
  std::optional<double> v =
      reading.sm_activity_ratio.has_value() ? reading.sm_activity_ratio : reading.utilization_ratio;
  g.has_value = v.has_value();
  if (v.has_value()) g.value = *v;
  ResolveOwner(g);
  return g;
}

void Registry::ResolveOwner(GpuInfo& g) const {
  g.job.clear();
  g.rank = -1;
  auto nit = nodes_.find(g.last.node);
  if (nit == nodes_.end()) return;
  for (const auto& [job_name, rank] : nit->second) {
    const JobRecord* job = FindJob(job_name);
    if (job == nullptr) continue;
    const RankInfo& r = job->ranks[rank];
    bool by_pid = r.pid != 0 && std::find(g.last.pids.begin(), g.last.pids.end(),
                                          static_cast<uint32_t>(r.pid)) != g.last.pids.end();
    bool by_hint = r.gpu >= 0 ? r.gpu == g.last.index : r.local_rank == g.last.index;
    if (by_pid || by_hint) {
      g.job = job_name;
      g.rank = rank;
      return;
    }
  }
}

const GpuInfo* Registry::GpuOf(const RankInfo& r) const {
  if (r.node.empty()) return nullptr;
  int index = r.gpu >= 0 ? r.gpu : r.local_rank;
  if (index >= 0) {
    auto it = gpus_.find({r.node, index});
    if (it != gpus_.end()) return &it->second;
  }
  if (r.pid != 0) {
    for (auto it = gpus_.lower_bound({r.node, INT32_MIN}); it != gpus_.end(); ++it) {
      if (it->first.first != r.node) break;
      const auto& pids = it->second.last.pids;
      if (std::find(pids.begin(), pids.end(), static_cast<uint32_t>(r.pid)) != pids.end()) {
        return &it->second;
      }
    }
  }
  return nullptr;
}

void Registry::DisownGpus(absl::string_view job) {
  for (auto& [key, g] : gpus_) {
    if (g.job == job) {
      g.job.clear();
      g.rank = -1;
    }
  }
}

}  // namespace stepwatch::analysis
