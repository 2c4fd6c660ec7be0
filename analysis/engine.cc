// The engine facade: ingests samples and readings into the registry and the step window, and runs
// the detectors of analysis/detectors/detectors.cc over them. Detection lives in the detectors.
#include "analysis/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/detector.h"
#include "analysis/detectors/scaling.h"
#include "analysis/finding_render.h"
#include "analysis/health_tracker.h"
#include "analysis/registry.h"
#include "analysis/ring.h"
#include "analysis/stats.h"
#include "analysis/timing.h"
#include "analysis/window.h"
#include "common/check.h"

namespace stepwatch::analysis {

class Engine::Impl {
 public:
  explicit Impl(EngineOptions options)
      : opt_(Normalized(std::move(options))),
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
  Registry registry_;
  std::vector<std::unique_ptr<Detector>> detectors_;
  // Positions in detectors_ of those that implement each group of calls (Detector::Hook).
  std::vector<size_t> on_step_, on_advance_, on_evaluate_, on_gpu_, on_host_;
  ScalingDetector* scaling_ = nullptr;  // one of detectors_: keeps the scaling history
  mutable DetectorClock clock_;         // Findings() is const but counts its time
  int64_t now_ = 0;
  std::vector<double> scratch_;
};

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
    if (s.step >= r.last_step - 2 * opt_.window_steps) return absl::OkStatus();
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
  if (s.step <= job.last_completed) return absl::OkStatus();  // late: its step is closed

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
    bool expired = first->second.first_nanos + opt_.step_grace_nanos <= now;
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

JobSnapshot Engine::Impl::Snapshot(const JobRecord& job) const {
  JobSnapshot s;
  s.job = job.name;
  s.world_size = job.world_size;
  s.last_step = job.max_step;
  s.last_seen_unix_nanos = job.last_seen_nanos;
  s.section_names = job.section_names;
  s.sections_folded = job.sections_folded;
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
