// The detector list and the engine's per-detector timing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/detector.h"
#include "analysis/engine.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis {
namespace {

TEST(EngineDetectorListTest, OrderAndSlots) {
  std::vector<std::unique_ptr<Detector>> list = MakeDetectors();
  std::vector<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    names.push_back(list[i]->name());
    EXPECT_EQ(list[i]->slot(), i);
    EXPECT_NE(list[i]->hooks(), 0u) << list[i]->name();
  }
  // slow_node reads the straggler flags of the same step: it must come after straggler.
  EXPECT_EQ(names,
            (std::vector<std::string>{"straggler", "slow_node", "pipeline", "scaling", "regression",
                                      "stall", "gpu_utilization", "gpu_health", "nic_health"}));
}

TEST(EngineDetectorListTest, TheEngineTimesEachDetector) {
  Engine engine;
  EXPECT_EQ(engine.DetectorTimings().size(), 9u);
  for (int64_t step = 0; step < 20; ++step) {
    for (int r = 0; r < 4; ++r) {
      StepEvent s;
      s.job = "j";
      s.rank = r;
      s.world_size = 4;
      s.step = step;
      s.step_seconds = 0.5;
      s.compute_seconds = 0.4;
      s.node = "n";
      s.received_unix_nanos = (step + 1) * 500'000'000LL;
      ASSERT_OK(engine.AddStep(s));
    }
  }
  GpuSample g;
  g.node = "n";
  g.index = 0;
  g.utilization_ratio = 0.9;
  engine.AddGpu(g);
  engine.Advance(11'000'000'000LL);
  (void)engine.Findings();

  const auto timings = engine.DetectorTimings();
  ASSERT_EQ(timings.size(), 9u);
  // 20 completed steps and one Findings call.
  EXPECT_EQ(timings.at("straggler").runs, 21);
  EXPECT_GT(timings.at("straggler").seconds, 0);
  EXPECT_EQ(timings.at("regression").runs, 21);
  // One Advance and one Findings call.
  EXPECT_EQ(timings.at("stall").runs, 2);
  // One reading, one Advance, one Findings call.
  EXPECT_EQ(timings.at("gpu_utilization").runs, 3);
  for (const auto& [name, t] : timings) EXPECT_GE(t.seconds, 0) << name;
}

}  // namespace
}  // namespace stepwatch::analysis
