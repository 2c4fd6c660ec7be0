#include "analysis/detectors/stall.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/finding.h"
#include "analysis/stats.h"

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
      view.options.stall_floor_nanos,
      static_cast<int64_t>(view.options.stall_multiple * median_step * kNanosPerSecond));
  if (now - job.last_progress_nanos > limit) {
    st.stalled = true;
    st.step = job.max_step;
    st.since_nanos = job.last_progress_nanos;
    st.limit_nanos = limit;
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
  f.summary = absl::StrFormat("no step progress for over %s after step %d",
                              Seconds(st.limit_nanos / kNanosPerSecond), job.max_step);
  auto list = [](const std::vector<int>& v) {
    constexpr size_t kShown = 16;
    std::string s = absl::StrJoin(v.begin(), v.begin() + std::min(v.size(), kShown), ",");
    if (v.size() > kShown) absl::StrAppend(&s, ",... (", v.size(), " in all)");
    return s;
  };
  if (silent.empty()) {
    absl::StrAppend(&f.summary, "; all ", waiting.size(), " ranks silent since that step");
  } else {
    absl::StrAppend(&f.summary, "; silent ranks (behind): ", list(silent));
    if (!waiting.empty()) absl::StrAppend(&f.summary, "; waiting ranks: ", list(waiting));
  }
  // Some processes ended while the others hang: the first to go likely crashed.
  if (!exited.empty()) {
    absl::StrAppend(&f.summary, exited.size() == 1 ? "; rank " : "; ranks ", list(exited),
                    " exited (process gone)");
    SetCause(&f, Cause::kRankExited);
    f.action =
        absl::StrCat("read the logs of rank", exited.size() == 1 ? " " : "s ", list(exited),
                     " (exited); the other ranks wait for ", exited.size() == 1 ? "it" : "them");
  } else {
    SetCause(&f, Cause::kHang);
    f.action =
        "dump the stacks of the silent ranks (py-spy dump) and read their NCCL logs "
        "(NCCL_DEBUG=INFO)";
  }
  // With every rank at the same step, all of them are the silent ones.
  f.ranks = BoundedRanks(silent.empty() ? waiting : silent, view.options.max_finding_ranks);
  out->push_back(std::move(f));
}

}  // namespace stepwatch::analysis
