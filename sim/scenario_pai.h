// Replays of the Alibaba PAI mini-batch traces (../shared/data/pai-minibatch, CC BY 4.0,
// attribution Alibaba PAI): each CSV row becomes one step event of one rank.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/engine.h"
#include "sim/scenario_eval.h"

namespace stepwatch::sim {

// Parses a `job_N_norm.csv` (columns `,worker,gpu,time,batch_time_norm`): step = time / 10, the
// worker's busy (compute) time = batch_time_norm milliseconds, and since synchronous training waits
// for the slowest worker, step_seconds = the largest busy time of that step and comm_seconds = the
// rest. Worker w runs on node "pai-worker-<w>". Samples come out ordered by step, then worker; a
// repeated (worker, step) row keeps the first.
absl::StatusOr<std::vector<analysis::StepEvent>> LoadPaiReplay(const std::string& csv_path,
                                                               const std::string& job);

struct ReplayResult {
  int64_t steps = 0;
  std::vector<Episode> episodes;
  analysis::JobSnapshot last_snapshot;
  std::vector<analysis::RankSnapshot> last_ranks;
};

// Feeds the samples to an engine step by step (Advance to each step's time) and records episodes.
ReplayResult RunReplay(const std::vector<analysis::StepEvent>& samples,
                       const analysis::EngineOptions& options = {});

}  // namespace stepwatch::sim
