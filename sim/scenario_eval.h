// Runs scenarios through analysis::Engine and scores the findings against the ground truth:
// precision, recall and detection latency, the figures of the detection benchmark.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/engine.h"
#include "sim/scenario.h"

namespace stepwatch::sim {

// One finding from the moment it appeared to the moment it went away.
struct Episode {
  analysis::FindingKind kind = analysis::FindingKind::kStraggler;
  std::string job;
  int rank = -1;
  std::string node;
  int gpu = -1;
  int64_t start_step = 0;
  int64_t start_unix_nanos = 0;
  int64_t end_step = -1;  // -1: still active at the end
  std::string summary;    // as first reported
  // Its cause and evidence as first reported.
  analysis::Cause cause = analysis::Cause::kUnknown;
  analysis::Evidence evidence;
  int truth = -1;  // index of the matched truth, -1: false positive
};

// Follows Engine::Findings() over time and cuts it into episodes.
class EpisodeTracker {
 public:
  void Observe(const std::vector<analysis::Finding>& findings, int64_t step, int64_t unix_nanos);
  const std::vector<Episode>& episodes() const { return episodes_; }
  std::vector<Episode>& mutable_episodes() { return episodes_; }

 private:
  using Key = std::tuple<int, std::string, int, std::string, int>;
  std::map<Key, size_t> open_;  // active finding -> episode index
  std::vector<Episode> episodes_;
};

struct TruthOutcome {
  Truth truth;
  bool detected = false;
  int64_t latency_steps = -1;
  double latency_s = -1;
  int64_t clear_steps = -1;  // after the fault ended, until its primary finding went away
};

struct ScenarioResult {
  std::string scenario;
  int64_t steps = 0;
  int ranks = 0;
  std::vector<TruthOutcome> truths;
  std::vector<Episode> episodes;
};

// Steps after a fault's end during which findings it caused may still start (or linger).
constexpr int64_t kClearSlackSteps = 40;

ScenarioResult RunScenario(const Scenario& scenario, const analysis::EngineOptions& options = {});

// Whether a finding of `kind` is the one expected for the fault (primary), or a true consequence
// of it (secondary, e.g. the step-time regression that a straggler causes in synchronous training).
bool IsPrimary(const Truth& truth, analysis::FindingKind kind);
bool IsConsequence(const Truth& truth, analysis::FindingKind kind);

struct KindStats {
  int faults = 0;
  int detected = 0;
  std::vector<int64_t> latency_steps;
  std::vector<double> latency_s;
  std::vector<int64_t> clear_steps;
};

struct SuiteStats {
  std::map<std::string, KindStats> by_fault;              // fault kind -> recall and latency
  std::map<std::string, std::pair<int, int>> by_finding;  // finding kind -> (true, false) episodes
  int healthy_scenarios = 0;
  int64_t healthy_steps = 0;
  int healthy_findings = 0;
  int true_episodes = 0;
  int false_episodes = 0;
  std::vector<std::string> false_positive_lines;  // "scenario: summary"
  std::vector<std::string> missed_lines;          // "scenario: fault kind at step"
};

void Accumulate(const ScenarioResult& result, SuiteStats* stats);
double Median(std::vector<double> v);
// The benchmark's Markdown tables.
std::string MarkdownReport(const SuiteStats& stats);

}  // namespace stepwatch::sim
