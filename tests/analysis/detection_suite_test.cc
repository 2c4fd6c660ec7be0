// The detection suite under ctest: every scenario of sim/scenarios through the engine, with the
// targets of the detection benchmark asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "sim/scenario.h"
#include "sim/scenario_eval.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::sim {
namespace {

TEST(DetectionSuiteTest, MeetsTargets) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(STEPWATCH_SCENARIO_DIR)) {
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 30u);
  SuiteStats stats;
  int64_t longest_healthy = 0;
  double max_cv = 0;
  for (const std::string& path : files) {
    auto sc = LoadScenario(path);
    ASSERT_OK(sc);
    max_cv = std::max(max_cv, sc->noise_cv);
    ScenarioResult r = RunScenario(*sc);
    bool healthy = std::none_of(r.truths.begin(), r.truths.end(),
                                [](const TruthOutcome& o) { return o.truth.expect_finding; });
    if (healthy) longest_healthy = std::max(longest_healthy, r.steps);
    for (const TruthOutcome& o : r.truths) {
      if (o.detected && o.truth.fault_kind == "low_gpu_util") {
        // Underutilization within its window (30 s) plus 5 s.
        EXPECT_LE(o.latency_s, 35.0) << r.scenario;
      }
    }
    Accumulate(r, &stats);
  }
  std::cout << MarkdownReport(stats);
  for (const auto& l : stats.false_positive_lines) std::cout << "false finding: " << l << "\n";
  for (const auto& l : stats.missed_lines) std::cout << "missed: " << l << "\n";

  EXPECT_GE(max_cv, 0.05);
  EXPECT_GE(longest_healthy, 10000);
  EXPECT_EQ(stats.healthy_findings, 0);
  int faults = 0, detected = 0;
  for (const auto& [kind, k] : stats.by_fault) {
    faults += k.faults;
    detected += k.detected;
  }
  ASSERT_GT(faults, 0);
  EXPECT_GE(static_cast<double>(detected) / faults, 0.95);
  const int episodes = stats.true_episodes + stats.false_episodes;
  ASSERT_GT(episodes, 0);
  EXPECT_GE(static_cast<double>(stats.true_episodes) / episodes, 0.95);

  // Stragglers of 10% or more: flagged within 20 steps (median), cleared within 20 after.
  const KindStats& slow = stats.by_fault["slow_rank"];
  ASSERT_GE(slow.latency_steps.size(), 5u);
  std::vector<double> latency(slow.latency_steps.begin(), slow.latency_steps.end());
  EXPECT_LE(Median(latency), 20);
  std::vector<double> clear;
  for (int64_t c : slow.clear_steps) {
    EXPECT_GE(c, 0) << "a straggler finding never cleared";
    clear.push_back(c);
  }
  EXPECT_LE(Median(clear), 20);
}

}  // namespace
}  // namespace stepwatch::sim
