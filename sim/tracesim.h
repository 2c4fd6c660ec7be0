// A trace-driven simulator of synchronous training: it replays a job from per-rank, per-step
// durations with the dependencies between ranks, and replays it again with one kind of slowness
// removed, to tell how much faster the job would run (the "what-ifs" the engine estimates from
// step summaries; sim/whatif_check.h compares the two). Standard library and Abseil only.
//
// Data parallel (DpTrace): a rank reaches the step's collective after its data wait, its compute
// and its other time (host-bound gaps); the collective completes once the slowest rank reached it
// and then takes its own time, which the trace gives as the smallest exposed communication of the
// step (the last rank to arrive waited for nobody). So
//   step = max over ranks (data + compute + other) + collective.
// Pipeline parallel (PipelineTrace): each data-parallel replica runs its stages on a 1F1B
// schedule (warm-up forwards, one forward one backward, cool-down backwards) with per-micro-batch
// forward and backward durations and a point-to-point transfer time between adjacent stages;
// stage 0 waits for its input data first; once every replica has flushed, the gradient collective
// takes its time.
//
// The what-ifs (Fix):
// - stragglers: every straggler runs as a healthy rank of its peers (the whole job; pipeline:
//   the same stage of the other replicas) would: its busy time (data + compute; pipeline: input
//   wait, forwards and backwards, scaled alike) becomes the peers' healthy reference times the
//   relative variation of one healthy peer in the same step (busy / its level; the peer taken in
//   turn), a draw from the healthy ranks' distribution of that step: ranks slow down together
//   (shared causes), which a draw from another step would lose. A rank's level at a step is its
//   median busy over the `level_window` steps around it; the reference is the median level of the
//   fast cluster when the peers' levels split into two groups separated by more than `cluster_gap`
//   (the fast group at least half of them), else the median level of all; a straggler's level is
//   over reference x (1 + straggler_margin) and reference + straggler_abs_seconds. With two peers
//   the reference is the faster one's level. Healthy ranks keep their own durations, so the step
//   still ends at the slowest healthy rank.
// - overlap (perfect overlap): the collective hides behind compute, up to the compute available:
//   on each rank, its compute not already overlapped by communication (compute - (comm - exposed
//   comm) where the trace has the total communication, else all of it); pipeline: behind every
//   rank's compute (the least of them), the pipeline's own transfers staying.
// - data (no data stall): every data wait is removed.
// - pipeline (pipeline balanced): the work split evenly across the stages, each rank keeping its
//   own speed: a stage's share of the work is the median over the replicas of its ranks' level
//   (forwards + backwards, per block of `level_window` steps) against the mean over the stages,
//   and every duration of its ranks is divided by that share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stepwatch::sim {

// One rank's step as the trace has it, seconds.
struct RankStep {
  double data = 0;          // waiting for input data
  double compute = 0;       // computing (communication that overlaps it included)
  double other = 0;         // neither: host-bound gaps, launch overhead
  double exposed_comm = 0;  // blocked in communication, waiting for slower ranks included
  double comm = -1;         // all communication, hidden behind compute or not; < 0: unknown
  double step = 0;          // the measured wall time of the step on this rank
  double busy() const { return data + compute; }
  double arrival() const { return data + compute + other; }
};

// A data-parallel job: every rank's split of every step.
struct DpTrace {
  std::string name;
  // Ranks of the job that the trace holds (a trace of some ranks of a larger job replays them as
  // the whole job).
  int ranks = 0;
  int job_world_size = 0;      // the job's own world size, as recorded (>= ranks)
  std::vector<int64_t> steps;  // step numbers
  std::vector<std::vector<RankStep>> rank_steps;  // [step index][rank]
};

// One rank of a pipeline in one step.
struct StageStep {
  std::vector<double> fwd, bwd;  // per micro-batch, seconds
  double data = 0;               // stage 0: waiting for input before the first forward
};

struct PipelineTrace {
  std::string name;
  int stages = 0;
  int replicas = 1;  // data-parallel replicas of the whole pipeline
  int microbatches = 0;
  double p2p_seconds = 0;  // one activation or gradient transfer between adjacent stages
  std::vector<int64_t> steps;
  // [step index][replica * stages + stage]: rank = replica * stages + stage.
  std::vector<std::vector<StageStep>> rank_steps;
  std::vector<double> collective;  // per step: the gradient collective after the flush
};

enum class Fix { kNone, kStragglers, kOverlap, kData, kPipeline };
// "none", "stragglers", "overlap", "data", "pipeline".
const char* FixName(Fix fix);

struct SimOptions {
  int level_window = 16;                 // steps of a rank's level
  double straggler_margin = 0.05;        // a straggler is this share over the reference
  double straggler_abs_seconds = 0.002;  // and this much
  double cluster_gap = 0.10;             // levels jumping by more split into two clusters
};

// Replays the job with `fix` applied: the simulated time of each step, seconds.
std::vector<double> ReplayDp(const DpTrace& trace, Fix fix, const SimOptions& options = {});
std::vector<double> ReplayPipeline(const PipelineTrace& trace, Fix fix,
                                   const SimOptions& options = {});

// The 1F1B makespan of one pipeline replica: fwd[stage][mb], bwd[stage][mb]; stage 0 starts
// after `data0`. Also the time each stage finishes (`stage_end`, optional).
double OneFOneB(const std::vector<std::vector<double>>& fwd,
                const std::vector<std::vector<double>>& bwd, double p2p_seconds, double data0,
                std::vector<double>* stage_end = nullptr);

// The stragglers the simulator fixes, from a group of peers' busy values [step][peer]: the factor
// each peer's busy time of each step is scaled by (1 for a healthy peer). Exposed for tests.
std::vector<std::vector<double>> StragglerScale(const std::vector<std::vector<double>>& busy,
                                                const SimOptions& options);

struct SimResult {
  double measured_seconds = 0;  // the trace's own total step time
  double replay_seconds = 0;    // the replay with nothing fixed
  // Speed-up of each fix: replay_seconds / the replay with it (1 when it removes nothing).
  double stragglers = 1, overlap = 1, data = 1, pipeline = 1;
};
SimResult Simulate(const DpTrace& trace, const SimOptions& options = {});
SimResult Simulate(const PipelineTrace& trace, const SimOptions& options = {});

// Loaders of the committed traces.
// sim/traces/*.csv written by sim/traces/kineto_steps.py (header trace,rank,world_size,step,
// step_s,data_s,compute_s,comm_s,exposed_comm_s,other_s): one DpTrace per value of `trace`, ranks
// renumbered 0.. in the order of their recorded rank; steps that some rank lacks are left out.
absl::StatusOr<std::vector<DpTrace>> LoadKinetoSteps(const std::string& csv_path);
// An Alibaba PAI `job_N_norm.csv` (../shared/data/pai-minibatch): step = time / 10, each worker's
// batch_time_norm milliseconds its compute; no data wait, no communication of its own (the
// collective's time is not recorded); steps that some worker lacks are left out, and a repeated
// (worker, step) keeps its first row, as sim/scenario_pai.h does.
absl::StatusOr<DpTrace> LoadPaiTrace(const std::string& csv_path, const std::string& name);

// Generated traces (deterministic), for what the real ones lack: pipelines, a data-stalled rank,
// communication that exceeds the compute. Names: "gen-dp-straggler", "gen-dp-data-straggler",
// "gen-dp-comm-heavy", "gen-pp-imbalanced", "gen-pp-straggler", "gen-pp-data".
std::vector<DpTrace> GeneratedDpTraces();
std::vector<PipelineTrace> GeneratedPipelineTraces();

}  // namespace stepwatch::sim
