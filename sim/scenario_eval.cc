#include "sim/scenario_eval.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stepwatch::sim {

using analysis::FindingKind;

bool IsPrimary(const Truth& t, FindingKind kind) {
  const std::string& k = t.fault_kind;
  if (k == "slow_rank" || k == "throttled_gpu") return kind == FindingKind::kStraggler;
  if (k == "slow_node") return kind == FindingKind::kSlowNode;
  if (k == "data_stall") {
    return kind == FindingKind::kUnderutilizedGpu || kind == FindingKind::kRegression;
  }
  if (k == "low_gpu_util") return kind == FindingKind::kUnderutilizedGpu;
  if (k == "comm_slowdown") return kind == FindingKind::kRegression;
  if (k == "hang") return kind == FindingKind::kStall;
  if (k == "rescale") return kind == FindingKind::kScalingEfficiency;
  if (k == "slow_stage") return kind == FindingKind::kPipelineImbalance;
  return false;
}

bool IsConsequence(const Truth& t, FindingKind kind) {
  const std::string& k = t.fault_kind;
  // In synchronous training everyone waits for the slow part: the job's step time regresses.
  if (k == "slow_rank" || k == "throttled_gpu" || k == "slow_stage") {
    return kind == FindingKind::kRegression;
  }
  // A hung job computes nothing: where SM activity is measured its GPUs read idle.
  if (k == "hang") return kind == FindingKind::kUnderutilizedGpu;
  // Ranks of a slow node are stragglers until the whole node is seen to be slow.
  if (k == "slow_node") {
    return kind == FindingKind::kRegression || kind == FindingKind::kStraggler;
  }
  return false;
}

namespace {

bool LocationMatches(const Truth& t, const Episode& e) {
  if (e.job != t.job && !(e.kind == FindingKind::kIdleGpu)) return false;
  switch (e.kind) {
    case FindingKind::kStraggler:
      return t.rank >= 0 ? e.rank == t.rank : (t.node.empty() || e.node == t.node);
    case FindingKind::kSlowNode:
      return e.node == t.node;
    case FindingKind::kUnderutilizedGpu:
      return t.rank < 0 || (e.node == t.node && e.gpu == t.gpu);
    case FindingKind::kIdleGpu:
      return false;
    default:
      return true;  // job-level findings
  }
}

int MatchTruth(const std::vector<Truth>& truths, const Episode& e, int64_t last_step) {
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < truths.size(); ++i) {
      const Truth& t = truths[i];
      if (!t.expect_finding) continue;
      const int64_t end = t.end_step < 0 ? last_step + 1 : t.end_step;
      if (e.start_step < t.onset_step || e.start_step >= end + kClearSlackSteps) continue;
      bool kind_ok = pass == 0 ? IsPrimary(t, e.kind) : IsConsequence(t, e.kind);
      if (kind_ok && LocationMatches(t, e)) return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace

void EpisodeTracker::Observe(const std::vector<analysis::Finding>& findings, int64_t step,
                             int64_t unix_nanos) {
  std::map<Key, size_t> still;
  for (const analysis::Finding& f : findings) {
    Key key{static_cast<int>(f.kind), f.job, f.rank, f.node, f.gpu};
    auto it = open_.find(key);
    if (it != open_.end()) {
      still.insert(*it);
      continue;
    }
    Episode e;
    e.kind = f.kind;
    e.job = f.job;
    e.rank = f.rank;
    e.node = f.node;
    e.gpu = f.gpu;
    e.start_step = step;
    e.start_unix_nanos = unix_nanos;
    e.summary = f.summary;
    e.cause = f.cause;
    e.evidence = f.evidence;
    still[key] = episodes_.size();
    episodes_.push_back(std::move(e));
  }
  for (const auto& [key, index] : open_) {
    if (still.count(key) == 0) episodes_[index].end_step = step;
  }
  open_ = std::move(still);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

ScenarioResult RunScenario(const Scenario& scenario, const analysis::EngineOptions& options) {
  ScenarioResult result;
  result.scenario = scenario.name;
  analysis::Engine engine(options);
  Generator gen(scenario);
  EpisodeTracker tracker;
  Tick tick;
  int64_t last_step = 0;
  while (gen.Next(&tick)) {
    for (const auto& h : tick.hosts) engine.AddHost(h);
    for (const auto& g : tick.gpus) engine.AddGpu(g);
    for (const auto& s : tick.samples) (void)engine.AddStep(s);
    engine.Advance(tick.unix_nanos);
    result.ranks = std::max(result.ranks, tick.world_size);
    last_step = tick.step;
    tracker.Observe(engine.Findings(), tick.step, tick.unix_nanos);
  }
  result.episodes = std::move(tracker.mutable_episodes());
  result.steps = last_step + 1;

  const std::vector<Truth>& truths = gen.truth();
  for (Episode& e : result.episodes) e.truth = MatchTruth(truths, e, last_step);
  for (size_t i = 0; i < truths.size(); ++i) {
    TruthOutcome o;
    o.truth = truths[i];
    for (const Episode& e : result.episodes) {
      if (e.truth != static_cast<int>(i) || !IsPrimary(truths[i], e.kind)) continue;
      if (!o.detected || e.start_step - truths[i].onset_step < o.latency_steps) {
        o.detected = true;
        o.latency_steps = e.start_step - truths[i].onset_step;
        o.latency_s = (e.start_unix_nanos - truths[i].onset_unix_nanos) / 1e9;
        if (truths[i].end_step >= 0 && e.end_step >= 0) {
          o.clear_steps = std::max<int64_t>(0, e.end_step - truths[i].end_step);
        } else {
          o.clear_steps = -1;
        }
      }
    }
    result.truths.push_back(o);
  }
  return result;
}

void Accumulate(const ScenarioResult& r, SuiteStats* s) {
  bool healthy = true;
  for (const TruthOutcome& o : r.truths) {
    if (!o.truth.expect_finding) continue;
    healthy = false;
    KindStats& k = s->by_fault[o.truth.fault_kind];
    ++k.faults;
    if (o.detected) {
      ++k.detected;
      k.latency_steps.push_back(o.latency_steps);
      k.latency_s.push_back(o.latency_s);
      if (o.truth.end_step >= 0) k.clear_steps.push_back(o.clear_steps);
    } else {
      s->missed_lines.push_back(
          absl::StrCat(r.scenario, ": ", o.truth.fault_kind, " at step ", o.truth.onset_step));
    }
  }
  if (healthy) {
    ++s->healthy_scenarios;
    s->healthy_steps += r.steps;
    s->healthy_findings += r.episodes.size();
  }
  for (const Episode& e : r.episodes) {
    auto& pair = s->by_finding[analysis::FindingKindName(e.kind)];
    if (e.truth >= 0) {
      ++pair.first;
      ++s->true_episodes;
    } else {
      ++pair.second;
      ++s->false_episodes;
      s->false_positive_lines.push_back(
          absl::StrCat(r.scenario, " (step ", e.start_step, "): ", e.summary));
    }
  }
}

std::string MarkdownReport(const SuiteStats& s) {
  std::string out;
  absl::StrAppend(&out,
                  "| fault kind | faults | detected | recall | median latency (steps) | "
                  "max latency (steps) | median latency (s) | median clear (steps) |\n"
                  "|---|---|---|---|---|---|---|---|\n");
  int faults = 0, detected = 0;
  for (const auto& [kind, k] : s.by_fault) {
    faults += k.faults;
    detected += k.detected;
    std::vector<double> steps(k.latency_steps.begin(), k.latency_steps.end());
    std::vector<double> clear;
    for (int64_t c : k.clear_steps) {
      if (c >= 0) clear.push_back(c);
    }
    const bool uncleared = clear.size() != k.clear_steps.size();
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "| %s | %d | %d | %.2f | %s | %s | %s | %s |\n", kind, k.faults, k.detected,
            k.faults ? static_cast<double>(k.detected) / k.faults : 0,
            steps.empty() ? "-" : absl::StrFormat("%.0f", Median(steps)),
            steps.empty() ? "-"
                          : absl::StrFormat("%.0f", *std::max_element(steps.begin(), steps.end())),
            k.latency_s.empty() ? "-" : absl::StrFormat("%.1f", Median(k.latency_s)),
            clear.empty()
                ? "-"
                : absl::StrFormat("%.0f%s", Median(clear), uncleared ? " (some never)" : "")));
  }
  absl::StrAppend(&out,
                  "\n| finding kind | true episodes | false episodes | precision |\n"
                  "|---|---|---|---|\n");
  for (const auto& [kind, p] : s.by_finding) {
    absl::StrAppend(&out, absl::StrFormat("| %s | %d | %d | %.2f |\n", kind, p.first, p.second,
                                          static_cast<double>(p.first) / (p.first + p.second)));
  }
  const int episodes = s.true_episodes + s.false_episodes;
  absl::StrAppend(
      &out, absl::StrFormat("\nOverall: recall %.3f (%d of %d faults), precision %.3f (%d of %d "
                            "finding episodes); healthy: %d findings in %d scenarios, %d steps.\n",
                            faults ? static_cast<double>(detected) / faults : 1.0, detected, faults,
                            episodes ? static_cast<double>(s.true_episodes) / episodes : 1.0,
                            s.true_episodes, episodes, s.healthy_findings, s.healthy_scenarios,
                            s.healthy_steps));
  return out;
}

}  // namespace stepwatch::sim
