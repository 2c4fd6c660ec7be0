// Collector ingest throughput on one core: samples (step events + GPU samples) per second applied
// through CollectorState::Apply, which is what every Ingest stream runs after gRPC deserialises a
// ReportBatch. Run: collector_ingest_bench --benchmark_counters_tabular=true
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "collector/state.h"
#include "common/clock.h"

namespace stepwatch::collector {
namespace {

constexpr int kStepsPerBatch = 1000;
constexpr int kGpusPerBatch = 8;

// One agent's batch: `steps_per_batch` step events of a job with `world_size` ranks (consecutive
// steps, every rank of each step), plus 8 GPU samples and a host sample.
v1::ReportBatch MakeBatch(int world_size) {
  v1::ReportBatch b;
  b.set_agent_id("agent-0");
  b.set_boot_id("boot-0");
  b.set_base_seq(1);
  b.mutable_node()->set_node("node-0");
  b.mutable_node()->set_nvml_available(true);
  for (int i = 0; i < kStepsPerBatch; ++i) {
    v1::StepEvent* e = b.add_steps();
    const int rank = i % world_size;
    e->set_job("bench-job");
    e->set_rank(rank);
    e->set_world_size(world_size);
    e->set_step(i / world_size);
    const double busy = rank == 3 ? 0.12 : 0.1 + 0.0001 * (i % 7);
    e->set_step_seconds(0.125);
    e->set_data_seconds(0.005);
    e->set_compute_seconds(busy - 0.005);
    e->set_comm_seconds(0.125 - busy);
    e->set_samples(64);
    e->set_gpu(rank % 8);
    e->set_pid(1000 + rank);
  }
  for (int g = 0; g < kGpusPerBatch; ++g) {
    v1::GpuSample* s = b.add_gpus();
    s->set_index(g);
    s->set_utilization_gpu_ratio(0.9);
    s->set_sm_activity_ratio(0.7);
    s->set_sm_clock_mhz(1980);
    s->set_sm_clock_max_mhz(1980);
    s->set_power_watts(400);
    s->set_memory_used_bytes(uint64_t{60} << 30);
    s->add_pids(1000 + g);
  }
  b.mutable_host()->set_cpu_utilization_ratio(0.3);
  b.mutable_host()->set_cpu_count(96);
  return b;
}

// Moves every event of `b` `steps` steps on, so that the engine sees new steps each batch.
void ShiftSteps(v1::ReportBatch* b, int64_t steps) {
  for (v1::StepEvent& e : *b->mutable_steps()) e.set_step(e.step() + steps);
}

// Fails the benchmark unless every step was accepted and the job advanced: a benchmark of
// rejected input would measure nothing.
void Check(benchmark::State& state, CollectorState& collector, int64_t batches) {
  collector.Tick();  // publishes what the last batches did
  StateSnapshot s = collector.Snapshot();
  uint64_t rejected = 0;
  for (const auto& [reason, n] : s.counters.steps_rejected) rejected += n;
  if (rejected != 0) state.SkipWithError(absl::StrCat(rejected, " steps rejected").c_str());
  if (s.jobs.size() != 1 || s.jobs[0].last_step < batches - 1) {
    state.SkipWithError("the job did not advance");
  }
}

void Report(benchmark::State& state, int64_t batches) {
  const double samples = static_cast<double>(batches) * (kStepsPerBatch + kGpusPerBatch);
  state.counters["samples_per_second"] = benchmark::Counter(samples, benchmark::Counter::kIsRate);
  state.counters["steps_per_batch"] = kStepsPerBatch;
}

void BM_ApplyBatch(benchmark::State& state) {
  const int world_size = static_cast<int>(state.range(0));
  SimulatedClock clock;
  CollectorState collector({}, &clock);
  v1::ReportBatch batch = MakeBatch(world_size);
  const int64_t steps_per_batch = kStepsPerBatch / world_size;
  uint64_t seq = 0;
  for (auto _ : state) {
    batch.set_seq(++seq);
    auto ack = collector.Apply(batch);
    benchmark::DoNotOptimize(ack);
    ShiftSteps(&batch, steps_per_batch);
    clock.AdvanceTime(absl::Nanoseconds(steps_per_batch * 125'000'000));
    if (seq % 8 == 0) {
      // The ticker runs once a second of real time, not of data: at this rate its cost (rank
      // rows, findings; bench/collector/tick_bench) is not ingest's, so it is left out.
      state.PauseTiming();
      collector.Tick();
      state.ResumeTiming();
    }
  }
  Check(state, collector, static_cast<int64_t>(seq));
  Report(state, static_cast<int64_t>(seq));
}
BENCHMARK(BM_ApplyBatch)->Arg(8)->Arg(1000)->ArgName("world_size")->Unit(benchmark::kMicrosecond);

void BM_ParseAndApplyBatch(benchmark::State& state) {
  const int world_size = static_cast<int>(state.range(0));
  SimulatedClock clock;
  CollectorState collector({}, &clock);
  const std::string wire = MakeBatch(world_size).SerializeAsString();
  const int64_t steps_per_batch = kStepsPerBatch / world_size;
  v1::ReportBatch batch;
  uint64_t seq = 0;
  for (auto _ : state) {
    if (!batch.ParseFromString(wire)) state.SkipWithError("parse failed");
    ++seq;
    batch.set_seq(seq);
    ShiftSteps(&batch, static_cast<int64_t>(seq - 1) * steps_per_batch);
    auto ack = collector.Apply(batch);
    benchmark::DoNotOptimize(ack);
    clock.AdvanceTime(absl::Nanoseconds(steps_per_batch * 125'000'000));
    if (seq % 8 == 0) {
      state.PauseTiming();
      collector.Tick();
      state.ResumeTiming();
    }
  }
  state.counters["wire_bytes_per_batch"] = static_cast<double>(wire.size());
  Check(state, collector, static_cast<int64_t>(seq));
  Report(state, static_cast<int64_t>(seq));
}
BENCHMARK(BM_ParseAndApplyBatch)
    ->Arg(8)
    ->Arg(1000)
    ->ArgName("world_size")
    ->Unit(benchmark::kMicrosecond);

// Duplicates (resent batches) must be cheap: they are acknowledged without touching the engine.
void BM_ApplyDuplicateBatch(benchmark::State& state) {
  SimulatedClock clock;
  CollectorState collector({}, &clock);
  v1::ReportBatch batch = MakeBatch(8);
  batch.set_seq(1);
  (void)collector.Apply(batch);
  for (auto _ : state) {
    auto ack = collector.Apply(batch);
    benchmark::DoNotOptimize(ack);
  }
}
BENCHMARK(BM_ApplyDuplicateBatch)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace stepwatch::collector

BENCHMARK_MAIN();
