// The ingest side of the engine: step samples into the job's pending steps (with the limits, the
// rescaling and restart of a job, and its named sections), GPU readings into the registry, and the
// completion of a step, which feeds its ranks' histories and the detectors' per-step hooks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/engine_impl.h"
#include "analysis/health_tracker.h"
#include "analysis/registry.h"
#include "analysis/ring.h"
#include "analysis/timing.h"
#include "analysis/window.h"
#include "common/check.h"

namespace stepwatch::analysis {

absl::Status Engine::Impl::AddStep(const StepEvent& s) {
  if (absl::Status valid = ValidateStepEvent(s); !valid.ok()) return valid;
  return AddValidatedStep(s);
}

absl::Status Engine::Impl::AddValidatedStep(const StepEvent& s) {
  if (s.world_size > opt_.max_ranks_per_job) {
    return absl::ResourceExhaustedError(
        absl::StrCat("world_size ", s.world_size, " over the limit ", opt_.max_ranks_per_job));
  }
  auto& jobs = registry_.mutable_jobs();
  auto it = jobs.find(s.job);
  if (it == jobs.end()) {
    if (static_cast<int>(jobs.size()) >= opt_.max_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("over the limit of ", opt_.max_jobs, " jobs; dropped job ", s.job));
    }
    it = jobs.emplace(s.job, std::make_unique<JobRecord>()).first;
    it->second->name = s.job;
    ResetJob(*it->second, s.world_size);
  }
  JobRecord& job = *it->second;
  if (job.world_size != s.world_size) ResetJob(job, s.world_size);  // rescaled
  // ValidateStepEvent (or the caller of AddValidatedStep) keeps rank within 0..world_size-1.
  SW_DCHECK(s.rank >= 0 && s.rank < job.world_size)
      << "rank " << s.rank << " of " << job.world_size;
  const RankInfo& r = job.ranks[s.rank];
  if (r.present && s.step <= r.last_step) {
    // A duplicate or an old resend, unless the job went back far: a restart from a checkpoint.
    if (s.step >= r.last_step - int64_t{2} * opt_.window_steps) return absl::OkStatus();
    ResetJob(job, s.world_size);
  }
  RankInfo& rank = job.ranks.Mutable(s.rank);
  if (rank.exited) {
    // A new step: the rank runs again (a restarted process).
    rank.exited = false;
    --job.exited_ranks;
  }
  if (!rank.present) {
    rank.present = true;
    rank.history = Ring<StepVals>(opt_.window_steps);
    ++job.present_ranks;
  }
  registry_.SetRankNode(job.name, s.rank, rank, s.node);
  rank.gpu = s.gpu.value_or(-1);
  rank.local_rank = s.local_rank.value_or(-1);
  rank.pid = s.pid;
  rank.pp_stage = s.pp_stage.value_or(-1);
  rank.tp_rank = s.tp_rank.value_or(-1);
  rank.last_step = s.step;
  rank.last_seen_nanos = s.received_unix_nanos;
  job.last_seen_nanos = std::max(job.last_seen_nanos, s.received_unix_nanos);
  now_ = std::max(now_, s.received_unix_nanos);
  if (s.step > job.max_step) {
    job.max_step = s.step;  // also ends a stall (StallState::Active)
    job.last_progress_nanos = s.received_unix_nanos;
  }
  if (s.step <= job.last_completed) {  // late: its step is closed
    ++job.late_samples;
    return absl::OkStatus();
  }

  Pending& p = job.pending[s.step];
  if (p.entries.empty()) p.first_nanos = s.received_unix_nanos;
  p.last_nanos = s.received_unix_nanos;
  p.entries.push_back(MakeEntry(s));
  if (!s.sections.empty()) IndexSections(job, s, &p, &p.entries.back());
  if (static_cast<int>(p.entries.size()) >= job.world_size) CompleteThrough(job, s.step);
  ExpirePending(job, now_);
  return absl::OkStatus();
}

// A section is stored by its index in the job's names, in one byte.
static_assert(kMaxSectionsPerJob <= 256);

void Engine::Impl::IndexSections(JobRecord& job, const StepEvent& s, Pending* p, Entry* e) {
  std::vector<std::string>& names = job.section_names;
  e->sections_begin = static_cast<uint32_t>(p->sections.size());
  for (const auto& [name, seconds] : s.sections) {
    if (!(seconds >= 0) || !std::isfinite(seconds)) continue;  // ValidateStepEvent refuses these
    size_t index = std::find(names.begin(), names.end(), name) - names.begin();
    if (index == names.size()) {
      if (static_cast<int>(names.size()) >= kMaxSectionsPerJob) {
        ++job.sections_folded;
        continue;
      }
      names.push_back(name);
    }
    SW_DCHECK(index < names.size());
    p->sections.push_back({static_cast<uint8_t>(index), static_cast<float>(seconds)});
  }
  e->sections_count = static_cast<uint8_t>(p->sections.size() - e->sections_begin);
  std::sort(p->sections.begin() + e->sections_begin, p->sections.end());
}

void Engine::Impl::AddGpu(const GpuSample& reading) {
  now_ = std::max(now_, reading.sampled_unix_nanos);
  GpuInfo& g = registry_.UpdateGpu(reading);
  g.health.Update(g.last, opt_);
  if (g.states.empty()) {
    for (const auto& d : detectors_) g.states.push_back(d->NewGpuState());
  }
  clock_.Sampled(on_gpu_, [&](size_t i) { detectors_[i]->OnGpu(View(), g, g.states[i].get()); });
}

void Engine::Impl::ResetJob(JobRecord& job, int world_size) {
  registry_.UnindexJob(job);
  std::string name = std::move(job.name);
  job = JobRecord();
  job.name = std::move(name);
  job.world_size = world_size;
  job.ranks.Reset(world_size);
  job.summaries = Ring<StepSummary>(opt_.window_steps);
  for (const auto& d : detectors_) job.states.push_back(d->NewJobState(opt_, world_size));
}

void Engine::Impl::ExpirePending(JobRecord& job, int64_t now) {
  while (!job.pending.empty()) {
    auto first = job.pending.begin();
    bool expired = first->second.first_nanos + step_grace_nanos_ <= now;
    bool too_many = static_cast<int>(job.pending.size()) > opt_.max_pending_steps;
    if (!expired && !too_many) break;
    CompleteThrough(job, first->first);
  }
}

// Completes every pending step up to and including `step`, oldest first.
void Engine::Impl::CompleteThrough(JobRecord& job, int64_t step) {
  while (!job.pending.empty() && job.pending.begin()->first <= step) {
    auto node = job.pending.extract(job.pending.begin());
    job.last_completed = node.key();
    ProcessStep(job, node.key(), node.mapped());
  }
}

void Engine::Impl::ProcessStep(JobRecord& job, int64_t step, Pending& p) {
  std::vector<Entry>& es = p.entries;
  if (es.empty()) return;
  ++job.completed_steps;
  if (static_cast<int>(es.size()) < job.world_size) ++job.incomplete_steps;
  // A rank that reports only its step time is busy for the share of the step its GPU's SMs were
  // active (when the GPU reports SM activity); the rest it waited.
  for (Entry& e : es) {
    if (!e.step_only) continue;
    RankInfo& r = job.ranks.Mutable(e.rank);
    const GpuInfo* g = registry_.GpuOf(r);
    if (g == nullptr || !g->last.sm_activity_ratio) continue;
    e.busy = std::clamp(*g->last.sm_activity_ratio, 0.0, 1.0) * e.step_seconds;
    e.compute = e.busy;
    e.wait = e.step_seconds - e.busy;
    e.unknown_split = false;
    // GPUs are sampled on their own clock: a reading spanning several steps is scored once.
    e.stale = g->last.sampled_unix_nanos == r.last_gpu_nanos;
    r.last_gpu_nanos = g->last.sampled_unix_nanos;
  }
  const StepSummary sum = Summarize(step, p.last_nanos, es, job.world_size, &scratch_, &job.ranks);
  job.summaries.Push(sum);
  // Peers (same pipeline stage and tensor rank) next to each other.
  std::sort(es.begin(), es.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.group, a.rank) < std::tie(b.group, b.rank);
  });
  for (Entry& e : es) {
    RankInfo& r = job.ranks.Mutable(e.rank);
    e.forgotten = !r.present;
    r.history.Push(StepVals{static_cast<float>(e.busy), static_cast<float>(e.compute),
                            static_cast<float>(e.data), static_cast<float>(e.wait)});
    if (e.sections_count == 0) continue;
    if (!r.sections) r.sections = std::make_unique<Ring<SectionVals>>(kSectionHistorySteps);
    SectionVals vals;
    vals.fill(std::numeric_limits<float>::quiet_NaN());
    for (uint32_t k = 0; k < e.sections_count; ++k) {
      const EntrySection& x = p.sections[e.sections_begin + k];
      vals[x.index] = x.seconds;
    }
    r.sections->Push(vals);
  }
  const StepView view{step, p.last_nanos, sum.step_seconds, es,
                      p.sections.empty() ? nullptr : &p.sections};
  clock_.Timed(on_step_,
               [&](size_t i) { detectors_[i]->OnStep(View(job), view, job.states[i].get()); });
}

}  // namespace stepwatch::analysis
