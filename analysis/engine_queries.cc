// The read side of the engine: a job's snapshot (window figures and the detectors' annotations),
// its ranks' medians and flags, and the active findings of every job, GPU and host, rendered and
// ordered.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <tuple>
#include <utility>

#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/engine_impl.h"
#include "analysis/finding_render.h"
#include "analysis/registry.h"
#include "analysis/ring.h"
#include "analysis/stats.h"
#include "analysis/timing.h"
#include "analysis/window.h"

namespace stepwatch::analysis {

std::vector<RankSnapshot> Engine::Impl::Ranks(absl::string_view name, int first, int end) const {
  std::vector<RankSnapshot> out;
  const JobRecord* job = registry_.FindJob(name);
  if (job == nullptr) return out;
  std::vector<double> scratch;
  for (int i = std::max(first, 0); i < std::min(end, job->world_size); ++i) {
    const RankInfo& r = job->ranks[i];
    if (!r.present) continue;
    RankSnapshot rs;
    rs.rank = i;
    rs.node = r.node;
    rs.gpu = r.gpu >= 0 ? r.gpu : r.local_rank;
    rs.pp_stage = r.pp_stage;
    auto median_of = [&](float StepVals::*field) {
      scratch.clear();
      for (size_t k = 0; k < r.history.size(); ++k) scratch.push_back(r.history[k].*field);
      return MedianInPlace(scratch);
    };
    rs.busy_seconds = median_of(&StepVals::busy);
    rs.compute_seconds = median_of(&StepVals::compute);
    rs.data_seconds = median_of(&StepVals::data);
    rs.comm_seconds = median_of(&StepVals::comm);
    if (r.sections) {
      for (size_t x = 0; x < job->section_names.size(); ++x) {
        scratch.clear();
        for (size_t k = 0; k < r.sections->size(); ++k) {
          const float v = (*r.sections)[k][x];
          if (!std::isnan(v)) scratch.push_back(v);
        }
        if (!scratch.empty())
          rs.sections.push_back({job->section_names[x], MedianInPlace(scratch)});
      }
    }
    for (size_t d = 0; d < detectors_.size(); ++d) {
      detectors_[d]->AnnotateRank(View(*job), job->states[d].get(), i, &rs);
    }
    out.push_back(std::move(rs));
  }
  return out;
}

void Engine::Impl::JobFindings(const JobRecord& job, std::vector<Finding>* out) const {
  std::vector<Finding> found;
  clock_.Timed(on_evaluate_,
               [&](size_t i) { detectors_[i]->Evaluate(View(job), job.states[i].get(), &found); });
  for (Finding& f : found) RenderFinding(&f);
  out->insert(out->end(), std::make_move_iterator(found.begin()),
              std::make_move_iterator(found.end()));
}

std::vector<Finding> Engine::Impl::Findings() const {
  std::vector<Finding> out;
  for (const auto& [name, job] : registry_.jobs()) JobFindings(*job, &out);
  const size_t gpu_findings = out.size();
  clock_.Timed(on_gpu_, [&](size_t i) {
    for (const auto& [key, g] : registry_.gpus()) {
      detectors_[i]->EvaluateGpu(View(), g, g.states[i].get(), &out);
    }
  });
  clock_.Timed(on_host_, [&](size_t i) {
    for (const auto& [node, host] : registry_.hosts()) {
      detectors_[i]->EvaluateHost(View(), node, host, &out);
    }
  });
  for (size_t i = gpu_findings; i < out.size(); ++i) RenderFinding(&out[i]);
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) {
    return std::tie(a.job, a.kind, a.rank, a.node, a.gpu) <
           std::tie(b.job, b.kind, b.rank, b.node, b.gpu);
  });
  return out;
}

JobSnapshot Engine::Impl::Snapshot(const JobRecord& job) const {
  JobSnapshot s;
  s.job = job.name;
  s.world_size = job.world_size;
  s.last_step = job.max_step;
  s.last_seen_unix_nanos = job.last_seen_nanos;
  s.section_names = job.section_names;
  s.sections_folded = job.sections_folded;
  s.last_complete_step = job.last_completed;
  s.incomplete_steps = job.incomplete_steps;
  s.late_samples = job.late_samples;
  for (int i = 0; i < job.world_size; ++i) {
    const RankInfo& r = job.ranks[i];
    if (r.present && r.last_step >= job.max_step - opt_.window_steps) ++s.ranks_reporting;
  }
  if (job.summaries.empty()) return s;
  FillWindowFigures(job.summaries, &s);
  for (size_t i = 0; i < detectors_.size(); ++i) {
    detectors_[i]->AnnotateJob(View(job), job.states[i].get(), &s);
  }
  return s;
}

}  // namespace stepwatch::analysis
