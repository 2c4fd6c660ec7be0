// Heap bytes the collector holds per job, rank, node and GPU: the figures behind
// MemoryCostsFor (collector/memory_budget.cc). Each case fills a fresh CollectorState through
// Apply, as the Ingest streams do, and reads glibc's in-use heap (mallinfo2) before and after.
//
//   memory_cost_bench [N]   (N items per case, default 20000)
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/collector/fleet.h"
#include "collector/state.h"
#include "common/clock.h"

namespace stepwatch::collector {
namespace {

size_t HeapInUse() { return mallinfo2().uordblks; }

// Batches of one node with `gpus` GPUs and no steps of their own.
bench::FleetSpec NoRanks(int gpus) {
  bench::FleetSpec spec;
  spec.gpus = gpus;
  spec.ranks_per_node = 0;
  return spec;
}

struct Case {
  const char* name;
  int window_steps;
  // Fills `state` with `n` items.
  void (*fill)(CollectorState* state, const Clock& clock, int n);
  // What the budget charges for one item.
  int64_t (*charged)(const MemoryCosts& c, int n);
};

v1::StepEvent* AddStep(v1::ReportBatch* b, const std::string& job, int rank, int world_size,
                       int64_t step) {
  v1::StepEvent* e = b->add_steps();
  e->set_job(job);
  e->set_rank(rank);
  e->set_world_size(world_size);
  e->set_step(step);
  e->set_step_seconds(0.2);
  e->set_data_seconds(0.005);
  e->set_compute_seconds(0.1 + 0.0001 * (rank % 7));
  e->set_comm_seconds(0.09);
  e->set_samples(64);
  e->set_gpu(rank % 8);
  e->set_pid(1000 + rank);
  return e;
}

// Every step of every rank, so that every step completes and each rank's window fills.
void FillCompleteSteps(CollectorState* state, const Clock& clock, int n, int window) {
  uint64_t seq = 0;
  for (int step = 0; step < window + 8; ++step) {
    for (int first = 0; first < n; first += 4096) {
      v1::ReportBatch b = bench::FleetBatch(NoRanks(0), 0, 0, ++seq, clock.NowUnixNanos());
      for (int r = first; r < std::min(n, first + 4096); ++r) AddStep(&b, "big", r, n, step);
      if (!state->Apply(b).ok()) std::abort();
    }
  }
}

const Case kCases[] = {
    {"job (1 rank each)", 64,
     [](CollectorState* state, const Clock& clock, int n) {
       uint64_t seq = 0;
       for (int first = 0; first < n; first += 1000) {
         v1::ReportBatch b = bench::FleetBatch(NoRanks(0), 0, 0, ++seq, clock.NowUnixNanos());
         for (int j = first; j < std::min(n, first + 1000); ++j) {
           AddStep(&b, absl::StrCat("job-", j), 0, 1, 0);
         }
         if (!state->Apply(b).ok()) std::abort();
       }
     },
     [](const MemoryCosts& c, int) { return c.job + c.rank_slot; }},
    {"rank, window 64, steps complete", 64,
     [](CollectorState* state, const Clock& clock, int n) {
       FillCompleteSteps(state, clock, n, 64);
     },
     [](const MemoryCosts& c, int) { return c.rank + c.rank_slot; }},
    {"rank, window 16, steps complete", 16,
     [](CollectorState* state, const Clock& clock, int n) {
       FillCompleteSteps(state, clock, n, 16);
     },
     [](const MemoryCosts& c, int) { return c.rank + c.rank_slot; }},
    {"rank, 64 steps pending (half the world silent)", 64,
     [](CollectorState* state, const Clock& clock, int n) {
       uint64_t seq = 0;
       for (int step = 0; step < 64; ++step) {
         for (int first = 0; first < n; first += 4096) {
           v1::ReportBatch b = bench::FleetBatch(NoRanks(0), 0, 0, ++seq, clock.NowUnixNanos());
           for (int r = first; r < std::min(n, first + 4096); ++r) {
             AddStep(&b, "big", r, 2 * n, step);
           }
           if (!state->Apply(b).ok()) std::abort();
         }
       }
     },
     [](const MemoryCosts& c, int) { return c.rank + 2 * c.rank_slot; }},
    {"rank, one step each (flood)", 64,
     [](CollectorState* state, const Clock& clock, int n) {
       uint64_t seq = 0;
       for (int first = 0; first < n; first += 1000) {
         v1::ReportBatch b = bench::FleetBatch(NoRanks(0), 0, 0, ++seq, clock.NowUnixNanos());
         for (int r = first; r < std::min(n, first + 1000); ++r) AddStep(&b, "flood", r, 60000, 0);
         if (!state->Apply(b).ok()) std::abort();
       }
     },
     [](const MemoryCosts& c, int n) { return c.rank + (c.job + 60000 * c.rank_slot) / n; }},
    {"node with its host sample, no GPU", 64,
     [](CollectorState* state, const Clock& clock, int n) {
       for (int i = 0; i < n; ++i) {
         if (!state->Apply(bench::FleetBatch(NoRanks(0), i, 0, 1, clock.NowUnixNanos())).ok()) {
           std::abort();
         }
       }
     },
     [](const MemoryCosts& c, int) { return c.node; }},
    {"GPU (nodes of 8, per GPU, node excluded)", 64,
     [](CollectorState* state, const Clock& clock, int n) {
       for (int i = 0; i < n / 8; ++i) {
         if (!state->Apply(bench::FleetBatch(NoRanks(8), i, 0, 1, clock.NowUnixNanos())).ok()) {
           std::abort();
         }
       }
     },
     [](const MemoryCosts& c, int) { return c.gpu + c.node / 8; }},
};

}  // namespace
}  // namespace stepwatch::collector

int main(int argc, char** argv) {
  using namespace stepwatch::collector;  // NOLINT
  const int n = argc > 1 ? std::atoi(argv[1]) : 20000;
  std::printf("%-48s %12s %12s\n", "item", "heap B/item", "charged B");
  for (const Case& c : kCases) {
    stepwatch::SimulatedClock clock;
    CollectorStateOptions options;
    options.engine.window_steps = c.window_steps;
    options.max_nodes = 1 << 30;
    options.engine.max_jobs = 1 << 30;
    options.expire_nanos = int64_t{1} << 62;
    auto state = std::make_unique<CollectorState>(options, &clock);
    const size_t before = HeapInUse();
    c.fill(state.get(), clock, n);
    const size_t after = HeapInUse();
    const double per_item = (static_cast<double>(after) - static_cast<double>(before)) / n;
    std::printf("%-48s %12.0f %12lld\n", c.name, per_item,
                static_cast<long long>(c.charged(MemoryCostsFor(options.engine), n)));
  }
  return 0;
}
