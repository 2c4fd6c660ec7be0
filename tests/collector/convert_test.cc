#include "collector/convert.h"

#include <iterator>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

TEST(ConvertTest, StepEventKeepsPresenceOfOptionalFields) {
  v1::StepEvent e;
  e.set_job("j");
  e.set_rank(3);
  e.set_world_size(8);
  e.set_step(42);
  e.set_step_seconds(0.25);
  e.set_compute_seconds(0.2);
  e.set_comm_seconds(0.0);  // present and zero is not the same as absent
  e.set_pp_stage(1);
  e.set_pid(99);
  e.set_received_unix_nanos(123);
  analysis::StepEvent s = ToStepSample(e, "node-1", 777);
  EXPECT_EQ(s.job, "j");
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.world_size, 8);
  EXPECT_EQ(s.step, 42);
  EXPECT_DOUBLE_EQ(s.step_seconds, 0.25);
  ASSERT_TRUE(s.compute_seconds.has_value());
  EXPECT_DOUBLE_EQ(*s.compute_seconds, 0.2);
  ASSERT_TRUE(s.comm_seconds.has_value());
  EXPECT_EQ(*s.comm_seconds, 0.0);
  EXPECT_FALSE(s.data_seconds.has_value());
  EXPECT_FALSE(s.samples.has_value());
  EXPECT_FALSE(s.gpu.has_value());
  EXPECT_EQ(s.pp_stage, 1);
  EXPECT_FALSE(s.dp_rank.has_value());
  EXPECT_EQ(s.node, "node-1");
  EXPECT_EQ(s.pid, 99);
  EXPECT_EQ(s.received_unix_nanos, 123);
}

TEST(ConvertTest, FillStepSampleClearsFieldsOfThePreviousEvent) {
  v1::StepEvent a;
  a.set_job("first");
  a.set_step_seconds(1);
  a.set_data_seconds(0.5);
  a.set_gpu(2);
  v1::StepEvent b;
  b.set_job("second");
  b.set_step_seconds(2);
  analysis::StepEvent s;
  FillStepSample(a, "n", 5, &s);
  ASSERT_TRUE(s.data_seconds.has_value());
  FillStepSample(b, "n", 5, &s);
  EXPECT_EQ(s.job, "second");
  EXPECT_FALSE(s.data_seconds.has_value());
  EXPECT_FALSE(s.gpu.has_value());
  EXPECT_EQ(s.received_unix_nanos, 5);  // not stamped by the agent: the default
}

TEST(ConvertTest, GpuSample) {
  v1::GpuSample g;
  g.set_index(5);
  g.set_sampled_unix_nanos(10);
  g.set_utilization_gpu_ratio(0.4);
  g.set_sm_clock_mhz(1410);
  g.set_sm_clock_max_mhz(1980);
  g.set_throttle_reasons(0x20);
  g.add_pids(7);
  g.add_pids(8);
  analysis::GpuSample r = ToGpuReading(g, "node-2");
  EXPECT_EQ(r.node, "node-2");
  EXPECT_EQ(r.index, 5);
  EXPECT_EQ(r.sampled_unix_nanos, 10);
  EXPECT_EQ(r.utilization_ratio, 0.4);
  EXPECT_FALSE(r.sm_activity_ratio.has_value());
  EXPECT_EQ(r.sm_clock_mhz, 1410);
  EXPECT_EQ(r.sm_clock_max_mhz, 1980);
  EXPECT_EQ(r.throttle_reasons, 0x20u);
  EXPECT_FALSE(r.power_watts.has_value());
  EXPECT_EQ(r.pids, (std::vector<uint32_t>{7, 8}));
}

TEST(ConvertTest, HostSample) {
  v1::HostSample h;
  h.set_cpu_count(64);
  h.set_cpu_utilization_ratio(0.9);
  analysis::HostSample r = ToHostReading(h, "n");
  EXPECT_EQ(r.cpu_count, 64u);
  EXPECT_EQ(r.cpu_utilization_ratio, 0.9);
  EXPECT_FALSE(r.memory_bandwidth_bytes_per_second.has_value());
}

TEST(ConvertTest, RankExitTimeFallsBackWhenUnstamped) {
  v1::RankExit x;
  x.set_job("j");
  x.set_rank(3);
  x.set_exited_unix_nanos(1234);
  EXPECT_EQ(ExitedUnixNanos(x, 99), 1234);
  x.clear_exited_unix_nanos();
  EXPECT_EQ(ExitedUnixNanos(x, 99), 99);
}

TEST(ConvertTest, FindingEvidenceKeepsWhatIsSetAndOnlyThat) {
  analysis::Finding f;
  f.kind = analysis::FindingKind::kStraggler;
  f.evidence.compute_vs_median_ratio = 1.31;
  f.evidence.busy_vs_median_ratio = 1.2;
  f.evidence.exited_ranks = {3, 7};
  analysis::DeviceEvidence d;
  d.rank = 13;
  d.node = "node-2";
  d.gpu = 5;
  d.sm_clock_mhz = 1410;
  d.sm_clock_max_mhz = 1980;
  d.throttle_reasons = 0x20;
  d.temperature_celsius = 91;
  d.host_cpu_ratio = 0.0;  // set and zero is not the same as unset
  f.evidence.devices.push_back(d);
  analysis::DeviceEvidence host;
  host.node = "node-2";
  f.evidence.devices.push_back(host);
  v1::Finding p;
  ToProto(f, &p);
  ASSERT_TRUE(p.has_evidence());
  const v1::FindingEvidence& e = p.evidence();
  ASSERT_TRUE(e.has_compute_vs_median_ratio());
  EXPECT_DOUBLE_EQ(e.compute_vs_median_ratio(), 1.31);
  EXPECT_DOUBLE_EQ(e.busy_vs_median_ratio(), 1.2);
  EXPECT_FALSE(e.has_data_excess_seconds());
  EXPECT_FALSE(e.has_stall_limit_seconds());
  EXPECT_FALSE(e.has_slow_rank_count());
  EXPECT_EQ(e.exited_ranks_size(), 2);
  EXPECT_EQ(e.exited_ranks(1), 7);
  ASSERT_EQ(e.devices_size(), 2);
  const v1::DeviceEvidence& pd = e.devices(0);
  EXPECT_EQ(pd.rank(), 13);
  EXPECT_EQ(pd.node(), "node-2");
  EXPECT_EQ(pd.gpu(), 5);
  EXPECT_DOUBLE_EQ(pd.sm_clock_mhz(), 1410);
  EXPECT_DOUBLE_EQ(pd.sm_clock_max_mhz(), 1980);
  EXPECT_EQ(pd.throttle_reasons(), 0x20u);
  EXPECT_DOUBLE_EQ(pd.temperature_celsius(), 91);
  ASSERT_TRUE(pd.has_host_cpu_ratio());
  EXPECT_EQ(pd.host_cpu_ratio(), 0.0);
  EXPECT_FALSE(pd.has_power_watts());
  EXPECT_FALSE(pd.has_utilization_ratio());
  EXPECT_EQ(e.devices(1).gpu(), -1);
  EXPECT_EQ(e.devices(1).rank(), -1);
  EXPECT_FALSE(e.devices(1).has_host_cpu_ratio());
}

// An engine finding carries its evidence through: a stall's figures reach the proto.
TEST(ConvertTest, EngineStallEvidenceReachesTheProto) {
  analysis::Engine engine;
  constexpr int64_t kSecond = 1'000'000'000;
  for (int64_t step = 0; step < 5; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      analysis::StepEvent s;
      s.job = "j";
      s.rank = rank;
      s.world_size = 2;
      s.step = step;
      s.step_seconds = 1.0;
      s.node = "node-0";
      s.received_unix_nanos = (step + 1) * kSecond;
      ASSERT_OK(engine.AddStep(s));
    }
  }
  engine.Advance(5 * kSecond + 40 * kSecond);
  std::vector<analysis::Finding> found = engine.Findings();
  ASSERT_EQ(found.size(), 1u);
  v1::Finding p;
  ToProto(found[0], &p);
  EXPECT_EQ(p.kind(), "stall");
  EXPECT_DOUBLE_EQ(p.evidence().stall_limit_seconds(), 30);
  EXPECT_DOUBLE_EQ(p.evidence().median_step_seconds(), 1.0);
  EXPECT_EQ(p.evidence().waiting_rank_count(), 2);
  EXPECT_EQ(p.evidence().silent_rank_count(), 0);
  EXPECT_FALSE(p.evidence().has_busy_vs_median_ratio());
  EXPECT_EQ(p.summary(), found[0].summary);
}

TEST(ConvertTest, FindingAndSnapshotsToProto) {
  analysis::Finding f;
  f.kind = analysis::FindingKind::kStraggler;
  f.job = "j";
  f.rank = 13;
  f.node = "node-2";
  f.gpu = 5;
  f.since_step = 100;
  f.severity = analysis::Severity::kCritical;
  f.persistent = true;
  f.summary = "rank 13 slow";
  v1::Finding p;
  ToProto(f, &p);
  EXPECT_EQ(p.kind(), "straggler");
  EXPECT_EQ(p.severity(), "critical");
  EXPECT_EQ(p.rank(), 13);
  EXPECT_EQ(p.gpu(), 5);
  EXPECT_EQ(p.node(), "node-2");
  EXPECT_EQ(p.since_step(), 100);
  EXPECT_TRUE(p.persistent());
  EXPECT_EQ(p.summary(), "rank 13 slow");

  analysis::JobSnapshot j;
  j.job = "j";
  j.world_size = 16;
  j.last_step = 9;
  j.median_step_seconds = 0.5;
  j.steps_per_second = 2;
  j.efficiency_ratio = 0.75;
  v1::JobStatus js;
  ToProto(j, 3, &js);
  EXPECT_EQ(js.world_size(), 16);
  EXPECT_EQ(js.last_step(), 9);
  EXPECT_EQ(js.step_seconds(), 0.5);
  EXPECT_EQ(js.efficiency_ratio(), 0.75);
  EXPECT_EQ(js.finding_count(), 3);

  analysis::RankSnapshot r;
  r.rank = 4;
  r.busy_seconds = 0.3;
  r.busy_vs_median_ratio = 1.3;
  r.straggler = true;
  v1::RankRow row;
  ToProto(r, &row);
  EXPECT_EQ(row.rank(), 4);
  EXPECT_EQ(row.busy_seconds(), 0.3);
  EXPECT_EQ(row.busy_vs_median_ratio(), 1.3);
  EXPECT_TRUE(row.straggler());
}

// Sections reach the engine sorted by name whatever the map's order, and a reused sample keeps
// none of the previous event's.
TEST(ConvertTest, StepSectionsAreSortedByName) {
  v1::StepEvent e;
  e.set_job("j");
  e.set_world_size(1);
  e.set_step_seconds(1);
  const char* names[] = {"optimizer", "backward", "forward", "a/b", "Z", "forward.attn"};
  for (size_t i = 0; i < std::size(names); ++i) (*e.mutable_sections())[names[i]] = 0.1 * (i + 1);
  analysis::StepEvent s = ToStepSample(e, "n", 1);
  ASSERT_EQ(s.sections.size(), std::size(names));
  const std::vector<std::string> sorted = {"Z",       "a/b",          "backward",
                                           "forward", "forward.attn", "optimizer"};
  for (size_t i = 0; i < sorted.size(); ++i) {
    EXPECT_EQ(s.sections[i].first, sorted[i]);
    EXPECT_DOUBLE_EQ(s.sections[i].second, e.sections().at(sorted[i]));
  }

  v1::StepEvent fewer;
  fewer.set_job("j");
  fewer.set_world_size(1);
  fewer.set_step_seconds(1);
  (*fewer.mutable_sections())["backward"] = 0.25;
  FillStepSample(fewer, "n", 1, &s);
  ASSERT_EQ(s.sections.size(), 1u);
  EXPECT_EQ(s.sections[0].first, "backward");
  EXPECT_DOUBLE_EQ(s.sections[0].second, 0.25);
  FillStepSample(v1::StepEvent(), "n", 1, &s);
  EXPECT_TRUE(s.sections.empty());
}

TEST(ConvertTest, SectionsReachTheQueryAnswers) {
  analysis::Finding f;
  f.kind = analysis::FindingKind::kStraggler;
  f.evidence.section = "backward";
  f.evidence.section_vs_reference_ratio = 1.5;
  v1::Finding p;
  ToProto(f, &p);
  ASSERT_TRUE(p.evidence().has_section());
  EXPECT_EQ(p.evidence().section(), "backward");
  EXPECT_DOUBLE_EQ(p.evidence().section_vs_reference_ratio(), 1.5);
  v1::Finding none;
  ToProto(analysis::Finding{}, &none);
  EXPECT_FALSE(none.evidence().has_section());
  EXPECT_FALSE(none.evidence().has_section_vs_reference_ratio());

  analysis::JobSnapshot j;
  j.job = "j";
  j.section_names = {"forward", "backward"};
  j.sections_folded = 7;
  v1::JobStatus js;
  ToProto(j, 0, &js);
  ASSERT_EQ(js.section_names_size(), 2);
  EXPECT_EQ(js.section_names(0), "forward");
  EXPECT_EQ(js.section_names(1), "backward");
  EXPECT_EQ(js.sections_folded(), 7);

  analysis::RankSnapshot r;
  r.rank = 2;
  r.sections = {{"forward", 0.01}, {"backward", 0.03}};
  v1::RankRow row;
  ToProto(r, &row);
  ASSERT_EQ(row.sections_size(), 2);
  EXPECT_EQ(row.sections(0).name(), "forward");
  EXPECT_DOUBLE_EQ(row.sections(0).seconds(), 0.01);
  EXPECT_EQ(row.sections(1).name(), "backward");
  EXPECT_DOUBLE_EQ(row.sections(1).seconds(), 0.03);
  v1::RankRow plain;
  ToProto(analysis::RankSnapshot{}, &plain);
  EXPECT_EQ(plain.sections_size(), 0);
}

}  // namespace
}  // namespace stepwatch::collector
