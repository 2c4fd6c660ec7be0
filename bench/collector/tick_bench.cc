// What publishing the readers' view costs: the time each CollectorState::Tick() holds the ingest
// mutex (engine advance, findings, every rank's row) and the part of it spent building the view,
// for one job of 1,000 and 100,000 ranks with full step windows; and the time a scrape takes to
// copy the published state. Run: collector_tick_bench --benchmark_counters_tabular=true
#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "collector/state.h"
#include "common/clock.h"

namespace stepwatch::collector {
namespace {

constexpr int kRanksPerNode = 8;
constexpr int64_t kStepNanos = 125'000'000;

// A collector holding one job of `world_size` ranks, `kRanksPerNode` per node, after `steps`
// complete steps (rank 3 slower than the others, so that one rank is flagged).
std::unique_ptr<CollectorState> Fill(SimulatedClock* clock, int world_size, int steps) {
  CollectorStateOptions o;
  o.max_nodes = 1 << 20;
  o.engine.max_ranks_per_job = std::max(world_size, o.engine.max_ranks_per_job);
  auto state = std::make_unique<CollectorState>(o, clock);
  const int nodes = (world_size + kRanksPerNode - 1) / kRanksPerNode;
  v1::ReportBatch b;
  for (int step = 0; step < steps; ++step) {
    for (int n = 0; n < nodes; ++n) {
      b.Clear();
      b.set_agent_id(absl::StrCat("agent-", n));
      b.set_boot_id("boot-0");
      b.set_seq(step + 1);
      b.mutable_node()->set_node(absl::StrCat("node-", n));
      for (int rank = n * kRanksPerNode; rank < std::min(world_size, (n + 1) * kRanksPerNode);
           ++rank) {
        v1::StepEvent* e = b.add_steps();
        e->set_job("bench-job");
        e->set_rank(rank);
        e->set_world_size(world_size);
        e->set_step(step);
        const double busy = rank == 3 ? 0.12 : 0.1 + 0.0001 * (rank % 7);
        e->set_step_seconds(0.125);
        e->set_data_seconds(0.005);
        e->set_compute_seconds(busy - 0.005);
        e->set_comm_seconds(0.125 - busy);
        e->set_gpu(rank % kRanksPerNode);
        e->set_pid(1000 + rank);
      }
      if (!state->Apply(b).ok()) return nullptr;
    }
    clock->AdvanceTime(absl::Nanoseconds(kStepNanos));
  }
  return state;
}

void BM_Tick(benchmark::State& state) {
  const int world_size = static_cast<int>(state.range(0));
  SimulatedClock clock;
  std::unique_ptr<CollectorState> collector = Fill(&clock, world_size, 64);
  if (collector == nullptr) {
    state.SkipWithError("batch refused");
    return;
  }
  double locked = 0;
  double build_locked = 0;
  double rows = 0;
  double longest = 0;
  double build_unlocked = 0;
  int rebuilds = 0;
  for (auto _ : state) {
    collector->Tick();
    const std::shared_ptr<const PublishedState> view = collector->Published();
    locked += view->tick_locked_nanos / 1e6;
    build_locked += view->build_locked_nanos / 1e6;
    if (view->rank_rows_rebuilt) {
      rows += view->rank_rows_locked_nanos / 1e6;
      ++rebuilds;
    }
    longest = std::max(longest, view->longest_hold_nanos / 1e6);
    build_unlocked += view->build_unlocked_nanos / 1e6;
  }
  const std::shared_ptr<const PublishedState> view = collector->Published();
  if (view->snapshot.jobs.size() != 1 ||
      view->ranks.at("bench-job")->size() != static_cast<size_t>(world_size)) {
    state.SkipWithError("the view lacks the job or its ranks");
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["locked_ms"] = locked / n;
  state.counters["view_locked_ms"] = build_locked / n;
  // Per tick that rebuilt the rows (the others share the previous view's).
  state.counters["rank_rows_ms"] = rebuilds > 0 ? rows / rebuilds : 0;
  state.counters["rows_rebuilt"] = rebuilds;
  state.counters["longest_hold_ms"] = longest;
  state.counters["view_unlocked_ms"] = build_unlocked / n;
}
BENCHMARK(BM_Tick)
    ->Arg(1000)
    ->Arg(100000)
    ->ArgName("ranks")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(10);

// What a /metrics scrape pays to copy the published state (outside the ingest mutex).
void BM_Snapshot(benchmark::State& state) {
  const int world_size = static_cast<int>(state.range(0));
  SimulatedClock clock;
  std::unique_ptr<CollectorState> collector = Fill(&clock, world_size, 64);
  if (collector == nullptr) {
    state.SkipWithError("batch refused");
    return;
  }
  collector->Tick();
  for (auto _ : state) benchmark::DoNotOptimize(collector->Snapshot());
}
BENCHMARK(BM_Snapshot)
    ->Arg(1000)
    ->Arg(100000)
    ->ArgName("ranks")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(10);

}  // namespace
}  // namespace stepwatch::collector

BENCHMARK_MAIN();
