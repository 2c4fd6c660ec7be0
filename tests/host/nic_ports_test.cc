// The InfiniBand/RoCE port parsers on real sysfs contents, and the reader on a fake sysfs tree
// written into a temporary folder: values, garbage, missing files and the bounds.
#include "host/nic_ports.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "host/host_sampler.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::host {
namespace {

using test::StatusIs;

namespace fs = std::filesystem;

TEST(NicPortParseTest, StatesAsTheKernelWritesThem) {
  EXPECT_EQ(*ParseIbPortState("4: ACTIVE\n"), 4u);
  EXPECT_EQ(*ParseIbPortState("1: DOWN\n"), 1u);
  EXPECT_EQ(*ParseIbPortState("5: LinkUp\n"), 5u);
  EXPECT_EQ(*ParseIbPortState("3: Disabled"), 3u);
  EXPECT_EQ(*ParseIbPortState("2"), 2u);
  for (const char* bad : {"", "\n", "ACTIVE", ": ACTIVE", "-1: DOWN", "4x: ACTIVE", "99999: X"}) {
    EXPECT_THAT(ParseIbPortState(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(NicPortParseTest, RatesInBytesPerSecondWithWidth) {
  absl::StatusOr<IbRate> hdr = ParseIbRate("200 Gb/sec (4X HDR)\n");
  ASSERT_OK(hdr.status());
  EXPECT_DOUBLE_EQ(hdr->bytes_per_second, 25e9);
  EXPECT_EQ(hdr->link_width, 4u);
  absl::StatusOr<IbRate> sdr = ParseIbRate("2.5 Gb/sec (1X SDR)");
  ASSERT_OK(sdr.status());
  EXPECT_DOUBLE_EQ(sdr->bytes_per_second, 2.5e9 / 8);
  EXPECT_EQ(sdr->link_width, 1u);
  absl::StatusOr<IbRate> bare = ParseIbRate("100 Gb/sec");
  ASSERT_OK(bare.status());
  EXPECT_DOUBLE_EQ(bare->bytes_per_second, 12.5e9);
  EXPECT_FALSE(bare->link_width.has_value());
  for (const char* bad : {"", "fast", "Gb/sec", "-5 Gb/sec (4X)", "nan Gb/sec", "200 Mb/sec"}) {
    EXPECT_THAT(ParseIbRate(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(NicPortParseTest, Counters) {
  EXPECT_EQ(*ParseSysfsCounter("0\n"), 0u);
  EXPECT_EQ(*ParseSysfsCounter("18446744073709551615\n"), 18446744073709551615u);
  for (const char* bad : {"", "-1", "12 34", "0x10", "18446744073709551616", "N/A\n"}) {
    EXPECT_THAT(ParseSysfsCounter(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(NicPortParseTest, Names) {
  EXPECT_TRUE(IsNicName("mlx5_0"));
  EXPECT_TRUE(IsNicName("bnxt_re0"));
  EXPECT_FALSE(IsNicName(""));
  EXPECT_FALSE(IsNicName("a b"));
  EXPECT_FALSE(IsNicName("mlx\"5"));
  EXPECT_FALSE(IsNicName(std::string(kMaxNicNameBytes + 1, 'a')));
}

// Writes ports under root/sys/class/infiniband the way the kernel lays them out.
class FakeSysfs {
 public:
  explicit FakeSysfs(std::string root) : root_(std::move(root)) {}

  std::string PortDir(const std::string& device, int port) const {
    return absl::StrCat(root_, "/sys/class/infiniband/", device, "/ports/", port);
  }
  void Write(const std::string& path, const std::string& text) const {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
  }
  // A healthy HDR port with the given symbol errors.
  void AddPort(const std::string& device, int port, uint64_t symbol_errors = 0) const {
    const std::string dir = PortDir(device, port);
    Write(dir + "/state", "4: ACTIVE\n");
    Write(dir + "/phys_state", "5: LinkUp\n");
    Write(dir + "/rate", "200 Gb/sec (4X HDR)\n");
    Write(dir + "/link_layer", "InfiniBand\n");
    Write(dir + "/counters/symbol_error", absl::StrCat(symbol_errors, "\n"));
    for (const char* c :
         {"port_rcv_errors", "link_downed", "port_xmit_discards", "port_xmit_wait"}) {
      Write(absl::StrCat(dir, "/counters/", c), "0\n");
    }
    Write(dir + "/counters/port_rcv_data", "1000\n");
    Write(dir + "/counters/port_xmit_data", "2000\n");
  }

 private:
  std::string root_;
};

TEST(NicPortReaderTest, ReadsEveryReadingOfAPort) {
  test::TempDir tmp("nic");
  FakeSysfs sysfs(tmp.path());
  sysfs.AddPort("mlx5_0", 1, 7);
  sysfs.Write(sysfs.PortDir("mlx5_0", 1) + "/hw_counters/out_of_buffer", "42\n");
  sysfs.Write(sysfs.PortDir("mlx5_0", 1) + "/hw_counters/lifespan", "10\n");  // a setting
  NicPortReader reader(tmp.path());
  v1::HostSample sample;
  reader.Read(&sample);
  ASSERT_EQ(sample.nic_ports_size(), 1);
  const v1::NicPort& p = sample.nic_ports(0);
  EXPECT_EQ(p.device(), "mlx5_0:1");
  EXPECT_EQ(p.link_layer(), "InfiniBand");
  EXPECT_EQ(p.state(), 4u);
  EXPECT_EQ(p.physical_state(), 5u);
  EXPECT_DOUBLE_EQ(p.rate_bytes_per_second(), 25e9);
  EXPECT_EQ(p.link_width(), 4u);
  EXPECT_EQ(p.symbol_errors_total(), 7u);
  EXPECT_TRUE(p.has_receive_errors_total());
  EXPECT_TRUE(p.has_link_downed_total());
  EXPECT_TRUE(p.has_transmit_discards_total());
  EXPECT_TRUE(p.has_transmit_wait_total());
  // 4-byte words to bytes.
  EXPECT_EQ(p.received_bytes_total(), 4000u);
  EXPECT_EQ(p.transmitted_bytes_total(), 8000u);
  ASSERT_EQ(p.hw_counters_size(), 1);
  EXPECT_EQ(p.hw_counters().at("out_of_buffer"), 42u);
  EXPECT_EQ(p.unavailable_size(), 0);
  EXPECT_EQ(reader.unavailable_readings_total(), 0u);
  EXPECT_EQ(sample.nic_ports_omitted(), 0u);
}

TEST(NicPortReaderTest, GarbageAndMissingFilesAreUnavailableNotFatal) {
  test::TempDir tmp("nic");
  FakeSysfs sysfs(tmp.path());
  sysfs.AddPort("mlx5_0", 1);
  const std::string dir = sysfs.PortDir("mlx5_0", 1);
  sysfs.Write(dir + "/state", "garbage\n");
  sysfs.Write(dir + "/rate", std::string(100000, 'x'));  // beyond the attribute size bound
  fs::remove(dir + "/counters/symbol_error");
  sysfs.Write(dir + "/counters/link_downed", "-3\n");
  sysfs.Write(dir + "/hw_counters/rx_bad", "n/a\n");
  NicPortReader reader(tmp.path());
  for (int round = 1; round <= 2; ++round) {
    v1::HostSample sample;
    reader.Read(&sample);
    ASSERT_EQ(sample.nic_ports_size(), 1);
    const v1::NicPort& p = sample.nic_ports(0);
    EXPECT_FALSE(p.has_state());
    EXPECT_FALSE(p.has_rate_bytes_per_second());
    EXPECT_FALSE(p.has_link_width());
    EXPECT_FALSE(p.has_symbol_errors_total());
    EXPECT_FALSE(p.has_link_downed_total());
    EXPECT_EQ(p.physical_state(), 5u);  // the rest still read
    EXPECT_EQ(p.received_bytes_total(), 4000u);
    EXPECT_EQ(p.hw_counters_size(), 0);
    EXPECT_EQ(std::vector<std::string>(p.unavailable().begin(), p.unavailable().end()),
              (std::vector<std::string>{"state", "rate", "counters/symbol_error",
                                        "counters/link_downed", "hw_counters"}));
    // Counted on every read (logged only the first time).
    EXPECT_EQ(reader.unavailable_readings_total(), 5u * round);
  }
}

TEST(NicPortReaderTest, DevicesInNameOrderPortsInNumberOrder) {
  test::TempDir tmp("nic");
  FakeSysfs sysfs(tmp.path());
  sysfs.AddPort("mlx5_1", 1);
  sysfs.AddPort("mlx5_0", 10);
  sysfs.AddPort("mlx5_0", 2);
  // Not ports and not devices: skipped.
  sysfs.Write(sysfs.PortDir("mlx5_0", 2) + "/../notaport/state", "4: ACTIVE\n");
  sysfs.Write(tmp.File("sys/class/infiniband/bad name/ports/1/state"), "4: ACTIVE\n");
  NicPortReader reader(tmp.path());
  v1::HostSample sample;
  reader.Read(&sample);
  ASSERT_EQ(sample.nic_ports_size(), 3);
  EXPECT_EQ(sample.nic_ports(0).device(), "mlx5_0:2");
  EXPECT_EQ(sample.nic_ports(1).device(), "mlx5_0:10");
  EXPECT_EQ(sample.nic_ports(2).device(), "mlx5_1:1");
}

TEST(NicPortReaderTest, PortsBeyondTheBoundAreCountedNotRead) {
  test::TempDir tmp("nic");
  FakeSysfs sysfs(tmp.path());
  for (int d = 0; d < 5; ++d) sysfs.AddPort(absl::StrCat("mlx5_", d), 1);
  NicPortReader reader(tmp.path(), /*max_ports=*/3);
  v1::HostSample sample;
  reader.Read(&sample);
  EXPECT_EQ(sample.nic_ports_size(), 3);
  EXPECT_EQ(sample.nic_ports_omitted(), 2u);
}

TEST(NicPortReaderTest, HwCountersAreBounded) {
  test::TempDir tmp("nic");
  FakeSysfs sysfs(tmp.path());
  sysfs.AddPort("mlx5_0", 1);
  for (size_t i = 0; i < kMaxNicHwCounters + 10; ++i) {
    sysfs.Write(absl::StrCat(sysfs.PortDir("mlx5_0", 1), "/hw_counters/c", 1000 + i), "1\n");
  }
  NicPortReader reader(tmp.path());
  v1::HostSample sample;
  reader.Read(&sample);
  ASSERT_EQ(sample.nic_ports_size(), 1);
  EXPECT_EQ(static_cast<size_t>(sample.nic_ports(0).hw_counters_size()), kMaxNicHwCounters);
}

TEST(NicPortReaderTest, NoInfinibandClassMeansNoPorts) {
  test::TempDir tmp("nic");
  NicPortReader reader(tmp.path());
  v1::HostSample sample;
  reader.Read(&sample);
  EXPECT_EQ(sample.nic_ports_size(), 0);
  EXPECT_EQ(sample.nic_ports_omitted(), 0u);
  EXPECT_EQ(reader.unavailable_readings_total(), 0u);
}

// Through the host sampler: the ports ride along with the /proc readings.
TEST(NicPortReaderTest, HostSamplerSendsThePorts) {
  test::TempDir tmp("nic");
  FakeSysfs sysfs(tmp.path());
  sysfs.AddPort("mlx5_0", 1, 3);
  sysfs.Write(tmp.File("proc/stat"), "cpu  1 0 1 10 0 0 0 0 0 0\ncpu0 1 0 1 10 0 0 0 0 0 0\n");
  std::unique_ptr<HostSampler> sampler = MakeHostSampler({tmp.path()});
  absl::StatusOr<v1::HostSample> sample = sampler->Sample(1);
  ASSERT_OK(sample.status());
  ASSERT_EQ(sample->nic_ports_size(), 1);
  EXPECT_EQ(sample->nic_ports(0).symbol_errors_total(), 3u);
}

}  // namespace
}  // namespace stepwatch::host
