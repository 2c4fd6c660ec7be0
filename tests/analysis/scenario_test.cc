#include "sim/scenario.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace stepwatch::sim {
namespace {

using ::testing::HasSubstr;

constexpr char kScenario[] = R"({
  "name": "t", "job": "bert", "seed": 3, "nodes": 2, "gpus_per_node": 4, "steps": 50,
  "step_s": 0.5, "noise_cv": 0.05, "idle_gpus_per_node": 1,
  "faults": [
    {"kind": "throttled_gpu", "onset": 10, "end": 20, "rank": 5, "factor": 1.4},
    {"kind": "hang", "onset": 30, "end": 35},
    {"kind": "rescale", "onset": 40, "nodes": 4, "factor": 1.6}
  ]
})";

TEST(ScenarioTest, ParsesAndRejectsClearly) {
  auto sc = ParseScenario(kScenario);
  ASSERT_OK(sc);
  EXPECT_EQ(sc->job, "bert");
  EXPECT_EQ(sc->faults.size(), 3u);
  EXPECT_EQ(sc->faults[0].rank, 5);
  EXPECT_EQ(sc->faults[2].end, -1);

  EXPECT_THAT(ParseScenario("{}").status().message(), HasSubstr("\"name\" is required"));
  EXPECT_THAT(ParseScenario(R"({"name":"x","nodes":0})").status().message(),
              HasSubstr("\"nodes\" must be"));
  EXPECT_THAT(ParseScenario(R"({"name":"x","faults":[{"kind":"meteor"}]})").status().message(),
              HasSubstr("unknown kind"));
  EXPECT_THAT(
      ParseScenario(R"({"name":"x","faults":[{"kind":"slow_rank","onset":5}]})").status().message(),
      HasSubstr("\"rank\" is required"));
  EXPECT_THAT(ParseScenario(R"({"name":"x","faults":[{"kind":"hang","onset":5,"end":5}]})")
                  .status()
                  .message(),
              HasSubstr("after"));
  EXPECT_FALSE(ParseScenario("not json").ok());
  EXPECT_EQ(LoadScenario("/nonexistent/x.json").status().code(), absl::StatusCode::kNotFound);
}

TEST(ScenarioTest, GeneratesDeterministicStreamsWithTruth) {
  auto sc = ParseScenario(kScenario);
  ASSERT_OK(sc);
  Generator a(*sc), b(*sc);
  Tick ta, tb;
  int ticks = 0;
  while (a.Next(&ta)) {
    ASSERT_TRUE(b.Next(&tb));
    ++ticks;
    ASSERT_EQ(ta.unix_nanos, tb.unix_nanos);
    ASSERT_EQ(ta.samples.size(), tb.samples.size());
    for (size_t i = 0; i < ta.samples.size(); ++i) {
      EXPECT_EQ(ta.samples[i].step_seconds, tb.samples[i].step_seconds);
      EXPECT_EQ(ta.samples[i].compute_seconds, tb.samples[i].compute_seconds);
    }
    if (ta.step >= 30 && ta.step < 35) {
      EXPECT_TRUE(ta.samples.empty());  // hung
    } else if (ta.step < 40) {
      ASSERT_EQ(ta.samples.size(), 8u);
      const auto& s5 = ta.samples[5];
      EXPECT_EQ(s5.node, "node-1");
      EXPECT_EQ(*s5.gpu, 1);
      EXPECT_EQ(s5.pid, 10005);
      // Synchronous: every rank reports the same step time; the split adds up to it.
      EXPECT_DOUBLE_EQ(s5.step_seconds, ta.samples[0].step_seconds);
      EXPECT_NEAR(*s5.data_seconds + *s5.compute_seconds + *s5.comm_seconds, s5.step_seconds, 1e-9);
    } else {
      EXPECT_EQ(ta.samples.size(), 16u);  // rescaled to 4 nodes
      EXPECT_EQ(ta.world_size, 16);
    }
    for (const auto& g : ta.gpus) {
      if (g.node == "node-1" && g.index == 1) {
        const bool throttled = ta.step >= 10 && ta.step < 20;
        EXPECT_EQ(*g.sm_clock_mhz < 1500, throttled);
        EXPECT_EQ(*g.throttle_reasons != 0, throttled);
      }
      if (g.index == 4) {
        EXPECT_TRUE(g.pids.empty());  // the idle GPU
      }
    }
  }
  EXPECT_EQ(ticks, 50);
  ASSERT_EQ(a.truth().size(), 3u);
  EXPECT_EQ(a.truth()[0].rank, 5);
  EXPECT_EQ(a.truth()[0].node, "node-1");
  EXPECT_EQ(a.truth()[0].gpu, 1);
  EXPECT_GT(a.truth()[0].onset_unix_nanos, Generator::kStartUnixNanos);
  EXPECT_TRUE(a.truth()[2].expect_finding);  // 1/1.6 = 0.625 < 0.8
}

TEST(ScenarioTest, EfficientRescaleIsNotExpectedToBeReported) {
  auto sc = ParseScenario(
      R"({"name":"x","nodes":2,"faults":[{"kind":"rescale","onset":5,"nodes":4,"factor":1.1}]})");
  ASSERT_OK(sc);
  Generator g(*sc);
  EXPECT_FALSE(g.truth()[0].expect_finding);
}

}  // namespace
}  // namespace stepwatch::sim
