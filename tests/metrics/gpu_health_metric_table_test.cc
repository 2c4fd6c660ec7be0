// The GPU health rows of the GPU table: labels and values from GpuSample.health, absent parts
// without a series, the per-NVLink rows agent-only.
#include "metrics/gpu_health_metric_table.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace stepwatch::metrics {
namespace {

const GpuMetric& Row(const std::string& name) {
  for (const GpuMetric& m : GpuMetrics()) {
    if (m.name == name) return m;
  }
  ADD_FAILURE() << "no " << name;
  return GpuMetrics().front();
}

// "label,label" -> value of every series of `name`.
std::map<std::string, double> Series(const std::string& name, const v1::GpuSample& g) {
  std::map<std::string, double> out;
  for (const NodeSeries& s : SeriesOf(Row(name), g)) {
    out[absl::StrJoin(s.label_values, ",")] = s.value;
  }
  return out;
}

v1::GpuSample Faulty() {
  v1::GpuSample g;
  v1::GpuHealth* h = g.mutable_health();
  h->set_pcie_link_generation_current(3);
  h->set_pcie_link_generation_max(5);
  h->set_pcie_link_width_current(8);
  h->set_pcie_link_width_max(16);
  h->set_pcie_replays_total(12);
  h->mutable_ecc()->set_corrected_volatile(1);
  h->mutable_ecc()->set_uncorrected_volatile(2);
  h->mutable_ecc()->set_corrected_aggregate(3);
  h->mutable_ecc()->set_uncorrected_aggregate(4);
  h->mutable_remapped_rows()->set_corrected(5);
  h->mutable_remapped_rows()->set_uncorrected(6);
  h->mutable_remapped_rows()->set_pending(true);
  v1::GpuHealth::NvLink* up = h->add_nvlinks();
  up->set_link(0);
  up->set_up(true);
  up->set_replay_errors_total(7);
  up->set_crc_data_errors_total(8);
  v1::GpuHealth::NvLink* down = h->add_nvlinks();
  down->set_link(1);
  down->set_up(false);
  v1::GpuHealth::Xid* xid = h->add_xids();
  xid->set_xid(79);
  xid->set_count(2);
  xid->set_last_unix_nanos(1'700'000'000'500'000'000);
  return g;
}

TEST(GpuHealthMetricTableTest, SeriesCarryTheirLabelsAndValues) {
  const v1::GpuSample g = Faulty();
  EXPECT_EQ(Series("gpu_pcie_link_generation", g),
            (std::map<std::string, double>{{"current", 3}, {"max", 5}}));
  EXPECT_EQ(Series("gpu_pcie_link_width", g),
            (std::map<std::string, double>{{"current", 8}, {"max", 16}}));
  EXPECT_EQ(Series("gpu_pcie_replays_total", g), (std::map<std::string, double>{{"", 12}}));
  EXPECT_EQ(Series("gpu_ecc_errors_total", g),
            (std::map<std::string, double>{{"corrected,volatile", 1},
                                           {"uncorrected,volatile", 2},
                                           {"corrected,aggregate", 3},
                                           {"uncorrected,aggregate", 4}}));
  EXPECT_EQ(Series("gpu_remapped_rows", g),
            (std::map<std::string, double>{{"corrected", 5}, {"uncorrected", 6}}));
  EXPECT_EQ(Series("gpu_row_remap_pending", g), (std::map<std::string, double>{{"", 1}}));
  EXPECT_EQ(Series("gpu_row_remap_failure", g), (std::map<std::string, double>{{"", 0}}));
  EXPECT_EQ(Series("gpu_nvlink_up", g), (std::map<std::string, double>{{"0", 1}, {"1", 0}}));
  EXPECT_EQ(Series("gpu_nvlink_errors_total", g),
            (std::map<std::string, double>{{"0,replay", 7}, {"0,crc_data", 8}}));
  EXPECT_EQ(Series("gpu_xid_events_total", g), (std::map<std::string, double>{{"79", 2}}));
  EXPECT_DOUBLE_EQ(Series("gpu_xid_last_event_timestamp_seconds", g)["79"], 1700000000.5);
  EXPECT_EQ(Series("gpu_xid_events_dropped_total", g), (std::map<std::string, double>{{"", 0}}));
}

TEST(GpuHealthMetricTableTest, AbsentHealthGivesNoSeries) {
  v1::GpuSample g;
  (*g.mutable_unavailable_metrics())["xid"] = "not_supported";
  for (const GpuMetric& m : GpuMetrics()) {
    if (m.reading == nullptr) continue;
    const std::string reading = m.reading;
    if (reading != "pcie_link" && reading != "pcie_replays" && reading != "ecc" &&
        reading != "remapped_rows" && reading != "nvlink_state" && reading != "nvlink_errors" &&
        reading != "xid") {
      continue;
    }
    EXPECT_TRUE(SeriesOf(m, g).empty()) << m.name;
  }
  // Xid readable but none seen: the dropped counter is still there, at 0.
  g.mutable_unavailable_metrics()->clear();
  g.mutable_health()->set_pcie_replays_total(0);
  EXPECT_EQ(Series("gpu_xid_events_dropped_total", g), (std::map<std::string, double>{{"", 0}}));
}

TEST(GpuHealthMetricTableTest, PerLinkRowsStayOnTheAgent) {
  EXPECT_EQ(Row("gpu_nvlink_up").scope, Scope::kAgentOnly);
  EXPECT_EQ(Row("gpu_nvlink_errors_total").scope, Scope::kAgentOnly);
  EXPECT_EQ(Row("gpu_xid_events_total").scope, Scope::kAgentAndCollector);
  EXPECT_EQ(Row("gpu_pcie_link_generation").scope, Scope::kAgentAndCollector);
}

}  // namespace
}  // namespace stepwatch::metrics
