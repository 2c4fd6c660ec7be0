// The host sampler on fake trees (copies of testdata/ in a temporary folder) and on this machine.
#include "host/host_sampler.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "host/memory_bandwidth.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::host {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSecond = 1000000000;

class HostSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(temp_dir_.path().empty()); }

  // Copies testdata/<name> over the fake root.
  void Install(const std::string& name) {
    fs::copy(fs::path(STEPWATCH_HOST_TESTDATA) / name, root_,
             fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }

  void Write(const std::string& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream out(root_ / relative, std::ios::trunc);
    out << text;
  }

  std::unique_ptr<HostSampler> Make() {
    HostSamplerOptions options;
    options.root = root_.string();
    return MakeHostSampler(options);
  }

  const test::TempDir temp_dir_{"stepwatch-host-test"};
  const fs::path root_{temp_dir_.path()};
};

TEST_F(HostSamplerTest, ReadsTheCapturedTree) {
  Install("debian12-2cpu");
  auto sampler = Make();
  absl::StatusOr<v1::HostSample> s = sampler->Sample(5 * kSecond);
  ASSERT_OK(s);
  EXPECT_EQ(s->sampled_unix_nanos(), 5 * kSecond);
  EXPECT_EQ(s->cpu_count(), 2u);
  EXPECT_FALSE(s->has_cpu_utilization_ratio());  // needs a previous reading
  EXPECT_EQ(s->memory_total_bytes(), 24684096ull * 1024);
  EXPECT_EQ(s->memory_available_bytes(), 24096076ull * 1024);
  EXPECT_EQ(s->network_receive_bytes_total(), 109767542u);
  EXPECT_EQ(s->network_transmit_bytes_total(), 90869u);
  EXPECT_FALSE(s->has_memory_bandwidth_bytes_per_second());
  EXPECT_EQ(s->memory_bandwidth_source(), "");
}

TEST_F(HostSamplerTest, CpuUtilizationFromDeltas) {
  Install("debian12-2cpu");
  Write("proc/stat", "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 0 1 1 0 0 0 0 0 0\n");
  auto sampler = Make();
  ASSERT_OK(sampler->Sample(1 * kSecond));
  // +300 busy (user 200, system 100), +100 idle, +100 iowait: 300 / 500 busy.
  Write("proc/stat", "cpu  300 0 200 900 100 0 0 0 0 0\ncpu0 1 0 1 1 0 0 0 0 0 0\n");
  absl::StatusOr<v1::HostSample> s = sampler->Sample(2 * kSecond);
  ASSERT_OK(s);
  EXPECT_EQ(s->cpu_count(), 1u);
  ASSERT_TRUE(s->has_cpu_utilization_ratio());
  EXPECT_DOUBLE_EQ(s->cpu_utilization_ratio(), 0.6);
}

TEST_F(HostSamplerTest, MissingFiles) {
  auto sampler = Make();
  EXPECT_FALSE(sampler->Sample(kSecond).ok());  // no /proc/stat at all

  Install("debian12-2cpu");
  fs::remove(root_ / "proc/meminfo");
  Write("proc/net/dev", "garbage\n");
  absl::StatusOr<v1::HostSample> s = sampler->Sample(2 * kSecond);
  ASSERT_OK(s);
  EXPECT_EQ(s->cpu_count(), 2u);
  EXPECT_FALSE(s->has_memory_total_bytes());
  EXPECT_FALSE(s->has_memory_available_bytes());
  EXPECT_FALSE(s->has_network_receive_bytes_total());
}

TEST_F(HostSamplerTest, MemoryBandwidthFromResctrl) {
  Install("debian12-2cpu");
  Install("resctrl");
  const std::string mon = "sys/fs/resctrl/mon_data/";
  auto sampler = Make();
  absl::StatusOr<v1::HostSample> first = sampler->Sample(10 * kSecond);
  ASSERT_OK(first);
  EXPECT_EQ(first->memory_bandwidth_source(), "resctrl");
  EXPECT_FALSE(first->has_memory_bandwidth_bytes_per_second());

  // Default group: +4e9 and +2e9; the control group "batch": +1e9 (its other domain stays
  // Unavailable and is left out). 7e9 bytes over 2 s.
  Write(mon + "mon_L3_00/mbm_total_bytes", "4001000000\n");
  Write(mon + "mon_L3_01/mbm_total_bytes", "2002000000\n");
  Write("sys/fs/resctrl/batch/mon_data/mon_L3_00/mbm_total_bytes", "1000300000\n");
  absl::StatusOr<v1::HostSample> second = sampler->Sample(12 * kSecond);
  ASSERT_OK(second);
  EXPECT_EQ(second->memory_bandwidth_source(), "resctrl");
  ASSERT_TRUE(second->has_memory_bandwidth_bytes_per_second());
  EXPECT_DOUBLE_EQ(second->memory_bandwidth_bytes_per_second(), 3.5e9);

  // A new control group changes what is summed: no rate across that change, then rates resume.
  Write("sys/fs/resctrl/train/mon_data/mon_L3_00/mbm_total_bytes", "999999999999\n");
  absl::StatusOr<v1::HostSample> third = sampler->Sample(13 * kSecond);
  ASSERT_OK(third);
  EXPECT_FALSE(third->has_memory_bandwidth_bytes_per_second());
  Write("sys/fs/resctrl/train/mon_data/mon_L3_00/mbm_total_bytes", "1999999999999\n");
  absl::StatusOr<v1::HostSample> fourth = sampler->Sample(14 * kSecond);
  ASSERT_OK(fourth);
  EXPECT_DOUBLE_EQ(fourth->memory_bandwidth_bytes_per_second(), 1e12);
}

TEST_F(HostSamplerTest, ResctrlWithoutReadableCountersIsUnavailable) {
  Install("debian12-2cpu");
  Write("sys/fs/resctrl/mon_data/mon_L3_00/mbm_total_bytes", "Unavailable\n");
  absl::StatusOr<std::unique_ptr<MemoryTrafficCounter>> counter =
      OpenResctrlCounter(root_.string());
  EXPECT_FALSE(counter.ok());
  auto sampler = Make();
  absl::StatusOr<v1::HostSample> s = sampler->Sample(kSecond);
  ASSERT_OK(s);
  EXPECT_EQ(s->memory_bandwidth_source(), "");
}

TEST_F(HostSamplerTest, DiscoversUncoreImcEvents) {
  Install("perf-imc");
  absl::StatusOr<std::vector<ImcEvent>> events = DiscoverImcEvents(root_.string());
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), 4u);  // two PMUs x (read, write); the core PMU "cpu" is not one
  const ImcEvent& read0 = (*events)[0];
  EXPECT_EQ(read0.pmu, "uncore_imc_0");
  EXPECT_EQ(read0.name, "cas_count_read");
  EXPECT_EQ(read0.type, 14u);
  EXPECT_EQ(read0.config, 0x0304u);
  EXPECT_EQ(read0.cpu, 0);
  EXPECT_DOUBLE_EQ(read0.bytes_per_count, 64.0);  // 6.103515625e-5 MiB per CAS
  EXPECT_EQ((*events)[1].name, "cas_count_write");
  EXPECT_EQ((*events)[1].config, 0x0c04u);
  EXPECT_EQ((*events)[3].pmu, "uncore_imc_1");
  EXPECT_EQ((*events)[3].type, 15u);

  // perf counters belong to the running kernel, so a fake root never opens them.
  Install("debian12-2cpu");
  auto sampler = Make();
  absl::StatusOr<v1::HostSample> s = sampler->Sample(kSecond);
  ASSERT_OK(s);
  EXPECT_EQ(s->memory_bandwidth_source(), "");
}

TEST_F(HostSamplerTest, NoImcPmuIsNotFound) {
  EXPECT_FALSE(DiscoverImcEvents(root_.string()).ok());
}

TEST(HostSamplerRealRootTest, ReadsThisMachine) {
  auto sampler = MakeHostSampler(HostSamplerOptions{});
  absl::StatusOr<v1::HostSample> first = sampler->Sample(kSecond);
  ASSERT_OK(first);
  EXPECT_GT(first->cpu_count(), 0u);
  EXPECT_GT(first->memory_total_bytes(), 0u);
  EXPECT_LE(first->memory_available_bytes(), first->memory_total_bytes());
  absl::StatusOr<v1::HostSample> second = sampler->Sample(2 * kSecond);
  ASSERT_OK(second);
  if (second->has_cpu_utilization_ratio()) {
    EXPECT_GE(second->cpu_utilization_ratio(), 0.0);
    EXPECT_LE(second->cpu_utilization_ratio(), 1.0);
  }
}

}  // namespace
}  // namespace stepwatch::host
