// Step events captured from real 4-rank gloo DDP jobs (tests/integration/ddp_train.py through
// stepwatch.torch.watch; tests/analysis/data/ddp4_*.csv) replayed through the engine in the
// order and at the times the agent received them, advancing it every 200 ms as the collector
// does. Real steps have what synthetic draws lack: ranks sharing a busy host's cores, 2-5 ms
// steps that vary by half, bursts of descheduled steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis {
namespace {

constexpr int kWorld = 4;
constexpr int64_t kT0 = 1'800'000'000'000'000'000;
constexpr int64_t kTickNanos = 200'000'000;

struct Captured {
  int64_t received_us = 0;
  StepEvent event;
};

std::vector<Captured> LoadCapture(const std::string& name) {
  std::ifstream in(std::string(STEPWATCH_CAPTURE_DIR) + "/" + name);
  EXPECT_TRUE(in.good()) << "cannot read " << name;
  std::vector<Captured> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::vector<int64_t> v;
    for (std::string f; std::getline(fields, f, ',');) v.push_back(std::stoll(f));
    if (v.size() != 7) {
      ADD_FAILURE() << "bad line in " << name << ": " << line;
      continue;
    }
    Captured c;
    c.received_us = v[0];
    StepEvent& x = c.event;
    x.job = "ddp";
    x.rank = static_cast<int>(v[1]);
    x.world_size = kWorld;
    x.step = v[2];
    x.step_seconds = v[3] * 1e-6;
    x.data_seconds = v[4] * 1e-6;
    x.compute_seconds = v[5] * 1e-6;
    x.comm_seconds = v[6] * 1e-6;
    x.samples = 16;
    x.local_rank = x.rank;
    x.node = "node-0";
    x.pid = 100 + x.rank;
    x.received_unix_nanos = kT0 + v[0] * 1000;
    out.push_back(std::move(c));
  }
  return out;
}

// What the straggler findings looked like at each tick of a replay.
struct Replay {
  // Highest step received when each rank was first flagged (absent: never).
  std::map<int, int64_t> first_flagged_at_step;
  // Per rank, the most consecutive ticks it stayed flagged, and whether any finding of it was
  // persistent.
  std::map<int, int> longest_flagged_ticks;
  bool any_persistent = false;
  // Summaries of every finding of another kind (a regression, a stall, a slow node...).
  std::set<std::string> other_findings;
  int64_t last_step = -1;
};

Replay ReplayCapture(const std::vector<Captured>& capture) {
  Engine engine;
  Replay r;
  std::map<int, int> flagged_ticks;
  int64_t next_tick = kT0 + kTickNanos;
  auto tick = [&](int64_t now) {
    engine.Advance(now);
    std::map<int, int> now_flagged;
    for (const Finding& f : engine.Findings()) {
      if (f.kind != FindingKind::kStraggler) {
        r.other_findings.insert(f.summary);
        continue;
      }
      now_flagged[f.rank] = flagged_ticks[f.rank] + 1;
      r.first_flagged_at_step.emplace(f.rank, r.last_step);
      r.any_persistent = r.any_persistent || f.persistent;
    }
    flagged_ticks = now_flagged;
    for (const auto& [rank, ticks] : flagged_ticks) {
      r.longest_flagged_ticks[rank] = std::max(r.longest_flagged_ticks[rank], ticks);
    }
  };
  for (const Captured& c : capture) {
    while (c.event.received_unix_nanos >= next_tick) {
      tick(next_tick);
      next_tick += kTickNanos;
    }
    EXPECT_OK(engine.AddStep(c.event));
    r.last_step = std::max(r.last_step, c.event.step);
  }
  tick(next_tick);
  return r;
}

// Rank 2 sleeps 30 ms in its forward; the other ranks' busy time is 2-5 ms of CPU that varies by
// half from step to step. Until the rescale rule read a smoothed median against the job's own
// noise, this capture's rank 2 was never flagged (its tests paused on most steps).
TEST(DdpCaptureReplayTest, CpuBoundJobFlagsItsSlowRankWithinFortySteps) {
  const std::vector<Captured> capture = LoadCapture("ddp4_cpu_slow_rank2.csv");
  ASSERT_EQ(capture.size(), 1600u);
  const Replay r = ReplayCapture(capture);
  ASSERT_TRUE(r.first_flagged_at_step.count(2)) << "rank 2 never flagged in 400 steps";
  EXPECT_LE(r.first_flagged_at_step.at(2), 40);
  EXPECT_EQ(r.first_flagged_at_step.size(), 1u) << "a rank other than 2 was flagged";
}

// A healthy job on a busy host: every rank waits 20 ms per step as if for a device. Twice in
// this capture a rank was really slower for a few steps (+10% to +27% for 7 steps); a flag for
// such a burst may come and go, but must not persist or last more than a few seconds.
TEST(DdpCaptureReplayTest, HealthyJobOnABusyHostRaisesNothingLasting) {
  const std::vector<Captured> capture = LoadCapture("ddp4_device_healthy.csv");
  ASSERT_EQ(capture.size(), 5996u);  // the last step of each rank was not captured
  const Replay r = ReplayCapture(capture);
  EXPECT_EQ(r.last_step, 1498);
  EXPECT_FALSE(r.any_persistent);
  EXPECT_TRUE(r.other_findings.empty()) << *r.other_findings.begin();
  for (const auto& [rank, ticks] : r.longest_flagged_ticks) {
    EXPECT_LE(ticks, 10) << "rank " << rank << " stayed flagged " << ticks * 0.2 << " s";
  }
}

}  // namespace
}  // namespace stepwatch::analysis
