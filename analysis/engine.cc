#include "analysis/engine.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/causes.h"
#include "analysis/ring.h"

namespace stepwatch::analysis {

const char* FindingKindName(FindingKind kind) {
  switch (kind) {
    case FindingKind::kStraggler:
      return "straggler";
    case FindingKind::kSlowNode:
      return "slow_node";
    case FindingKind::kPipelineImbalance:
      return "pipeline_imbalance";
    case FindingKind::kUnderutilizedGpu:
      return "underutilized_gpu";
    case FindingKind::kIdleGpu:
      return "idle_gpu";
    case FindingKind::kScalingEfficiency:
      return "scaling_efficiency";
    case FindingKind::kRegression:
      return "regression";
    case FindingKind::kStall:
      return "stall";
  }
  return "unknown";
}

const char* SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kCritical:
      return "critical";
  }
  return "unknown";
}

absl::Status ValidateStepSample(const StepSample& s) {
  constexpr double kMaxSeconds = 86400;  // a step longer than a day is a bug, not a measurement
  if (s.job.empty()) return absl::InvalidArgumentError("step sample without job");
  if (s.world_size <= 0) return absl::InvalidArgumentError("world_size must be positive");
  if (s.rank < 0 || s.rank >= s.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", s.rank, " outside [0, ", s.world_size, ")"));
  }
  if (s.step < 0) return absl::InvalidArgumentError("negative step");
  if (!std::isfinite(s.step_s) || s.step_s <= 0 || s.step_s > kMaxSeconds) {
    return absl::InvalidArgumentError("step_s must be positive, finite and at most a day");
  }
  for (const auto* d : {&s.data_s, &s.compute_s, &s.comm_s}) {
    if (d->has_value() && (!std::isfinite(**d) || **d < 0 || **d > kMaxSeconds)) {
      return absl::InvalidArgumentError("durations must be non-negative, finite, at most a day");
    }
  }
  if (s.samples.has_value() && *s.samples < 0) {
    return absl::InvalidArgumentError("negative samples");
  }
  // As the agent's datagram contract says; a batch from elsewhere must not reach the peer-group
  // key (a negative pp_stage shifted left is undefined behaviour).
  for (const auto* i : {&s.local_rank, &s.gpu, &s.dp_rank, &s.pp_stage, &s.tp_rank}) {
    if (i->has_value() && **i < 0) {
      return absl::InvalidArgumentError("negative index (local_rank, gpu, dp/pp/tp rank)");
    }
  }
  return absl::OkStatus();
}

const char* CauseName(Cause cause) {
  switch (cause) {
    case Cause::kUnknown:
      return "unknown";
    case Cause::kMoreWork:
      return "more_work";
    case Cause::kThermalThrottling:
      return "thermal_throttling";
    case Cause::kPowerThrottling:
      return "power_throttling";
    case Cause::kHardwareSlowdown:
      return "hardware_slowdown";
    case Cause::kLowClocks:
      return "low_clocks";
    case Cause::kHostCpu:
      return "host_cpu";
    case Cause::kDataLoading:
      return "data_loading";
    case Cause::kExposedComm:
      return "exposed_communication";
    case Cause::kMemoryBandwidth:
      return "memory_bandwidth";
    case Cause::kNoWork:
      return "no_work";
    case Cause::kImbalance:
      return "imbalance";
    case Cause::kRankExited:
      return "rank_exited";
    case Cause::kHang:
      return "hang";
  }
  return "unknown";
}

std::vector<std::string> DecodeThrottleReasons(uint64_t mask) {
  // NVML clocks-throttle-reason bits; idle, application clocks, sync boost and display clock
  // settings are not slowdowns and are left out.
  std::vector<std::string> out;
  auto add = [&out](const char* s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.emplace_back(s);
  };
  if (mask & 0x20ull || mask & 0x40ull) add("thermal throttling");
  if (mask & 0x4ull) add("power capping");
  if (mask & 0x80ull) add("power brake");
  if (mask & 0x8ull) add("hardware slowdown");
  return out;
}

namespace {

constexpr double kMadToSigma = 1.4826;
constexpr double kNanosPerSecond = 1e9;
constexpr int kRegressionWindow = 16;
constexpr int kRegressionReference = 48;

double MedianInPlace(std::vector<double>& v) {
  if (v.empty()) return 0;
  size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  double lo = *std::max_element(v.begin(), v.begin() + mid);
  return (lo + hi) / 2;
}

bool Finite(double d) { return std::isfinite(d); }

// One rank's contribution to one step, reduced to what the detectors need.
struct Entry {
  int rank = 0;
  int64_t group = -1;  // (pp_stage, tp_rank) peer group; -1: all ranks are peers
  int pp_stage = -1;
  double step_s = 0;
  double busy = 0;
  double compute = 0;
  double data = 0;
  double wait = 0;
  int64_t samples = -1;
  bool split = false;          // data_s or compute_s reported
  bool step_only = false;      // nothing but step_s: the GPU's SM activity may tell the split
  bool stale = false;          // split taken from a GPU reading already used: no new evidence
  bool unknown_split = false;  // step_only with no SM activity: busy is the step, not evidence
};

struct Pending {
  int64_t first_nanos = 0;
  int64_t last_nanos = 0;
  std::vector<Entry> entries;
};

struct StepVals {
  float busy = 0, compute = 0, data = 0, comm = 0;
};

struct Score {
  int64_t step = 0;
  float busy = 0, ref = 0;
  float compute = 0, ref_compute = 0;
  float data = 0, ref_data = 0;
  float sigma = 0;  // robust relative noise of the peer group in this step
  bool over = false;
  bool split = false;
};

struct RankState {
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
  Ring<Score> scores;
  double sum_ratio = 0;
  double sum_excess = 0;
  double sum_sigma = 0;
  double sum_ratio_sq = 0;
  int64_t last_gpu_nanos = -1;  // the GPU reading last used for a step-only split
  int over_count = 0;
  bool flagged = false;
  int64_t flagged_since_step = 0;
  int64_t flagged_since_nanos = 0;
  int64_t flagged_steps = 0;
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
  const RankState& operator[](int i) const {
    static const RankState* const kAbsent = new RankState();
    return slots_[i] ? *slots_[i] : *kAbsent;
  }
  RankState& Mutable(int i) {
    if (!slots_[i]) slots_[i] = std::make_unique<RankState>();
    return *slots_[i];
  }
  void Erase(int i) { slots_[i].reset(); }

 private:
  std::vector<std::unique_ptr<RankState>> slots_;
};

struct StepSummary {
  int64_t step = 0;
  int64_t nanos = 0;
  double step_s = 0;
  double med_busy = 0;
  double max_busy = 0;
  double exposed_comm = 0;
  double med_data = 0;
  double samples = -1;       // summed over ranks, -1 when not reported
  bool split_known = false;  // some rank's split was reported or inferred from SM activity
};

struct StageState {
  Ring<float> medians;
  double sum = 0;
};

struct JobState {
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

  // Regressions.
  Ring<std::pair<int64_t, float>> reg_recent{kRegressionWindow};
  Ring<float> reg_reference{kRegressionReference};
  bool regressed = false;
  int64_t regressed_since_step = 0;
  int64_t regressed_since_nanos = 0;
  double regression_baseline = 0;
  double regression_level = 0;
  // What rose with the step time, fixed when the regression is found.
  Cause regression_cause = Cause::kUnknown;
  std::string regression_cause_text;

  // Stalls.
  bool stalled = false;
  int64_t stalled_since_nanos = 0;
  int64_t stall_limit_nanos = 0;

  // Pipeline stages.
  std::map<int, StageState> stages;
  bool imbalanced = false;
  int imbalanced_stage = -1;
  double imbalance_ratio = 0;
  double imbalance_stage_s = 0;
  double imbalance_others_s = 0;
  int64_t imbalanced_since_step = 0;
  int64_t imbalanced_since_nanos = 0;

  // Nodes whose ranks are all slow: one node finding instead of one per rank. Set when every rank
  // of the node is flagged, cleared when none is, or fewer than half have been for a detector
  // window (a single rank left slow is then a straggler of its own).
  struct NodeSlow {
    int64_t since_step = 0;
    int64_t since_nanos = 0;
    int64_t under_half_since = -1;  // step when fewer than half its ranks stayed flagged
  };
  std::map<std::string, NodeSlow> slow_nodes;
  bool flags_changed = false;

  // Scaling efficiency at the current world size.
  std::optional<double> scaling_ratio;
  int scaling_reference_size = 0;
  int64_t scaling_since_step = 0;
  int64_t scaling_since_nanos = 0;
};

struct GpuState {
  GpuReading last;
  bool has_value = false;
  double value = 0;  // SM activity where known, else utilization
  int64_t below_since = -1;
  bool flagged = false;
  int64_t flagged_since_nanos = 0;
  int64_t since_step = 0;
  std::string job;  // owner, empty when none
  int rank = -1;
};

std::string Percent(double ratio) { return absl::StrFormat("%.0f%%", ratio * 100); }

std::string Seconds(double s) {
  if (s < 1) return absl::StrFormat("%.0f ms", s * 1000);
  return absl::StrFormat("%.2f s", s);
}

}  // namespace

class Engine::Impl {
 public:
  explicit Impl(EngineOptions options) : opt_(std::move(options)) {
    opt_.window_steps = std::max(opt_.window_steps, 4);
    opt_.straggler_window = std::max(opt_.straggler_window, 4);
    opt_.max_pending_steps = std::max(opt_.max_pending_steps, 1);
  }

  absl::Status AddStep(const StepSample& s) {
    if (absl::Status valid = ValidateStepSample(s); !valid.ok()) return valid;
    if (s.world_size > opt_.max_ranks_per_job) {
      return absl::ResourceExhaustedError(
          absl::StrCat("world_size ", s.world_size, " over the limit ", opt_.max_ranks_per_job));
    }
    auto it = jobs_.find(s.job);
    if (it == jobs_.end()) {
      if (static_cast<int>(jobs_.size()) >= opt_.max_jobs) {
        return absl::ResourceExhaustedError(
            absl::StrCat("over the limit of ", opt_.max_jobs, " jobs; dropped job ", s.job));
      }
      it = jobs_.emplace(s.job, std::make_unique<JobState>()).first;
      it->second->name = s.job;
      ResetJob(*it->second, s.world_size);
    }
    JobState& job = *it->second;
    if (job.world_size != s.world_size) ResetJob(job, s.world_size);  // rescaled
    const RankState& r = job.ranks[s.rank];
    if (r.present && s.step <= r.last_step) {
      // A duplicate or an old resend, unless the job went back far: a restart from a checkpoint.
      if (s.step >= r.last_step - 2 * opt_.window_steps) return absl::OkStatus();
      ResetJob(job, s.world_size);
    }
    RankState& rank = job.ranks.Mutable(s.rank);
    if (rank.exited) {
      // A new step: the rank runs again (a restarted process).
      rank.exited = false;
      --job.exited_ranks;
    }
    if (!rank.present) {
      rank.present = true;
      rank.history = Ring<StepVals>(opt_.window_steps);
      rank.scores = Ring<Score>(opt_.straggler_window);
      ++job.present_ranks;
    }
    if (rank.node != s.node) {
      if (!rank.node.empty()) nodes_[rank.node].erase({job.name, s.rank});
      rank.node = s.node;
      if (!s.node.empty()) nodes_[s.node].insert({job.name, s.rank});
    }
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
      job.max_step = s.step;
      job.last_progress_nanos = s.received_unix_nanos;
      job.stalled = false;
    }
    if (s.step <= job.last_completed) return absl::OkStatus();  // late: its step is closed

    Entry e;
    e.rank = s.rank;
    e.pp_stage = rank.pp_stage;
    if (s.pp_stage.has_value() || s.tp_rank.has_value()) {
      e.group = (static_cast<int64_t>(s.pp_stage.value_or(0)) << 32) |
                static_cast<uint32_t>(s.tp_rank.value_or(0));
    }
    e.step_s = s.step_s;
    e.data = s.data_s.value_or(0);
    if (s.compute_s.has_value() || s.data_s.has_value()) {
      e.compute = s.compute_s.value_or(0);
      e.busy = e.data + e.compute;
      e.wait = s.comm_s.has_value() ? *s.comm_s : std::max(0.0, s.step_s - e.busy);
      e.split = true;
    } else if (s.comm_s.has_value()) {
      // Only the wait is known: the rank that waits least is the one the others wait for.
      e.busy = std::max(0.0, s.step_s - *s.comm_s);
      e.compute = e.busy;
      e.wait = *s.comm_s;
    } else {
      e.busy = s.step_s;
      e.compute = s.step_s;
      e.wait = 0;
      e.step_only = true;
      e.unknown_split = true;
    }
    e.samples = s.samples.value_or(-1);

    Pending& p = job.pending[s.step];
    if (p.entries.empty()) p.first_nanos = s.received_unix_nanos;
    p.last_nanos = s.received_unix_nanos;
    p.entries.push_back(e);
    if (static_cast<int>(p.entries.size()) >= job.world_size) {
      CompleteThrough(job, s.step);
    }
    ExpirePending(job, now_);
    return absl::OkStatus();
  }

  void AddGpu(const GpuReading& reading) {
    now_ = std::max(now_, reading.sampled_unix_nanos);
    GpuState& g = gpus_[{reading.node, reading.index}];
    g.last = reading;
    std::optional<double> v = reading.sm_activity_ratio.has_value() ? reading.sm_activity_ratio
                                                                    : reading.utilization_ratio;
    g.has_value = v.has_value();
    if (v.has_value()) g.value = *v;
    ResolveOwner(g);
    UpdateUnderutil(g, reading.sampled_unix_nanos);
  }

  void AddHost(const HostReading& reading) {
    now_ = std::max(now_, reading.sampled_unix_nanos);
    hosts_[reading.node] = reading;
  }

  void Advance(int64_t now) {
    now_ = std::max(now_, now);
    for (auto& [name, job] : jobs_) {
      ExpirePending(*job, now);
      CheckStall(*job, now);
    }
    for (auto& [key, g] : gpus_) UpdateUnderutil(g, now);
  }

  std::vector<JobSnapshot> Jobs() const {
    std::vector<JobSnapshot> out;
    for (const auto& [name, job] : jobs_) out.push_back(Snapshot(*job));
    return out;
  }

  std::optional<JobSnapshot> Job(absl::string_view name) const {
    auto it = jobs_.find(std::string(name));
    if (it == jobs_.end()) return std::nullopt;
    return Snapshot(*it->second);
  }

  std::vector<RankSnapshot> Ranks(absl::string_view name) const {
    std::vector<RankSnapshot> out;
    auto it = jobs_.find(std::string(name));
    if (it == jobs_.end()) return out;
    const JobState& job = *it->second;
    std::vector<double> scratch;
    for (int i = 0; i < job.world_size; ++i) {
      const RankState& r = job.ranks[i];
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
      rs.busy_s = median_of(&StepVals::busy);
      rs.compute_s = median_of(&StepVals::compute);
      rs.data_s = median_of(&StepVals::data);
      rs.comm_s = median_of(&StepVals::comm);
      // Scores exist only where the rank had a peer to compare with and its split was known.
      rs.comparable = !r.scores.empty();
      if (rs.comparable) rs.busy_vs_median_ratio = r.sum_ratio / r.scores.size();
      rs.straggler = r.flagged || (job.imbalanced && r.pp_stage == job.imbalanced_stage);
      out.push_back(std::move(rs));
    }
    return out;
  }

  std::vector<Finding> Findings() const {
    std::vector<Finding> out;
    for (const auto& [name, job] : jobs_) JobFindings(*job, &out);
    for (const auto& [key, g] : gpus_) {
      if (!g.flagged) continue;
      out.push_back(GpuFinding(g));
    }
    std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) {
      return std::tie(a.job, a.kind, a.rank, a.node, a.gpu) <
             std::tie(b.job, b.kind, b.rank, b.node, b.gpu);
    });
    return out;
  }

  std::optional<FinishedJob> MarkRankExited(absl::string_view name, int rank, int pid,
                                            int64_t nanos) {
    auto it = jobs_.find(std::string(name));
    if (it == jobs_.end()) return std::nullopt;
    JobState& job = *it->second;
    if (rank < 0 || rank >= job.world_size) return std::nullopt;
    if (!job.ranks[rank].present) return std::nullopt;
    RankState& r = job.ranks.Mutable(rank);
    // The rank's last step came from another process (restarted): that one still runs.
    if (pid != 0 && r.pid != 0 && pid != r.pid) return std::nullopt;
    if (!r.exited) {
      r.exited = true;
      r.exited_nanos = nanos;
      ++job.exited_ranks;
    }
    if (job.exited_ranks < job.present_ranks) return std::nullopt;
    // Every rank that reported has exited: the job finished rather than stalled. It is removed at
    // once, so no stall or underutilization finding outlives it (a hang keeps its processes).
    FinishedJob done;
    done.job = job.name;
    done.ranks = job.present_ranks;
    done.last_step = job.max_step;
    done.last_snapshot = Snapshot(job);
    JobFindings(job, &done.last_findings);
    RemoveJob(name);
    return done;
  }

  void RemoveJob(absl::string_view name) {
    auto it = jobs_.find(std::string(name));
    if (it == jobs_.end()) return;
    for (int i = 0; i < it->second->world_size; ++i) {
      const RankState& r = it->second->ranks[i];
      if (r.present && !r.node.empty()) nodes_[r.node].erase({it->second->name, i});
    }
    for (auto& [key, g] : gpus_) {
      if (g.job == name) {
        g.job.clear();
        g.rank = -1;
        g.flagged = false;
        g.below_since = -1;
      }
    }
    jobs_.erase(it);
  }

  bool RankReportedFrom(absl::string_view name, int rank, absl::string_view node) const {
    auto it = jobs_.find(std::string(name));
    if (it == jobs_.end() || rank < 0 || rank >= it->second->world_size) return false;
    const RankState& r = it->second->ranks[rank];
    return r.present && r.node == node;
  }

  void RemoveNode(absl::string_view node) {
    std::string n(node);
    for (auto it = gpus_.begin(); it != gpus_.end();) {
      it = it->first.first == n ? gpus_.erase(it) : std::next(it);
    }
    hosts_.erase(n);
    auto nit = nodes_.find(n);
    if (nit == nodes_.end()) return;
    for (const auto& [job_name, rank] : nit->second) {
      auto jit = jobs_.find(job_name);
      if (jit == jobs_.end()) continue;
      JobState& job = *jit->second;
      if (!job.ranks[rank].present) continue;
      if (job.ranks[rank].exited) --job.exited_ranks;
      job.ranks.Erase(rank);
      --job.present_ranks;
    }
    nodes_.erase(nit);
  }

  std::string SerializeScalingHistory() const {
    std::string out = "stepwatch-scaling-history v1\n";
    for (const auto& [job, sizes] : scaling_) {
      for (const auto& [size, per_gpu] : sizes) {
        absl::StrAppend(&out, absl::CEscape(job), "\t", size, "\t",
                        absl::StrFormat("%.17g", per_gpu), "\n");
      }
    }
    return out;
  }

  absl::Status LoadScalingHistory(absl::string_view data) {
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
          !absl::SimpleAtod(f[2], &per_gpu) || size <= 0 || !Finite(per_gpu) || per_gpu <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("scaling history line ", i + 1, " is malformed"));
      }
      parsed[job][size] = per_gpu;
    }
    for (const auto& [job, sizes] : parsed) {
      for (const auto& [size, per_gpu] : sizes) {
        double& v = scaling_[job][size];
        v = std::max(v, per_gpu);
      }
    }
    return absl::OkStatus();
  }

 private:
  void ResetJob(JobState& job, int world_size) {
    for (int i = 0; i < job.world_size; ++i) {
      const RankState& r = job.ranks[i];
      if (r.present && !r.node.empty()) nodes_[r.node].erase({job.name, i});
    }
    std::string name = job.name;
    job = JobState();
    job.name = std::move(name);
    job.world_size = world_size;
    job.ranks.Reset(world_size);
    job.summaries = Ring<StepSummary>(opt_.window_steps);
  }

  void ExpirePending(JobState& job, int64_t now) {
    while (!job.pending.empty()) {
      auto first = job.pending.begin();
      bool expired = first->second.first_nanos + opt_.step_grace_nanos <= now;
      bool too_many = static_cast<int>(job.pending.size()) > opt_.max_pending_steps;
      if (!expired && !too_many) break;
      CompleteThrough(job, first->first);
    }
  }

  // Completes every pending step up to and including `step`, oldest first.
  void CompleteThrough(JobState& job, int64_t step) {
    while (!job.pending.empty() && job.pending.begin()->first <= step) {
      auto node = job.pending.extract(job.pending.begin());
      job.last_completed = node.key();
      ProcessStep(job, node.key(), node.mapped());
    }
  }

  void ProcessStep(JobState& job, int64_t step, Pending& p) {
    std::vector<Entry>& es = p.entries;
    if (es.empty()) return;
    const int64_t nanos = p.last_nanos;
    ++job.completed_steps;
    // A rank that reports only its step time is busy for the share of the step its GPU's SMs were
    // active (when the GPU reports SM activity); the rest it waited.
    for (Entry& e : es) {
      if (!e.step_only) continue;
      RankState& r = job.ranks.Mutable(e.rank);
      const GpuState* g = GpuOf(r);
      if (g == nullptr || !g->last.sm_activity_ratio) continue;
      e.busy = std::clamp(*g->last.sm_activity_ratio, 0.0, 1.0) * e.step_s;
      e.compute = e.busy;
      e.wait = e.step_s - e.busy;
      e.unknown_split = false;
      // GPUs are sampled on their own clock: a reading spanning several steps is scored once.
      e.stale = g->last.sampled_unix_nanos == r.last_gpu_nanos;
      r.last_gpu_nanos = g->last.sampled_unix_nanos;
    }

    // Job-level figures.
    scratch_.clear();
    for (const Entry& e : es) scratch_.push_back(e.step_s);
    StepSummary sum;
    sum.step = step;
    sum.nanos = nanos;
    sum.step_s = MedianInPlace(scratch_);
    scratch_.clear();
    double max_busy = 0, min_wait = es[0].wait, samples = 0;
    bool any_samples = false;
    for (const Entry& e : es) {
      scratch_.push_back(e.busy);
      max_busy = std::max(max_busy, e.busy);
      min_wait = std::min(min_wait, e.wait);
      if (e.samples >= 0) {
        samples += e.samples;
        any_samples = true;
      }
    }
    sum.med_busy = MedianInPlace(scratch_);
    sum.max_busy = max_busy;
    sum.exposed_comm = min_wait;
    sum.split_known =
        std::any_of(es.begin(), es.end(), [](const Entry& e) { return !e.unknown_split; });
    scratch_.clear();
    for (const Entry& e : es) scratch_.push_back(e.data);
    sum.med_data = MedianInPlace(scratch_);
    // Ranks that did not report this step processed samples too: scale up to the world size.
    if (any_samples) sum.samples = samples * job.world_size / es.size();
    job.summaries.Push(sum);

    // Per-rank history and straggler scores, against peers of the same group.
    std::sort(es.begin(), es.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.group, a.rank) < std::tie(b.group, b.rank);
    });
    bool any_stage = false;
    for (size_t begin = 0; begin < es.size();) {
      size_t end = begin;
      while (end < es.size() && es[end].group == es[begin].group) ++end;
      ScoreGroup(job, step, nanos, sum.step_s, es, begin, end);
      if (es[begin].pp_stage >= 0) any_stage = true;
      begin = end;
    }
    if (any_stage) UpdatePipeline(job, step, nanos, es);
    if (job.flags_changed || !job.slow_nodes.empty()) UpdateSlowNodes(job, step, nanos);
    UpdateRegression(job, step, nanos, sum.step_s);
    if (job.completed_steps % 8 == 0) UpdateScaling(job, step, nanos);
  }

  void ScoreGroup(JobState& job, int64_t step, int64_t nanos, double step_s,
                  const std::vector<Entry>& es, size_t begin, size_t end) {
    // Ranks whose split is unknown (step time only) say nothing about who is slower.
    std::vector<size_t> peers;
    for (size_t i = begin; i < end; ++i) {
      if (!es[i].unknown_split) peers.push_back(i);
    }
    const size_t n = peers.size();
    double ref = 0, ref_compute = 0, ref_data = 0, sigma = 0;
    auto median_of = [&](double Entry::*field) {
      scratch_.clear();
      for (size_t i : peers) scratch_.push_back(es[i].*field);
      return MedianInPlace(scratch_);
    };
    if (n >= 3) {
      ref = median_of(&Entry::busy);
      for (double& v : scratch_) v = std::fabs(v - ref);
      double mad = MedianInPlace(scratch_);
      sigma = ref > 0 ? kMadToSigma * mad / ref : 0;
      ref_compute = median_of(&Entry::compute);
      ref_data = median_of(&Entry::data);
    }
    if (n >= 2) {
      // Persistent differences between peers (heterogeneous hardware, uneven shards) inflate the
      // spread across ranks but not the noise of a rank's own ratio over time, which is what the
      // window mean has to beat. Once ranks have history, use the median over peers of that
      // temporal noise. Two peers have no robust spread at all: until then the margins alone hold.
      scratch_.clear();
      for (size_t i : peers) {
        const RankState& r = job.ranks[es[i].rank];
        const double k = r.scores.size();
        if (2 * k < opt_.straggler_window) continue;
        const double mean = r.sum_ratio / k;
        scratch_.push_back(std::sqrt(std::max(0.0, r.sum_ratio_sq / k - mean * mean)));
      }
      if (2 * scratch_.size() >= n) sigma = MedianInPlace(scratch_);
    }
    for (size_t i = begin; i < end; ++i) {
      const Entry& e = es[i];
      RankState& r = job.ranks.Mutable(e.rank);
      r.history.Push(StepVals{static_cast<float>(e.busy), static_cast<float>(e.compute),
                              static_cast<float>(e.data), static_cast<float>(e.wait)});
    }
    if (n < 2) return;  // nobody to compare with
    for (size_t k = 0; k < n; ++k) {
      const Entry& e = es[peers[k]];
      RankState& r = job.ranks.Mutable(e.rank);
      double rank_ref = ref, rank_ref_compute = ref_compute, rank_ref_data = ref_data;
      bool waits_less = true;
      if (n == 2) {
        // No majority: compare with the other rank. The slower one is busier and waits less (the
        // faster one waits for it in the collective).
        const Entry& other = es[peers[1 - k]];
        rank_ref = other.busy;
        rank_ref_compute = other.compute;
        rank_ref_data = other.data;
        waits_less = e.wait < other.wait;
      }
      if (rank_ref <= 0 || e.stale) continue;
      Score sc;
      sc.step = step;
      sc.busy = e.busy;
      sc.ref = rank_ref;
      sc.compute = e.compute;
      sc.ref_compute = rank_ref_compute;
      sc.data = e.data;
      sc.ref_data = rank_ref_data;
      sc.sigma = sigma;
      sc.over = e.busy / rank_ref - 1 > opt_.straggler_rel_margin && waits_less;
      sc.split = e.split;
      Score old;
      if (r.scores.Push(sc, &old)) {
        r.sum_ratio -= old.busy / old.ref;
        r.sum_excess -= old.busy - old.ref;
        r.sum_sigma -= old.sigma;
        r.sum_ratio_sq -= (old.busy / old.ref) * (old.busy / old.ref);
        r.over_count -= old.over ? 1 : 0;
      }
      r.sum_ratio += sc.busy / sc.ref;
      r.sum_excess += sc.busy - sc.ref;
      r.sum_sigma += sc.sigma;
      r.sum_ratio_sq += (sc.busy / sc.ref) * (sc.busy / sc.ref);
      r.over_count += sc.over ? 1 : 0;
      const bool was = r.flagged;
      EvaluateStraggler(r, step, nanos, step_s);
      if (was != r.flagged) job.flags_changed = true;
    }
  }

  void EvaluateStraggler(RankState& r, int64_t step, int64_t nanos, double step_s) {
    const double n = r.scores.size();
    if (r.flagged) ++r.flagged_steps;
    if (static_cast<int>(n) < opt_.straggler_window) return;
    const double rel = r.sum_ratio / n - 1;
    const double excess = r.sum_excess / n;
    const double margin = std::max(opt_.straggler_rel_margin,
                                   opt_.straggler_noise_z * (r.sum_sigma / n) / std::sqrt(n));
    const double abs_margin =
        std::max(opt_.straggler_abs_margin_s, opt_.straggler_step_fraction * step_s);
    if (!r.flagged) {
      if (rel > margin && excess > abs_margin && 2 * r.over_count > n) {
        r.flagged = true;
        r.flagged_steps = 0;
        // The episode began at the first over-margin step of the current run in the window.
        r.flagged_since_step = step;
        r.flagged_since_nanos = nanos;
        for (size_t i = r.scores.size(); i-- > 0;) {
          if (!r.scores[i].over) break;
          r.flagged_since_step = r.scores[i].step;
        }
      }
    } else if (rel < margin / 2 || excess < abs_margin / 2) {
      r.flagged = false;
    }
  }

  void UpdateSlowNodes(JobState& job, int64_t step, int64_t nanos) {
    job.flags_changed = false;
    struct Count {
      int present = 0, flagged = 0;
      int64_t since_step = INT64_MAX, since_nanos = 0;
    };
    std::map<std::string, Count> counts;
    for (int i = 0; i < job.world_size; ++i) {
      const RankState& r = job.ranks[i];
      if (!r.present || r.node.empty()) continue;
      Count& c = counts[r.node];
      ++c.present;
      if (!r.flagged) continue;
      ++c.flagged;
      if (r.flagged_since_step < c.since_step) {
        c.since_step = r.flagged_since_step;
        c.since_nanos = r.flagged_since_nanos;
      }
    }
    for (const auto& [node, c] : counts) {
      auto it = job.slow_nodes.find(node);
      if (it == job.slow_nodes.end()) {
        if (c.present >= 2 && c.flagged == c.present && 2 * c.present < job.present_ranks) {
          job.slow_nodes[node] = JobState::NodeSlow{c.since_step, c.since_nanos};
        }
      } else if (c.flagged == 0) {
        job.slow_nodes.erase(it);
      } else if (2 * c.flagged >= c.present) {
        it->second.under_half_since = -1;
      } else if (it->second.under_half_since < 0) {
        it->second.under_half_since = step;
      } else if (step - it->second.under_half_since >= opt_.straggler_window) {
        job.slow_nodes.erase(it);
      }
    }
    for (auto it = job.slow_nodes.begin(); it != job.slow_nodes.end();) {
      it = counts.count(it->first) == 0 ? job.slow_nodes.erase(it) : std::next(it);
    }
  }

  void UpdatePipeline(JobState& job, int64_t step, int64_t nanos, const std::vector<Entry>& es) {
    std::map<int, std::vector<double>> per_stage;
    for (const Entry& e : es) {
      if (e.pp_stage >= 0) per_stage[e.pp_stage].push_back(e.busy);
    }
    for (auto& [stage, v] : per_stage) {
      auto it = job.stages.find(stage);
      if (it == job.stages.end()) {
        it = job.stages.emplace(stage, StageState{Ring<float>(opt_.straggler_window), 0}).first;
      }
      float m = MedianInPlace(v), old = 0;
      if (it->second.medians.Push(m, &old)) it->second.sum -= old;
      it->second.sum += m;
    }
    if (job.stages.size() < 2) return;
    int worst = -1;
    double worst_mean = -1;
    std::vector<std::pair<int, double>> means;
    for (const auto& [stage, st] : job.stages) {
      if (!st.medians.full()) return;
      double mean = st.sum / st.medians.size();
      means.push_back({stage, mean});
      if (mean > worst_mean) {
        worst_mean = mean;
        worst = stage;
      }
    }
    std::vector<double> others;
    for (const auto& [stage, mean] : means) {
      if (stage != worst) others.push_back(mean);
    }
    double others_median = MedianInPlace(others);
    if (others_median <= 0) return;
    double ratio = worst_mean / others_median;
    if (!job.imbalanced && ratio >= opt_.pipeline_ratio) {
      job.imbalanced = true;
      job.imbalanced_since_step = step;
      job.imbalanced_since_nanos = nanos;
    } else if (job.imbalanced && ratio < opt_.pipeline_clear_ratio) {
      job.imbalanced = false;
    }
    job.imbalanced_stage = worst;
    job.imbalance_ratio = ratio;
    job.imbalance_stage_s = worst_mean;
    job.imbalance_others_s = others_median;
  }

  // Change-point detection on the job's step time: the median of the last kRegressionWindow steps
  // against a reference level (the median of the steps before them, frozen while flagged).
  void UpdateRegression(JobState& job, int64_t step, int64_t nanos, double step_s) {
    std::pair<int64_t, float> old;
    if (job.reg_recent.Push({step, static_cast<float>(step_s)}, &old) && !job.regressed) {
      job.reg_reference.Push(old.second);
    }
    if (!job.reg_recent.full() || job.reg_reference.size() < kRegressionWindow) return;
    scratch_.clear();
    for (size_t i = 0; i < job.reg_recent.size(); ++i) scratch_.push_back(job.reg_recent[i].second);
    const double recent = MedianInPlace(scratch_);
    if (!job.regressed) {
      scratch_.clear();
      for (size_t i = 0; i < job.reg_reference.size(); ++i)
        scratch_.push_back(job.reg_reference[i]);
      const double base = MedianInPlace(scratch_);
      if (base <= 0 || recent < base * (1 + opt_.regression_threshold)) return;
      job.regressed = true;
      job.regression_baseline = base;
      // The shift began where a split of the recent window fits best: before at the baseline,
      // after at the mean of the rest.
      const size_t n = job.reg_recent.size();
      size_t best = 0;
      double best_cost = -1;
      for (size_t j = 0; j < n; ++j) {
        double mean_after = 0;
        for (size_t i = j; i < n; ++i) mean_after += job.reg_recent[i].second;
        mean_after /= (n - j);
        double cost = 0;
        for (size_t i = 0; i < n; ++i) {
          double level = i < j ? base : mean_after;
          double d = job.reg_recent[i].second - level;
          cost += d * d;
        }
        if (best_cost < 0 || cost < best_cost) {
          best_cost = cost;
          best = j;
        }
      }
      job.regressed_since_step = job.reg_recent[best].first;
      job.regressed_since_nanos = nanos;
      job.regression_cause = RegressionCause(job, &job.regression_cause_text);
    } else if (recent <= job.regression_baseline * (1 + opt_.regression_threshold / 2)) {
      job.regressed = false;
    }
    job.regression_level = recent;
  }

  // The part of the step split that rose most from before the regression's first step to after it
  // (per-step means): a straggler shows as imbalance, a slower network as exposed communication.
  static Cause RegressionCause(const JobState& job, std::string* text) {
    text->clear();
    struct Parts {
      double n = 0, comm = 0, imbalance = 0, data = 0, compute = 0;
    } before, after;
    for (size_t i = 0; i < job.summaries.size(); ++i) {
      const StepSummary& x = job.summaries[i];
      if (!x.split_known) continue;
      Parts& p = x.step < job.regressed_since_step ? before : after;
      ++p.n;
      p.comm += x.exposed_comm;
      p.imbalance += x.max_busy - x.med_busy;
      p.data += x.med_data;
      p.compute += std::max(0.0, x.med_busy - x.med_data);
    }
    if (before.n == 0 || after.n == 0) return Cause::kUnknown;
    struct Rise {
      double seconds;
      Cause cause;
      const char* name;
    };
    const Rise rises[] = {
        {after.comm / after.n - before.comm / before.n, Cause::kExposedComm,
         "exposed communication"},
        {after.imbalance / after.n - before.imbalance / before.n, Cause::kImbalance,
         "waiting for slower ranks"},
        {after.data / after.n - before.data / before.n, Cause::kDataLoading, "data loading"},
        // Every rank computing longer: new code or inputs, or slower GPUs; no single cause.
        {after.compute / after.n - before.compute / before.n, Cause::kUnknown, "compute"},
    };
    const Rise* best = nullptr;
    for (const Rise& r : rises) {
      if (r.seconds > 0 && (best == nullptr || r.seconds > best->seconds)) best = &r;
    }
    if (best == nullptr) return Cause::kUnknown;
    *text = absl::StrCat("; largest rise: ", best->name, " +", Seconds(best->seconds), " per step");
    return best->cause;
  }

  void UpdateScaling(JobState& job, int64_t step, int64_t nanos) {
    if (static_cast<int>(job.summaries.size()) < opt_.straggler_window) return;
    scratch_.clear();
    for (size_t i = 0; i < job.summaries.size(); ++i) scratch_.push_back(job.summaries[i].step_s);
    const double median_step = MedianInPlace(scratch_);
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
    auto& sizes = scaling_[job.name];
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
      job.scaling_ratio.reset();
      return;
    }
    if (!job.scaling_ratio.has_value()) {
      job.scaling_since_step = step;
      job.scaling_since_nanos = nanos;
    }
    job.scaling_ratio = per_gpu / best_smaller;
    job.scaling_reference_size = ref_size;
  }

  void CheckStall(JobState& job, int64_t now) {
    if (job.max_step < 0 || job.stalled) return;
    double median_step = 0;
    if (!job.summaries.empty()) {
      scratch_.clear();
      for (size_t i = 0; i < job.summaries.size(); ++i) scratch_.push_back(job.summaries[i].step_s);
      median_step = MedianInPlace(scratch_);
    }
    int64_t limit = std::max<int64_t>(
        opt_.stall_floor_nanos,
        static_cast<int64_t>(opt_.stall_multiple * median_step * kNanosPerSecond));
    if (now - job.last_progress_nanos > limit) {
      job.stalled = true;
      job.stalled_since_nanos = job.last_progress_nanos;
      job.stall_limit_nanos = limit;
    }
  }

  void ResolveOwner(GpuState& g) {
    g.job.clear();
    g.rank = -1;
    auto nit = nodes_.find(g.last.node);
    if (nit == nodes_.end()) return;
    for (const auto& [job_name, rank] : nit->second) {
      auto jit = jobs_.find(job_name);
      if (jit == jobs_.end()) continue;
      const RankState& r = jit->second->ranks[rank];
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

  void UpdateUnderutil(GpuState& g, int64_t now) {
    const bool tracked = !g.job.empty() || g.last.pids.empty();
    if (!g.has_value || !tracked) {
      g.below_since = -1;
      g.flagged = false;
      return;
    }
    if (g.value >= opt_.underutil_threshold) {
      g.below_since = -1;
      g.flagged = false;
      return;
    }
    if (g.below_since < 0) {
      g.below_since = g.last.sampled_unix_nanos;
      g.since_step = 0;
      if (!g.job.empty()) {
        auto jit = jobs_.find(g.job);
        if (jit != jobs_.end()) g.since_step = std::max<int64_t>(0, jit->second->max_step);
      }
    }
    // Readings that stopped arriving prove nothing about the present.
    const bool fresh = now - g.last.sampled_unix_nanos <= opt_.underutil_window_nanos;
    if (!g.flagged && fresh && now - g.below_since >= opt_.underutil_window_nanos) {
      g.flagged = true;
      g.flagged_since_nanos = g.below_since;
    }
  }

  JobSnapshot Snapshot(const JobState& job) const {
    JobSnapshot s;
    s.job = job.name;
    s.world_size = job.world_size;
    s.last_step = job.max_step;
    s.last_seen_unix_nanos = job.last_seen_nanos;
    for (int i = 0; i < job.world_size; ++i) {
      const RankState& r = job.ranks[i];
      if (r.present && r.last_step >= job.max_step - opt_.window_steps) ++s.ranks_reporting;
    }
    if (job.summaries.empty()) return s;
    std::vector<double> v;
    for (size_t i = 0; i < job.summaries.size(); ++i) v.push_back(job.summaries[i].step_s);
    s.median_step_s = MedianInPlace(v);
    if (s.median_step_s > 0) s.steps_per_second = 1 / s.median_step_s;
    v.clear();
    for (size_t i = 0; i < job.summaries.size(); ++i) {
      if (job.summaries[i].samples >= 0) v.push_back(job.summaries[i].samples);
    }
    if (!v.empty() && s.median_step_s > 0)
      s.samples_per_second = MedianInPlace(v) / s.median_step_s;
    // Only steps whose split is known: a step time alone says nothing of where the time went.
    double step = 0, busy = 0, imbalance = 0, comm = 0, data = 0, hideable = 0;
    for (size_t i = 0; i < job.summaries.size(); ++i) {
      const StepSummary& x = job.summaries[i];
      if (!x.split_known) continue;
      s.split_known = true;
      step += x.step_s;
      busy += x.med_busy;
      imbalance += x.max_busy - x.med_busy;
      comm += x.exposed_comm;
      data += x.med_data;
      // Communication can only hide behind compute that exists in the same step.
      hideable += std::min(x.exposed_comm, std::max(0.0, x.med_busy - x.med_data));
    }
    if (s.split_known && step > 0) {
      TimeBreakdown& b = s.breakdown;
      b.data = data / step;
      b.compute = std::max(0.0, busy - data) / step;
      b.imbalance = imbalance / step;
      b.comm = comm / step;
      double total = b.data + b.compute + b.imbalance + b.comm;
      if (total > 1) {
        b.data /= total;
        b.compute /= total;
        b.imbalance /= total;
        b.comm /= total;
        total = 1;
      }
      b.other = 1 - total;
      s.efficiency_ratio = std::min(1.0, busy / step);
      auto speedup = [step](double removed) {
        double rest = step - removed;
        return rest > 0 ? std::max(1.0, step / rest) : 1.0;
      };
      s.whatif.stragglers = speedup(imbalance);
      s.whatif.overlap = speedup(hideable);
      s.whatif.data = speedup(data);
    }
    s.scaling_efficiency_ratio = job.scaling_ratio;
    return s;
  }

  const GpuState* GpuOf(const RankState& r) const {
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

  // Causes read from a GPU's and its host's last readings: clocks, throttling, power, host CPU;
  // a low GPU utilization is evidence (a text) without a cause of its own.
  Evidence DeviceEvidence(const GpuState* g, const std::string& node) const {
    Evidence ev;
    if (g != nullptr) {
      ev = GpuSlowdowns(g->last);
      if (g->has_value && g->value < opt_.underutil_threshold) {
        ev.texts.push_back(absl::StrCat("GPU utilization ", Percent(g->value)));
      }
    }
    if (std::optional<double> cpu = SaturatedHostCpu(node)) {
      AddCause(Cause::kHostCpu, &ev.causes);
      ev.texts.push_back(absl::StrCat("host CPU ", Percent(*cpu)));
    }
    return ev;
  }

  // The node's host CPU utilization when it is saturated and clearly busier than the median host:
  // a busy CPU on every node (or several nodes sharing one host) explains no single slow rank.
  std::optional<double> SaturatedHostCpu(const std::string& node) const {
    auto hit = hosts_.find(node);
    if (hit == hosts_.end() || !hit->second.cpu_utilization_ratio ||
        *hit->second.cpu_utilization_ratio < 0.9) {
      return std::nullopt;
    }
    std::vector<double> all;
    for (const auto& [name, host] : hosts_) {
      if (host.cpu_utilization_ratio) all.push_back(*host.cpu_utilization_ratio);
    }
    std::nth_element(all.begin(), all.begin() + all.size() / 2, all.end());
    const double median = all[all.size() / 2];
    if (all.size() > 1 && *hit->second.cpu_utilization_ratio - median < 0.1) return std::nullopt;
    return *hit->second.cpu_utilization_ratio;
  }

  // The rank's own split against its peers over the detector window.
  struct SplitView {
    std::string text;
    bool data = false;  // the excess is in data loading rather than compute
  };
  SplitView SplitOf(const RankState& r) const {
    double busy = 0, ref = 0, compute = 0, ref_compute = 0, data = 0, ref_data = 0;
    bool split = false;
    for (size_t i = 0; i < r.scores.size(); ++i) {
      const Score& s = r.scores[i];
      split = split || s.split;
      busy += s.busy;
      ref += s.ref;
      compute += s.compute;
      ref_compute += s.ref_compute;
      data += s.data;
      ref_data += s.ref_data;
    }
    const double n = std::max<size_t>(1, r.scores.size());
    const double data_excess = (data - ref_data) / n, compute_excess = (compute - ref_compute) / n;
    if (data_excess > compute_excess && data_excess > 0) {
      return {absl::StrCat("data loading +", Seconds(data_excess), " vs median"), true};
    }
    if (ref_compute > 0 && split) {
      return {absl::StrFormat("compute %+.0f%% vs median", (compute / ref_compute - 1) * 100)};
    }
    if (ref > 0) return {absl::StrFormat("busy %+.0f%% vs median", (busy / ref - 1) * 100)};
    return {"slower than its peers"};
  }

  // Whether a rank's GPU shows it doing more work than its peers rather than being slower: full
  // clocks, no throttling, a busy GPU (and no saturated host, which DeviceEvidence would name).
  bool FullSpeedAndBusy(const GpuState* g) const {
    return g != nullptr && AtFullSpeed(g->last) && g->has_value &&
           g->value >= opt_.underutil_threshold;
  }

  std::vector<int> Bounded(std::vector<int> ranks) const {
    std::sort(ranks.begin(), ranks.end());
    if (static_cast<int>(ranks.size()) > opt_.max_finding_ranks) {
      ranks.resize(std::max(0, opt_.max_finding_ranks));
    }
    return ranks;
  }

  // Cause, advice and the cause's part of the summary for one flagged rank.
  void AttributeStraggler(int rank, const RankState& r, const GpuState* g, Finding* f) const {
    const SplitView split = SplitOf(r);
    const Evidence dev = DeviceEvidence(g, r.node);
    absl::StrAppend(&f->summary, ": ", split.text);
    if (split.data) {
      f->causes.push_back(Cause::kDataLoading);
      for (Cause c : dev.causes) AddCause(c, &f->causes);
      if (!dev.texts.empty()) absl::StrAppend(&f->summary, "; ", absl::StrJoin(dev.texts, "; "));
      f->action = DeviceAction(Cause::kDataLoading, r.node, f->gpu);
    } else if (!dev.causes.empty()) {
      f->causes = dev.causes;
      const bool host = dev.causes[0] == Cause::kHostCpu;
      absl::StrAppend(&f->summary,
                      host ? "; slower host: " : "; slower GPU: ", absl::StrJoin(dev.texts, "; "));
      f->action = DeviceAction(dev.causes[0], r.node, f->gpu);
    } else if (FullSpeedAndBusy(g)) {
      f->causes.push_back(Cause::kMoreWork);
      const GpuReading& x = g->last;
      std::string clock =
          x.sm_clock_mhz ? absl::StrFormat("SM clock %.0f MHz, ", *x.sm_clock_mhz) : std::string();
      absl::StrAppend(&f->summary, "; more work than its peers at full clocks (", clock,
                      g->last.sm_activity_ratio ? "SM activity " : "utilization ",
                      Percent(g->value), ")");
      f->action = absl::StrCat("check the sharding and data balance of rank ", rank,
                               " (e.g. uneven sequence lengths or batch sizes)");
    } else {
      absl::StrAppend(&f->summary, "; cause unknown");
      if (g == nullptr) absl::StrAppend(&f->summary, " (no GPU readings)");
      if (!dev.texts.empty()) absl::StrAppend(&f->summary, ": ", absl::StrJoin(dev.texts, "; "));
      f->action = absl::StrCat("compare rank ", rank, "'s GPU and host with its peers' ",
                               "(nvidia-smi, py-spy dump)");
    }
    f->cause = f->causes.empty() ? Cause::kUnknown : f->causes[0];
  }

  void SlowNodeFinding(const JobState& job, const std::string& node, const JobState::NodeSlow& st,
                       std::vector<Finding>* out) const {
    Finding f;
    f.kind = FindingKind::kSlowNode;
    f.job = job.name;
    f.node = node;
    f.since_step = st.since_step;
    f.since_unix_nanos = st.since_nanos;
    double ratio = 0;
    int count = 0;
    const RankState* sample_rank = nullptr;
    std::vector<int> flagged;
    std::vector<std::string> gpu_texts;
    for (int i = 0; i < job.world_size; ++i) {
      const RankState& r = job.ranks[i];
      if (!r.present || r.node != node) continue;
      f.persistent = f.persistent || r.flagged_steps >= opt_.persistent_steps;
      ratio += r.sum_ratio / std::max<size_t>(1, r.scores.size());
      ++count;
      if (r.flagged) flagged.push_back(i);
      if (sample_rank == nullptr) sample_rank = &r;
      // Every GPU of the node's ranks: one throttled GPU may be the whole story.
      const GpuState* g = GpuOf(r);
      if (g == nullptr) continue;
      Evidence ev = GpuSlowdowns(g->last);
      for (Cause c : ev.causes) AddCause(c, &f.causes);
      if (!ev.texts.empty()) {
        gpu_texts.push_back(
            absl::StrCat("GPU ", g->last.index, ": ", absl::StrJoin(ev.texts, ", ")));
      }
    }
    ratio /= std::max(1, count);
    f.severity = ratio >= 1.5 ? Severity::kCritical : Severity::kWarning;
    const int nflagged = static_cast<int>(flagged.size());
    f.summary = nflagged == count
                    ? absl::StrFormat("%s: all %d ranks slow", node, count)
                    : absl::StrFormat("%s: %d of %d ranks slow", node, nflagged, count);
    absl::StrAppend(&f.summary, absl::StrFormat(", busy %+.0f%% vs median", (ratio - 1) * 100));
    bool data = false;
    if (sample_rank != nullptr) {
      SplitView split = SplitOf(*sample_rank);
      data = split.data;
      absl::StrAppend(&f.summary, "; ", split.text);
    }
    for (const std::string& t : gpu_texts) absl::StrAppend(&f.summary, "; ", t);
    if (std::optional<double> cpu = SaturatedHostCpu(node)) {
      AddCause(Cause::kHostCpu, &f.causes);
      absl::StrAppend(&f.summary, "; host CPU ", Percent(*cpu));
    }
    if (data) f.causes.insert(f.causes.begin(), Cause::kDataLoading);
    f.cause = f.causes.empty() ? Cause::kUnknown : f.causes[0];
    // The node, not the job's partition, is at fault: drain or inspect it.
    if (f.cause == Cause::kDataLoading) {
      f.action = absl::StrCat("drain ", node, " or inspect its storage and data loading (more ",
                              "data-loader workers)");
    } else {
      f.action = DeviceAction(f.cause, node, -1);
    }
    f.ranks = Bounded(std::move(flagged));
    out->push_back(std::move(f));
  }

  void PipelineFinding(const JobState& job, std::vector<Finding>* out) const {
    Finding f = JobFinding(FindingKind::kPipelineImbalance, job, job.imbalanced_since_step,
                           job.imbalanced_since_nanos);
    f.stage = job.imbalanced_stage;
    f.summary = absl::StrFormat("stage %d takes %.1fx the other stages (busy %s vs %s)",
                                job.imbalanced_stage, job.imbalance_ratio,
                                Seconds(job.imbalance_stage_s), Seconds(job.imbalance_others_s));
    std::vector<int> ranks;
    std::set<std::string> nodes;
    std::vector<std::string> texts;
    std::string device_node;
    int device_gpu = -1;
    for (int i = 0; i < job.world_size; ++i) {
      const RankState& r = job.ranks[i];
      if (!r.present || r.pp_stage != job.imbalanced_stage) continue;
      ranks.push_back(i);
      nodes.insert(r.node);
      const GpuState* g = GpuOf(r);
      Evidence ev = DeviceEvidence(g, r.node);
      if (ev.causes.empty()) continue;
      if (f.causes.empty()) {
        device_node = r.node;
        device_gpu = g != nullptr ? g->last.index : -1;
      }
      for (Cause c : ev.causes) AddCause(c, &f.causes);
      texts.push_back(absl::StrCat("rank ", i, " on ", r.node,
                                   g != nullptr ? absl::StrCat(" GPU ", g->last.index) : "", ": ",
                                   absl::StrJoin(ev.texts, ", ")));
    }
    if (nodes.size() == 1) {
      f.node = *nodes.begin();
      if (!f.node.empty()) absl::StrAppend(&f.summary, " on ", f.node);
    } else if (!nodes.empty()) {
      constexpr size_t kShown = 4;
      std::vector<std::string> shown(nodes.begin(),
                                     std::next(nodes.begin(), std::min(nodes.size(), kShown)));
      absl::StrAppend(
          &f.summary, "; its ranks run on ", absl::StrJoin(shown, ", "),
          nodes.size() > kShown ? absl::StrCat(" and ", nodes.size() - kShown, " more") : "");
    }
    if (!f.causes.empty()) {
      constexpr size_t kShown = 4;
      texts.resize(std::min(texts.size(), kShown));
      absl::StrAppend(&f.summary, "; slower devices: ", absl::StrJoin(texts, "; "));
      f.action = DeviceAction(f.causes[0], device_node, device_gpu);
    } else {
      f.causes.push_back(Cause::kMoreWork);
      absl::StrAppend(&f.summary, "; more work than the other stages");
      f.action = absl::StrCat("move layers off stage ", job.imbalanced_stage,
                              " to the other stages (rebalance the pipeline partition)");
    }
    f.cause = f.causes[0];
    f.ranks = Bounded(std::move(ranks));
    out->push_back(std::move(f));
  }

  // The job's largest loss in its step split: exposed communication, imbalance or data loading.
  Cause JobLoss(const JobState& job, std::string* text) const {
    JobSnapshot s = Snapshot(job);
    if (!s.split_known) return Cause::kUnknown;
    const TimeBreakdown& b = s.breakdown;
    std::pair<double, Cause> best{0, Cause::kUnknown};
    for (auto loss :
         {std::pair{b.comm, Cause::kExposedComm}, std::pair{b.imbalance, Cause::kImbalance},
          std::pair{b.data, Cause::kDataLoading}}) {
      if (loss.first > best.first) best = loss;
    }
    if (best.second == Cause::kUnknown) return best.second;
    const char* name = best.second == Cause::kExposedComm ? "exposed communication"
                       : best.second == Cause::kImbalance ? "waiting for slower ranks"
                                                          : "data loading";
    *text = absl::StrCat("; largest loss: ", name, " ", Percent(best.first), " of the step");
    return best.second;
  }

  void JobFindings(const JobState& job, std::vector<Finding>* out) const {
    // Stragglers, grouped by node: a node whose ranks are all slow is one node finding.
    std::set<std::string> slow_nodes;
    for (const auto& [node, st] : job.slow_nodes) {
      slow_nodes.insert(node);
      SlowNodeFinding(job, node, st, out);
    }
    for (int i = 0; i < job.world_size; ++i) {
      const RankState& r = job.ranks[i];
      if (!r.present || !r.flagged || slow_nodes.count(r.node) > 0) continue;
      Finding f;
      f.kind = FindingKind::kStraggler;
      f.job = job.name;
      f.rank = i;
      f.ranks = {i};
      f.node = r.node;
      f.stage = r.pp_stage;
      const GpuState* g = GpuOf(r);
      f.gpu = r.gpu >= 0 ? r.gpu : (r.local_rank >= 0 ? r.local_rank : (g ? g->last.index : -1));
      f.since_step = r.flagged_since_step;
      f.since_unix_nanos = r.flagged_since_nanos;
      f.persistent = r.flagged_steps >= opt_.persistent_steps;
      const double ratio = r.sum_ratio / std::max<size_t>(1, r.scores.size());
      f.severity = ratio >= 1.5 ? Severity::kCritical : Severity::kWarning;
      f.summary = absl::StrCat("rank ", i);
      if (!r.node.empty()) absl::StrAppend(&f.summary, " on ", r.node);
      if (f.gpu >= 0) absl::StrAppend(&f.summary, " GPU ", f.gpu);
      AttributeStraggler(i, r, g, &f);
      if (!f.persistent) absl::StrAppend(&f.summary, " (transient so far)");
      out->push_back(std::move(f));
    }
    if (job.imbalanced) PipelineFinding(job, out);
    if (job.scaling_ratio && *job.scaling_ratio < opt_.scaling_threshold) {
      Finding f = JobFinding(FindingKind::kScalingEfficiency, job, job.scaling_since_step,
                             job.scaling_since_nanos);
      f.persistent = true;
      f.summary = absl::StrFormat(
          "scaling efficiency %s at %d GPUs: per-GPU throughput %.2fx the best at %d GPUs",
          Percent(*job.scaling_ratio), job.world_size, *job.scaling_ratio,
          job.scaling_reference_size);
      std::string loss;
      SetCause(&f, JobLoss(job, &loss));
      absl::StrAppend(&f.summary, loss);
      f.action = JobAction(f.cause);
      out->push_back(std::move(f));
    }
    if (job.regressed) {
      Finding f = JobFinding(FindingKind::kRegression, job, job.regressed_since_step,
                             job.regressed_since_nanos);
      f.summary = absl::StrFormat("step time up %.0f%% since step %d: %s vs %s before",
                                  (job.regression_level / job.regression_baseline - 1) * 100,
                                  job.regressed_since_step, Seconds(job.regression_level),
                                  Seconds(job.regression_baseline));
      SetCause(&f, job.regression_cause);
      absl::StrAppend(&f.summary, job.regression_cause_text);
      f.action = JobAction(f.cause);
      if (f.cause == Cause::kUnknown && !job.regression_cause_text.empty()) {
        f.action = "compute rose on every rank: look for a change of code, inputs or GPU clocks";
      }
      out->push_back(std::move(f));
    }
    if (job.stalled) StallFinding(job, out);
  }

  void StallFinding(const JobState& job, std::vector<Finding>* out) const {
    Finding f = JobFinding(FindingKind::kStall, job, job.max_step, job.stalled_since_nanos);
    f.severity = Severity::kCritical;
    std::vector<int> silent, waiting, exited;
    for (int i = 0; i < job.world_size; ++i) {
      const RankState& r = job.ranks[i];
      if (r.exited) exited.push_back(i);
      if (!r.present || r.last_step < job.max_step) {
        silent.push_back(i);
      } else {
        waiting.push_back(i);
      }
    }
    f.summary = absl::StrFormat("no step progress for over %s after step %d",
                                Seconds(job.stall_limit_nanos / kNanosPerSecond), job.max_step);
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
    f.ranks = Bounded(silent.empty() ? waiting : silent);
    out->push_back(std::move(f));
  }

  static void SetCause(Finding* f, Cause c) {
    f->cause = c;
    f->causes.clear();
    if (c != Cause::kUnknown) f->causes.push_back(c);
  }

  // A finding about a whole job (not one rank, node or GPU).
  static Finding JobFinding(FindingKind kind, const JobState& job, int64_t since_step,
                            int64_t since_unix_nanos) {
    Finding f;
    f.kind = kind;
    f.job = job.name;
    f.since_step = since_step;
    f.since_unix_nanos = since_unix_nanos;
    return f;
  }

  Finding GpuFinding(const GpuState& g) const {
    Finding f;
    f.node = g.last.node;
    f.gpu = g.last.index;
    f.since_unix_nanos = g.flagged_since_nanos;
    f.since_step = g.since_step;
    const double secs = (g.last.sampled_unix_nanos - g.below_since) / kNanosPerSecond;
    const char* what = g.last.sm_activity_ratio ? "SM activity" : "utilization";
    if (g.job.empty()) {
      f.kind = FindingKind::kIdleGpu;
      f.severity = Severity::kInfo;
      f.summary = absl::StrFormat("%s GPU %d: no process, %s %s for %.0f s (idle capacity)", f.node,
                                  f.gpu, what, Percent(g.value), secs);
      SetCause(&f, Cause::kNoWork);
      f.action = absl::StrCat("schedule work on ", f.node, " GPU ", f.gpu, " or release it");
      return f;
    }
    f.kind = FindingKind::kUnderutilizedGpu;
    f.job = g.job;
    f.rank = g.rank;
    if (g.rank >= 0) f.ranks = {g.rank};
    f.summary =
        absl::StrFormat("%s GPU %d (rank %d): %s %s < %s for %.0f s; ", f.node, f.gpu, g.rank, what,
                        Percent(g.value), Percent(opt_.underutil_threshold), secs);
    UnderutilCause(g, &f);
    return f;
  }

  // Appends the cause to the summary and sets cause and action.
  void UnderutilCause(const GpuState& g, Finding* f) const {
    auto set = [f](Cause c, const std::string& text, const std::string& action) {
      SetCause(f, c);
      absl::StrAppend(&f->summary, text);
      f->action = action;
    };
    auto hit = hosts_.find(g.last.node);
    if (hit != hosts_.end() && hit->second.cpu_utilization_ratio &&
        *hit->second.cpu_utilization_ratio >= 0.9) {
      return set(
          Cause::kHostCpu,
          absl::StrCat("host CPU bound (CPU ", Percent(*hit->second.cpu_utilization_ratio), ")"),
          absl::StrCat("find what loads ", g.last.node,
                       "'s CPUs (input preprocessing, other processes): more CPU cores per "
                       "GPU or lighter preprocessing"));
    }
    const GpuReading& x = g.last;
    if (x.dram_bandwidth_ratio && *x.dram_bandwidth_ratio >= 0.5 && x.sm_activity_ratio &&
        *x.sm_activity_ratio < opt_.underutil_threshold) {
      return set(
          Cause::kMemoryBandwidth,
          absl::StrCat("memory-bandwidth bound (DRAM bandwidth ", Percent(*x.dram_bandwidth_ratio),
                       ", SM activity ", Percent(*x.sm_activity_ratio), ")"),
          "profile the kernels: fuse memory-bound operations or raise arithmetic "
          "intensity (larger batch, mixed precision)");
    }
    const std::string release = "check whether the job is idle or hung; release the GPU if idle";
    auto jit = jobs_.find(g.job);
    if (jit == jobs_.end()) return set(Cause::kNoWork, "no work", release);
    const JobState& job = *jit->second;
    if (job.summaries.empty() ||
        x.sampled_unix_nanos - job.last_seen_nanos > opt_.underutil_window_nanos) {
      return set(Cause::kNoWork, "no work: the job reports no steps", release);
    }
    JobSnapshot s = Snapshot(job);
    if (s.breakdown.data >= 0.15) {
      return set(
          Cause::kDataLoading,
          absl::StrCat("waiting for input data (data ", Percent(s.breakdown.data), " of the step)"),
          DeviceAction(Cause::kDataLoading, g.last.node, g.last.index));
    }
    if (s.breakdown.comm + s.breakdown.imbalance >= 0.3) {
      const Cause c =
          s.breakdown.comm >= s.breakdown.imbalance ? Cause::kExposedComm : Cause::kImbalance;
      return set(c,
                 absl::StrCat("communication bound (exposed communication and waiting ",
                              Percent(s.breakdown.comm + s.breakdown.imbalance), " of the step)"),
                 JobAction(c));
    }
    return set(Cause::kUnknown,
               "cause unclear: the step split shows little waiting (small kernels or "
               "launch-bound)",
               "profile a step: small kernels or launch overhead (larger batch, CUDA graphs)");
  }

  EngineOptions opt_;
  std::map<std::string, std::unique_ptr<JobState>> jobs_;
  std::map<std::pair<std::string, int>, GpuState> gpus_;
  std::map<std::string, HostReading> hosts_;
  std::map<std::string, std::set<std::pair<std::string, int>>> nodes_;  // node -> (job, rank)
  std::map<std::string, std::map<int, double>> scaling_;  // job -> world size -> per-GPU rate
  int64_t now_ = 0;
  std::vector<double> scratch_;
};

Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Engine::~Engine() = default;
absl::Status Engine::AddStep(const StepSample& sample) { return impl_->AddStep(sample); }
void Engine::AddGpu(const GpuReading& reading) { impl_->AddGpu(reading); }
void Engine::AddHost(const HostReading& reading) { impl_->AddHost(reading); }
void Engine::Advance(int64_t now_unix_nanos) { impl_->Advance(now_unix_nanos); }
std::vector<JobSnapshot> Engine::Jobs() const { return impl_->Jobs(); }
std::optional<JobSnapshot> Engine::Job(absl::string_view job) const { return impl_->Job(job); }
std::vector<RankSnapshot> Engine::Ranks(absl::string_view job) const { return impl_->Ranks(job); }
std::vector<Finding> Engine::Findings() const { return impl_->Findings(); }
void Engine::RemoveJob(absl::string_view job) { impl_->RemoveJob(job); }
std::optional<FinishedJob> Engine::MarkRankExited(absl::string_view job, int rank, int pid,
                                                  int64_t unix_nanos) {
  return impl_->MarkRankExited(job, rank, pid, unix_nanos);
}
void Engine::RemoveNode(absl::string_view node) { impl_->RemoveNode(node); }
bool Engine::RankReportedFrom(absl::string_view job, int rank, absl::string_view node) const {
  return impl_->RankReportedFrom(job, rank, node);
}
std::string Engine::SerializeScalingHistory() const { return impl_->SerializeScalingHistory(); }
absl::Status Engine::LoadScalingHistory(absl::string_view data) {
  return impl_->LoadScalingHistory(data);
}

}  // namespace stepwatch::analysis
