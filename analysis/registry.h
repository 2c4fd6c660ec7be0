// The job/rank/node registry: which jobs exist, where each rank runs (node, GPU, pid), the last
// reading of every GPU and host, and the single answer to "which GPU does this rank drive".
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "analysis/engine.h"
#include "analysis/health_tracker.h"
#include "analysis/ring.h"
#include "analysis/window.h"

namespace stepwatch::analysis {

// A detector's state for one job (analysis/detector.h); each detector derives its own.
class DetectorState {
 public:
  virtual ~DetectorState() = default;
};

// Steps of named-section history kept per rank (the medians RankSnapshot::sections shows).
inline constexpr size_t kSectionHistorySteps = 16;

// One step's named sections of one rank, by the job's section index (NaN: not reported).
using SectionVals = std::array<float, kMaxSectionsPerJob>;

struct RankInfo {
  bool present = false;
  std::string node;
  int gpu = -1;
  int local_rank = -1;
  int pid = 0;
  int pp_stage = -1;
  int tp_rank = -1;
  int64_t last_step = -1;
  int64_t last_seen_nanos = 0;
  Ring<StepVals> history;
  // The named sections of its recent steps (allocated when it first reports one).
  std::unique_ptr<Ring<SectionVals>> sections;
  int64_t last_gpu_nanos = -1;  // the GPU reading last used for a step-only split
  // The agent saw the process that sent this rank's last step exit.
  bool exited = false;
  int64_t exited_nanos = 0;
};

// Ranks of one job, allocated when they first report: a sample that claims a huge world size costs
// one pointer per rank, not the history of every rank.
class RankTable {
 public:
  void Reset(int world_size) {
    slots_.clear();
    slots_.resize(world_size);
  }
  // An absent rank reads as a default (not present) one.
  const RankInfo& operator[](int i) const {
    static const RankInfo* const kAbsent = new RankInfo();
    return slots_[i] ? *slots_[i] : *kAbsent;
  }
  RankInfo& Mutable(int i) {
    if (!slots_[i]) slots_[i] = std::make_unique<RankInfo>();
    return *slots_[i];
  }
  void Erase(int i) { slots_[i].reset(); }

 private:
  std::vector<std::unique_ptr<RankInfo>> slots_;
};

// One job: its ranks, pending steps, window of complete steps, and each detector's state.
struct JobRecord {
  std::string name;
  int world_size = 0;
  RankTable ranks;
  int present_ranks = 0;
  int exited_ranks = 0;  // present ranks whose process exited
  std::map<int64_t, Pending> pending;
  int64_t last_completed = -1;
  int64_t max_step = -1;
  int64_t last_progress_nanos = 0;
  int64_t last_seen_nanos = 0;
  Ring<StepSummary> summaries;
  int64_t completed_steps = 0;
  // Named sections in order of first report (at most kMaxSectionsPerJob), and section values
  // dropped because their name came after the limit.
  std::vector<std::string> section_names;
  int64_t sections_folded = 0;
  // Steps analysed with fewer ranks than the world size (completed by the grace period or the
  // pending cap), and rank samples that came after their step was analysed (left out of it).
  int64_t incomplete_steps = 0;
  int64_t late_samples = 0;
  // One slot per detector, in the order of the detector list (null when it keeps none).
  std::vector<std::unique_ptr<DetectorState>> states;
};

// The last reading of one GPU and the rank that drives it.
struct GpuInfo {
  GpuSample last;
  bool has_value = false;
  double value = 0;  // SM activity where known, else utilization
  std::string job;   // owner, empty when none
  int rank = -1;
  // Its hardware faults as of the last reading (read by the gpu_health detector and by the
  // cause of a finding on a rank that drives it).
  GpuHealthTracker health;
  // One slot per detector, in the order of the detector list (null when it keeps none).
  std::vector<std::unique_ptr<DetectorState>> states;
};

// The last reading of one node's host and its network ports' faults.
struct HostInfo {
  HostSample last;
  NicHealthTracker nics;
};
using HostMap = std::map<std::string, HostInfo>;

using GpuKey = std::pair<std::string, int>;  // (node, index)
// Jobs by name; looked up by string_view without a copy.
using JobMap = std::map<std::string, std::unique_ptr<JobRecord>, std::less<>>;

class Registry {
 public:
  JobRecord* FindJob(absl::string_view name);
  const JobRecord* FindJob(absl::string_view name) const;
  const JobMap& jobs() const { return jobs_; }
  JobMap& mutable_jobs() { return jobs_; }

  // Records where `rank` of `job` runs now (the node index follows it).
  void SetRankNode(const std::string& job, int rank, RankInfo& r, const std::string& node);
  // Takes the job's ranks out of the node index (before the job is reset or removed).
  void UnindexJob(const JobRecord& job);
  // Forgets a rank (its node is going away); the node index entry is the caller's.
  void EraseRank(JobRecord& job, int rank);
  // (job, rank) pairs that reported from `node`.
  const std::set<std::pair<std::string, int>>* RanksOn(const std::string& node) const;
  void EraseNode(const std::string& node);

  // Records a reading and resolves which rank drives the GPU (by pid, else gpu/local_rank hint).
  GpuInfo& UpdateGpu(const GpuSample& reading);
  const std::map<GpuKey, GpuInfo>& gpus() const { return gpus_; }
  // The GPU a rank drives: by its gpu (else local_rank) index on its node, else by its pid.
  const GpuInfo* GpuOf(const RankInfo& r) const;
  // Forgets the owner of every GPU `job` drove.
  void DisownGpus(absl::string_view job);

  void UpdateHost(const HostSample& reading, const EngineOptions& opt) {
    HostInfo& h = hosts_[reading.node];
    h.last = reading;
    h.nics.Update(reading, opt);
  }
  const HostMap& hosts() const { return hosts_; }

 private:
  void ResolveOwner(GpuInfo& g) const;

  JobMap jobs_;
  std::map<GpuKey, GpuInfo> gpus_;
  HostMap hosts_;
  std::map<std::string, std::set<std::pair<std::string, int>>> nodes_;  // node -> (job, rank)
};

}  // namespace stepwatch::analysis
