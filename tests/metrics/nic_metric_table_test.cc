// The NIC rows of the host table: one series per port, state folded into nic_port_up, absent
// readings without a series.
#include "metrics/nic_metric_table.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stepwatch::metrics {
namespace {

const HostMetric& Host(const std::string& name) {
  for (const HostMetric& m : HostMetrics()) {
    if (m.name == name) return m;
  }
  ADD_FAILURE() << "no " << name;
  return HostMetrics().front();
}

v1::HostSample TwoPorts() {
  v1::HostSample h;
  v1::NicPort* up = h.add_nic_ports();
  up->set_device("mlx5_0:1");
  up->set_state(kIbPortStateActive);
  up->set_physical_state(kIbPhysicalStateLinkUp);
  up->set_rate_bytes_per_second(25e9);
  up->set_symbol_errors_total(12);
  up->set_received_bytes_total(4096);
  v1::NicPort* down = h.add_nic_ports();
  down->set_device("mlx5_1:1");
  down->set_state(1);           // DOWN
  down->set_physical_state(3);  // Disabled
  down->add_unavailable("rate");
  return h;
}

TEST(NicMetricTableTest, PortUpNeedsActiveAndLinkUp) {
  const std::vector<NodeSeries> s = SeriesOf(Host("nic_port_up"), TwoPorts());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].label_values, std::vector<std::string>{"mlx5_0:1"});
  EXPECT_EQ(s[0].value, 1);
  EXPECT_EQ(s[1].value, 0);

  v1::HostSample active_but_training = TwoPorts();
  active_but_training.mutable_nic_ports(0)->set_physical_state(4);
  EXPECT_EQ(SeriesOf(Host("nic_port_up"), active_but_training)[0].value, 0);
  v1::HostSample active_defer = TwoPorts();
  active_defer.mutable_nic_ports(0)->set_state(kIbPortStateActiveDefer);
  EXPECT_EQ(SeriesOf(Host("nic_port_up"), active_defer)[0].value, 1);
}

TEST(NicMetricTableTest, AbsentReadingsGiveNoSeries) {
  const v1::HostSample h = TwoPorts();
  const std::vector<NodeSeries> rate = SeriesOf(Host("nic_port_rate_bytes_per_second"), h);
  ASSERT_EQ(rate.size(), 1u);
  EXPECT_EQ(rate[0].value, 25e9);
  const std::vector<NodeSeries> errors = SeriesOf(Host("nic_port_errors_total"), h);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].label_values, (std::vector<std::string>{"mlx5_0:1", "symbol_error"}));
  EXPECT_EQ(errors[0].value, 12);
  const std::vector<NodeSeries> missing = SeriesOf(Host("nic_port_reading_unavailable"), h);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].label_values, (std::vector<std::string>{"mlx5_1:1", "rate"}));
  EXPECT_EQ(SeriesOf(Host("nic_ports"), h)[0].value, 2);
  EXPECT_EQ(SeriesCount(Host("nic_ports"), v1::HostSample()), 0u);
}

TEST(NicMetricTableTest, HwCountersInNameOrder) {
  v1::HostSample h = TwoPorts();
  auto& counters = *h.mutable_nic_ports(0)->mutable_hw_counters();
  counters["rx_write_requests"] = 5;
  counters["out_of_buffer"] = 9;
  counters["duplicate_request"] = 1;
  const std::vector<NodeSeries> s = SeriesOf(Host("nic_port_hw_counters_total"), h);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].label_values[1], "duplicate_request");
  EXPECT_EQ(s[1].label_values[1], "out_of_buffer");
  EXPECT_EQ(s[1].value, 9);
  EXPECT_EQ(s[2].label_values[1], "rx_write_requests");
}

}  // namespace
}  // namespace stepwatch::metrics
