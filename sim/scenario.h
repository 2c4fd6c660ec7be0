// Scenarios: a JSON description of a training job and the faults injected into it, and a
// deterministic generator of what stepwatch would observe (per-rank step samples, per-GPU and
// per-host readings) plus the ground truth. The detection benchmark feeds the output straight into
// analysis::Engine; stepwatch-sim sends it through real agents.
//
// Scenario file (all fields but "name" optional):
// {
//   "name": "slow-rank-10pct", "job": "bert", "seed": 7,
//   "nodes": 4, "gpus_per_node": 8, "steps": 2000, "step_s": 0.5, "noise_cv": 0.03,
//   "compute_fraction": 0.7, "data_fraction": 0.05,        // of step_seconds; the rest is
//   communication "report": "full" | "step_comm" | "step_only",           // which fields ranks
//   send "samples_per_rank": 32, "gpu_interval_s": 1.0, "pp_stages": 1, "idle_gpus_per_node": 0,
//   "sm_activity": false,                                   // GPUs also report SM activity
//   "phases": [{"steps": 100, "step_s": 0.8}],              // step_s per phase; then "step_s"
//   "faults": [{"kind": "slow_rank", "onset": 500, "end": 1500, "rank": 3, "factor": 1.1}]
// }
// Fault kinds: slow_rank (rank, factor on busy time), slow_node (node index, factor), data_stall
// (extra_s of data wait per step on every rank), low_gpu_util (factor on utilization of the GPU
// of "rank", or of every GPU when rank is -1), comm_slowdown (factor on communication),
// throttled_gpu (rank, factor: the SM clock drops to max/factor and compute grows by factor,
// thermal throttle bits set), hang (no step completes between onset and end; time still passes),
// slow_stage (pipeline "stage", factor on busy time; needs pp_stages > 1; ranks are split into
// contiguous stages), rescale (at onset the job restarts on "nodes" nodes with per-GPU throughput
// divided by "factor"). "end" of -1 or absent: never ends.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/engine.h"

namespace stepwatch::sim {

enum class Report { kFull, kStepComm, kStepOnly };

struct Phase {
  int64_t steps = 0;
  double step_seconds = 0;
};

struct Fault {
  std::string kind;
  int64_t onset = 0;
  int64_t end = -1;  // exclusive; -1: until the scenario ends
  int rank = -1;
  int node = -1;
  int stage = -1;  // slow_stage
  int nodes = 0;   // rescale: the new node count
  double factor = 1;
  double extra_s = 0;
};

struct Scenario {
  std::string name;
  std::string job = "job";
  uint64_t seed = 1;
  int nodes = 2;
  int gpus_per_node = 8;
  int64_t steps = 1000;
  double step_seconds = 0.5;
  double noise_cv = 0.02;
  double compute_fraction = 0.7;
  double data_fraction = 0.05;
  Report report = Report::kFull;
  int64_t samples_per_rank = 32;
  double gpu_interval_s = 1.0;
  int pp_stages = 1;
  int idle_gpus_per_node = 0;
  bool sm_activity = false;  // GPU readings carry SM activity (DCGM / GPM) besides utilization
  std::vector<Phase> phases;
  std::vector<Fault> faults;
};

absl::StatusOr<Scenario> ParseScenario(absl::string_view json_text);
absl::StatusOr<Scenario> LoadScenario(const std::string& path);

// What a correct detector should report, derived from a fault.
struct Truth {
  std::string fault_kind;  // as in the scenario
  int64_t onset_step = 0;
  int64_t end_step = -1;  // exclusive; -1: until the end
  int64_t onset_unix_nanos = -1;
  int64_t end_unix_nanos = -1;
  std::string job;
  int rank = -1;     // slow_rank, throttled_gpu, low_gpu_util on one rank's GPU
  std::string node;  // slow_node; the rank's node where a rank is named
  int gpu = -1;      // the rank's GPU where a rank is named
  // False for a fault that should pass unreported (e.g. a rescale that keeps its efficiency).
  bool expect_finding = true;
};

// Everything observed during one step of the scenario.
struct Tick {
  int64_t step = 0;
  int64_t unix_nanos = 0;  // when the step ended
  int world_size = 0;
  std::vector<analysis::StepEvent> samples;  // empty while hung
  std::vector<analysis::GpuSample> gpus;     // when a GPU sampling interval ended in this step
  std::vector<analysis::HostSample> hosts;
};

// Node names are "node-<i>"; rank = node * gpus_per_node + local_rank, on GPU index local_rank;
// pid = 10000 + rank. Extra idle GPUs come after the busy ones and have no process.
class Generator {
 public:
  static constexpr int64_t kStartUnixNanos = 1'800'000'000'000'000'000;
  explicit Generator(Scenario scenario);

  // Fills `tick` with the next step; false when the scenario is over.
  bool Next(Tick* tick);
  // Ground truth, one entry per fault, from construction; onset_unix_nanos and end_unix_nanos are
  // filled in when the generator reaches those steps (-1 before).
  const std::vector<Truth>& truth() const { return truth_; }
  const Scenario& scenario() const { return sc_; }

 private:
  double BaseStep(int64_t step) const;
  int Nodes(int64_t step) const;
  double ThroughputFactor(int64_t step) const;
  bool Active(const Fault& f, int64_t step) const;
  const std::string& NodeName(int node);

  // One step's work per rank (index = rank), and which nodes' hosts are busy (index = node).
  struct RankSplit {
    std::vector<double> compute, data, gpu_util, clock;
    std::vector<bool> throttled, host_busy;
  };
  // The parts of Next: the step's events (none while hung), then the GPU and host samples when a
  // sampling interval ended; `normal` is Next's distribution, so the random sequence stays one.
  void AddStepEvents(int64_t step, int world, double step_seconds, const RankSplit& split,
                     Tick* tick);
  void AddGpuAndHostSamples(int nodes, bool hung, double step_seconds, const RankSplit& split,
                            std::normal_distribution<double>* normal, Tick* tick);

  Scenario sc_;
  std::vector<Truth> truth_;
  std::mt19937_64 rng_;
  int64_t step_ = 0;
  int64_t now_ = kStartUnixNanos;
  double next_gpu_sample_ = 0;  // seconds since start
  double elapsed_s_ = 0;
  std::vector<std::string> node_names_;
};

}  // namespace stepwatch::sim
