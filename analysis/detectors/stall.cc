#include "analysis/detectors/stall.h"

#include <algorithm>
#include <string>

#include "absl/time/time.h"
#include "analysis/finding.h"
#include "analysis/ring.h"
#include "analysis/stats.h"
#include "analysis/window.h"

namespace stepwatch::analysis {

std::unique_ptr<DetectorState> StallDetector::NewJobState(const EngineOptions&, int) const {
  return std::make_unique<StallState>();
}

void StallDetector::OnAdvance(const JobView& view, int64_t now, DetectorState* state) {
  auto& st = *static_cast<StallState*>(state);
  const JobRecord& job = view.job;
  if (job.max_step < 0 || st.Active(job)) return;
  const double median_step = job.summaries.empty() ? 0 : MedianStep(job.summaries, &scratch_);
  int64_t limit = std::max<int64_t>(
      absl::ToInt64Nanoseconds(view.options.stall_floor),
      static_cast<int64_t>(view.options.stall_multiple * median_step * kNanosPerSecond));
  if (now - job.last_progress_nanos > limit) {
    st.stalled = true;
    st.step = job.max_step;
    st.since_nanos = job.last_progress_nanos;
    st.limit_nanos = limit;
    st.median_step_seconds = median_step;
  }
}

void StallDetector::Evaluate(const JobView& view, const DetectorState* state,
                             std::vector<Finding>* out) const {
  const auto& st = *static_cast<const StallState*>(state);
  const JobRecord& job = view.job;
  if (!st.Active(job)) return;
  Finding f = JobFinding(FindingKind::kStall, job.name, job.max_step, st.since_nanos);
  f.severity = Severity::kCritical;
  std::vector<int> silent, waiting, exited;
  for (int i = 0; i < job.world_size; ++i) {
    const RankInfo& r = job.ranks[i];
    if (r.exited) exited.push_back(i);
    if (!r.present || r.last_step < job.max_step) {
      silent.push_back(i);
    } else {
      waiting.push_back(i);
    }
  }
  Evidence& e = f.evidence;
  e.stall_limit_seconds = st.limit_nanos / kNanosPerSecond;
  e.median_step_seconds = st.median_step_seconds;
  e.silent_rank_count = static_cast<int64_t>(silent.size());
  e.waiting_rank_count = static_cast<int64_t>(waiting.size());
  e.exited_rank_count = static_cast<int64_t>(exited.size());
  e.waiting_ranks = BoundedRanks(waiting, view.options.max_finding_ranks);
  e.exited_ranks = BoundedRanks(exited, view.options.max_finding_ranks);
  // Some processes ended while the others hang: the first to go likely crashed.
  SetCause(&f, exited.empty() ? Cause::kHang : Cause::kRankExited);
  // With every rank at the same step, all of them are the silent ones.
  f.ranks = BoundedRanks(silent.empty() ? waiting : silent, view.options.max_finding_ranks);
  out->push_back(std::move(f));
}

}  // namespace stepwatch::analysis
