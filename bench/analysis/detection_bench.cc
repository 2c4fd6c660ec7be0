// stepwatch-detection-bench: runs every scenario of a directory through the diagnosis engine and
// prints precision, recall and detection latency per fault kind as Markdown tables.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "sim/scenario.h"
#include "sim/scenario_eval.h"
#include "sim/scenario_pai.h"

namespace {

constexpr char kUsage[] =
    "usage: stepwatch-detection-bench [--verbose] PATH...\n"
    "       stepwatch-detection-bench --pai CSV...\n"
    "  PATH       a scenario JSON file, or a directory whose *.json files are all run\n"
    "             (the suite lives in sim/scenarios)\n"
    "  --verbose  also list each scenario's outcome, every false finding and every miss\n"
    "  --pai      replay PAI mini-batch traces (job_N_norm.csv) and print what was found\n";

int ReplayPai(const std::vector<std::string>& files) {
  for (const std::string& path : files) {
    auto samples = stepwatch::sim::LoadPaiReplay(path, std::filesystem::path(path).stem());
    if (!samples.ok()) {
      std::cerr << samples.status() << "\n";
      return 1;
    }
    stepwatch::sim::ReplayResult r = stepwatch::sim::RunReplay(*samples);
    std::cout << "## " << path << ": " << samples->size() << " step events, " << r.steps
              << " steps\n";
    for (const auto& e : r.episodes) {
      std::cout << "  step " << e.start_step << "-" << e.end_step << " "
                << stepwatch::analysis::FindingKindName(e.kind) << ": " << e.summary << "\n";
    }
    const auto& s = r.last_snapshot;
    std::cout << "  at the end: median step " << s.median_step_seconds << " s, efficiency "
              << s.efficiency_ratio << ", imbalance share " << s.breakdown.imbalance
              << ", what-if stragglers fixed " << s.whatif.stragglers << "x\n";
    for (const auto& rank : r.last_ranks) {
      std::cout << "    worker " << rank.rank << ": busy " << rank.busy_seconds << " s, x"
                << rank.busy_vs_median_ratio << (rank.straggler ? " STRAGGLER" : "") << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  bool verbose = false;
  bool pai = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--pai") {
      pai = true;
      continue;
    }
    if (arg == "--verbose") {
      verbose = true;
      continue;
    }
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      for (const auto& entry : fs::directory_iterator(arg)) {
        if (entry.path().extension() == ".json") files.push_back(entry.path().string());
      }
    } else {
      files.push_back(arg);
    }
  }
  if (files.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  std::sort(files.begin(), files.end());
  if (pai) return ReplayPai(files);
  stepwatch::sim::SuiteStats stats;
  int64_t samples = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& path : files) {
    auto scenario = stepwatch::sim::LoadScenario(path);
    if (!scenario.ok()) {
      std::cerr << scenario.status() << "\n";
      return 1;
    }
    stepwatch::sim::ScenarioResult r = stepwatch::sim::RunScenario(*scenario);
    samples += r.steps * r.ranks;
    stepwatch::sim::Accumulate(r, &stats);
    if (verbose) {
      int detected = 0, expected = 0, false_episodes = 0;
      for (const auto& t : r.truths) {
        if (!t.truth.expect_finding) continue;
        ++expected;
        detected += t.detected ? 1 : 0;
      }
      for (const auto& e : r.episodes) false_episodes += e.truth < 0 ? 1 : 0;
      std::cout << r.scenario << ": " << r.steps << " steps x " << r.ranks << " ranks; detected "
                << detected << "/" << expected << "; false findings " << false_episodes << "\n";
      for (const auto& e : r.episodes) {
        std::cout << "  [" << (e.truth >= 0 ? "ok" : "FALSE") << "] step " << e.start_step << "-"
                  << e.end_step << ": " << e.summary << "\n";
      }
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "\n## Detection suite: " << files.size() << " scenarios\n\n"
            << stepwatch::sim::MarkdownReport(stats);
  std::cout << "Rank-steps analysed: " << samples << " in " << secs << " s.\n";
  for (const auto& line : stats.false_positive_lines)
    std::cout << "false finding: " << line << "\n";
  for (const auto& line : stats.missed_lines) std::cout << "missed: " << line << "\n";
  return 0;
}
