// A job in a registry, driven through the Detector interface without the engine: what each
// detector test needs to feed steps and read findings.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/detector.h"
#include "analysis/finding_render.h"
#include "analysis/registry.h"

namespace stepwatch::analysis::testing {

class DetectorFixture {
 public:
  // `detectors` in list order; their slots are set here.
  DetectorFixture(std::vector<Detector*> detectors, int world_size, EngineOptions options = {})
      : detectors_(std::move(detectors)), options_(options) {
    for (size_t i = 0; i < detectors_.size(); ++i) detectors_[i]->set_slot(i);
    auto job = std::make_unique<JobRecord>();
    job->name = "job";
    job->world_size = world_size;
    job->ranks.Reset(world_size);
    job->summaries = Ring<StepSummary>(options_.window_steps);
    for (Detector* d : detectors_) job->states.push_back(d->NewJobState(options_, world_size));
    job_ = job.get();
    registry_.mutable_jobs()["job"] = std::move(job);
  }

  JobRecord& job() { return *job_; }
  Registry& registry() { return registry_; }
  const EngineOptions& options() const { return options_; }
  JobView view() const { return JobView{*job_, registry_, options_}; }
  EngineView engine_view() const { return EngineView{registry_, options_}; }

  RankInfo& AddRank(int rank, const std::string& node, int gpu = -1, int pp_stage = -1) {
    RankInfo& r = job_->ranks.Mutable(rank);
    r.present = true;
    r.history = Ring<StepVals>(options_.window_steps);
    r.gpu = gpu;
    r.pp_stage = pp_stage;
    ++job_->present_ranks;
    registry_.SetRankNode(job_->name, rank, r, node);
    return r;
  }

  // Completes one step: a full split per rank (busy = compute, wait = step - busy), entries sorted
  // by (group, rank) as the engine does; every detector's OnStep runs in order.
  void Step(int64_t step, double step_seconds, const std::vector<double>& busy,
            const std::vector<int64_t>& groups = {}) {
    std::vector<Entry> es;
    for (size_t i = 0; i < busy.size(); ++i) {
      Entry e;
      e.rank = static_cast<int>(i);
      e.group = groups.empty() ? -1 : groups[i];
      e.pp_stage = job_->ranks[e.rank].pp_stage;
      e.step_seconds = step_seconds;
      e.busy = e.compute = busy[i];
      e.wait = step_seconds - busy[i];
      e.split = true;
      es.push_back(e);
      job_->ranks.Mutable(e.rank).last_step = step;
    }
    std::sort(es.begin(), es.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.group, a.rank) < std::tie(b.group, b.rank);
    });
    const int64_t nanos = step * 1'000'000'000;
    std::vector<double> scratch;
    const StepSummary sum = Summarize(step, nanos, es, job_->world_size, &scratch);
    job_->summaries.Push(sum);
    ++job_->completed_steps;
    job_->max_step = std::max(job_->max_step, step);
    job_->last_completed = step;
    job_->last_progress_nanos = nanos;
    const StepView view{step, nanos, sum.step_seconds, es};
    for (size_t i = 0; i < detectors_.size(); ++i) {
      detectors_[i]->OnStep(this->view(), view, job_->states[i].get());
    }
  }

  void Advance(int64_t now) {
    for (size_t i = 0; i < detectors_.size(); ++i) {
      detectors_[i]->OnAdvance(view(), now, job_->states[i].get());
    }
  }

  // Every detector's findings for the job, in list order, rendered (as the engine collects them).
  std::vector<Finding> Findings() const {
    std::vector<Finding> out;
    for (size_t i = 0; i < detectors_.size(); ++i) {
      detectors_[i]->Evaluate(view(), job_->states[i].get(), &out);
    }
    for (Finding& f : out) RenderFinding(&f);
    return out;
  }

  RankSnapshot Rank(int rank) const {
    RankSnapshot rs;
    rs.rank = rank;
    for (size_t i = 0; i < detectors_.size(); ++i) {
      detectors_[i]->AnnotateRank(view(), job_->states[i].get(), rank, &rs);
    }
    return rs;
  }

 private:
  std::vector<Detector*> detectors_;
  EngineOptions options_;
  Registry registry_;
  JobRecord* job_ = nullptr;
};

}  // namespace stepwatch::analysis::testing
