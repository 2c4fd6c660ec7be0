#include "sim/scenario_pai.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "sim/scenario.h"

namespace stepwatch::sim {

absl::StatusOr<std::vector<analysis::StepEvent>> LoadPaiReplay(const std::string& csv_path,
                                                               const std::string& job) {
  std::ifstream in(csv_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", csv_path));
  std::string line;
  if (!std::getline(in, line) ||
      absl::StripTrailingAsciiWhitespace(line) != ",worker,gpu,time,batch_time_norm") {
    return absl::InvalidArgumentError(
        absl::StrCat(csv_path, ": expected the header ,worker,gpu,time,batch_time_norm"));
  }
  struct Row {
    int worker;
    int64_t time;
    double busy_ms;
  };
  std::map<int64_t, std::map<int, Row>> by_step;  // step -> worker -> row
  int max_worker = -1;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    absl::string_view text = absl::StripTrailingAsciiWhitespace(line);
    if (text.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(text, ',');
    Row row{};
    double busy = 0;
    if (f.size() != 5 || !absl::SimpleAtoi(f[1], &row.worker) ||
        !absl::SimpleAtoi(f[3], &row.time) || !absl::SimpleAtod(f[4], &busy) || row.worker < 0 ||
        row.worker > 100000 || row.time < 0 || !(busy > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(csv_path, ":", line_no, ": malformed row"));
    }
    row.busy_ms = busy;
    max_worker = std::max(max_worker, row.worker);
    by_step[row.time / 10].emplace(row.worker, row);  // the first row of a (worker, step) wins
  }
  std::vector<analysis::StepEvent> out;
  for (const auto& [step, rows] : by_step) {
    double step_ms = 0;
    for (const auto& [w, row] : rows) step_ms = std::max(step_ms, row.busy_ms);
    for (const auto& [w, row] : rows) {
      analysis::StepEvent s;
      s.job = job;
      s.rank = w;
      s.world_size = max_worker + 1;
      s.step = step;
      s.step_seconds = step_ms / 1000;
      s.compute_seconds = row.busy_ms / 1000;
      s.comm_seconds = (step_ms - row.busy_ms) / 1000;
      s.node = absl::StrCat("pai-worker-", w);
      s.received_unix_nanos = Generator::kStartUnixNanos + row.time * 1'000'000'000LL;
      out.push_back(std::move(s));
    }
  }
  return out;
}

ReplayResult RunReplay(const std::vector<analysis::StepEvent>& samples,
                       const analysis::EngineOptions& options) {
  ReplayResult result;
  analysis::Engine engine(options);
  EpisodeTracker tracker;
  std::string job;
  for (size_t i = 0; i < samples.size();) {
    const int64_t step = samples[i].step;
    int64_t now = 0;
    for (; i < samples.size() && samples[i].step == step; ++i) {
      (void)engine.AddStep(samples[i]);
      now = std::max(now, samples[i].received_unix_nanos);
      job = samples[i].job;
    }
    engine.Advance(now);
    tracker.Observe(engine.Findings(), step, now);
    result.steps = step + 1;
  }
  result.episodes = tracker.episodes();
  if (auto snap = engine.Job(job)) result.last_snapshot = *snap;
  result.last_ranks = engine.Ranks(job);
  return result;
}

}  // namespace stepwatch::sim
