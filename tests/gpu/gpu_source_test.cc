// The real NVML loader (OpenNvmlGpuSource) against the fake NVML shared library.
#include "gpu/gpu_source.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::gpu {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kTwoGpus[] = R"({
  "driver_version": "550.54.15",
  "gpus": [
    {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa", "utilization_gpu": 93,
     "utilization_memory": 40, "memory_used_bytes": 60000000000, "memory_total_bytes": 85899345920,
     "sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980, "power_mw": 650000, "power_limit_mw": 700000,
     "temperature_c": 64, "throttle_reasons": 4, "pcie_tx_kbps": 1000, "pcie_rx_kbps": 2000,
     "nvlink_tx_kbps": 4000000, "nvlink_rx_kbps": 2000000,
     "sm_activity": 0.8, "dram_bandwidth": 0.5, "tensor_activity": 0.6, "pids": [1234, 5678],
     "pcie_link_gen": 5, "pcie_link_gen_max": 5, "pcie_link_width": 16, "pcie_link_width_max": 16,
     "pcie_replays": 0, "ecc_corrected_volatile": 0, "ecc_uncorrected_volatile": 0,
     "ecc_corrected_aggregate": 0, "ecc_uncorrected_aggregate": 0, "remapped_rows_corrected": 0,
     "nvlink_up": [1, 1], "nvlink_replay_errors": [0, 0], "nvlink_recovery_errors": [0, 0],
     "nvlink_crc_flit_errors": [0, 0], "nvlink_crc_data_errors": [0, 0]},
    {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-bbbb", "utilization_gpu": 12}
  ]
})";

class GpuSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.empty());
    setenv("STEPWATCH_FAKE_NVML_STATE", state_path_.c_str(), 1);
  }

  // Replaces the state atomically, as the documentation asks writers to.
  void WriteState(const std::string& text) {
    const std::string tmp = state_path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << text;
    }
    ASSERT_EQ(rename(tmp.c_str(), state_path_.c_str()), 0);
  }

  std::unique_ptr<GpuSource> Open(const std::string& library = STEPWATCH_FAKE_NVML_PATH) {
    GpuSourceOptions options;
    options.nvml_library = library;
    return OpenNvmlGpuSource(options);
  }

  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  std::vector<v1::GpuSample> SampleOk(GpuSource* source) {
    absl::StatusOr<std::vector<v1::GpuSample>> samples = source->Sample(Now());
    EXPECT_OK(samples);
    return samples.ok() ? *samples : std::vector<v1::GpuSample>{};
  }

  const test::TempDir temp_dir_{"stepwatch-gpu-test"};
  const std::string dir_ = temp_dir_.path();
  const std::string state_path_ = temp_dir_.File("state.json");
};

TEST_F(GpuSourceTest, ReadsWhatTheStateSays) {
  WriteState(kTwoGpus);
  auto source = Open();
  v1::NodeInfo node;
  source->DescribeNode(&node);
  EXPECT_TRUE(node.nvml_available());
  EXPECT_EQ(node.nvml_error(), "");
  EXPECT_EQ(node.driver_version(), "550.54.15");
  EXPECT_EQ(node.gpu_count(), 2);

  std::vector<v1::GpuSample> first = SampleOk(source.get());
  ASSERT_EQ(first.size(), 2u);
  const v1::GpuSample& g = first[0];
  EXPECT_EQ(g.index(), 0);
  EXPECT_EQ(g.name(), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(g.uuid(), "GPU-aaaa");
  EXPECT_DOUBLE_EQ(g.utilization_gpu_ratio(), 0.93);
  EXPECT_DOUBLE_EQ(g.utilization_memory_ratio(), 0.40);
  EXPECT_EQ(g.memory_used_bytes(), 60000000000u);
  EXPECT_EQ(g.memory_total_bytes(), 85899345920u);
  EXPECT_DOUBLE_EQ(g.sm_clock_mhz(), 1755);
  EXPECT_DOUBLE_EQ(g.sm_clock_max_mhz(), 1980);
  EXPECT_DOUBLE_EQ(g.power_watts(), 650);
  EXPECT_DOUBLE_EQ(g.power_limit_watts(), 700);
  EXPECT_DOUBLE_EQ(g.temperature_celsius(), 64);
  EXPECT_EQ(g.throttle_reasons(), 4u);
  EXPECT_DOUBLE_EQ(g.pcie_tx_bytes_per_second(), 1000 * 1024.0);
  EXPECT_DOUBLE_EQ(g.pcie_rx_bytes_per_second(), 2000 * 1024.0);
  EXPECT_THAT(g.pids(), ElementsAre(1234u, 5678u));
  // Rates between two readings: nothing yet on the first sample.
  EXPECT_FALSE(g.has_nvlink_tx_bytes_per_second());
  EXPECT_FALSE(g.has_sm_activity_ratio());
  EXPECT_EQ(first[1].index(), 1);
  EXPECT_EQ(first[1].uuid(), "GPU-bbbb");
  EXPECT_DOUBLE_EQ(first[1].utilization_gpu_ratio(), 0.12);

  // Let NVLink traffic accumulate, past GPM's 100 ms minimum between samples.
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  std::vector<v1::GpuSample> second = SampleOk(source.get());
  ASSERT_EQ(second.size(), 2u);
  const v1::GpuSample& h = second[0];
  EXPECT_DOUBLE_EQ(h.sm_activity_ratio(), 0.8);
  EXPECT_DOUBLE_EQ(h.dram_bandwidth_ratio(), 0.5);
  EXPECT_DOUBLE_EQ(h.tensor_activity_ratio(), 0.6);
  ASSERT_TRUE(h.has_nvlink_tx_bytes_per_second());
  EXPECT_NEAR(h.nvlink_tx_bytes_per_second(), 4000000 * 1024.0, 0.05 * 4000000 * 1024.0);
  EXPECT_NEAR(h.nvlink_rx_bytes_per_second(), 2000000 * 1024.0, 0.05 * 2000000 * 1024.0);
  // The second GPU has no GPM and no NVLink in its state.
  EXPECT_FALSE(second[1].has_sm_activity_ratio());
  EXPECT_FALSE(second[1].has_nvlink_rx_bytes_per_second());
  // Everything the first GPU's state has is available; the second lacks what its state leaves out.
  EXPECT_THAT(h.unavailable_metrics(), IsEmpty());
  EXPECT_EQ(second[1].unavailable_metrics().at("power"), "not_supported");
  EXPECT_EQ(second[1].unavailable_metrics().at("sm_activity"), "not_supported");
  EXPECT_EQ(second[1].unavailable_metrics().at("nvlink"), "not_supported");
  EXPECT_EQ(second[1].unavailable_metrics().count("utilization"), 0u);
}

TEST_F(GpuSourceTest, SeesChangesOnTheFly) {
  WriteState(R"({"gpus":[{"utilization_gpu":10,"sm_activity":0.1}]})");
  auto source = Open();
  std::vector<v1::GpuSample> before = SampleOk(source.get());
  ASSERT_EQ(before.size(), 1u);
  EXPECT_DOUBLE_EQ(before[0].utilization_gpu_ratio(), 0.10);

  WriteState(R"({"gpus":[{"utilization_gpu":90,"sm_activity":0.7},{"utilization_gpu":5}]})");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::vector<v1::GpuSample> after;
  for (int i = 0; i < 500 && std::chrono::steady_clock::now() < deadline; ++i) {
    after = SampleOk(source.get());
    if (after.size() == 2 && after[0].has_sm_activity_ratio() &&
        after[0].sm_activity_ratio() > 0.5) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(after.size(), 2u);
  EXPECT_DOUBLE_EQ(after[0].utilization_gpu_ratio(), 0.90);
  EXPECT_DOUBLE_EQ(after[0].sm_activity_ratio(), 0.7);
  EXPECT_DOUBLE_EQ(after[1].utilization_gpu_ratio(), 0.05);
  v1::NodeInfo node;
  source->DescribeNode(&node);
  EXPECT_EQ(node.gpu_count(), 2);
}

TEST_F(GpuSourceTest, KeepsLastGoodStateWhenFileIsPartialOrMissing) {
  WriteState(R"({"gpus":[{"utilization_gpu":42}]})");
  auto source = Open();
  ASSERT_EQ(SampleOk(source.get()).size(), 1u);

  // Half a file, then no file: readings must stay at the last good state across several rechecks.
  WriteState(R"({"gpus":[{"utilization_gpu":9)");
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  int samples = 0;
  while (std::chrono::steady_clock::now() < until && samples < 1000) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 1u);
    EXPECT_DOUBLE_EQ(s[0].utilization_gpu_ratio(), 0.42);
    ++samples;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(unlink(state_path_.c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  std::vector<v1::GpuSample> s = SampleOk(source.get());
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].utilization_gpu_ratio(), 0.42);

  // A good file again is picked up.
  WriteState(R"({"gpus":[{"utilization_gpu":77}]})");
  double seen = 0;
  for (int i = 0; i < 500 && seen != 0.77; ++i) {
    std::vector<v1::GpuSample> t = SampleOk(source.get());
    if (t.size() == 1) seen = t[0].utilization_gpu_ratio();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_DOUBLE_EQ(seen, 0.77);
}

TEST_F(GpuSourceTest, AbsentFieldsAreLeftUnset) {
  WriteState(R"({"gpus":[{"name":"Bare GPU"}]})");
  auto source = Open();
  for (int round = 0; round < 2; ++round) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 1u);
    const v1::GpuSample& g = s[0];
    EXPECT_EQ(g.name(), "Bare GPU");
    EXPECT_FALSE(g.has_utilization_gpu_ratio());
    EXPECT_FALSE(g.has_utilization_memory_ratio());
    EXPECT_FALSE(g.has_memory_used_bytes());
    EXPECT_FALSE(g.has_memory_total_bytes());
    EXPECT_FALSE(g.has_sm_clock_mhz());
    EXPECT_FALSE(g.has_sm_clock_max_mhz());
    EXPECT_FALSE(g.has_power_watts());
    EXPECT_FALSE(g.has_power_limit_watts());
    EXPECT_FALSE(g.has_temperature_celsius());
    EXPECT_FALSE(g.has_throttle_reasons());
    EXPECT_FALSE(g.has_pcie_tx_bytes_per_second());
    EXPECT_FALSE(g.has_pcie_rx_bytes_per_second());
    EXPECT_FALSE(g.has_nvlink_tx_bytes_per_second());
    EXPECT_FALSE(g.has_nvlink_rx_bytes_per_second());
    EXPECT_FALSE(g.has_sm_activity_ratio());
    EXPECT_FALSE(g.has_dram_bandwidth_ratio());
    EXPECT_FALSE(g.has_tensor_activity_ratio());
    EXPECT_EQ(g.pids_size(), 0);
  }
}

// A state with `n` pids 1000, 1001, ... on one GPU of driver `driver`, with `missing` entry points.
std::string ProcessState(int n, const std::string& driver, const std::string& missing) {
  std::string pids;
  for (int i = 0; i < n; ++i) absl::StrAppend(&pids, i == 0 ? "" : ",", 1000 + i);
  return absl::StrCat(R"({"driver_version":")", driver, R"(","missing_functions":[)", missing,
                      R"(],"gpus":[{"pids":[)", pids, "]}]}");
}

std::vector<unsigned int> Pids(int n) {
  std::vector<unsigned int> pids;
  for (int i = 0; i < n; ++i) pids.push_back(1000 + i);
  return pids;
}

// Each driver variant's process entry layout, with more processes than 48 (where a 24-byte reader
// of 32-byte entries lets the driver write past a 64-entry buffer) and than the first buffer.
TEST_F(GpuSourceTest, ProcessListsMatchEveryDriverVariant) {
  struct Variant {
    const char* driver;
    const char* missing;
  };
  const Variant variants[] = {
      {"535.54.03", ""},                                              // 32-byte _v3, 24-byte _v2
      {"535.54.03", R"("nvmlDeviceGetComputeRunningProcesses_v2")"},  // only the 32-byte _v3
      {"535.86.10", R"("nvmlDeviceGetComputeRunningProcesses_v2")"},
      {"535.98", R"("nvmlDeviceGetComputeRunningProcesses_v2")"},      // no _v3: the 16-byte call
      {"535.104.05", R"("nvmlDeviceGetComputeRunningProcesses_v2")"},  // 24-byte _v3 again
      {"550.54.15", R"("nvmlDeviceGetComputeRunningProcesses_v2",
                        "nvmlDeviceGetComputeRunningProcesses_v3")"},
  };
  for (const Variant& v : variants) {
    for (int n : {5, 49, 60, 150}) {
      SCOPED_TRACE(absl::StrCat(v.driver, " without [", v.missing, "], ", n, " processes"));
      WriteState(ProcessState(n, v.driver, v.missing));
      auto source = Open();
      std::vector<v1::GpuSample> s = SampleOk(source.get());
      ASSERT_EQ(s.size(), 1u);
      EXPECT_THAT(s[0].pids(), ElementsAreArray(Pids(n)));
      EXPECT_EQ(s[0].unavailable_metrics().count("processes"), 0u);
    }
  }
}

TEST_F(GpuSourceTest, NoWorkingProcessCallIsReported) {
  WriteState(ProcessState(3, "535.98",
                          R"("nvmlDeviceGetComputeRunningProcesses_v2",
                             "nvmlDeviceGetComputeRunningProcesses")"));
  auto source = Open();
  std::vector<v1::GpuSample> s = SampleOk(source.get());
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].pids_size(), 0);
  EXPECT_EQ(s[0].unavailable_metrics().at("processes"), "missing_entry_point");
}

// Link 0 carries nothing (down) and the links differ: only the sum over all links gives the rate.
TEST_F(GpuSourceTest, NvlinkRateIsTheSumOverAllLinks) {
  WriteState(R"({"gpus":[{"nvlink_tx_kbps_per_link":[0, 100000, 200000, 300000],
                          "nvlink_rx_kbps_per_link":[0, 50000, 0, 50000]}]})");
  auto source = Open();
  ASSERT_EQ(SampleOk(source.get()).size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<v1::GpuSample> s = SampleOk(source.get());
  ASSERT_EQ(s.size(), 1u);
  ASSERT_TRUE(s[0].has_nvlink_tx_bytes_per_second());
  EXPECT_NEAR(s[0].nvlink_tx_bytes_per_second(), 600000 * 1024.0, 0.05 * 600000 * 1024.0);
  EXPECT_NEAR(s[0].nvlink_rx_bytes_per_second(), 100000 * 1024.0, 0.05 * 100000 * 1024.0);
}

// The fake writes the whole metrics array of the emulated driver (333 entries in the newest
// headers, 98 in R520..R525); a shorter array in the loader fails here under AddressSanitizer.
TEST_F(GpuSourceTest, GpmWorksWithEveryMetricArraySize) {
  for (int max : {98, 210, 333}) {
    SCOPED_TRACE(max);
    WriteState(absl::StrCat(R"({"gpm_metric_max":)", max,
                            R"(,"gpus":[{"sm_activity":0.25,"dram_bandwidth":0.5,
                                         "tensor_activity":0.75}]})"));
    auto source = Open();
    ASSERT_EQ(SampleOk(source.get()).size(), 1u);
    std::this_thread::sleep_for(std::chrono::milliseconds(110));
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 1u);
    EXPECT_DOUBLE_EQ(s[0].sm_activity_ratio(), 0.25);
    EXPECT_DOUBLE_EQ(s[0].dram_bandwidth_ratio(), 0.5);
    EXPECT_DOUBLE_EQ(s[0].tensor_activity_ratio(), 0.75);
  }
}

TEST_F(GpuSourceTest, GpmSamplesAreAtLeast100MsApart) {
  WriteState(R"({"gpus":[{"sm_activity":0.5}]})");
  void* lib = dlopen(STEPWATCH_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto min_gap = reinterpret_cast<int64_t (*)()>(dlsym(lib, "stepwatch_fake_nvml_gpm_min_gap_us"));
  ASSERT_NE(min_gap, nullptr);
  auto source = Open();
  int with_gpm = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(800);
  for (int i = 0; i < 300 && std::chrono::steady_clock::now() < until; ++i) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 1u);
    if (s[0].has_sm_activity_ratio()) {
      EXPECT_DOUBLE_EQ(s[0].sm_activity_ratio(), 0.5);
      ++with_gpm;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Sampled every ~10 ms, GPM still ran (values repeat between GPM samples)...
  EXPECT_GE(with_gpm, 5);
  // ...but the driver never saw two GPM samples of the GPU closer than 100 ms.
  EXPECT_GE(min_gap(), 100000);
  source.reset();
  dlclose(lib);
}

TEST_F(GpuSourceTest, TemperaturePrefersTheVersionedCallAndFallsBack) {
  struct Variant {
    const char* missing;
    bool available;
  };
  const Variant variants[] = {
      {"", true},
      {R"("nvmlDeviceGetTemperature")", true},   // NVML 13 without the deprecated call
      {R"("nvmlDeviceGetTemperatureV")", true},  // drivers before the V call
      {R"("nvmlDeviceGetTemperature","nvmlDeviceGetTemperatureV")", false},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.missing);
    WriteState(absl::StrCat(R"({"missing_functions":[)", v.missing,
                            R"(],"gpus":[{"temperature_c":71}]})"));
    auto source = Open();
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 1u);
    if (v.available) {
      EXPECT_DOUBLE_EQ(s[0].temperature_celsius(), 71);
      EXPECT_EQ(s[0].unavailable_metrics().count("temperature"), 0u);
    } else {
      EXPECT_FALSE(s[0].has_temperature_celsius());
      EXPECT_EQ(s[0].unavailable_metrics().at("temperature"), "missing_entry_point");
    }
  }
}

// The fake refuses UUID buffers below the documented 96 bytes, as the driver does.
TEST_F(GpuSourceTest, ReadsUuidsWithTheDocumentedBufferSize) {
  const std::string uuid = "GPU-" + std::string(85, 'f');
  WriteState(absl::StrCat(R"({"gpus":[{"uuid":")", uuid, R"("}]})"));
  auto source = Open();
  std::vector<v1::GpuSample> s = SampleOk(source.get());
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].uuid(), uuid);
}

TEST_F(GpuSourceTest, ReportsWhyEachMetricIsUnavailable) {
  WriteState(R"({"gpus":[{"utilization_gpu":50,"power_mw":300000,"temperature_c":60,
      "sm_activity":0.5,"pids":[7],
      "errors":{"nvmlGpmSampleGet":4,"nvmlDeviceGetPowerUsage":3,
                "nvmlDeviceGetComputeRunningProcesses_v2":4,"nvmlDeviceGetUtilizationRates":15}}]})");
  auto source = Open();
  for (int round = 0; round < 2; ++round) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 1u);
    const auto& why = s[0].unavailable_metrics();
    EXPECT_EQ(why.at("sm_activity"), "no_permission");
    EXPECT_EQ(why.at("tensor_activity"), "no_permission");
    EXPECT_EQ(why.at("power"), "not_supported");
    EXPECT_EQ(why.at("processes"), "no_permission");
    EXPECT_EQ(why.at("utilization"), "gpu_lost");
    EXPECT_EQ(why.count("temperature"), 0u);
    EXPECT_DOUBLE_EQ(s[0].temperature_celsius(), 60);
    EXPECT_FALSE(s[0].has_power_watts());
    EXPECT_EQ(s[0].pids_size(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(110));
  }
}

TEST_F(GpuSourceTest, DriverWithoutGpm) {
  WriteState(R"({"driver_version":"515.65.01","missing_functions":["nvmlGpmQueryDeviceSupport",
      "nvmlGpmSampleAlloc","nvmlGpmSampleGet","nvmlGpmMetricsGet"],
      "gpus":[{"utilization_gpu":40,"sm_activity":0.5}]})");
  auto source = Open();
  for (int round = 0; round < 2; ++round) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 1u);
    EXPECT_FALSE(s[0].has_sm_activity_ratio());
    EXPECT_EQ(s[0].unavailable_metrics().at("sm_activity"), "missing_entry_point");
    EXPECT_DOUBLE_EQ(s[0].utilization_gpu_ratio(), 0.40);
    std::this_thread::sleep_for(std::chrono::milliseconds(110));
  }
}

TEST_F(GpuSourceTest, MigGpuReportsDeviceWideReadingsOnly) {
  WriteState(R"({"gpus":[{"mig_mode":1,"utilization_gpu":40,"memory_total_bytes":1000,
      "memory_used_bytes":10,"power_mw":100000,"sm_activity":0.5,"pids":[11,12]},
      {"utilization_gpu":30,"sm_activity":0.25}]})");
  auto source = Open();
  for (int round = 0; round < 2; ++round) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 2u);
    EXPECT_FALSE(s[0].has_utilization_gpu_ratio());
    EXPECT_FALSE(s[0].has_sm_activity_ratio());
    EXPECT_EQ(s[0].unavailable_metrics().at("utilization"), "mig_enabled");
    EXPECT_EQ(s[0].unavailable_metrics().at("sm_activity"), "mig_enabled");
    EXPECT_EQ(s[0].memory_total_bytes(), 1000u);
    EXPECT_DOUBLE_EQ(s[0].power_watts(), 100);
    EXPECT_THAT(s[0].pids(), ElementsAre(11u, 12u));
    EXPECT_DOUBLE_EQ(s[1].utilization_gpu_ratio(), 0.30);
    EXPECT_EQ(s[1].unavailable_metrics().count("utilization"), 0u);
    std::this_thread::sleep_for(std::chrono::milliseconds(110));
  }
}

TEST_F(GpuSourceTest, GrowsTheProcessBufferForManyProcesses) {
  std::string pids;
  for (int i = 0; i < 150; ++i) absl::StrAppend(&pids, i == 0 ? "" : ",", 1000 + i);
  WriteState(absl::StrCat(R"({"gpus":[{"pids":[)", pids, "]}]}"));
  auto source = Open();
  std::vector<v1::GpuSample> s = SampleOk(source.get());
  ASSERT_EQ(s.size(), 1u);
  ASSERT_EQ(s[0].pids_size(), 150);
  EXPECT_EQ(s[0].pids(0), 1000u);
  EXPECT_EQ(s[0].pids(149), 1149u);
}

TEST_F(GpuSourceTest, MissingEntryPointsLeaveMetricsUnset) {
  WriteState(kTwoGpus);
  auto source = Open(STEPWATCH_FAKE_NVML_MINIMAL_PATH);
  v1::NodeInfo node;
  source->DescribeNode(&node);
  EXPECT_TRUE(node.nvml_available());
  EXPECT_EQ(node.driver_version(), "550.54.15");
  for (int round = 0; round < 2; ++round) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].name(), "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(s[0].uuid(), "");
    EXPECT_FALSE(s[0].has_utilization_gpu_ratio());
    EXPECT_FALSE(s[0].has_memory_total_bytes());
    EXPECT_FALSE(s[0].has_power_watts());
    EXPECT_FALSE(s[0].has_sm_activity_ratio());
    EXPECT_FALSE(s[0].has_nvlink_tx_bytes_per_second());
    EXPECT_EQ(s[0].pids_size(), 0);
  }
}

TEST_F(GpuSourceTest, ShutsNvmlDownOnDestruction) {
  WriteState(kTwoGpus);
  // Hold the library loaded ourselves so that its state outlives the source.
  void* lib = dlopen(STEPWATCH_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto init_count = reinterpret_cast<int (*)()>(dlsym(lib, "stepwatch_fake_nvml_init_count"));
  ASSERT_NE(init_count, nullptr);
  EXPECT_EQ(init_count(), 0);
  auto source = Open();
  EXPECT_EQ(init_count(), 1);
  ASSERT_EQ(SampleOk(source.get()).size(), 2u);
  source.reset();
  EXPECT_EQ(init_count(), 0);
  dlclose(lib);
}

TEST_F(GpuSourceTest, NonexistentLibraryMeansNoNvml) {
  const std::string missing = dir_ + "/no-such-libnvidia-ml.so.1";
  auto source = Open(missing);
  v1::NodeInfo node;
  source->DescribeNode(&node);
  EXPECT_FALSE(node.nvml_available());
  EXPECT_THAT(node.nvml_error(), HasSubstr(missing));
  EXPECT_EQ(node.gpu_count(), 0);
  EXPECT_TRUE(SampleOk(source.get()).empty());
}

TEST_F(GpuSourceTest, FailedInitMeansNoNvml) {
  WriteState(R"({"fail_init": true, "gpus":[{"utilization_gpu":50}]})");
  auto source = Open();
  v1::NodeInfo node;
  source->DescribeNode(&node);
  EXPECT_FALSE(node.nvml_available());
  EXPECT_THAT(node.nvml_error(), HasSubstr("nvmlInit"));
  EXPECT_THAT(node.nvml_error(), HasSubstr("Driver Not Loaded"));
  EXPECT_TRUE(SampleOk(source.get()).empty());
}

TEST_F(GpuSourceTest, FakeWithoutStateVariableFailsInit) {
  unsetenv("STEPWATCH_FAKE_NVML_STATE");
  auto source = Open();
  v1::NodeInfo node;
  source->DescribeNode(&node);
  EXPECT_FALSE(node.nvml_available());
  EXPECT_THAT(node.nvml_error(), HasSubstr("nvmlInit"));
}

}  // namespace
}  // namespace stepwatch::gpu
