// A synchronous data-parallel job driven through the engine, for the engine's tests
// (engine_*_test.cc): every rank reports the same step time, the split shows who waited.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "analysis/engine.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis::engine_test {

inline constexpr int64_t kT0 = 1'700'000'000'000'000'000;
inline constexpr int64_t kSec = 1'000'000'000;

// Per-rank split of one step; the step time is the synchronous one: max busy + collective.
struct Split {
  double compute = 0.4;
  double data = 0.02;
};

// Drives an engine with a synchronous data-parallel job: every rank reports the same step time;
// the split shows who waited. `split(rank, step)` gives each rank's busy time.
class JobDriver {
 public:
  JobDriver(Engine* engine, std::string job, int nodes, int gpus, double comm_seconds = 0.1,
            uint64_t seed = 1)
      : engine_(engine),
        job_(std::move(job)),
        nodes_(nodes),
        gpus_(gpus),
        comm_s_(comm_seconds),
        rng_(seed) {}

  // Noise: coefficient of variation on each rank's compute and data.
  double noise_cv = 0.02;
  std::function<Split(int rank, int64_t step)> split = [](int, int64_t) { return Split{}; };
  bool report_split = true;       // data_seconds + compute_seconds + comm_seconds
  bool report_comm_only = false;  // step_seconds + comm_seconds
  int64_t samples = 16;
  std::function<void(StepEvent&)> decorate;

  int world() const { return nodes_ * gpus_; }
  int64_t now() const { return now_; }
  int64_t step() const { return step_; }

  // Runs `n` steps; returns false if AddStep failed.
  void Run(int64_t n) {
    std::normal_distribution<double> normal(0, 1);
    for (int64_t i = 0; i < n; ++i, ++step_) {
      std::vector<Split> s(world());
      double max_busy = 0;
      for (int r = 0; r < world(); ++r) {
        s[r] = split(r, step_);
        s[r].compute *= std::max(0.2, 1 + noise_cv * normal(rng_));
        s[r].data *= std::max(0.0, 1 + noise_cv * normal(rng_));
        max_busy = std::max(max_busy, s[r].compute + s[r].data);
      }
      const double step_seconds = max_busy + comm_s_;
      now_ += static_cast<int64_t>(step_seconds * kSec);
      for (int r = 0; r < world(); ++r) {
        StepEvent x;
        x.job = job_;
        x.rank = r;
        x.world_size = world();
        x.step = step_;
        x.step_seconds = step_seconds;
        const double wait = std::max(0.0, step_seconds - s[r].compute - s[r].data);
        if (report_split) {
          x.compute_seconds = s[r].compute;
          x.data_seconds = s[r].data;
          x.comm_seconds = wait;
        } else if (report_comm_only) {
          x.comm_seconds = wait;
        }
        if (samples > 0) x.samples = samples;
        x.local_rank = r % gpus_;
        x.node = "node-" + std::to_string(r / gpus_);
        x.pid = 5000 + r;
        x.received_unix_nanos = now_;
        if (decorate) decorate(x);
        absl::Status st = engine_->AddStep(x);
        ASSERT_OK(st);
      }
      engine_->Advance(now_);
      if (after_step) after_step(step_);
    }
  }
  std::function<void(int64_t)> after_step;

 private:
  Engine* engine_;
  std::string job_;
  int nodes_, gpus_;
  double comm_s_;
  std::mt19937_64 rng_;
  int64_t step_ = 0;
  int64_t now_ = kT0;
};

inline std::vector<Finding> Of(const Engine& e, FindingKind kind) {
  std::vector<Finding> out;
  for (const Finding& f : e.Findings()) {
    if (f.kind == kind) out.push_back(f);
  }
  return out;
}

// One GPU reading: `util` utilization with `pids` on it.
inline GpuSample Reading(const std::string& node, int index, int64_t t, double util,
                         std::vector<uint32_t> pids) {
  GpuSample x;
  x.node = node;
  x.index = index;
  x.sampled_unix_nanos = t;
  x.utilization_ratio = util;
  x.pids = std::move(pids);
  return x;
}

// GPU readings for every rank of a JobDriver job: full clocks and busy unless `slow` says
// otherwise.
inline void AddGpus(Engine* e, const JobDriver& d, int nodes, int gpus,
                    const std::function<void(int node, int gpu, GpuSample&)>& slow = nullptr) {
  for (int n = 0; n < nodes; ++n) {
    for (int g = 0; g < gpus; ++g) {
      GpuSample x = Reading("node-" + std::to_string(n), g, d.now(), 0.95,
                            {static_cast<uint32_t>(5000 + n * gpus + g)});
      x.sm_clock_mhz = 1980;
      x.sm_clock_max_mhz = 1980;
      x.throttle_reasons = 0;
      if (slow) slow(n, g, x);
      e->AddGpu(x);
    }
  }
}

}  // namespace stepwatch::analysis::engine_test
