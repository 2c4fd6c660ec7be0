#include "collector/convert.h"

#include "gtest/gtest.h"

namespace stepwatch::collector {
namespace {

TEST(ConvertTest, StepEventKeepsPresenceOfOptionalFields) {
  v1::StepEvent e;
  e.set_job("j");
  e.set_rank(3);
  e.set_world_size(8);
  e.set_step(42);
  e.set_step_s(0.25);
  e.set_compute_s(0.2);
  e.set_comm_s(0.0);  // present and zero is not the same as absent
  e.set_pp_stage(1);
  e.set_pid(99);
  e.set_received_unix_nanos(123);
  analysis::StepSample s = ToStepSample(e, "node-1", 777);
  EXPECT_EQ(s.job, "j");
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.world_size, 8);
  EXPECT_EQ(s.step, 42);
  EXPECT_DOUBLE_EQ(s.step_s, 0.25);
  ASSERT_TRUE(s.compute_s.has_value());
  EXPECT_DOUBLE_EQ(*s.compute_s, 0.2);
  ASSERT_TRUE(s.comm_s.has_value());
  EXPECT_EQ(*s.comm_s, 0.0);
  EXPECT_FALSE(s.data_s.has_value());
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
  a.set_step_s(1);
  a.set_data_s(0.5);
  a.set_gpu(2);
  v1::StepEvent b;
  b.set_job("second");
  b.set_step_s(2);
  analysis::StepSample s;
  FillStepSample(a, "n", 5, &s);
  ASSERT_TRUE(s.data_s.has_value());
  FillStepSample(b, "n", 5, &s);
  EXPECT_EQ(s.job, "second");
  EXPECT_FALSE(s.data_s.has_value());
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
  analysis::GpuReading r = ToGpuReading(g, "node-2");
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
  analysis::HostReading r = ToHostReading(h, "n");
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
  j.median_step_s = 0.5;
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
  r.busy_s = 0.3;
  r.busy_vs_median_ratio = 1.3;
  r.straggler = true;
  v1::RankRow row;
  ToProto(r, &row);
  EXPECT_EQ(row.rank(), 4);
  EXPECT_EQ(row.busy_seconds(), 0.3);
  EXPECT_EQ(row.busy_vs_median_ratio(), 1.3);
  EXPECT_TRUE(row.straggler());
}

}  // namespace
}  // namespace stepwatch::collector
