#include "analysis/detectors/gpu_utilization.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "tests/analysis/detectors/fixture.h"

namespace stepwatch::analysis {
namespace {

using testing::DetectorFixture;

constexpr int64_t kSecond = 1'000'000'000;

class EngineGpuUtilizationDetectorTest : public ::testing::Test {
 protected:
  EngineGpuUtilizationDetectorTest() : fx_({&detector_}, 1) {}

  // A reading of node-a GPU `index` at `t` seconds, fed to the detector; returns its findings.
  std::vector<Finding> Read(int index, double utilization, int64_t t) {
    GpuSample r;
    r.node = "node-a";
    r.index = index;
    r.sampled_unix_nanos = t * kSecond;
    r.utilization_ratio = utilization;
    const GpuInfo& g = fx_.registry().UpdateGpu(r);
    std::unique_ptr<DetectorState>& st = states_[index];
    if (!st) st = detector_.NewGpuState();
    detector_.OnGpu(fx_.engine_view(), g, st.get());
    std::vector<Finding> out;
    detector_.EvaluateGpu(fx_.engine_view(), g, st.get(), &out);
    for (Finding& f : out) RenderFinding(&f);
    return out;
  }

  GpuUtilizationDetector detector_;
  DetectorFixture fx_;
  std::map<int, std::unique_ptr<DetectorState>> states_;
};

TEST_F(EngineGpuUtilizationDetectorTest, AnIdleGpuIsIdleCapacityAfterTheWindow) {
  EXPECT_TRUE(Read(0, 0.1, 0).empty());
  EXPECT_TRUE(Read(0, 0.1, 29).empty());
  std::vector<Finding> found = Read(0, 0.1, 30);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, FindingKind::kIdleGpu);
  EXPECT_EQ(found[0].severity, Severity::kInfo);
  EXPECT_EQ(found[0].job, "");
  EXPECT_EQ(found[0].node, "node-a");
  EXPECT_EQ(found[0].gpu, 0);
  EXPECT_EQ(found[0].since_unix_nanos, 0);
  EXPECT_EQ(found[0].cause, Cause::kNoWork);
  const Evidence& e = found[0].evidence;
  EXPECT_DOUBLE_EQ(e.below_threshold_seconds.value_or(-1), 30);
  EXPECT_DOUBLE_EQ(e.utilization_threshold_ratio.value_or(-1), 0.5);
  ASSERT_EQ(e.devices.size(), 1u);
  EXPECT_DOUBLE_EQ(e.devices[0].utilization_ratio.value_or(-1), 0.1);
  EXPECT_FALSE(e.devices[0].sm_activity_ratio.has_value());
  // Rendered from those fields.
  EXPECT_EQ(found[0].summary, "node-a GPU 0: no process, utilization 10% for 30 s (idle capacity)");
  EXPECT_EQ(found[0].action, "schedule work on node-a GPU 0 or release it");
  EXPECT_TRUE(Read(0, 0.9, 31).empty()) << "a busy reading did not clear it";
}

TEST_F(EngineGpuUtilizationDetectorTest, TheGpuOfARankIsUnderutilizedForItsJob) {
  fx_.AddRank(0, "node-a", /*gpu=*/1);
  Read(1, 0.2, 0);
  std::vector<Finding> found = Read(1, 0.2, 30);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, FindingKind::kUnderutilizedGpu);
  EXPECT_EQ(found[0].job, "job");
  EXPECT_EQ(found[0].rank, 0);
  EXPECT_EQ(found[0].ranks, std::vector<int>{0});
  EXPECT_EQ(found[0].cause, Cause::kNoWork);
  ASSERT_EQ(found[0].evidence.devices.size(), 1u);
  EXPECT_EQ(found[0].evidence.devices[0].gpu, 1);
  EXPECT_EQ(found[0].evidence.devices[0].rank, 0);
  EXPECT_DOUBLE_EQ(found[0].evidence.devices[0].utilization_ratio.value_or(-1), 0.2);
  EXPECT_FALSE(found[0].evidence.data_share_ratio.has_value()) << "no steps, no split";
  EXPECT_EQ(found[0].summary,
            "node-a GPU 1 (rank 0): utilization 20% < 50% for 30 s; no work: the job reports no "
            "steps");

  const GpuInfo& g = fx_.registry().gpus().at({"node-a", 1});
  detector_.OnGpuReleased(fx_.engine_view(), g, states_[1].get());
  std::vector<Finding> out;
  detector_.EvaluateGpu(fx_.engine_view(), g, states_[1].get(), &out);
  EXPECT_TRUE(out.empty()) << "still flagged after its job was removed";
}

}  // namespace
}  // namespace stepwatch::analysis
