// The engine's what-ifs against the trace-driven simulator (sim/tracesim.h): every trace's steps
// go through analysis::Engine as step events, and the engine's JobSnapshot::whatif is set beside
// the simulator's replay of the same steps with each slowness removed.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/engine.h"
#include "sim/tracesim.h"

namespace stepwatch::sim {

// The step events of a trace, as its ranks would report them: DP: step_seconds = the rank's
// measured step, data_seconds, compute_seconds, and comm_seconds = its exposed communication
// (other time is the rest of the step, reported as nothing); pipeline: step_seconds = the replayed
// step, compute_seconds = the rank's forward and backward, data_seconds its input wait,
// comm_seconds the rest (bubbles, transfers, the collective), pp_stage and dp_rank set. Ordered by
// step, then rank; received times advance by the step times.
std::vector<analysis::StepEvent> StepEventsOf(const DpTrace& trace);
std::vector<analysis::StepEvent> StepEventsOf(const PipelineTrace& trace);

struct WhatIfRow {
  Fix fix = Fix::kNone;
  double engine = 1;
  analysis::WhatIfKind kind = analysis::WhatIfKind::kEstimate;
  double sim = 1;
  double error = 0;  // (engine - sim) / sim
  // An estimate within `tolerance` of the simulator, or a bound the simulator's value respects.
  bool ok = false;
  // The same over each complete window of the engine's default window_steps (64) consecutive
  // steps (none for a shorter trace): how many, how many were ok, and the largest |error|.
  int windows = 0;
  int windows_ok = 0;
  double worst_window_error = 0;
};

struct TraceCheck {
  std::string trace;
  std::string source;  // where it comes from, for the table
  int ranks = 0;
  int steps = 0;
  double measured_seconds = 0;
  double replay_seconds = 0;
  std::vector<WhatIfRow> rows;  // stragglers, overlap, data (DP) and pipeline (pipeline traces)
};

// Feeds the trace's step events to an engine whose window holds all of its steps, and compares
// the what-ifs of its last snapshot with the simulator's; then, with the engine's default window,
// each complete 64-step window against the simulator on the same steps.
TraceCheck Check(const DpTrace& trace, const std::string& source, double tolerance = 0.10);
TraceCheck Check(const PipelineTrace& trace, const std::string& source, double tolerance = 0.10);

// Every committed trace: the CSVs under `traces_dir` (sim/traces), the PAI jobs under `pai_dir`
// (../shared/data/pai-minibatch; skipped when empty), and the generated traces.
absl::StatusOr<std::vector<TraceCheck>> CheckAll(const std::string& traces_dir,
                                                 const std::string& pai_dir,
                                                 double tolerance = 0.10);

// One row per trace and what-if: | trace | source | ranks x steps | replay vs measured | what-if |
// engine | kind | simulator | error % | windows ok | worst window error % | ok |
std::string MarkdownTable(const std::vector<TraceCheck>& checks);

}  // namespace stepwatch::sim
