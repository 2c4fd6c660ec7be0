// /metrics size and render time, and the sizes of stepwatchctl's answers, for a fleet of
// `nodes` nodes of 8 GPUs (default 10,000) with 8 ranks each in jobs of 512 ranks, one rank a
// straggler. Fills a CollectorState through Apply as the Ingest streams do, then renders the
// exposition as a scrape does (snapshot, families, text) with and without the total series cap.
//
//   metrics_size_bench [nodes] [steps]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/collector/fleet.h"
#include "collector/metrics.h"
#include "collector/state.h"
#include "common/clock.h"
#include "prometheus/text_serializer.h"

namespace stepwatch::collector {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

void Render(const CollectorState& state, int max_series) {
  MetricsOptions options;
  options.max_series = max_series;
  // Best of three: the first render also warms the allocator.
  double best = 1e9;
  std::string text;
  SeriesDrops dropped;
  size_t series = 0;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    SeriesDrops d;
    std::vector<prometheus::MetricFamily> families =
        BuildMetricFamilies(state.Snapshot(), options, &d);
    text = prometheus::TextSerializer().Serialize(families);
    best = std::min(best, Seconds(start));
    dropped = d;
    series = 0;
    for (const auto& f : families) series += f.metric.size();
  }
  std::printf("max_series=%d: %zu series, %.2f MB, render %.3f s; dropped:", max_series, series,
              text.size() / 1e6, best);
  for (const auto& [family, n] : dropped)
    std::printf(" %s=%llu", family.c_str(), static_cast<unsigned long long>(n));
  std::printf("\n");
}

}  // namespace
}  // namespace stepwatch::collector

int main(int argc, char** argv) {
  using namespace stepwatch::collector;  // NOLINT
  bench::FleetSpec spec;
  spec.nodes = argc > 1 ? std::atoi(argv[1]) : 10000;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  spec.slow_rank = 3;
  stepwatch::SimulatedClock clock;
  CollectorStateOptions options;
  CollectorState state(options, &clock);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    for (int n = 0; n < spec.nodes; ++n) {
      if (!state.Apply(bench::FleetBatch(spec, n, step, step + 1, clock.NowUnixNanos())).ok()) {
        std::abort();
      }
    }
    clock.AdvanceTime(absl::Nanoseconds(200'000'000));
    state.Tick();
  }
  const StateSnapshot s = state.Snapshot();
  std::printf("%d nodes x %d GPUs, %zu jobs, %zu findings, filled in %.1f s\n", spec.nodes,
              spec.gpus, s.jobs.size(), s.findings.size(), Seconds(start));
  std::printf("memory accounted: %.1f MiB\n", state.MemoryAccountedBytes() / 1048576.0);
  {
    const auto t = std::chrono::steady_clock::now();
    const StateSnapshot snap = state.Snapshot();
    std::printf("snapshot alone: %.3f s\n", Seconds(t));
  }
  Render(state, MetricsOptions{}.max_series);
  Render(state, 0);
  std::printf("stepwatchctl status response: %.2f MB\n", state.Status().ByteSizeLong() / 1e6);
  std::printf("stepwatchctl findings response: %.2f MB\n", state.Findings("").ByteSizeLong() / 1e6);
  return 0;
}
