#include "analysis/detectors/scaling.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "analysis/causes.h"
#include "analysis/finding.h"
#include "analysis/ring.h"
#include "analysis/stats.h"
#include "analysis/window.h"

namespace stepwatch::analysis {
namespace {

// The job's largest loss in its step split: exposed communication, imbalance or data loading,
// with the split's shares set on `e` (when the split is known).
Cause JobLoss(const JobRecord& job, Evidence* e) {
  JobSnapshot s;
  FillWindowFigures(job.summaries, &s);
  if (!s.split_known) return Cause::kUnknown;
  const TimeBreakdown& b = s.breakdown;
  e->comm_share_ratio = b.comm;
  e->imbalance_share_ratio = b.imbalance;
  e->data_share_ratio = b.data;
  std::pair<double, Cause> best{0, Cause::kUnknown};
  for (auto loss :
       {std::pair{b.comm, Cause::kExposedComm}, std::pair{b.imbalance, Cause::kImbalance},
        std::pair{b.data, Cause::kDataLoading}}) {
    if (loss.first > best.first) best = loss;
  }
  return best.second;
}

}  // namespace

std::unique_ptr<DetectorState> ScalingDetector::NewJobState(const EngineOptions&, int) const {
  return std::make_unique<ScalingState>();
}

void ScalingDetector::OnStep(const JobView& view, const StepView& step, DetectorState* state) {
  const JobRecord& job = view.job;
  if (job.completed_steps % view.options.scaling_every_steps != 0) return;
  auto& st = *static_cast<ScalingState*>(state);
  if (static_cast<int>(job.summaries.size()) < view.options.straggler_window) return;
  const double median_step = MedianStep(job.summaries, &scratch_);
  if (median_step <= 0) return;
  // Throughput per GPU: samples per second over ranks when reported, else steps per second
  // (each rank processes its share of one step).
  double per_gpu = 1 / median_step;
  scratch_.clear();
  for (size_t i = 0; i < job.summaries.size(); ++i) {
    if (job.summaries[i].samples >= 0) scratch_.push_back(job.summaries[i].samples);
  }
  if (!scratch_.empty()) {
    per_gpu = MedianInPlace(scratch_) / median_step / job.world_size;
  }
  auto& sizes = HistoryOf(job.name, view.options.max_scaling_history_jobs).per_gpu;
  double& best_here = sizes[job.world_size];
  best_here = std::max(best_here, per_gpu);
  double best_smaller = 0;
  int ref_size = 0;
  for (const auto& [size, v] : sizes) {
    if (size < job.world_size && v > best_smaller) {
      best_smaller = v;
      ref_size = size;
    }
  }
  if (best_smaller <= 0) {
    st.ratio.reset();
    return;
  }
  if (!st.ratio.has_value()) {
    st.since_step = step.step;
    st.since_nanos = step.nanos;
  }
  st.ratio = per_gpu / best_smaller;
  st.reference_size = ref_size;
}

void ScalingDetector::Evaluate(const JobView& view, const DetectorState* state,
                               std::vector<Finding>* out) const {
  const auto& st = *static_cast<const ScalingState*>(state);
  if (!st.ratio || *st.ratio >= view.options.scaling_threshold) return;
  const JobRecord& job = view.job;
  Finding f = JobFinding(FindingKind::kScalingEfficiency, job.name, st.since_step, st.since_nanos);
  f.persistent = true;
  f.evidence.scaling_efficiency_ratio = st.ratio;
  f.evidence.world_size = job.world_size;
  f.evidence.reference_world_size = st.reference_size;
  SetCause(&f, JobLoss(job, &f.evidence));
  out->push_back(std::move(f));
}

void ScalingDetector::AnnotateJob(const JobView&, const DetectorState* state,
                                  JobSnapshot* out) const {
  out->scaling_efficiency_ratio = static_cast<const ScalingState*>(state)->ratio;
}

ScalingDetector::JobHistory& ScalingDetector::HistoryOf(const std::string& job, int max_jobs) {
  auto it = history_.find(job);
  if (it == history_.end()) {
    // A linear scan, paid once per new job name only when the history is full.
    while (!history_.empty() && static_cast<int>(history_.size()) >= std::max(1, max_jobs)) {
      history_.erase(
          std::min_element(history_.begin(), history_.end(), [](const auto& a, const auto& b) {
            return a.second.last_update < b.second.last_update;
          }));
    }
    it = history_.emplace(job, JobHistory{}).first;
  }
  it->second.last_update = ++update_clock_;
  return it->second;
}

std::string ScalingDetector::SerializeHistory() const {
  std::string out = "stepwatch-scaling-history v1\n";
  for (const auto& [job, h] : history_) {
    for (const auto& [size, per_gpu] : h.per_gpu) {
      absl::StrAppend(&out, absl::CEscape(job), "\t", size, "\t", absl::StrFormat("%.17g", per_gpu),
                      "\n");
    }
  }
  return out;
}

absl::Status ScalingDetector::LoadHistory(absl::string_view data) {
  std::vector<absl::string_view> lines = absl::StrSplit(data, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != "stepwatch-scaling-history v1") {
    return absl::InvalidArgumentError("not a stepwatch scaling history (bad header)");
  }
  std::map<std::string, std::map<int, double>> parsed;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<absl::string_view> f = absl::StrSplit(lines[i], '\t');
    std::string job, error;
    int size = 0;
    double per_gpu = 0;
    if (f.size() != 3 || !absl::CUnescape(f[0], &job, &error) || !absl::SimpleAtoi(f[1], &size) ||
        !absl::SimpleAtod(f[2], &per_gpu) || size <= 0 || !std::isfinite(per_gpu) || per_gpu <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("scaling history line ", i + 1, " is malformed"));
    }
    parsed[job][size] = per_gpu;
  }
  for (const auto& [job, sizes] : parsed) {
    for (const auto& [size, per_gpu] : sizes) {
      double& v = history_[job].per_gpu[size];
      v = std::max(v, per_gpu);
    }
  }
  return absl::OkStatus();
}

}  // namespace stepwatch::analysis
