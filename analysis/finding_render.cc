#include "analysis/finding_render.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/causes.h"
#include "analysis/finding.h"

namespace stepwatch::analysis {
namespace {

constexpr uint64_t kPowerCapBit = 0x4;  // NVML: SW power cap

// The GPU's busy figure and its name: SM activity where known, else utilization.
std::optional<double> GpuBusy(const DeviceEvidence& d) {
  return d.sm_activity_ratio ? d.sm_activity_ratio : d.utilization_ratio;
}

// The slowdowns of one GPU: "SM clock 1410 of 1980 MHz, thermal throttling", "at power cap (...)".
std::vector<std::string> SlowdownTexts(const DeviceEvidence& d) {
  std::vector<std::string> texts;
  std::string clock;
  if (d.sm_clock_mhz && d.sm_clock_max_mhz) {
    clock = absl::StrFormat("SM clock %.0f of %.0f MHz", *d.sm_clock_mhz, *d.sm_clock_max_mhz);
  }
  const uint64_t mask = d.throttle_reasons.value_or(0);
  const std::vector<std::string> reasons = DecodeThrottleReasons(mask);
  if (!clock.empty() && !reasons.empty()) {
    texts.push_back(absl::StrCat(clock, ", ", absl::StrJoin(reasons, ", ")));
  } else if (!clock.empty()) {
    texts.push_back(clock);
  } else if (!reasons.empty()) {
    texts.push_back(absl::StrJoin(reasons, ", "));
  }
  // A power cap among the throttle reasons already says it.
  if (d.power_watts && d.power_limit_watts && !(mask & kPowerCapBit)) {
    texts.push_back(
        absl::StrFormat("at power cap (%.0f of %.0f W)", *d.power_watts, *d.power_limit_watts));
  }
  return texts;
}

// Everything set on one GPU and its host, in the order the summaries name them: hardware faults
// first (they are the primary cause).
std::vector<std::string> DeviceTexts(const DeviceEvidence& d) {
  std::vector<std::string> texts = d.health;
  for (std::string& t : SlowdownTexts(d)) texts.push_back(std::move(t));
  if (std::optional<double> busy = GpuBusy(d)) {
    texts.push_back(absl::StrCat("GPU utilization ", Percent(*busy)));
  }
  if (d.host_cpu_ratio) texts.push_back(absl::StrCat("host CPU ", Percent(*d.host_cpu_ratio)));
  return texts;
}

// At most 16 ranks, then how many in all.
std::string RankList(const std::vector<int>& v, int64_t total) {
  constexpr size_t kShown = 16;
  std::string s = absl::StrJoin(v.begin(), v.begin() + std::min(v.size(), kShown), ",");
  if (total > static_cast<int64_t>(kShown)) absl::StrAppend(&s, ",... (", total, " in all)");
  return s;
}

// A slow rank's (or node's sample rank's) excess against its peers.
std::string SplitText(const Evidence& e) {
  // A straggler found in one named section: the step's sum may not show it at all.
  if (e.section && e.section_vs_reference_ratio) {
    return absl::StrFormat("section %s %+.0f%% vs peers", *e.section,
                           (*e.section_vs_reference_ratio - 1) * 100);
  }
  if (e.data_excess_seconds) {
    return absl::StrCat("data loading +", Seconds(*e.data_excess_seconds), " vs peers");
  }
  if (e.compute_vs_median_ratio) {
    return absl::StrFormat("compute %+.0f%% vs peers", (*e.compute_vs_median_ratio - 1) * 100);
  }
  if (e.busy_vs_median_ratio) {
    return absl::StrFormat("busy %+.0f%% vs peers", (*e.busy_vs_median_ratio - 1) * 100);
  }
  return "slower than its peers";
}

std::string StragglerSummary(const Finding& f) {
  const Evidence& e = f.evidence;
  std::string s = absl::StrCat("rank ", f.rank);
  if (!f.node.empty()) absl::StrAppend(&s, " on ", f.node);
  // Without a known GPU the summary names the local rank, never as a GPU (a CPU-only job).
  if (f.gpu >= 0) {
    absl::StrAppend(&s, " GPU ", f.gpu);
  } else if (f.local_rank >= 0) {
    absl::StrAppend(&s, " local rank ", f.local_rank);
  }
  absl::StrAppend(&s, ": ", SplitText(e));
  const DeviceEvidence d = e.devices.empty() ? DeviceEvidence() : e.devices[0];
  const std::vector<std::string> texts = DeviceTexts(d);
  if (f.cause == Cause::kDataLoading) {
    if (!texts.empty()) absl::StrAppend(&s, "; ", absl::StrJoin(texts, "; "));
  } else if (f.cause == Cause::kMoreWork) {
    const std::optional<double> busy = GpuBusy(d);
    absl::StrAppend(&s, "; more work than its peers at full clocks (",
                    d.sm_clock_mhz ? absl::StrFormat("SM clock %.0f MHz, ", *d.sm_clock_mhz) : "",
                    d.sm_activity_ratio ? "SM activity " : "utilization ",
                    Percent(busy.value_or(0)), ")");
  } else if (f.cause == Cause::kUnknown) {
    absl::StrAppend(&s, "; cause unknown");
    if (d.gpu < 0) absl::StrAppend(&s, " (no GPU readings)");
    if (!texts.empty()) absl::StrAppend(&s, ": ", absl::StrJoin(texts, "; "));
  } else {
    const char* what = f.cause == Cause::kHostCpu ? "; slower host: "
                       : f.cause == Cause::kNicDown || f.cause == Cause::kNicDegraded ||
                               f.cause == Cause::kNicErrors
                           ? "; network port fault: "
                       : IsHealthCause(f.cause) ? "; GPU fault: "
                                                : "; slower GPU: ";
    absl::StrAppend(&s, what, absl::StrJoin(texts, "; "));
  }
  if (!f.persistent) absl::StrAppend(&s, " (transient so far)");
  return s;
}

std::string SlowNodeSummary(const Finding& f) {
  const Evidence& e = f.evidence;
  const int64_t slow = e.slow_rank_count.value_or(0), all = e.node_rank_count.value_or(0);
  std::string s = slow == all ? absl::StrFormat("%s: all %d ranks slow", f.node, all)
                              : absl::StrFormat("%s: %d of %d ranks slow", f.node, slow, all);
  absl::StrAppend(&s, absl::StrFormat(", busy %+.0f%% vs peers",
                                      (e.busy_vs_median_ratio.value_or(1) - 1) * 100));
  // Where the node's excess lies (the first rank's split), when it is known to lie somewhere.
  if (e.data_excess_seconds || e.compute_vs_median_ratio) {
    Evidence split;
    split.data_excess_seconds = e.data_excess_seconds;
    split.compute_vs_median_ratio = e.compute_vs_median_ratio;
    absl::StrAppend(&s, "; ", SplitText(split));
  }
  for (const DeviceEvidence& d : e.devices) {
    const std::vector<std::string> texts = DeviceTexts(d);
    if (texts.empty()) continue;
    if (d.gpu >= 0) {
      absl::StrAppend(&s, "; GPU ", d.gpu, ": ", absl::StrJoin(texts, ", "));
    } else {
      absl::StrAppend(&s, "; ", absl::StrJoin(texts, "; "));
    }
  }
  return s;
}

std::string PipelineSummary(const Finding& f) {
  const Evidence& e = f.evidence;
  std::string s = absl::StrFormat("stage %d takes %.1fx the other stages (busy %s vs %s)", f.stage,
                                  e.stage_vs_median_ratio.value_or(0),
                                  Seconds(e.stage_busy_seconds.value_or(0)),
                                  Seconds(e.other_stages_busy_seconds.value_or(0)));
  const int64_t nodes = e.node_count.value_or(0);
  if (nodes == 1) {
    if (!f.node.empty()) absl::StrAppend(&s, " on ", f.node);
  } else if (nodes > 1) {
    const int64_t more = nodes - static_cast<int64_t>(e.nodes.size());
    absl::StrAppend(&s, "; its ranks run on ", absl::StrJoin(e.nodes, ", "),
                    more > 0 ? absl::StrCat(" and ", more, " more") : "");
  }
  if (f.cause == Cause::kMoreWork) {
    absl::StrAppend(&s, "; more work than the other stages");
    return s;
  }
  std::vector<std::string> devices;
  for (const DeviceEvidence& d : e.devices) {
    devices.push_back(absl::StrCat("rank ", d.rank, " on ", d.node,
                                   d.gpu >= 0 ? absl::StrCat(" GPU ", d.gpu) : "", ": ",
                                   absl::StrJoin(DeviceTexts(d), ", ")));
  }
  absl::StrAppend(&s, "; slower devices: ", absl::StrJoin(devices, "; "));
  return s;
}

std::string GpuSummary(const Finding& f) {
  const Evidence& e = f.evidence;
  const DeviceEvidence d = e.devices.empty() ? DeviceEvidence() : e.devices[0];
  const char* what = d.sm_activity_ratio ? "SM activity" : "utilization";
  const std::string busy = Percent(GpuBusy(d).value_or(0));
  const double secs = e.below_threshold_seconds.value_or(0);
  if (f.kind == FindingKind::kIdleGpu) {
    return absl::StrFormat("%s GPU %d: no process, %s %s for %.0f s (idle capacity)", f.node, f.gpu,
                           what, busy, secs);
  }
  std::string s =
      absl::StrFormat("%s GPU %d (rank %d): %s %s < %s for %.0f s; ", f.node, f.gpu, f.rank, what,
                      busy, Percent(e.utilization_threshold_ratio.value_or(0)), secs);
  switch (f.cause) {
    case Cause::kHostCpu:
      absl::StrAppend(&s, "host CPU bound (CPU ", Percent(d.host_cpu_ratio.value_or(0)), ")");
      break;
    case Cause::kMemoryBandwidth:
      absl::StrAppend(&s, "memory-bandwidth bound (DRAM bandwidth ",
                      Percent(d.dram_bandwidth_ratio.value_or(0)), ", SM activity ",
                      Percent(d.sm_activity_ratio.value_or(0)), ")");
      break;
    case Cause::kNoWork:
      absl::StrAppend(&s, "no work: the job reports no steps");
      break;
    case Cause::kDataLoading:
      absl::StrAppend(&s, "waiting for input data (data ", Percent(e.data_share_ratio.value_or(0)),
                      " of the step)");
      break;
    case Cause::kExposedComm:
    case Cause::kImbalance:
      absl::StrAppend(&s, "communication bound (exposed communication and waiting ",
                      Percent(e.comm_share_ratio.value_or(0) + e.imbalance_share_ratio.value_or(0)),
                      " of the step)");
      break;
    default:
      absl::StrAppend(&s,
                      "cause unclear: the step split shows little waiting (small kernels or "
                      "launch-bound)");
  }
  return s;
}

std::string ScalingSummary(const Finding& f) {
  const Evidence& e = f.evidence;
  const double ratio = e.scaling_efficiency_ratio.value_or(0);
  std::string s = absl::StrFormat(
      "scaling efficiency %s at %d GPUs: per-GPU throughput %.2fx the best at %d GPUs",
      Percent(ratio), e.world_size.value_or(0), ratio, e.reference_world_size.value_or(0));
  std::optional<double> share;
  const char* name = "";
  switch (f.cause) {
    case Cause::kExposedComm:
      share = e.comm_share_ratio, name = "exposed communication";
      break;
    case Cause::kImbalance:
      share = e.imbalance_share_ratio, name = "waiting for slower ranks";
      break;
    case Cause::kDataLoading:
      share = e.data_share_ratio, name = "data loading";
      break;
    default:
      break;
  }
  if (share) absl::StrAppend(&s, "; largest loss: ", name, " ", Percent(*share), " of the step");
  return s;
}

// Step times of fast jobs need a decimal: "7.4 ms", not "7 ms" (nor "+0 ms").
std::string StepSeconds(double s) {
  if (s < 0.0095) return absl::StrFormat("%.1f ms", s * 1000);
  return Seconds(s);
}

// The since-step is the change point, the same step as the finding's since_step. rise_seconds
// unset: the split is unknown (nothing said); 0: no part of it rose measurably.
std::string RegressionSummary(const Finding& f) {
  const Evidence& e = f.evidence;
  std::string s = absl::StrFormat("step time up %.0f%% since step %d: %s vs %s before",
                                  (e.step_vs_baseline_ratio.value_or(1) - 1) * 100, f.since_step,
                                  StepSeconds(e.step_seconds.value_or(0)),
                                  StepSeconds(e.baseline_step_seconds.value_or(0)));
  if (e.rise_seconds && *e.rise_seconds > 0) {
    const char* name = f.cause == Cause::kExposedComm   ? "exposed communication"
                       : f.cause == Cause::kImbalance   ? "waiting for slower ranks"
                       : f.cause == Cause::kDataLoading ? "data loading"
                                                        : "compute";
    absl::StrAppend(&s, "; largest rise: ", name, " +", StepSeconds(*e.rise_seconds), " per step");
  } else if (e.rise_seconds) {
    absl::StrAppend(&s, "; no single part of the split rose measurably");
  }
  return s;
}

// "node-3 GPU 5: Xid 79 (GPU has fallen off the bus), 1 event; jobs on the node: train-a"
std::string HealthSummary(const Finding& f) {
  const Evidence& e = f.evidence;
  std::string s = f.kind == FindingKind::kGpuHealth ? absl::StrCat(f.node, " GPU ", f.gpu)
                                                    : absl::StrCat(f.node, " port ", f.device);
  if (f.rank >= 0) absl::StrAppend(&s, " (rank ", f.rank, ")");
  absl::StrAppend(&s, ": ", absl::StrJoin(e.health, "; "));
  if (!e.jobs_at_risk.empty()) {
    absl::StrAppend(&s, "; jobs on the node: ", absl::StrJoin(e.jobs_at_risk, ", "));
  } else {
    absl::StrAppend(&s, "; no job on the node");
  }
  return s;
}

std::string StallSummary(const Finding& f) {
  const Evidence& e = f.evidence;
  std::string s = absl::StrFormat("no step progress for over %s after step %d",
                                  Seconds(e.stall_limit_seconds.value_or(0)), f.since_step);
  const int64_t silent = e.silent_rank_count.value_or(0);
  const int64_t waiting = e.waiting_rank_count.value_or(0);
  const int64_t exited = e.exited_rank_count.value_or(0);
  if (silent == 0) {
    absl::StrAppend(&s, "; all ", waiting, " ranks silent since that step");
  } else {
    absl::StrAppend(&s, "; silent ranks (behind): ", RankList(f.ranks, silent));
    if (waiting > 0) {
      absl::StrAppend(&s, "; waiting ranks: ", RankList(e.waiting_ranks, waiting));
    }
  }
  if (exited > 0) {
    absl::StrAppend(&s, exited == 1 ? "; rank " : "; ranks ", RankList(e.exited_ranks, exited),
                    " exited (process gone)");
  }
  return s;
}

// Advice for a slow rank, node or stage on `node` (GPU `gpu`, -1 when not about one GPU).
std::string DeviceAction(Cause cause, const std::string& node, int gpu) {
  const std::string where = node.empty() ? std::string("its node") : node;
  const std::string device =
      gpu >= 0 ? absl::StrCat(where, " GPU ", gpu) : absl::StrCat(where, "'s GPUs");
  switch (cause) {
    case Cause::kThermalThrottling:
      return absl::StrCat("drain ", where, " or inspect ", device, ": cooling (fans, airflow)");
    case Cause::kPowerThrottling:
      return absl::StrCat("drain ", where, " or inspect ", device,
                          ": power limit and power supply");
    case Cause::kHardwareSlowdown:
      return absl::StrCat("drain ", where, " and inspect ", device,
                          " (hardware slowdown: power brake, faulty part)");
    case Cause::kLowClocks:
      return absl::StrCat("drain ", where, " or inspect ", device,
                          ": clock settings (application clocks, clock locks)");
    case Cause::kHostCpu:
      return absl::StrCat("drain ", where, " or inspect its host: CPU load (other processes, ",
                          "data-loader threads)");
    case Cause::kDataLoading:
      return absl::StrCat("more data-loader workers or faster storage on ", where);
    case Cause::kXid:
      return absl::StrCat("drain ", where, ", read the driver's Xid messages (dmesg) and reset ",
                          device, "; replace it if the error recurs");
    case Cause::kEccUncorrected:
      return absl::StrCat("drain ", where, " and reset ", device,
                          " (uncorrected memory errors); replace it if they recur");
    case Cause::kRowRemapPending:
      return absl::StrCat("reset ", device, " when its jobs end (drain ", where,
                          ") to apply the pending row remap");
    case Cause::kRowRemapFailure:
      return absl::StrCat("drain ", where, " and replace ", device, " (row remapping failed)");
    case Cause::kNvlinkDown:
    case Cause::kNvlinkErrors:
      return absl::StrCat("drain ", where, " and inspect ", device,
                          "'s NVLinks (reseat the GPU or the NVLink bridge, nvidia-smi nvlink -e)");
    case Cause::kPcieDowngraded:
    case Cause::kPcieReplays:
      return absl::StrCat("drain ", where, " and reseat ", device,
                          " (PCIe slot, riser and cable; nvidia-smi -q -d PCIE)");
    case Cause::kNicDown:
    case Cause::kNicDegraded:
    case Cause::kNicErrors:
      return absl::StrCat("drain ", where,
                          " and check the cable, transceiver and switch port of its network "
                          "port (ibstat, perfquery)");
    default:
      return absl::StrCat("drain ", where, " or inspect ", device, " and its host");
  }
}

// Advice for a job-wide loss (scaling efficiency, regression, a communication-bound GPU).
std::string JobAction(Cause cause) {
  switch (cause) {
    case Cause::kExposedComm:
      return "overlap communication with compute (bucketed, asynchronous collectives) or check "
             "the network";
    case Cause::kImbalance:
      return "find the ranks the others wait for (stepwatchctl explain, flagged ranks) and fix or "
             "drain their nodes, or rebalance their work";
    case Cause::kDataLoading:
      return "more data-loader workers or faster storage";
    default:
      return "profile a step (no dominant loss in the step's split)";
  }
}

std::string StragglerAction(const Finding& f) {
  switch (f.cause) {
    case Cause::kMoreWork:
      return absl::StrCat("check the sharding and data balance of rank ", f.rank,
                          " (e.g. uneven sequence lengths or batch sizes)");
    case Cause::kUnknown:
      return absl::StrCat("compare rank ", f.rank, "'s GPU and host with its peers' ",
                          "(nvidia-smi, py-spy dump)");
    default:
      return DeviceAction(f.cause, f.node, f.gpu);
  }
}

std::string GpuAction(const Finding& f) {
  switch (f.cause) {
    case Cause::kHostCpu:
      return absl::StrCat("find what loads ", f.node,
                          "'s CPUs (input preprocessing, other processes): more CPU cores per "
                          "GPU or lighter preprocessing");
    case Cause::kMemoryBandwidth:
      return "profile the kernels: fuse memory-bound operations or raise arithmetic intensity "
             "(larger batch, mixed precision)";
    case Cause::kNoWork:
      return "check whether the job is idle or hung; release the GPU if idle";
    case Cause::kDataLoading:
      return DeviceAction(Cause::kDataLoading, f.node, f.gpu);
    case Cause::kExposedComm:
    case Cause::kImbalance:
      return JobAction(f.cause);
    default:
      return "profile a step: small kernels or launch overhead (larger batch, CUDA graphs)";
  }
}

std::string StallAction(const Finding& f) {
  const int64_t exited = f.evidence.exited_rank_count.value_or(0);
  if (exited == 0) {
    return "dump the stacks of the silent ranks (py-spy dump) and read their NCCL logs "
           "(NCCL_DEBUG=INFO)";
  }
  return absl::StrCat("read the logs of rank", exited == 1 ? " " : "s ",
                      RankList(f.evidence.exited_ranks, exited),
                      " (exited); the other ranks wait for ", exited == 1 ? "it" : "them");
}

}  // namespace

std::string RenderSummary(const Finding& f) {
  switch (f.kind) {
    case FindingKind::kStraggler:
      return StragglerSummary(f);
    case FindingKind::kSlowNode:
      return SlowNodeSummary(f);
    case FindingKind::kPipelineImbalance:
      return PipelineSummary(f);
    case FindingKind::kUnderutilizedGpu:
    case FindingKind::kIdleGpu:
      return GpuSummary(f);
    case FindingKind::kScalingEfficiency:
      return ScalingSummary(f);
    case FindingKind::kRegression:
      return RegressionSummary(f);
    case FindingKind::kStall:
      return StallSummary(f);
    case FindingKind::kGpuHealth:
    case FindingKind::kNicHealth:
      return HealthSummary(f);
  }
  return "";
}

std::string RenderAction(const Finding& f) {
  switch (f.kind) {
    case FindingKind::kStraggler:
      return StragglerAction(f);
    case FindingKind::kSlowNode:
      // The node, not the job's partition, is at fault: drain or inspect it.
      if (f.cause == Cause::kDataLoading) {
        return absl::StrCat("drain ", f.node,
                            " or inspect its storage and data loading (more data-loader workers)");
      }
      return DeviceAction(f.cause, f.node, -1);
    case FindingKind::kPipelineImbalance:
      if (f.cause == Cause::kMoreWork || f.evidence.devices.empty()) {
        return absl::StrCat("move layers off stage ", f.stage,
                            " to the other stages (rebalance the pipeline partition)");
      }
      return DeviceAction(f.cause, f.evidence.devices[0].node, f.evidence.devices[0].gpu);
    case FindingKind::kUnderutilizedGpu:
      return GpuAction(f);
    case FindingKind::kIdleGpu:
      return absl::StrCat("schedule work on ", f.node, " GPU ", f.gpu, " or release it");
    case FindingKind::kScalingEfficiency:
      return JobAction(f.cause);
    case FindingKind::kRegression:
      if (f.cause == Cause::kUnknown && f.evidence.rise_seconds.value_or(0) > 0) {
        return "compute rose on every rank: look for a change of code, inputs or GPU clocks";
      }
      return JobAction(f.cause);
    case FindingKind::kStall:
      return StallAction(f);
    case FindingKind::kGpuHealth:
      if (f.severity == Severity::kInfo) {
        return "read the job's logs: the error was raised by the program, not the GPU";
      }
      return DeviceAction(f.cause, f.node, f.gpu);
    case FindingKind::kNicHealth:
      return absl::StrCat("drain ", f.node, " and check the cable, transceiver and switch port of ",
                          f.device, " (ibstat, perfquery)");
  }
  return "";
}

void RenderFinding(Finding* f) {
  f->summary = RenderSummary(*f);
  f->action = RenderAction(*f);
}

}  // namespace stepwatch::analysis
