// The collector's ingest path: a ReportBatch decoded from the input bytes is applied to a fresh
// CollectorState, resent (the duplicate path), followed by a next batch a second later, and the
// state is then ticked, queried and snapshotted as /metrics and stepwatchctl would. Never a crash,
// and a batch resent is never counted twice.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "collector/state.h"
#include "common/clock.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace {

// Small limits so that one input cannot make a single run slow (the defaults allow 100,000 ranks).
stepwatch::collector::CollectorStateOptions Options() {
  stepwatch::collector::CollectorStateOptions o;
  o.engine.max_jobs = 8;
  o.engine.max_ranks_per_job = 256;
  o.max_nodes = 8;
  o.max_gpus_per_node = 16;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  stepwatch::v1::ReportBatch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size))) return 0;
  stepwatch::SimulatedClock clock;
  stepwatch::collector::CollectorState state(Options(), &clock);
  if (!state.Apply(batch).ok()) return 0;
  const uint64_t steps = state.Snapshot().counters.steps_received;
  if (!state.Apply(batch).ok()) std::abort();
  if (state.Snapshot().counters.steps_received != steps) std::abort();

  clock.AdvanceTime(absl::Seconds(1));
  batch.set_seq(batch.seq() + 1);
  for (auto& s : *batch.mutable_steps()) {
    if (s.step() < INT64_MAX) s.set_step(s.step() + 1);
  }
  (void)state.Apply(batch);
  state.Tick();
  clock.AdvanceTime(absl::Seconds(600));  // past expiry: jobs and nodes are forgotten
  state.Tick();

  (void)state.Status();
  (void)state.Findings("");
  stepwatch::collector::StateSnapshot snap = state.Snapshot();
  for (const auto& job : snap.jobs) (void)state.Explain(job.job);
  for (const auto& s : batch.steps()) (void)state.Explain(s.job());
  (void)state.SerializeScalingHistory();
  return 0;
}
