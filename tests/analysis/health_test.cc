// Hardware health through the engine: GPU and network-port readings in, gpu_health and nic_health
// findings out, and the health cause of a straggler on a faulty GPU.
#include "analysis/health.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/engine.h"
#include "analysis/health_tracker.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kT0 = 1'700'000'000'000'000'000;
constexpr int64_t kSec = 1'000'000'000;

std::vector<Finding> OfKind(const Engine& e, FindingKind kind) {
  std::vector<Finding> out;
  for (Finding& f : e.Findings()) {
    if (f.kind == kind) out.push_back(std::move(f));
  }
  return out;
}

class GpuHealthTest : public ::testing::Test {
 protected:
  // A reading of node-a GPU 0 at kT0 + `t` seconds with `health`, `busy` utilization.
  void Read(int64_t t, const GpuHealth& health, double busy = 0.9) {
    GpuSample r;
    r.node = "node-a";
    r.index = 0;
    r.sampled_unix_nanos = kT0 + t * kSec;
    r.utilization_ratio = busy;
    r.health = health;
    engine_.AddGpu(r);
  }
  std::vector<Finding> Health() const { return OfKind(engine_, FindingKind::kGpuHealth); }

  Engine engine_;
};

TEST_F(GpuHealthTest, AHealthyGpuWithOldCountsHasNoFinding) {
  GpuHealth h;
  h.ecc_uncorrected_total = 3;  // from before the collector saw the GPU
  h.pcie_replays_total = 5000;
  h.nvlinks = {{0, true, 40, 0}, {1, true, 7, 0}};
  h.xids = {{13, 2, kT0 - 3600 * kSec}};  // an hour ago
  for (int t = 0; t < 60; ++t) Read(t, h);
  EXPECT_TRUE(Health().empty());
}

TEST_F(GpuHealthTest, AnXidThatMeansTheGpuFellOffTheBusIsCritical) {
  GpuHealth h;
  Read(0, h);
  h.xids = {{79, 1, kT0 + 4 * kSec}};
  Read(5, h);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kXid);
  EXPECT_EQ(found[0].severity, Severity::kCritical);
  EXPECT_EQ(found[0].node, "node-a");
  EXPECT_EQ(found[0].gpu, 0);
  EXPECT_THAT(found[0].summary, HasSubstr("Xid 79 (GPU has fallen off the bus), 1 event"));
  EXPECT_THAT(found[0].summary, HasSubstr("no job on the node"));
  EXPECT_THAT(found[0].action, HasSubstr("drain node-a"));
  // Held for the health window after the event, then history.
  Read(250, h);
  EXPECT_EQ(Health().size(), 1u);
  Read(305, h);
  EXPECT_TRUE(Health().empty());
}

TEST_F(GpuHealthTest, AnXidSeenFirstButRecentIsNew) {
  // The collector started after the event: the agent's count says when it happened.
  GpuHealth h;
  h.xids = {{48, 1, kT0 - 10 * kSec}};
  Read(0, h);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_THAT(found[0].summary, HasSubstr("double-bit ECC error"));
}

TEST_F(GpuHealthTest, AnApplicationXidIsInformationalNotAHardwareFault) {
  GpuHealth h;
  Read(0, h);
  h.xids = {{13, 3, kT0 + kSec}};
  Read(1, h);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].severity, Severity::kInfo);
  EXPECT_THAT(found[0].summary, HasSubstr("not a hardware fault"));
  EXPECT_THAT(found[0].action, HasSubstr("not the GPU"));
}

TEST_F(GpuHealthTest, RisingUncorrectedEccIsCritical) {
  GpuHealth h;
  h.ecc_uncorrected_total = 2;
  Read(0, h);
  EXPECT_TRUE(Health().empty());
  h.ecc_uncorrected_total = 5;
  Read(1, h);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kEccUncorrected);
  EXPECT_EQ(found[0].severity, Severity::kCritical);
  EXPECT_THAT(found[0].summary, HasSubstr("3 uncorrected ECC errors"));
}

TEST_F(GpuHealthTest, RowRemappingFailureOutranksAPendingRemap) {
  GpuHealth h;
  h.row_remap_pending = true;
  Read(0, h);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kRowRemapPending);
  EXPECT_EQ(found[0].severity, Severity::kWarning);
  h.row_remap_failure = true;
  Read(1, h);
  found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kRowRemapFailure);
  EXPECT_EQ(found[0].severity, Severity::kCritical);
  EXPECT_EQ(found[0].causes,
            (std::vector<Cause>{Cause::kRowRemapFailure, Cause::kRowRemapPending}));
  // The pending remap began first: the finding's start.
  EXPECT_EQ(found[0].since_unix_nanos, kT0);
}

TEST_F(GpuHealthTest, ALinkThatWasUpAndWentDownIsAFaultOneNeverUpIsNot) {
  GpuHealth h;
  h.nvlinks = {{0, true, 0, 0}, {1, true, 0, 0}, {2, false, 0, 0}};
  Read(0, h);
  EXPECT_TRUE(Health().empty()) << "link 2 was never up (not connected)";
  h.nvlinks[1].up = false;
  Read(1, h);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kNvlinkDown);
  EXPECT_THAT(found[0].summary, HasSubstr("NVLink 1 down"));
}

TEST_F(GpuHealthTest, NvlinkErrorsCountByTheirRiseInTheWindow) {
  GpuHealth h;
  h.nvlinks = {{0, true, 1000, 0}};
  for (int t = 0; t < 100; ++t) Read(t, h);
  EXPECT_TRUE(Health().empty());
  h.nvlinks[0].errors_total = 1012;
  Read(100, h);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kNvlinkErrors);
  EXPECT_THAT(found[0].summary, HasSubstr("12 NVLink errors in 5 min"));
  // No further rise: once the rise has left the window, no fault.
  for (int t = 101; t < 500; t += 10) Read(t, h);
  EXPECT_TRUE(Health().empty());
}

TEST_F(GpuHealthTest, ADowngradedPcieLinkCountsOnlyWhileBusy) {
  GpuHealth h;
  h.pcie_generation = 1;
  h.pcie_generation_max = 5;
  h.pcie_width = 16;
  h.pcie_width_max = 16;
  Read(0, h, /*busy=*/0.0);
  EXPECT_TRUE(Health().empty()) << "an idle GPU trains down to save power";
  h.pcie_generation = 3;
  h.pcie_width = 8;
  Read(1, h, 0.95);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kPcieDowngraded);
  EXPECT_THAT(found[0].summary, HasSubstr("PCIe gen 3 x8 of gen 5 x16 while busy"));
  Read(2, h, 0.0);
  EXPECT_EQ(Health().size(), 1u) << "an idle reading neither shows nor clears it";
  h.pcie_generation = 5;
  h.pcie_width = 16;
  Read(3, h, 0.95);
  EXPECT_TRUE(Health().empty());
}

TEST_F(GpuHealthTest, PcieReplaysRisingAreAFaultAReloadedDriverStartsAfresh) {
  GpuHealth h;
  h.pcie_replays_total = 10;
  Read(0, h);
  h.pcie_replays_total = 150;
  Read(30, h);
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kPcieReplays);
  h.pcie_replays_total = 3;  // counters restart with the driver
  Read(31, h);
  EXPECT_TRUE(Health().empty());
}

class NicHealthTest : public ::testing::Test {
 protected:
  static NicPortHealth Port(const std::string& device, bool up, double gbits = 200) {
    NicPortHealth p;
    p.device = device;
    p.state = up ? 4 : 1;
    p.physical_state = up ? 5 : 3;
    p.rate_bytes_per_second = gbits * 1e9 / 8;
    p.link_width = 4;
    p.errors_total = 0;
    p.link_downed_total = 0;
    return p;
  }
  void Read(int64_t t, const std::vector<NicPortHealth>& ports) {
    HostSample h;
    h.node = "node-b";
    h.sampled_unix_nanos = kT0 + t * kSec;
    h.nic_ports = ports;
    engine_.AddHost(h);
  }
  std::vector<Finding> Health() const { return OfKind(engine_, FindingKind::kNicHealth); }

  Engine engine_;
};

TEST_F(NicHealthTest, HealthyPortsAndAnUnusedOneHaveNoFinding) {
  for (int t = 0; t < 30; ++t) {
    Read(t, {Port("mlx5_0:1", true), Port("mlx5_1:1", true), Port("mlx5_2:1", false)});
  }
  EXPECT_TRUE(Health().empty());
}

TEST_F(NicHealthTest, APortThatGoesDownNamesItsDevice) {
  Read(0, {Port("mlx5_0:1", true), Port("mlx5_1:1", true)});
  Read(1, {Port("mlx5_0:1", true), Port("mlx5_1:1", false)});
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kNicDown);
  EXPECT_EQ(found[0].device, "mlx5_1:1");
  EXPECT_EQ(found[0].node, "node-b");
  EXPECT_EQ(found[0].severity, Severity::kCritical);
  EXPECT_THAT(found[0].summary, HasSubstr("node-b port mlx5_1:1: port mlx5_1:1 down"));
  EXPECT_THAT(found[0].action, HasSubstr("mlx5_1:1"));
}

TEST_F(NicHealthTest, APortSlowerThanItsNeighboursIsDegraded) {
  Read(0, {Port("mlx5_0:1", true, 200), Port("mlx5_1:1", true, 100)});
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kNicDegraded);
  EXPECT_EQ(found[0].device, "mlx5_1:1");
  EXPECT_THAT(found[0].summary, HasSubstr("at 100 Gb/s x4, the node's other ports at 200 Gb/s x4"));
}

TEST_F(NicHealthTest, RisingErrorsOrADownedLinkAreErrors) {
  NicPortHealth p = Port("mlx5_0:1", true);
  p.errors_total = 500;  // history
  Read(0, {p});
  EXPECT_TRUE(Health().empty());
  p.errors_total = 520;
  Read(60, {p});
  std::vector<Finding> found = Health();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kNicErrors);
  EXPECT_THAT(found[0].summary, HasSubstr("20 symbol and receive errors"));
  // Out of the window: cleared. Then one link-down event is enough.
  for (int t = 100; t <= 600; t += 50) Read(t, {p});
  EXPECT_TRUE(Health().empty());
  p.link_downed_total = 1;
  Read(610, {p});
  EXPECT_EQ(Health().size(), 1u);
}

// Four ranks on node-a GPUs 0..3, rank 1 half again as busy; GPU 1 reports `health`.
TEST(HealthCauseTest, AStragglerOnAFaultyGpuCarriesTheFaultAsItsCause) {
  Engine engine;
  GpuHealth bad;
  bad.nvlinks = {{0, true, 0, 0}};
  for (int64_t step = 0; step < 80; ++step) {
    const int64_t now = kT0 + step * kSec;
    if (step == 40) bad.nvlinks[0].up = false;
    for (int gpu = 0; gpu < 4; ++gpu) {
      GpuSample g;
      g.node = "node-a";
      g.index = gpu;
      g.sampled_unix_nanos = now;
      g.utilization_ratio = 0.9;
      g.sm_clock_mhz = 1980;
      g.sm_clock_max_mhz = 1980;
      if (gpu == 1) g.health = bad;
      engine.AddGpu(g);
    }
    for (int rank = 0; rank < 4; ++rank) {
      StepEvent s;
      s.job = "train";
      s.rank = rank;
      s.world_size = 4;
      s.step = step;
      s.node = "node-a";
      s.gpu = rank;
      s.step_seconds = 0.7;
      s.compute_seconds = rank == 1 ? 0.6 : 0.4 + 0.001 * ((step + rank) % 3);
      s.data_seconds = 0.01;
      s.comm_seconds = 0.7 - 0.01 - *s.compute_seconds;
      s.received_unix_nanos = now;
      ASSERT_OK(engine.AddStep(s));
    }
    engine.Advance(now);
  }
  std::vector<Finding> stragglers = OfKind(engine, FindingKind::kStraggler);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0].rank, 1);
  EXPECT_EQ(stragglers[0].cause, Cause::kNvlinkDown);
  EXPECT_THAT(stragglers[0].summary, HasSubstr("GPU fault: NVLink 0 down"));
  EXPECT_THAT(stragglers[0].action, HasSubstr("NVLinks"));
  std::vector<Finding> health = OfKind(engine, FindingKind::kGpuHealth);
  ASSERT_EQ(health.size(), 1u);
  EXPECT_EQ(health[0].job, "train");
  EXPECT_EQ(health[0].rank, 1);
  EXPECT_EQ(health[0].evidence.jobs_at_risk, std::vector<std::string>{"train"});
}

TEST(XidClassTest, CodesSayWhetherTheHardwareIsAtFault) {
  EXPECT_TRUE(ClassifyXid(79).hardware);
  EXPECT_TRUE(ClassifyXid(79).critical);
  EXPECT_FALSE(ClassifyXid(13).hardware);
  EXPECT_FALSE(ClassifyXid(31).hardware);
  EXPECT_TRUE(ClassifyXid(92).hardware);
  EXPECT_FALSE(ClassifyXid(92).critical);
  EXPECT_STREQ(ClassifyXid(9999).meaning, "Xid error");
}

TEST(RiseWindowTest, RiseOverTheWindowOnly) {
  RiseWindow w;
  const int64_t window = 100 * kSec;
  EXPECT_EQ(w.Add(0, 10, window), 0u);
  EXPECT_EQ(w.Add(5 * kSec, 15, window), 5u);
  EXPECT_EQ(w.Add(50 * kSec, 20, window), 10u);
  // 200 s later the rise of the first 50 s has left the window.
  EXPECT_EQ(w.Add(200 * kSec, 20, window), 0u);
  EXPECT_EQ(w.Add(210 * kSec, 25, window), 5u);
  EXPECT_EQ(w.Add(220 * kSec, 2, window), 0u) << "a counter that fell starts afresh";
}

}  // namespace
}  // namespace stepwatch::analysis
