// The diagnosis engine: a pure library. Plain structs in, findings and derived figures out.
// No gRPC, protobuf, Prometheus or threads; deterministic; verdicts are driven by step numbers, and
// the only notion of time is the `*_unix_nanos` values the caller passes in (never a clock read),
// so a recording replayed faster than real time gives the same verdicts.
//
// Not thread-safe: the caller (the collector) serializes access.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "analysis/health.h"

namespace stepwatch::analysis {

// One rank's report of one step (the StepEvent datagram plus where it came from).
struct StepEvent {
  std::string job;
  int rank = 0;
  int world_size = 0;
  int64_t step = 0;
  double step_seconds = 0;
  std::optional<double> data_seconds;
  std::optional<double> compute_seconds;
  std::optional<double> comm_seconds;
  std::optional<int64_t> samples;
  std::optional<int> local_rank;
  std::optional<int> gpu;
  std::optional<int> dp_rank;
  std::optional<int> pp_stage;
  std::optional<int> tp_rank;
  // Named sections of the step as the client reported them (name, seconds), e.g. ("forward",
  // 0.12): each is compared across ranks like the busy time, so a straggler in one section that
  // the sum of the step hides is found. A job keeps its first kMaxSectionsPerJob names; values of
  // later names are folded into nothing but counted (JobSnapshot::sections_folded).
  std::vector<std::pair<std::string, double>> sections;
  // Node of the agent that received it; pid of the sender (0 when unknown).
  std::string node;
  int pid = 0;
  int64_t received_unix_nanos = 0;
};

// InvalidArgument when the sample breaks the step-event contract (docs/step-event.md, checked by
// common/step_event_rules.h): what AddStep checks first, exposed so that a caller can refuse a
// sample before spending anything on it.
absl::Status ValidateStepEvent(const StepEvent& sample);

// Named sections one job may have (the step-event contract's limit too).
inline constexpr int kMaxSectionsPerJob = 16;

// One reading of one GPU on one node.
struct GpuSample {
  std::string node;
  int index = 0;
  int64_t sampled_unix_nanos = 0;
  std::optional<double> utilization_ratio;      // NVML utilization.gpu, 0..1
  std::optional<double> sm_activity_ratio;      // GPM / DCGM SM activity, 0..1
  std::optional<double> dram_bandwidth_ratio;   // 0..1
  std::optional<double> tensor_activity_ratio;  // 0..1
  std::optional<double> sm_clock_mhz;
  std::optional<double> sm_clock_max_mhz;
  std::optional<double> power_watts;
  std::optional<double> power_limit_watts;
  std::optional<double> temperature_celsius;
  std::optional<uint64_t> throttle_reasons;  // NVML clocks-throttle-reasons bitmask
  std::vector<uint32_t> pids;
  GpuHealth health;
};

// One reading of one node's host.
struct HostSample {
  std::string node;
  int64_t sampled_unix_nanos = 0;
  uint32_t cpu_count = 0;
  std::optional<double> cpu_utilization_ratio;  // 0..1
  std::optional<double> memory_bandwidth_bytes_per_second;
  std::vector<NicPortHealth> nic_ports;  // InfiniBand / RoCE ports
};

enum class FindingKind {
  kStraggler,
  kSlowNode,
  kPipelineImbalance,
  kUnderutilizedGpu,
  kIdleGpu,
  kScalingEfficiency,
  kRegression,
  kStall,
  kGpuHealth,
  kNicHealth,
};
// "straggler", "slow_node", "pipeline_imbalance", "underutilized_gpu", "idle_gpu",
// "scaling_efficiency", "regression", "stall", "gpu_health", "nic_health".
const char* FindingKindName(FindingKind kind);

enum class Severity { kInfo, kWarning, kCritical };
const char* SeverityName(Severity severity);  // "info", "warning", "critical"

// Names of the slowdowns in an NVML clocks-throttle-reasons bitmask, e.g. {"thermal throttling"}.
std::vector<std::string> DecodeThrottleReasons(uint64_t mask);

// Why a finding holds, as a closed vocabulary: exported as the `cause` label of
// stepwatch_finding and the alerts, so keep the names stable.
enum class Cause {
  kUnknown,            // "unknown": the evidence does not single out a cause
  kMoreWork,           // "more_work": compute excess at normal clocks and high utilization
                       //   (uneven sharding, longer sequences, more data on this rank)
  kThermalThrottling,  // "thermal_throttling"
  kPowerThrottling,    // "power_throttling": power cap or power brake
  kHardwareSlowdown,   // "hardware_slowdown"
  kLowClocks,          // "low_clocks": SM clock well under its maximum with no reason given
  kHostCpu,            // "host_cpu": the node's CPUs are saturated, busier than its peers'
  kDataLoading,        // "data_loading": waiting for input data
  kExposedComm,        // "exposed_communication": communication not hidden behind compute
  kMemoryBandwidth,    // "memory_bandwidth": DRAM bandwidth bound
  kNoWork,             // "no_work": the GPU's job reports no steps
  kImbalance,          // "imbalance": ranks wait for slower peers (scaling, regression)
  kRankExited,         // "rank_exited": a stall in which some ranks' processes are gone
  kHang,               // "hang": a stall with every process alive
  // Hardware health (gpu_health and nic_health findings; the primary cause of a straggler, slow
  // node or slow stage on the affected GPU or node):
  kXid,              // "xid": the driver reported an Xid error
  kEccUncorrected,   // "ecc_uncorrected": uncorrected ECC errors rose
  kRowRemapPending,  // "row_remap_pending": a row remap waits for the next GPU reset
  kRowRemapFailure,  // "row_remap_failure": a row remap failed
  kNvlinkDown,       // "nvlink_down": an NVLink that was up is down
  kNvlinkErrors,     // "nvlink_errors": NVLink replay, recovery or CRC errors rising
  kPcieDowngraded,   // "pcie_downgraded": a busy GPU's PCIe link under its generation or width
  kPcieReplays,      // "pcie_replays": PCIe replays rising
  kNicDown,          // "nic_down": a network port that was active is not
  kNicDegraded,      // "nic_degraded": a port's rate or width under the node's other ports'
  kNicErrors,        // "nic_errors": a port's symbol or receive errors rising, or its link downed
};
const char* CauseName(Cause cause);

// The figures of one GPU and its host that a finding rests on. A detector sets a field only where
// it is evidence (a slowdown, a low utilization, a saturated host; the clock and activity of a GPU
// doing more work at full speed), so the summary names exactly the fields that are set.
struct DeviceEvidence {
  int rank = -1;  // the rank it runs, -1 when not about one rank
  std::string node;
  int gpu = -1;  // -1 for the host alone
  std::optional<double> sm_clock_mhz;
  std::optional<double> sm_clock_max_mhz;
  std::optional<uint64_t> throttle_reasons;   // NVML mask, set when it names a slowdown
  std::optional<double> temperature_celsius;  // with thermal throttling
  std::optional<double> power_watts;          // with power draw at its limit
  std::optional<double> power_limit_watts;
  // The GPU's busy figure: SM activity where known, else NVML utilization (one of them is set).
  std::optional<double> utilization_ratio;
  std::optional<double> sm_activity_ratio;
  std::optional<double> dram_bandwidth_ratio;
  // The host's CPU utilization, and the median host's, when it is saturated.
  std::optional<double> host_cpu_ratio;
  std::optional<double> host_cpu_median_ratio;
  // The GPU's and its node's hardware faults, one line each (e.g. "Xid 79 (GPU has fallen off
  // the bus)", "PCIe gen 3 x8 of gen 5 x16 while busy", "port mlx5_0:1 down").
  std::vector<std::string> health;
};

// The measured figures behind a finding, by kind; unset when not measured or not applicable.
// Ratios are 0..1 shares or x-fold factors as named; the summary is rendered from these.
struct Evidence {
  // A slow rank or node against its peers' median over the straggler window: busy time (the
  // flagged figure), compute, and the excess data-loading time per step where that dominates.
  std::optional<double> busy_vs_median_ratio;
  std::optional<double> compute_vs_median_ratio;
  std::optional<double> data_excess_seconds;
  // A straggler found in one named section (the step's sum may hide it): the section and its
  // median against the fast group's.
  std::optional<std::string> section;
  std::optional<double> section_vs_reference_ratio;
  // Slow node: its flagged ranks and all its ranks in the job.
  std::optional<int64_t> slow_rank_count;
  std::optional<int64_t> node_rank_count;
  // Pipeline imbalance: the slowest stage's mean busy time against the median of the others.
  std::optional<double> stage_vs_median_ratio;
  std::optional<double> stage_busy_seconds;
  std::optional<double> other_stages_busy_seconds;
  // Nodes the stage's ranks run on (the first few) and how many there are.
  std::vector<std::string> nodes;
  std::optional<int64_t> node_count;
  // Underutilized or idle GPU: the threshold it stayed under, and for how long.
  std::optional<double> utilization_threshold_ratio;
  std::optional<double> below_threshold_seconds;
  // The job's step split over its window (underutilized GPU, scaling efficiency): shares 0..1.
  std::optional<double> data_share_ratio;
  std::optional<double> comm_share_ratio;
  std::optional<double> imbalance_share_ratio;
  // Scaling efficiency: per-GPU throughput against the best at a smaller world size.
  std::optional<double> scaling_efficiency_ratio;
  std::optional<int64_t> world_size;
  std::optional<int64_t> reference_world_size;
  // Regression: median step time now and before, their ratio, and the largest rise per step of
  // one part of the split (the cause names which; unknown cause: compute).
  std::optional<double> step_seconds;
  std::optional<double> baseline_step_seconds;
  std::optional<double> step_vs_baseline_ratio;
  std::optional<double> rise_seconds;
  // Stall: how long without progress made it one, the median step then, and the ranks.
  std::optional<double> stall_limit_seconds;
  std::optional<double> median_step_seconds;
  std::optional<int64_t> silent_rank_count;
  std::optional<int64_t> waiting_rank_count;
  std::optional<int64_t> exited_rank_count;
  std::vector<int> waiting_ranks;  // sorted, bounded (max_finding_ranks)
  std::vector<int> exited_ranks;   // sorted, bounded (max_finding_ranks)
  // GPUs and hosts: the rank's (straggler), the slow node's, the slow stage's (the first few), the
  // underutilized one.
  std::vector<DeviceEvidence> devices;
  // Health findings: each fault, one line, and the jobs with ranks on the node (at risk; the
  // first few).
  std::vector<std::string> health;
  std::vector<std::string> jobs_at_risk;
};

struct Finding {
  FindingKind kind = FindingKind::kStraggler;
  std::string job;     // empty for idle GPUs (no job)
  int rank = -1;       // -1 when not about one rank
  std::string node;    // empty when not about one node
  int gpu = -1;        // -1 when not about one GPU
  std::string device;  // nic_health: the port, "<device>:<port>"; empty otherwise
  // A straggler whose GPU is unknown (a CPU-only job): its local rank, named in the summary
  // instead of a GPU (`gpu` stays -1); -1 otherwise.
  int local_rank = -1;
  int64_t since_step = 0;
  int64_t since_unix_nanos = 0;
  Severity severity = Severity::kWarning;
  bool persistent = false;
  int stage = -1;  // pipeline stage, -1 when not about one stage
  // The primary cause, and every cause found (primary first; empty when unknown).
  Cause cause = Cause::kUnknown;
  std::vector<Cause> causes;
  // What the operator should do, one line, e.g. "drain node-2 or inspect its GPUs' cooling",
  // rendered from the kind, cause and evidence (RenderAction).
  std::string action;
  // Ranks the finding is about: the rank itself, every flagged rank of a slow node, every rank of
  // a slow pipeline stage, the silent ranks of a stall. Sorted, bounded (max_finding_ranks).
  std::vector<int> ranks;
  Evidence evidence;
  // One line for humans rendered from the fields above and the evidence (RenderSummary), e.g.
  // "rank 13 on node-2 GPU 5: compute +31% vs median; SM clock 1410 of 1980 MHz, thermal
  // throttling"
  std::string summary;
};

// Shares of the step time, each 0..1, summing to about 1.
struct TimeBreakdown {
  double compute = 0;
  double imbalance = 0;
  double comm = 0;
  double data = 0;
  double other = 0;
};

// What a what-if figure is: the speed-up itself as well as step summaries can tell it, or a bound
// where they cannot (the true speed-up is at least / at most the figure). Checked against a
// trace-driven simulation (sim/whatif_check.h, docs/analysis.md "What-ifs checked against a
// simulation").
enum class WhatIfKind { kEstimate, kLowerBound, kUpperBound };
// "estimate", "lower_bound", "upper_bound".
const char* WhatIfKindName(WhatIfKind kind);

// Speed-up (>= 1) if each cause were removed, over the window of complete steps.
struct WhatIf {
  // Every straggler as fast as the healthy ranks of its peer group: the step then ends at the
  // slowest healthy rank. An upper bound when a group has under 3 ranks (no healthy reference:
  // every rank as fast as the fastest).
  double stragglers = 1;
  // Perfect overlap: the collective hidden behind each rank's compute. An upper bound: compute
  // that already hides communication cannot hide more, and step summaries do not tell how much
  // does (nor, in a pipeline, the bubble from the collective).
  double overlap = 1;
  // No data stall on any rank. A lower bound in a pipeline (a wait of the first stage delays
  // every stage after it).
  double data = 1;
  // Pipeline stages balanced (ranks report pp_stage; 1 otherwise): the slowest stage's busy time
  // down to the mean of the stages'. An upper bound: the pipeline's fill and drain keep part of
  // the gain.
  double pipeline = 1;
  WhatIfKind stragglers_kind = WhatIfKind::kEstimate;
  WhatIfKind overlap_kind = WhatIfKind::kUpperBound;
  WhatIfKind data_kind = WhatIfKind::kEstimate;
  WhatIfKind pipeline_kind = WhatIfKind::kEstimate;
};

struct JobSnapshot {
  std::string job;
  // False while no rank has reported how its step splits (only step_seconds, and no GPU SM activity
  // to infer it from): efficiency, breakdown and what-ifs are then unknown, not 100% compute.
  bool split_known = false;
  int world_size = 0;
  int ranks_reporting = 0;
  int64_t last_step = -1;
  double median_step_seconds = 0;  // over the recent window of complete steps
  double steps_per_second = 0;     // 1 / median_step_seconds, 0 when unknown
  double samples_per_second = 0;   // summed over ranks; 0 when ranks report no samples
  double efficiency_ratio = 0;     // ideal / actual step time; 0 when unknown
  TimeBreakdown breakdown;
  WhatIf whatif;
  std::optional<double> scaling_efficiency_ratio;
  int64_t last_seen_unix_nanos = 0;
  // Named sections of the job (first kMaxSectionsPerJob names, in order of first report), and
  // section values dropped because their name came after the limit.
  std::vector<std::string> section_names;
  int64_t sections_folded = 0;
  // The last step analysed; steps analysed with fewer ranks than the world size (completed by
  // --step_grace or the pending cap); rank samples that came after their step was analysed, left
  // out of the analysis. Either count rising means ranks' reports arrive too far apart.
  int64_t last_complete_step = -1;
  int64_t incomplete_steps = 0;
  int64_t late_samples = 0;
};

// One named section of a rank: its median over the recent window (seconds).
struct SectionMedian {
  std::string name;
  double seconds = 0;
};

struct RankSnapshot {
  int rank = 0;
  std::string node;
  int gpu = -1;
  int pp_stage = -1;
  // Medians over the recent window, seconds.
  double busy_seconds = 0;
  double compute_seconds = 0;
  double data_seconds = 0;
  double comm_seconds = 0;
  double busy_vs_median_ratio = 1;  // busy / the reference busy of the rank's peers
  // Medians of the rank's named sections over the recent window (the job's section order).
  std::vector<SectionMedian> sections;
  // Flagged: alone, as one of a slow node's ranks, or as a rank of the slowest stage of an
  // imbalanced pipeline.
  bool straggler = false;
  // The busy_vs_median_ratio compares with peers (with 2 peers, with the other one); false when it
  // cannot (no other peer, or no known split), and the ratio then reads 1 but means nothing.
  bool comparable = true;
};

// A job whose reporting ranks have all exited (MarkRankExited).
struct FinishedJob {
  std::string job;
  int ranks = 0;  // ranks that had reported, all exited
  int64_t last_step = -1;
  // The job as it was just before it was removed, and its findings then.
  JobSnapshot last_snapshot;
  std::vector<Finding> last_findings;
};

struct EngineOptions {
  // Steps of history kept per job and rank (bounds memory per rank).
  int window_steps = 64;
  // A step is complete when all ranks reported or this much later than its first report.
  absl::Duration step_grace = absl::Seconds(5);
  // Underutilization: below `underutil_threshold` for `underutil_window`.
  double underutil_threshold = 0.5;
  absl::Duration underutil_window = absl::Seconds(30);
  // Scaling efficiency below this is a finding.
  double scaling_threshold = 0.8;
  // A sustained step-time shift of this fraction or more is a regression.
  double regression_threshold = 0.10;
  // Stall: no progress for stall_multiple x median step, and at least stall_floor.
  double stall_multiple = 10;
  absl::Duration stall_floor = absl::Seconds(30);
  // Limits; AddStep returns ResourceExhausted when one would be exceeded.
  int max_jobs = 1000;
  int max_ranks_per_job = 100000;

  // Stragglers (analysis/detectors/straggler.h): each rank's busy time, and each named section,
  // is compared every step with the reference of its peers (the mean of the healthy group: the
  // central part of the fast cluster when the ranks split into two, less the suspects). The
  // relative excess feeds a bank of sequential tests (CUSUM) tuned to effects of 1, 2, 4, 8 and
  // 16 x straggler_rel_margin, scaled by the peers' own noise. A rank is flagged when one of them
  // crosses log(peers x tests / straggler_false_alarm_per_step) and the mean excess since that
  // test's change point (against the other healthy peers) is at least straggler_rel_margin, the
  // absolute margin and the step-fraction margin. It clears when a test for "back among its peers"
  // against "still straggler_rel_margin slower" crosses log(1 / straggler_clear_false_alarm).
  // `straggler_window` steps of scores are kept as the finding's evidence (the split).
  int straggler_window = 16;
  double straggler_rel_margin = 0.05;
  double straggler_abs_margin_seconds = 0.002;
  double straggler_step_fraction = 0.02;
  // False flags per peer group and step (the threshold grows with the number of ranks tested, so
  // a 100,000-rank job raises no more of them than an 8-rank one).
  double straggler_false_alarm_per_step = 1e-7;
  double straggler_clear_false_alarm = 1e-3;
  // The relative noise assumed at least (no job measures steps more exactly than this).
  double straggler_noise_floor = 0.005;
  // Flagged for this many steps: persistent rather than transient.
  int persistent_steps = 100;
  // Pipeline imbalance: slowest stage vs the median of the others, flag and clear levels.
  double pipeline_ratio = 1.25;
  double pipeline_clear_ratio = 1.15;
  // Pending (incomplete) steps kept per job; older ones are completed with what they have.
  int max_pending_steps = 64;
  // At most this many ranks listed in one finding's `ranks`.
  int max_finding_ranks = 256;

  // A slow rank or node is critical at this ratio of its busy time to its peers' median.
  double critical_ratio = 1.5;
  // Regression: the recent windows (regression_window steps, twice and four times that) against
  // a reference of up to regression_reference complete steps before the last 4 x
  // regression_window. The shift must be at least regression_threshold and regression_z standard
  // errors of the medians' difference (the job's own noise); the first regression_warmup_steps
  // complete steps of a job (compilation, autotuning, caches) are never a reference.
  int regression_window = 16;
  int regression_reference = 128;
  double regression_z = 6;
  int regression_warmup_steps = 50;
  // Scaling efficiency is recomputed every this many complete steps of a job.
  int scaling_every_steps = 8;
  // Job names kept in the scaling history (it outlives jobs); beyond it the name least recently
  // updated is forgotten, so per-run job names cannot grow it without bound.
  int max_scaling_history_jobs = 10000;
  // Device evidence: an SM clock under this share of its maximum is low; a power draw at this
  // share of its limit is at the cap.
  double low_clock_ratio = 0.95;
  double power_cap_ratio = 0.97;
  // A host CPU this busy is saturated; to explain one slow rank or node it must also be this far
  // above the median host's.
  double host_cpu_saturated = 0.9;
  double host_cpu_above_median = 0.1;
  // Causes of an underutilized GPU: memory-bandwidth bound at this DRAM bandwidth, waiting for
  // data at this share of the step, communication bound at this share of exposed communication
  // plus imbalance.
  double memory_bound_dram_ratio = 0.5;
  double data_bound_share = 0.15;
  double comm_bound_share = 0.3;
  // Hysteresis: a regression clears when its shift falls under this share of
  // regression_threshold.
  double regression_clear_share = 0.5;
  // A slow node has at least this many ranks of the job, all flagged; it clears once fewer than
  // slow_node_clear_share of them have stayed flagged for straggler_window steps.
  int slow_node_min_ranks = 2;
  double slow_node_clear_share = 0.5;
  // Hardware health (analysis/health_tracker.h): counters are judged by their rise over the last
  // health_window (an Xid event is a fault for that long after it); a rise of at least this
  // many NVLink errors, PCIe replays or network port errors in the window is a fault. A PCIe link
  // under its maximum counts only while the GPU is busier than underutil_threshold.
  absl::Duration health_window = absl::Minutes(5);
  int64_t nvlink_error_rise = 10;
  int64_t pcie_replay_rise = 100;
  int64_t nic_error_rise = 10;
};

// Cumulative time one detector has spent in the engine (a steady-clock measurement for
// monitoring the engine itself; verdicts never depend on it).
struct DetectorTiming {
  double seconds = 0;
  // Calls: one per completed step, per job in each Advance and Findings(), per GPU reading, and
  // one per Advance and Findings() for all GPUs together.
  int64_t runs = 0;
};

// Who holds one rank, for the caller's admission of steps (RankHolderOf).
struct RankHolder {
  // The node its last step came from: a view of the engine's copy, valid until the engine changes.
  absl::string_view node;
  // That step's receipt time (as the caller passed it).
  int64_t last_seen_unix_nanos = 0;
  // The process that sent it exited (MarkRankExited, ReleaseRanksOn).
  bool exited = false;
};

// One job as a whole, for the caller's admission of steps (JobHoldingOf).
struct JobHolding {
  int world_size = 0;
  // Ranks that reported and are still known (KnownRanks), and those of them whose process has not
  // exited.
  int present_ranks = 0;
  int running_ranks = 0;
  // The latest receipt time of any of its steps.
  int64_t last_seen_unix_nanos = 0;
};

class Engine {
 public:
  explicit Engine(EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // InvalidArgument for a sample that breaks the contract; ResourceExhausted when a limit on jobs
  // or ranks per job is hit (the sample is dropped).
  absl::Status AddStep(const StepEvent& sample);
  // AddStep for a sample the caller has already had ValidateStepEvent accept (the collector
  // checks before it charges memory): skips the second check on the ingest path.
  absl::Status AddValidatedStep(const StepEvent& sample);
  void AddGpu(const GpuSample& reading);
  void AddHost(const HostSample& reading);

  // Runs the time-driven parts (step grace, stalls, underutilization windows) up to `now`.
  void Advance(int64_t now_unix_nanos);

  std::vector<JobSnapshot> Jobs() const;
  std::optional<JobSnapshot> Job(absl::string_view job) const;
  std::vector<RankSnapshot> Ranks(absl::string_view job) const;
  // The known ranks of `job` in [first, end): a caller can build every rank's row in slices.
  std::vector<RankSnapshot> Ranks(absl::string_view job, int first, int end) const;
  // Active findings, ordered by job, kind, rank.
  std::vector<Finding> Findings() const;

  // Forgets state (expiry by the caller).
  void RemoveJob(absl::string_view job);

  // The process of `rank` of `job` exited at `unix_nanos` (its agent saw the pid gone). `pid` is
  // that process (0: unknown); an exit of a process other than the one that sent the rank's last
  // step is ignored (the rank was restarted). Unknown jobs and ranks are ignored. While other ranks
  // still run, a stall of the job names the exited ranks. Once every rank that reported has
  // exited, the job has finished, not stalled: it is removed (as RemoveJob, so none of its
  // findings remain) and returned; a later step starts it afresh.
  std::optional<FinishedJob> MarkRankExited(absl::string_view job, int rank, int pid,
                                            int64_t unix_nanos);
  // The ranks of `job` whose last step came from `node` went to another collector (the job moved
  // there): each is marked exited as by MarkRankExited with an unknown pid, so the job is not
  // expected to progress here through them. Returns the job when that was the last of its ranks
  // (it is then removed).
  std::optional<FinishedJob> ReleaseRanksOn(absl::string_view job, absl::string_view node,
                                            int64_t unix_nanos);
  void RemoveNode(absl::string_view node);
  // Whether `rank` of `job` is known and its last step came from `node`.
  bool RankReportedFrom(absl::string_view job, int rank, absl::string_view node) const;
  // The holder of `rank` of `job`; nullopt for an unknown job, a rank outside its world, and a
  // rank that has not reported (or was removed with its node, or lost when the job was reset).
  std::optional<RankHolder> RankHolderOf(absl::string_view job, int rank) const;
  // nullopt for an unknown job.
  std::optional<JobHolding> JobHoldingOf(absl::string_view job) const;
  // Whether some rank of `job` last reported from `node`.
  bool NodeHoldsRankOf(absl::string_view job, absl::string_view node) const;

  // The registry is the one record of which jobs and ranks exist; callers that keep per-job state
  // beside it (the collector's memory charges and reports) ask it here.
  size_t JobCount() const;
  // The ranks of `job` that reported and are still known (not removed with their node); nullopt
  // for an unknown job.
  std::optional<int> KnownRanks(absl::string_view job) const;
  bool RankKnown(absl::string_view job, int rank) const;
  const EngineOptions& options() const;

  // Scaling history (per job name: best throughput per GPU at each world size), kept by the
  // caller in a state file so that it survives restarts.
  std::string SerializeScalingHistory() const;
  absl::Status LoadScalingHistory(absl::string_view data);

  // Time spent per detector since the engine was made, by detector name.
  std::map<std::string, DetectorTiming> DetectorTimings() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stepwatch::analysis
