// Analysis cost per rank per step: one synchronous step of N ranks (full split reported) through
// Engine::AddStep, completion of the step, all detectors, and Advance. Target: <= 1 us per rank.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "analysis/engine.h"

namespace stepwatch::analysis {
namespace {

void BM_StepPerRank(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  // Named sections per step (forward, backward, optimizer): each is a series the straggler
  // detector tests like the busy time.
  const int sections = static_cast<int>(state.range(1));
  const int gpus_per_node = 8;
  Engine engine;
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal(0, 1);
  std::vector<StepEvent> samples(ranks);
  // A few noise patterns, reused, so that the timing measures the engine rather than the RNG.
  constexpr int kPatterns = 16;
  std::vector<std::vector<double>> compute(kPatterns, std::vector<double>(ranks));
  for (auto& p : compute) {
    for (double& c : p) c = 0.35 * (1 + 0.03 * normal(rng));
  }
  for (int r = 0; r < ranks; ++r) {
    StepEvent& s = samples[r];
    s.job = "bench-job";
    s.rank = r;
    s.world_size = ranks;
    s.samples = 32;
    s.local_rank = r % gpus_per_node;
    s.gpu = r % gpus_per_node;
    s.node = "node-" + std::to_string(r / gpus_per_node);
    s.pid = 10000 + r;
  }
  int64_t step = 0;
  int64_t now = 1'800'000'000'000'000'000;
  for (auto _ : state) {
    const std::vector<double>& c = compute[step % kPatterns];
    now += 500'000'000;
    for (int r = 0; r < ranks; ++r) {
      StepEvent& s = samples[r];
      s.step = step;
      s.step_seconds = 0.5;
      s.compute_seconds = c[r];
      s.data_seconds = 0.02;
      s.comm_seconds = 0.5 - c[r] - 0.02;
      s.received_unix_nanos = now;
      s.sections.clear();
      static const char* const kNames[] = {"forward", "backward", "optimizer"};
      for (int k = 0; k < sections; ++k) s.sections.push_back({kNames[k], c[r] / 3});
      benchmark::DoNotOptimize(engine.AddStep(s));
    }
    engine.Advance(now);
    ++step;
  }
  state.SetItemsProcessed(state.iterations() * ranks);
  state.counters["ns_per_rank_step"] =
      benchmark::Counter(static_cast<double>(state.iterations() * ranks),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_StepPerRank)
    ->Args({64, 0})
    ->Args({1024, 0})
    ->Args({16384, 0})
    ->Args({100000, 0})
    ->Args({1024, 3})
    ->Args({100000, 3})
    ->Unit(benchmark::kMillisecond);

// Findings() and Jobs() as the collector calls them on each scrape, for a job of N ranks.
void BM_FindingsAndSnapshot(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  Engine engine;
  std::vector<StepEvent> samples(ranks);
  for (int step = 0; step < 64; ++step) {
    for (int r = 0; r < ranks; ++r) {
      StepEvent& s = samples[r];
      s.job = "bench-job";
      s.rank = r;
      s.world_size = ranks;
      s.step = step;
      s.step_seconds = 0.5;
      s.compute_seconds = r == 3 ? 0.45 : 0.35;
      s.comm_seconds = 0.5 - *s.compute_seconds;
      s.node = "node-" + std::to_string(r / 8);
      s.received_unix_nanos = 1'800'000'000'000'000'000 + step * 500'000'000LL;
      (void)engine.AddStep(s);
    }
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(engine.Findings());
    benchmark::DoNotOptimize(engine.Jobs());
  }
}
BENCHMARK(BM_FindingsAndSnapshot)->Arg(1024)->Arg(100000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace stepwatch::analysis

BENCHMARK_MAIN();
