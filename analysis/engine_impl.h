// The engine's private state and its operations (analysis/engine.h forwards to it): the registry
// of jobs, ranks, GPUs and hosts, the detectors with the hooks each one implements, and the clock
// that times them. Its members are defined by job in analysis/engine.cc (the facade, Advance and
// the removal of jobs, ranks and nodes), analysis/engine_ingest.cc (samples into steps) and
// analysis/engine_queries.cc (snapshots, ranks and findings). Internal to the engine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "analysis/detector.h"
#include "analysis/detectors/scaling.h"
#include "analysis/engine.h"
#include "analysis/registry.h"
#include "analysis/timing.h"
#include "analysis/window.h"
#include "common/check.h"

namespace stepwatch::analysis {

class Engine::Impl {
 public:
  explicit Impl(EngineOptions options)
      : opt_(Normalized(std::move(options))),
        step_grace_nanos_(absl::ToInt64Nanoseconds(opt_.step_grace)),
        detectors_(MakeDetectors()),
        clock_(detectors_.size()) {
    for (size_t i = 0; i < detectors_.size(); ++i) {
      const unsigned hooks = detectors_[i]->hooks();
      if (hooks & Detector::kStep) on_step_.push_back(i);
      if (hooks & Detector::kAdvance) on_advance_.push_back(i);
      if (hooks & Detector::kEvaluate) on_evaluate_.push_back(i);
      if (hooks & Detector::kGpu) on_gpu_.push_back(i);
      if (hooks & Detector::kHost) on_host_.push_back(i);
      if (auto* s = dynamic_cast<ScalingDetector*>(detectors_[i].get())) scaling_ = s;
    }
    // SerializeScalingHistory() and LoadScalingHistory() go through it.
    SW_CHECK(scaling_ != nullptr) << "MakeDetectors() built no scaling detector";
  }

  absl::Status AddStep(const StepEvent& s);
  absl::Status AddValidatedStep(const StepEvent& s);
  void AddGpu(const GpuSample& reading);
  void AddHost(const HostSample& reading) {
    now_ = std::max(now_, reading.sampled_unix_nanos);
    registry_.UpdateHost(reading, opt_);
  }
  void Advance(int64_t now);
  std::vector<JobSnapshot> Jobs() const {
    std::vector<JobSnapshot> out;
    for (const auto& [name, job] : registry_.jobs()) out.push_back(Snapshot(*job));
    return out;
  }
  std::optional<JobSnapshot> Job(absl::string_view name) const {
    const JobRecord* job = registry_.FindJob(name);
    if (job == nullptr) return std::nullopt;
    return Snapshot(*job);
  }
  std::vector<RankSnapshot> Ranks(absl::string_view name, int first, int end) const;
  std::vector<Finding> Findings() const;
  std::optional<FinishedJob> MarkRankExited(absl::string_view name, int rank, int pid,
                                            int64_t nanos);
  std::optional<FinishedJob> ReleaseRanksOn(absl::string_view job, absl::string_view node,
                                            int64_t unix_nanos);
  void RemoveJob(absl::string_view name);
  bool RankReportedFrom(absl::string_view name, int rank, absl::string_view node) const {
    const JobRecord* job = registry_.FindJob(name);
    if (job == nullptr || rank < 0 || rank >= job->world_size) return false;
    const RankInfo& r = job->ranks[rank];
    return r.present && r.node == node;
  }
  std::optional<RankHolder> RankHolderOf(absl::string_view name, int rank) const {
    const JobRecord* job = registry_.FindJob(name);
    if (job == nullptr || rank < 0 || rank >= job->world_size) return std::nullopt;
    const RankInfo& r = job->ranks[rank];
    if (!r.present) return std::nullopt;
    return RankHolder{r.node, r.last_seen_nanos, r.exited};
  }
  std::optional<JobHolding> JobHoldingOf(absl::string_view name) const {
    const JobRecord* job = registry_.FindJob(name);
    if (job == nullptr) return std::nullopt;
    return JobHolding{job->world_size, job->present_ranks, job->present_ranks - job->exited_ranks,
                      job->last_seen_nanos};
  }
  bool NodeHoldsRankOf(absl::string_view name, absl::string_view node) const {
    const auto* ranks = registry_.RanksOn(std::string(node));
    if (ranks == nullptr) return false;
    const std::string job(name);
    auto it = ranks->lower_bound({job, std::numeric_limits<int>::min()});
    return it != ranks->end() && it->first == job;
  }
  void RemoveNode(absl::string_view node);
  size_t JobCount() const { return registry_.jobs().size(); }
  std::optional<int> KnownRanks(absl::string_view name) const {
    const JobRecord* job = registry_.FindJob(name);
    if (job == nullptr) return std::nullopt;
    return job->present_ranks;
  }
  bool RankKnown(absl::string_view name, int rank) const {
    const JobRecord* job = registry_.FindJob(name);
    return job != nullptr && rank >= 0 && rank < job->world_size && job->ranks[rank].present;
  }
  const EngineOptions& options() const { return opt_; }
  std::string SerializeScalingHistory() const { return scaling_->SerializeHistory(); }
  absl::Status LoadScalingHistory(absl::string_view data) { return scaling_->LoadHistory(data); }
  std::map<std::string, DetectorTiming> DetectorTimings() const {
    std::map<std::string, DetectorTiming> out;
    for (size_t i = 0; i < detectors_.size(); ++i) out[detectors_[i]->name()] = clock_.timing(i);
    return out;
  }

 private:
  static EngineOptions Normalized(EngineOptions o) {
    o.window_steps = std::max(o.window_steps, 4);
    o.straggler_window = std::max(o.straggler_window, 4);
    o.max_pending_steps = std::max(o.max_pending_steps, 1);
    o.regression_window = std::max(o.regression_window, 1);
    o.regression_reference = std::max(o.regression_reference, o.regression_window);
    o.scaling_every_steps = std::max(o.scaling_every_steps, 1);
    return o;
  }

  JobView View(const JobRecord& job) const { return JobView{job, registry_, opt_}; }
  EngineView View() const { return EngineView{registry_, opt_}; }
  void ResetJob(JobRecord& job, int world_size);
  void ExpirePending(JobRecord& job, int64_t now);
  void CompleteThrough(JobRecord& job, int64_t step);
  void ProcessStep(JobRecord& job, int64_t step, Pending& p);
  void JobFindings(const JobRecord& job, std::vector<Finding>* out) const;
  JobSnapshot Snapshot(const JobRecord& job) const;
  // Gives the sample's named sections the job's section indices (new names while under the limit).
  static void IndexSections(JobRecord& job, const StepEvent& s, Pending* p, Entry* e);

  EngineOptions opt_;
  int64_t step_grace_nanos_;  // opt_.step_grace, for comparing receipt times
  Registry registry_;
  std::vector<std::unique_ptr<Detector>> detectors_;
  // Positions in detectors_ of those that implement each group of calls (Detector::Hook).
  std::vector<size_t> on_step_, on_advance_, on_evaluate_, on_gpu_, on_host_;
  ScalingDetector* scaling_ = nullptr;  // one of detectors_: keeps the scaling history
  mutable DetectorClock clock_;         // Findings() is const but counts its time
  int64_t now_ = 0;
  std::vector<double> scratch_;
};

}  // namespace stepwatch::analysis
