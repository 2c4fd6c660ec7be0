#include "sim/whatif_check.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stepwatch::sim {
namespace {

constexpr int64_t kNanos = 1'000'000'000;
constexpr int64_t kStartUnixNanos = 1'700'000'000'000'000'000;  // received times start here

analysis::StepEvent Event(const std::string& job, int rank, int world, int64_t step,
                          int64_t nanos) {
  analysis::StepEvent e;
  e.job = job;
  e.rank = rank;
  e.world_size = world;
  e.step = step;
  e.node = absl::StrCat(job, "-node-", rank);
  e.pid = 1000 + rank;
  e.received_unix_nanos = nanos;
  return e;
}

double Sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// Feeds `events` (ordered by step) to an engine and returns its what-ifs after each step whose
// index (0-based, among the distinct steps) is in `at` (ascending).
std::vector<analysis::WhatIf> EngineWhatIfs(const std::vector<analysis::StepEvent>& events,
                                            int window_steps, const std::vector<size_t>& at) {
  analysis::EngineOptions options;
  options.window_steps = window_steps;
  analysis::Engine engine(options);
  std::vector<analysis::WhatIf> out;
  size_t k = 0, next = 0;
  for (size_t i = 0; i < events.size() && next < at.size(); ++k) {
    const int64_t step = events[i].step;
    int64_t now = 0;
    for (; i < events.size() && events[i].step == step; ++i) {
      (void)engine.AddStep(events[i]);
      now = std::max(now, events[i].received_unix_nanos);
    }
    engine.Advance(now);
    if (k == at[next]) {
      std::optional<analysis::JobSnapshot> snap = engine.Job(events.front().job);
      out.push_back(snap ? snap->whatif : analysis::WhatIf());
      ++next;
    }
  }
  return out;
}

WhatIfRow Row(Fix fix, double engine, analysis::WhatIfKind kind, double sim, double tolerance) {
  WhatIfRow r;
  r.fix = fix;
  r.engine = engine;
  r.kind = kind;
  r.sim = sim;
  r.error = sim > 0 ? (engine - sim) / sim : 0;
  constexpr double kSlack = 1e-9;
  switch (kind) {
    case analysis::WhatIfKind::kEstimate:
      r.ok = std::abs(r.error) <= tolerance;
      break;
    case analysis::WhatIfKind::kLowerBound:
      r.ok = sim >= engine - kSlack;
      break;
    case analysis::WhatIfKind::kUpperBound:
      r.ok = sim <= engine + kSlack;
      break;
  }
  return r;
}

DpTrace Slice(const DpTrace& t, size_t b, size_t e) {
  DpTrace s = t;
  s.steps.assign(t.steps.begin() + b, t.steps.begin() + e);
  s.rank_steps.assign(t.rank_steps.begin() + b, t.rank_steps.begin() + e);
  return s;
}

PipelineTrace Slice(const PipelineTrace& t, size_t b, size_t e) {
  PipelineTrace s = t;
  s.steps.assign(t.steps.begin() + b, t.steps.begin() + e);
  s.rank_steps.assign(t.rank_steps.begin() + b, t.rank_steps.begin() + e);
  s.collective.assign(t.collective.begin() + b, t.collective.begin() + e);
  return s;
}

std::vector<WhatIfRow> Rows(const analysis::WhatIf& w, const SimResult& sim, bool pipeline,
                            double tolerance) {
  std::vector<WhatIfRow> rows;
  rows.push_back(Row(Fix::kStragglers, w.stragglers, w.stragglers_kind, sim.stragglers, tolerance));
  rows.push_back(Row(Fix::kOverlap, w.overlap, w.overlap_kind, sim.overlap, tolerance));
  rows.push_back(Row(Fix::kData, w.data, w.data_kind, sim.data, tolerance));
  if (pipeline) {
    rows.push_back(Row(Fix::kPipeline, w.pipeline, w.pipeline_kind, sim.pipeline, tolerance));
  }
  return rows;
}

template <typename Trace>
TraceCheck CheckTrace(const Trace& t, int ranks, bool pipeline, const std::string& source,
                      double tolerance) {
  TraceCheck c;
  c.trace = t.name;
  c.source = source;
  c.ranks = ranks;
  c.steps = static_cast<int>(t.rank_steps.size());
  const SimResult sim = Simulate(t);
  c.measured_seconds = sim.measured_seconds;
  c.replay_seconds = sim.replay_seconds;
  const std::vector<analysis::StepEvent> events = StepEventsOf(t);
  const size_t steps = t.rank_steps.size();
  if (steps == 0) return c;
  const analysis::WhatIf whole =
      EngineWhatIfs(events, std::max(analysis::EngineOptions().window_steps, c.steps + 1),
                    {steps - 1})
          .front();
  c.rows = Rows(whole, sim, pipeline, tolerance);
  // The engine's own window, one complete window after another.
  const size_t window = analysis::EngineOptions().window_steps;
  std::vector<size_t> ends;
  for (size_t e = window; e <= steps; e += window) ends.push_back(e - 1);
  const std::vector<analysis::WhatIf> engine = EngineWhatIfs(events, window, ends);
  for (size_t i = 0; i < ends.size(); ++i) {
    const size_t e = ends[i] + 1;
    const std::vector<WhatIfRow> rows =
        Rows(engine[i], Simulate(Slice(t, e - window, e)), pipeline, tolerance);
    for (size_t r = 0; r < rows.size(); ++r) {
      WhatIfRow& row = c.rows[r];
      ++row.windows;
      if (rows[r].ok) ++row.windows_ok;
      row.worst_window_error = std::max(row.worst_window_error, std::abs(rows[r].error));
    }
  }
  for (WhatIfRow& row : c.rows) row.ok = row.ok && row.windows_ok == row.windows;
  return c;
}

}  // namespace

std::vector<analysis::StepEvent> StepEventsOf(const DpTrace& t) {
  std::vector<analysis::StepEvent> out;
  int64_t nanos = kStartUnixNanos;
  for (size_t k = 0; k < t.rank_steps.size(); ++k) {
    const std::vector<RankStep>& rs = t.rank_steps[k];
    double step = 0;
    for (const RankStep& r : rs) step = std::max(step, r.step);
    nanos += static_cast<int64_t>(std::llround(step * kNanos));
    for (int i = 0; i < static_cast<int>(rs.size()); ++i) {
      analysis::StepEvent e = Event(t.name, i, t.ranks, t.steps[k], nanos);
      e.step_seconds = std::max(rs[i].step, 1e-6);
      e.data_seconds = rs[i].data;
      e.compute_seconds = rs[i].compute;
      e.comm_seconds = rs[i].exposed_comm;
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::vector<analysis::StepEvent> StepEventsOf(const PipelineTrace& t) {
  std::vector<analysis::StepEvent> out;
  const std::vector<double> steps = ReplayPipeline(t, Fix::kNone);
  const int world = t.stages * t.replicas;
  int64_t nanos = kStartUnixNanos;
  for (size_t k = 0; k < t.rank_steps.size(); ++k) {
    nanos += static_cast<int64_t>(std::llround(steps[k] * kNanos));
    for (int rank = 0; rank < world; ++rank) {
      const StageStep& x = t.rank_steps[k][rank];
      analysis::StepEvent e = Event(t.name, rank, world, t.steps[k], nanos);
      const double compute = Sum(x.fwd) + Sum(x.bwd);
      e.step_seconds = steps[k];
      e.data_seconds = x.data;
      e.compute_seconds = compute;
      e.comm_seconds = std::max(0.0, steps[k] - compute - x.data);
      e.pp_stage = rank % t.stages;
      e.dp_rank = rank / t.stages;
      out.push_back(std::move(e));
    }
  }
  return out;
}

TraceCheck Check(const DpTrace& t, const std::string& source, double tolerance) {
  return CheckTrace(t, t.ranks, /*pipeline=*/false, source, tolerance);
}

TraceCheck Check(const PipelineTrace& t, const std::string& source, double tolerance) {
  return CheckTrace(t, t.stages * t.replicas, /*pipeline=*/true, source, tolerance);
}

absl::StatusOr<std::vector<TraceCheck>> CheckAll(const std::string& traces_dir,
                                                 const std::string& pai_dir, double tolerance) {
  namespace fs = std::filesystem;
  std::vector<TraceCheck> out;
  if (!pai_dir.empty()) {
    for (int job = 1; job <= 4; ++job) {
      const std::string name = absl::StrCat("pai-job-", job);
      absl::StatusOr<DpTrace> t =
          LoadPaiTrace(absl::StrCat(pai_dir, "/job_", job, "_norm.csv"), name);
      if (!t.ok()) return t.status();
      out.push_back(Check(*t, "Alibaba PAI", tolerance));
    }
  }
  std::vector<std::string> csvs;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(traces_dir, ec)) {
    if (e.path().extension() == ".csv") csvs.push_back(e.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", traces_dir, ": ", ec.message()));
  std::sort(csvs.begin(), csvs.end());
  for (const std::string& csv : csvs) {
    absl::StatusOr<std::vector<DpTrace>> ts = LoadKinetoSteps(csv);
    if (!ts.ok()) return ts.status();
    for (const DpTrace& t : *ts) {
      out.push_back(Check(t, fs::path(csv).filename().string(), tolerance));
    }
  }
  for (const DpTrace& t : GeneratedDpTraces()) out.push_back(Check(t, "generated", tolerance));
  for (const PipelineTrace& t : GeneratedPipelineTraces()) {
    out.push_back(Check(t, "generated", tolerance));
  }
  return out;
}

std::string MarkdownTable(const std::vector<TraceCheck>& checks) {
  std::string s =
      "| trace | source | ranks x steps | replay vs measured | what-if | engine | kind | "
      "simulator | error % | 64-step windows ok | worst window error % | ok |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const TraceCheck& c : checks) {
    const double replay_err =
        c.measured_seconds > 0 ? (c.replay_seconds / c.measured_seconds - 1) * 100 : 0;
    for (const WhatIfRow& r : c.rows) {
      const std::string windows =
          r.windows == 0 ? "-" : absl::StrCat(r.windows_ok, " of ", r.windows);
      const std::string worst =
          r.windows == 0 ? "-" : absl::StrFormat("%.1f", r.worst_window_error * 100);
      absl::StrAppendFormat(&s,
                            "| %s | %s | %d x %d | %+.1f%% | %s | %.3f | %s | %.3f | %+.1f | %s | "
                            "%s | %s |\n",
                            c.trace, c.source, c.ranks, c.steps, replay_err, FixName(r.fix),
                            r.engine, analysis::WhatIfKindName(r.kind), r.sim, r.error * 100,
                            windows, worst, r.ok ? "yes" : "NO");
    }
  }
  return s;
}

}  // namespace stepwatch::sim
