// The generated traces of the trace-driven simulator (sim/tracesim.h), deterministic from their
// seeds: data-parallel jobs with a compute or data-loading straggler or a heavy collective, and
// pipelines with an imbalanced stage, a straggler or a data wait.
#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sim/tracesim.h"

namespace stepwatch::sim {

namespace {

// Multiplicative noise of coefficient of variation `cv`, never under 0.2.
class Noise {
 public:
  explicit Noise(uint64_t seed) : rng_(seed) {}
  double operator()(double cv) { return std::max(0.2, 1 + cv * normal_(rng_)); }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0, 1};
};

struct DpSpec {
  std::string name;
  int ranks = 16;
  int steps = 200;
  double compute = 0.30, data = 0.01, other = 0.005, collective = 0.08, hidden = 0.05;
  double cv = 0.02;
  int slow_rank = -1;
  double slow_factor = 1;
  int data_rank = -1;
  double data_stall = 0;
};

DpTrace MakeDp(const DpSpec& spec, uint64_t seed) {
  Noise noise(seed);
  DpTrace t;
  t.name = spec.name;
  t.ranks = t.job_world_size = spec.ranks;
  for (int s = 0; s < spec.steps; ++s) {
    std::vector<RankStep> rs(spec.ranks);
    double max_arrival = 0;
    for (int r = 0; r < spec.ranks; ++r) {
      RankStep& x = rs[r];
      x.compute = spec.compute * noise(spec.cv) * (r == spec.slow_rank ? spec.slow_factor : 1);
      x.data =
          spec.data * noise(spec.cv) + (r == spec.data_rank ? spec.data_stall * noise(0.1) : 0);
      x.other = spec.other * noise(spec.cv);
      max_arrival = std::max(max_arrival, x.arrival());
    }
    const double collective = spec.collective * noise(spec.cv);
    for (RankStep& x : rs) {
      x.exposed_comm = max_arrival - x.arrival() + collective;
      x.comm = x.exposed_comm + std::min(spec.hidden, x.compute);
      x.step = max_arrival + collective;
    }
    t.steps.push_back(s);
    t.rank_steps.push_back(std::move(rs));
  }
  return t;
}

struct PpSpec {
  std::string name;
  int stages = 4, replicas = 4, microbatches = 8, steps = 120;
  double fwd = 0.010, bwd = 0.020, p2p = 0.001, collective = 0.03, data = 0.002, cv = 0.02;
  int slow_stage = -1;
  double stage_factor = 1;
  int slow_rank = -1;
  double rank_factor = 1;
};

PipelineTrace MakePp(const PpSpec& spec, uint64_t seed) {
  Noise noise(seed);
  PipelineTrace t;
  t.name = spec.name;
  t.stages = spec.stages;
  t.replicas = spec.replicas;
  t.microbatches = spec.microbatches;
  t.p2p_seconds = spec.p2p;
  const int ranks = spec.stages * spec.replicas;
  for (int k = 0; k < spec.steps; ++k) {
    std::vector<StageStep> rs(ranks);
    for (int rank = 0; rank < ranks; ++rank) {
      const int s = rank % spec.stages;
      const double f = (s == spec.slow_stage ? spec.stage_factor : 1) *
                       (rank == spec.slow_rank ? spec.rank_factor : 1);
      StageStep& x = rs[rank];
      for (int mb = 0; mb < spec.microbatches; ++mb) {
        x.fwd.push_back(spec.fwd * f * noise(spec.cv));
        x.bwd.push_back(spec.bwd * f * noise(spec.cv));
      }
      if (s == 0) x.data = spec.data * noise(0.1);
    }
    t.steps.push_back(k);
    t.rank_steps.push_back(std::move(rs));
    t.collective.push_back(spec.collective * noise(spec.cv));
  }
  return t;
}

}  // namespace

std::vector<DpTrace> GeneratedDpTraces() {
  std::vector<DpTrace> out;
  DpSpec a;
  a.name = "gen-dp-straggler";  // one rank 30% slower in compute
  a.slow_rank = 5;
  a.slow_factor = 1.3;
  out.push_back(MakeDp(a, 11));
  DpSpec b;
  b.name = "gen-dp-data-straggler";  // one rank waits 0.15 s for input data each step
  b.data_rank = 9;
  b.data_stall = 0.15;
  out.push_back(MakeDp(b, 12));
  DpSpec c;
  c.name = "gen-dp-comm-heavy";  // 0.30 s collective against 0.12 s compute, 0.08 s of it hidden
  c.ranks = 8;
  c.compute = 0.12;
  c.collective = 0.30;
  c.hidden = 0.08;
  out.push_back(MakeDp(c, 13));
  return out;
}

std::vector<PipelineTrace> GeneratedPipelineTraces() {
  std::vector<PipelineTrace> out;
  PpSpec a;
  a.name = "gen-pp-imbalanced";  // stage 2 does 40% more work
  a.slow_stage = 2;
  a.stage_factor = 1.4;
  out.push_back(MakePp(a, 21));
  PpSpec b;
  b.name = "gen-pp-straggler";  // stage 1 of replica 2 runs 30% slower
  b.slow_rank = 2 * b.stages + 1;
  b.rank_factor = 1.3;
  out.push_back(MakePp(b, 22));
  PpSpec c;
  c.name = "gen-pp-data";  // stage 0 waits 40 ms for input before its first forward
  c.data = 0.04;
  out.push_back(MakePp(c, 23));
  return out;
}

}  // namespace stepwatch::sim
