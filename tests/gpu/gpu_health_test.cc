// GPU health readings (gpu/gpu_health.cc) through the real NVML loader and the fake NVML.
#include "gpu/gpu_health.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gpu/gpu_source.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::gpu {
namespace {

using ::testing::HasSubstr;

// GPU 0: an SXM GPU at gen 5 x16 with 18 NVLinks, ECC and row remapping; GPU 1: a PCIe GPU
// without NVLink, whose ECC is off.
constexpr char kHealthy[] = R"({"gpus": [
  {"utilization_gpu": 90, "pcie_link_gen": 5, "pcie_link_gen_max": 5, "pcie_link_width": 16,
   "pcie_link_width_max": 16, "pcie_replays": 7,
   "ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 0,
   "ecc_corrected_aggregate": 40, "ecc_uncorrected_aggregate": 2,
   "remapped_rows_corrected": 1, "remapped_rows_uncorrected": 0,
   "remapped_rows_pending": 0, "remapped_rows_failure": 0,
   "nvlink_up": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],
   "nvlink_replay_errors": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,5],
   "nvlink_recovery_errors": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,6],
   "nvlink_crc_flit_errors": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,7],
   "nvlink_crc_data_errors": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,8]},
  {"utilization_gpu": 10, "pcie_link_gen": 1, "pcie_link_gen_max": 4, "pcie_link_width": 16,
   "pcie_link_width_max": 16, "pcie_replays": 0}
]})";

class GpuHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_path_ = dir_.File("state.json");
    setenv("STEPWATCH_FAKE_NVML_STATE", state_path_.c_str(), 1);
  }

  // Replaces the state atomically, as docs/fake-nvml.md asks writers to.
  void WriteState(const std::string& text) {
    const std::string tmp = state_path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << text;
    }
    ASSERT_EQ(rename(tmp.c_str(), state_path_.c_str()), 0);
  }

  static std::unique_ptr<GpuSource> Open(const std::string& library = STEPWATCH_FAKE_NVML_PATH) {
    GpuSourceOptions options;
    options.nvml_library = library;
    return OpenNvmlGpuSource(options);
  }

  static std::vector<v1::GpuSample> SampleOk(GpuSource* source, int64_t now = 1) {
    absl::StatusOr<std::vector<v1::GpuSample>> samples = source->Sample(now);
    EXPECT_OK(samples);
    return samples.ok() ? *samples : std::vector<v1::GpuSample>{};
  }

  // Samples until `done` holds (the fake re-reads its state at most every 100 ms); bounded.
  static std::vector<v1::GpuSample> SampleUntil(
      GpuSource* source, const std::function<bool(const std::vector<v1::GpuSample>&)>& done,
      int64_t now = 1) {
    std::vector<v1::GpuSample> s;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (int i = 0; i < 500 && std::chrono::steady_clock::now() < deadline; ++i) {
      s = SampleOk(source, now);
      if (done(s)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return s;
  }

  static std::string Unavailable(const v1::GpuSample& g, const std::string& reading) {
    const auto it = g.unavailable_metrics().find(reading);
    return it == g.unavailable_metrics().end() ? "ok" : it->second;
  }

  test::TempDir dir_{"stepwatch-gpu-health"};
  std::string state_path_;
};

TEST_F(GpuHealthTest, ReadsEveryHealthValue) {
  WriteState(kHealthy);
  auto source = Open();
  std::vector<v1::GpuSample> s = SampleOk(source.get());
  ASSERT_EQ(s.size(), 2u);
  ASSERT_TRUE(s[0].has_health());
  const v1::GpuHealth& h = s[0].health();
  EXPECT_EQ(h.pcie_link_generation_current(), 5u);
  EXPECT_EQ(h.pcie_link_generation_max(), 5u);
  EXPECT_EQ(h.pcie_link_width_current(), 16u);
  EXPECT_EQ(h.pcie_link_width_max(), 16u);
  EXPECT_EQ(h.pcie_replays_total(), 7u);
  ASSERT_TRUE(h.has_ecc());
  // Each of the four (error type, counter type) pairs reaches its own field.
  EXPECT_EQ(h.ecc().corrected_volatile(), 3u);
  EXPECT_EQ(h.ecc().uncorrected_volatile(), 0u);
  EXPECT_EQ(h.ecc().corrected_aggregate(), 40u);
  EXPECT_EQ(h.ecc().uncorrected_aggregate(), 2u);
  ASSERT_TRUE(h.has_remapped_rows());
  EXPECT_EQ(h.remapped_rows().corrected(), 1u);
  EXPECT_FALSE(h.remapped_rows().pending());
  ASSERT_EQ(h.nvlinks_size(), 18);
  for (int l = 0; l < 18; ++l) {
    EXPECT_EQ(h.nvlinks(l).link(), static_cast<unsigned int>(l));
    EXPECT_TRUE(h.nvlinks(l).up());
  }
  // Each nvmlNvLinkErrorCounter_t value reaches its own field.
  EXPECT_EQ(h.nvlinks(17).replay_errors_total(), 5u);
  EXPECT_EQ(h.nvlinks(17).recovery_errors_total(), 6u);
  EXPECT_EQ(h.nvlinks(17).crc_flit_errors_total(), 7u);
  EXPECT_EQ(h.nvlinks(17).crc_data_errors_total(), 8u);
  EXPECT_EQ(h.xids_size(), 0);
  for (const char* reading : kGpuHealthReadingNames) {
    EXPECT_EQ(Unavailable(s[0], reading), "ok") << reading;
  }

  // The PCIe GPU: an idle link trained down is read as it is; ECC, remapping, NVLink missing.
  ASSERT_TRUE(s[1].has_health());
  EXPECT_EQ(s[1].health().pcie_link_generation_current(), 1u);
  EXPECT_EQ(s[1].health().pcie_link_generation_max(), 4u);
  EXPECT_FALSE(s[1].health().has_ecc());
  EXPECT_FALSE(s[1].health().has_remapped_rows());
  EXPECT_EQ(s[1].health().nvlinks_size(), 0);
  EXPECT_EQ(Unavailable(s[1], "ecc"), "not_supported");
  EXPECT_EQ(Unavailable(s[1], "remapped_rows"), "not_supported");
  EXPECT_EQ(Unavailable(s[1], "nvlink_state"), "not_supported");
  EXPECT_EQ(Unavailable(s[1], "pcie_link"), "ok");
  EXPECT_EQ(Unavailable(s[1], "xid"), "ok");
}

TEST_F(GpuHealthTest, SeesFaultsAppearWhileRunning) {
  WriteState(kHealthy);
  auto source = Open();
  ASSERT_EQ(SampleOk(source.get()).size(), 2u);
  // Link 3 down, gen 3 x8, uncorrected ECC rising, a remap pending.
  std::string faulty = kHealthy;
  faulty.replace(faulty.find("[1,1,1,1,1"), 10, "[1,1,1,0,1");
  faulty.replace(faulty.find("\"pcie_link_gen\": 5"), 18, "\"pcie_link_gen\": 3");
  faulty.replace(faulty.find("\"pcie_link_width\": 16"), 21, "\"pcie_link_width\": 8 ");
  faulty.replace(faulty.find("\"ecc_uncorrected_volatile\": 0"), 29,
                 "\"ecc_uncorrected_volatile\": 9");
  faulty.replace(faulty.find("\"remapped_rows_pending\": 0"), 26, "\"remapped_rows_pending\": 1");
  WriteState(faulty);
  std::vector<v1::GpuSample> s = SampleUntil(source.get(), [](const auto& s) {
    return s.size() == 2 && s[0].health().nvlinks_size() == 18 && !s[0].health().nvlinks(3).up();
  });
  ASSERT_EQ(s.size(), 2u);
  const v1::GpuHealth& h = s[0].health();
  ASSERT_EQ(h.nvlinks_size(), 18);
  EXPECT_FALSE(h.nvlinks(3).up());
  EXPECT_TRUE(h.nvlinks(4).up());
  EXPECT_EQ(h.pcie_link_generation_current(), 3u);
  EXPECT_EQ(h.pcie_link_width_current(), 8u);
  EXPECT_EQ(h.ecc().uncorrected_volatile(), 9u);
  EXPECT_TRUE(h.remapped_rows().pending());
}

TEST_F(GpuHealthTest, XidEventsAreCountedOnceWithoutWaiting) {
  WriteState(kHealthy);
  void* lib = dlopen(STEPWATCH_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto max_wait =
      reinterpret_cast<int64_t (*)()>(dlsym(lib, "stepwatch_fake_nvml_max_event_wait_ms"));
  ASSERT_NE(max_wait, nullptr);
  auto source = Open();
  // The first reading registers the GPUs; events from then on are delivered.
  ASSERT_EQ(SampleOk(source.get(), 100).size(), 2u);
  std::string with_xids = kHealthy;
  with_xids.replace(with_xids.find("{\"utilization_gpu\": 10"), 22,
                    R"({"xids": [79, 13, 79], "utilization_gpu": 10)");
  WriteState(with_xids);
  std::vector<v1::GpuSample> s = SampleUntil(
      source.get(), [](const auto& s) { return s.size() == 2 && s[1].health().xids_size() > 0; },
      200);
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(s[1].health().xids_size(), 2);
  EXPECT_EQ(s[1].health().xids(0).xid(), 13u);
  EXPECT_EQ(s[1].health().xids(0).count(), 1u);
  EXPECT_EQ(s[1].health().xids(1).xid(), 79u);
  EXPECT_EQ(s[1].health().xids(1).count(), 2u);
  EXPECT_EQ(s[1].health().xids(1).last_unix_nanos(), 200);
  EXPECT_EQ(s[0].health().xids_size(), 0);  // Attributed to the GPU the event names.
  // Consumed: later readings neither count them again nor move their time.
  for (int i = 0; i < 3; ++i) {
    s = SampleOk(source.get(), 300 + i);
    ASSERT_EQ(s.size(), 2u);
    ASSERT_EQ(s[1].health().xids_size(), 2);
    EXPECT_EQ(s[1].health().xids(1).count(), 2u);
    EXPECT_EQ(s[1].health().xids(1).last_unix_nanos(), 200);
  }
  EXPECT_EQ(max_wait(), 0) << "the sampler must never wait for events";
  source.reset();
  dlclose(lib);
}

TEST_F(GpuHealthTest, BoundsTheXidCodesKept) {
  WriteState(kHealthy);
  auto source = Open();
  ASSERT_EQ(SampleOk(source.get()).size(), 2u);
  std::string codes;
  for (int x = 1; x <= kMaxXidCodesPerGpu + 4; ++x) absl::StrAppend(&codes, x == 1 ? "" : ",", x);
  std::string with_xids = kHealthy;
  with_xids.replace(with_xids.find("{\"utilization_gpu\": 90"), 22,
                    absl::StrCat(R"({"xids": [)", codes, R"(], "utilization_gpu": 90)"));
  WriteState(with_xids);
  std::vector<v1::GpuSample> s = SampleUntil(source.get(), [](const auto& s) {
    return !s.empty() && s[0].health().xid_events_dropped() > 0;
  });
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s[0].health().xids_size(), kMaxXidCodesPerGpu);
  EXPECT_EQ(s[0].health().xid_events_dropped(), 4u);
}

TEST_F(GpuHealthTest, NotSupportedPerEntryPointIsUnavailable) {
  std::string state = kHealthy;
  state.replace(state.find("{\"utilization_gpu\": 90"), 1,
                R"({"errors": {"nvmlDeviceGetPcieReplayCounter": 3,
                               "nvmlDeviceGetNvLinkErrorCounter": 3,
                               "nvmlDeviceGetMaxPcieLinkGeneration": 3,
                               "nvmlDeviceRegisterEvents": 3,
                               "nvmlDeviceGetRemappedRows": 4},)");
  WriteState(state);
  auto source = Open();
  for (int round = 0; round < 2; ++round) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 2u);
    const v1::GpuHealth& h = s[0].health();
    EXPECT_EQ(Unavailable(s[0], "pcie_replays"), "not_supported");
    EXPECT_FALSE(h.has_pcie_replays_total());
    // The GPU's own maximum stands in for the slot's.
    EXPECT_EQ(Unavailable(s[0], "pcie_link"), "ok");
    EXPECT_EQ(h.pcie_link_generation_max(), 5u);
    EXPECT_EQ(Unavailable(s[0], "nvlink_errors"), "not_supported");
    EXPECT_EQ(Unavailable(s[0], "nvlink_state"), "ok");
    ASSERT_EQ(h.nvlinks_size(), 18);
    EXPECT_FALSE(h.nvlinks(17).has_replay_errors_total());
    EXPECT_EQ(Unavailable(s[0], "xid"), "not_supported");
    EXPECT_EQ(Unavailable(s[0], "remapped_rows"), "no_permission");
    EXPECT_EQ(Unavailable(s[0], "ecc"), "ok");
    EXPECT_EQ(Unavailable(s[1], "xid"), "ok");
  }
}

TEST_F(GpuHealthTest, NvlinkCountersTheDriverLacksAreLeftUnset) {
  WriteState(R"({"gpus": [{"nvlink_up": [1, 0], "nvlink_replay_errors": [4, 9]}]})");
  auto source = Open();
  std::vector<v1::GpuSample> s = SampleOk(source.get());
  ASSERT_EQ(s.size(), 1u);
  ASSERT_EQ(s[0].health().nvlinks_size(), 2);
  EXPECT_EQ(Unavailable(s[0], "nvlink_errors"), "ok");
  EXPECT_EQ(s[0].health().nvlinks(1).replay_errors_total(), 9u);
  EXPECT_FALSE(s[0].health().nvlinks(1).up());
  EXPECT_FALSE(s[0].health().nvlinks(1).has_crc_data_errors_total());
  EXPECT_FALSE(s[0].health().nvlinks(0).has_recovery_errors_total());
}

TEST_F(GpuHealthTest, MissingEntryPointsAreUnavailable) {
  WriteState(kHealthy);
  auto source = Open(STEPWATCH_FAKE_NVML_MINIMAL_PATH);
  for (int round = 0; round < 2; ++round) {
    std::vector<v1::GpuSample> s = SampleOk(source.get());
    ASSERT_EQ(s.size(), 2u);
    EXPECT_FALSE(s[0].has_health());
    for (const char* reading : kGpuHealthReadingNames) {
      EXPECT_EQ(Unavailable(s[0], reading), "missing_entry_point") << reading;
    }
  }
}

TEST_F(GpuHealthTest, EntryPointsTheDriverLacksAreUnavailable) {
  std::string state = kHealthy;
  state.replace(0, 1, R"({"missing_functions": ["nvmlEventSetWait_v2",
                        "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetNvLinkState"],)");
  WriteState(state);
  auto source = Open();
  std::vector<v1::GpuSample> s = SampleOk(source.get());
  ASSERT_EQ(s.size(), 2u);
  // FUNCTION_NOT_FOUND from an exported symbol reads as a missing entry point.
  EXPECT_EQ(Unavailable(s[0], "xid"), "missing_entry_point");
  EXPECT_EQ(Unavailable(s[0], "ecc"), "missing_entry_point");
  EXPECT_EQ(Unavailable(s[0], "nvlink_state"), "missing_entry_point");
  EXPECT_EQ(s[0].health().nvlinks_size(), 0);
  EXPECT_EQ(s[0].health().pcie_link_generation_current(), 5u);
}

// The health readings' availability is exported with the others (gpu_metric_available).
TEST(GpuHealthReadingNamesTest, AreAmongTheGpuMetricNames) {
  const std::set<std::string> all(std::begin(kGpuMetricNames), std::end(kGpuMetricNames));
  for (const char* reading : kGpuHealthReadingNames) EXPECT_EQ(all.count(reading), 1u) << reading;
}

}  // namespace
}  // namespace stepwatch::gpu
