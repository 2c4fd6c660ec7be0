#include "agent/agent_metrics.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "gpu/gpu_source.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/testing/net.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::agent {
namespace {

http::MetricsEndpointOptions Listen(std::string listen) {
  http::MetricsEndpointOptions options;
  options.listen = std::move(listen);
  return options;
}

AgentMetricsSources FakeSources() {
  AgentMetricsSources s;
  s.node = "node-7";
  s.buffer_capacity_batches = 600;
  s.ingest = [] {
    IngestStats i;
    i.datagrams_total = 12;
    i.events_accepted_total = 9;
    i.rejected_total[static_cast<int>(RejectReason::kNotJson)] = 2;
    i.rejected_total[static_cast<int>(RejectReason::kOutOfRange)] = 1;
    return i;
  };
  s.link = [] {
    CollectorLinkStats st;
    st.batches_sent_total = 5;
    st.batches_acknowledged_total = 4;
    st.batches_resent_total = 1;
    st.batches_dropped_total = 2;
    st.buffered_batches = 1;
    st.connected = true;
    return st;
  };
  s.tls = [] {
    security::CheckedKeyCertPair::Stats t;
    t.reloads = 3;
    t.reload_errors = 1;
    return t;
  };
  s.samples = [] {
    NodeReading n;
    n.node.set_nvml_available(true);
    n.node.set_gpu_count(2);
    v1::GpuSample g0;
    g0.set_index(0);
    g0.set_uuid("GPU-0");
    g0.set_name("NVIDIA H100");
    g0.set_utilization_gpu_ratio(0.93);
    g0.set_sm_clock_mhz(1980);
    g0.set_memory_used_bytes(40ull << 30);
    g0.set_sm_activity_ratio(0.8);
    g0.add_pids(1234);
    v1::GpuSample g1;  // a GPU whose driver exposes nothing optional
    g1.set_index(1);
    (*g1.mutable_unavailable_metrics())["sm_activity"] = "no_permission";
    (*g1.mutable_unavailable_metrics())["utilization"] = "mig_enabled";
    n.gpus = {g0, g1};
    v1::HostSample h;
    h.set_cpu_count(32);
    h.set_cpu_utilization_ratio(0.25);
    h.set_network_receive_bytes_total(1000);
    n.host = h;
    return n;
  };
  return s;
}

// name{labels} -> value, labels rendered "k=v,k=v" in the order given.
std::map<std::string, double> Flatten(const std::vector<prometheus::MetricFamily>& families) {
  std::map<std::string, double> out;
  for (const auto& f : families) {
    for (const auto& m : f.metric) {
      std::string key = f.name + "{";
      for (const auto& l : m.label) key += l.name + "=" + l.value + ",";
      key += "}";
      out[key] = f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return out;
}

TEST(AgentMetricsTest, ExposesHealthAndNodeSnapshot) {
  AgentCollectable c(FakeSources());
  const auto values = Flatten(c.Collect());
  auto v = [&](const std::string& key) {
    auto it = values.find(key);
    EXPECT_NE(it, values.end()) << key;
    return it == values.end() ? -1 : it->second;
  };
  EXPECT_EQ(v("stepwatch_agent_events_received_total{node=node-7,}"), 9);
  EXPECT_EQ(v("stepwatch_agent_events_rejected_total{node=node-7,reason=not_json,}"), 2);
  EXPECT_EQ(v("stepwatch_agent_events_rejected_total{node=node-7,reason=out_of_range,}"), 1);
  // Every reason is present from the start, so rate() works on the first rejection.
  EXPECT_EQ(v("stepwatch_agent_events_rejected_total{node=node-7,reason=too_large,}"), 0);
  EXPECT_EQ(v("stepwatch_agent_batches_sent_total{node=node-7,}"), 5);
  EXPECT_EQ(v("stepwatch_agent_batches_acknowledged_total{node=node-7,}"), 4);
  EXPECT_EQ(v("stepwatch_agent_batches_resent_total{node=node-7,}"), 1);
  EXPECT_EQ(v("stepwatch_agent_batches_dropped_total{node=node-7,}"), 2);
  EXPECT_EQ(v("stepwatch_agent_buffer_batches{node=node-7,}"), 1);
  EXPECT_EQ(v("stepwatch_agent_buffer_capacity_batches{node=node-7,}"), 600);
  EXPECT_EQ(v("stepwatch_agent_tls_reloads_total{node=node-7,}"), 3);
  EXPECT_EQ(v("stepwatch_agent_tls_reload_errors_total{node=node-7,}"), 1);
  EXPECT_EQ(v("stepwatch_agent_connected{node=node-7,}"), 1);
  EXPECT_EQ(v("stepwatch_agent_nvml_available{node=node-7,}"), 1);
  EXPECT_DOUBLE_EQ(
      v("stepwatch_agent_gpu_utilization_ratio{node=node-7,gpu=0,namespace=,pod=,container=,}"),
      0.93);
  EXPECT_DOUBLE_EQ(
      v("stepwatch_agent_gpu_sm_clock_hertz{node=node-7,gpu=0,namespace=,pod=,container=,}"),
      1.98e9);
  EXPECT_DOUBLE_EQ(
      v("stepwatch_agent_gpu_memory_used_bytes{node=node-7,gpu=0,namespace=,pod=,container=,}"),
      40.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(
      v("stepwatch_agent_gpu_sm_activity_ratio{node=node-7,gpu=0,namespace=,pod=,container=,}"),
      0.8);
  EXPECT_EQ(v("stepwatch_agent_gpu_processes{node=node-7,gpu=0,namespace=,pod=,container=,}"), 1);
  EXPECT_EQ(
      v("stepwatch_agent_gpu_info{node=node-7,gpu=1,namespace=,pod=,container=,uuid=,name=,}"), 1);
  // Unavailable readings produce no series rather than a misleading zero.
  EXPECT_EQ(
      values.count(
          "stepwatch_agent_gpu_utilization_ratio{node=node-7,gpu=1,namespace=,pod=,container=,}"),
      0u);
  EXPECT_EQ(values.count(
                "stepwatch_agent_gpu_power_watts{node=node-7,gpu=0,namespace=,pod=,container=,}"),
            0u);
  EXPECT_EQ(values.count("stepwatch_agent_host_memory_total_bytes{node=node-7,}"), 0u);
  EXPECT_DOUBLE_EQ(v("stepwatch_agent_host_cpu_utilization_ratio{node=node-7,}"), 0.25);
  EXPECT_EQ(v("stepwatch_agent_host_cpus{node=node-7,}"), 32);
  EXPECT_EQ(v("stepwatch_agent_host_network_receive_bytes_total{node=node-7,}"), 1000);
}

// Several collectors: the totals keep the one-collector names, each link has its own series.
TEST(AgentMetricsTest, ExposesTotalsAndPerCollectorSeries) {
  AgentMetricsSources sources = FakeSources();
  sources.link = nullptr;
  sources.collectors = [] {
    CollectorRouterStats r;
    for (int i = 0; i < 2; ++i) {
      CollectorLinkStats l;
      l.collector = i == 0 ? "10.0.0.1:7070" : "10.0.0.2:7070";
      l.connected = i == 0;
      l.reachable = true;
      l.jobs = 3 + i;
      l.buffered_batches = 10 * i;
      l.batches_acknowledged_total = 7 + i;
      r.links.push_back(l);
    }
    r.total.connected = false;
    r.total.buffered_batches = 10;
    r.total.batches_acknowledged_total = 15;
    r.links_added_total = 2;
    r.job_moves_total = 4;
    return r;
  };
  AgentCollectable c(std::move(sources));
  const auto values = Flatten(c.Collect());
  auto v = [&](const std::string& key) {
    auto it = values.find(key);
    EXPECT_NE(it, values.end()) << key;
    return it == values.end() ? -1 : it->second;
  };
  EXPECT_EQ(v("stepwatch_agent_connected{node=node-7,}"), 0);
  EXPECT_EQ(v("stepwatch_agent_buffer_batches{node=node-7,}"), 10);
  EXPECT_EQ(v("stepwatch_agent_batches_acknowledged_total{node=node-7,}"), 15);
  EXPECT_EQ(v("stepwatch_agent_collectors{node=node-7,}"), 2);
  EXPECT_EQ(v("stepwatch_agent_collectors_added_total{node=node-7,}"), 2);
  EXPECT_EQ(v("stepwatch_agent_job_moves_total{node=node-7,}"), 4);
  EXPECT_EQ(v("stepwatch_agent_collector_connected{node=node-7,collector=10.0.0.1:7070,}"), 1);
  EXPECT_EQ(v("stepwatch_agent_collector_connected{node=node-7,collector=10.0.0.2:7070,}"), 0);
  EXPECT_EQ(v("stepwatch_agent_collector_reachable{node=node-7,collector=10.0.0.2:7070,}"), 1);
  EXPECT_EQ(v("stepwatch_agent_collector_jobs{node=node-7,collector=10.0.0.2:7070,}"), 4);
  EXPECT_EQ(v("stepwatch_agent_collector_buffer_batches{node=node-7,collector=10.0.0.2:7070,}"),
            10);
  EXPECT_EQ(v("stepwatch_agent_collector_batches_acknowledged_total{node=node-7,collector=10.0.0.1:"
              "7070,}"),
            7);
}

TEST(AgentMetricsTest, ExportsMetricAvailabilityPerGpu) {
  AgentCollectable c(FakeSources());
  const auto values = Flatten(c.Collect());
  auto v = [&](int gpu, const std::string& metric, const std::string& reason) {
    const std::string key =
        absl::StrCat("stepwatch_agent_gpu_metric_available{node=node-7,gpu=", gpu,
                     ",namespace=,pod=,container=,metric=", metric, ",reason=", reason, ",}");
    auto it = values.find(key);
    EXPECT_NE(it, values.end()) << key;
    return it == values.end() ? -1 : it->second;
  };
  EXPECT_EQ(v(0, "sm_activity", "ok"), 1);
  EXPECT_EQ(v(0, "utilization", "ok"), 1);
  EXPECT_EQ(v(1, "sm_activity", "no_permission"), 0);
  EXPECT_EQ(v(1, "utilization", "mig_enabled"), 0);
  EXPECT_EQ(v(1, "power", "ok"), 1);
  // One series per GPU and reading.
  int series = 0;
  for (const auto& [key, value] : values) {
    series += key.rfind("stepwatch_agent_gpu_metric_available{", 0) == 0;
  }
  EXPECT_EQ(series, 2 * static_cast<int>(std::size(gpu::kGpuMetricNames)));
}

TEST(AgentMetricsTest, CountersEndInTotalAndFamiliesHaveHelp) {
  AgentCollectable c(FakeSources());
  for (const auto& f : c.Collect()) {
    EXPECT_FALSE(f.help.empty()) << f.name;
    const bool total = f.name.size() > 6 && f.name.substr(f.name.size() - 6) == "_total";
    EXPECT_EQ(f.type == prometheus::MetricType::Counter, total) << f.name;
  }
}

TEST(AgentMetricsTest, ServesOverHttpAndPassesPromtool) {
  auto server = MetricsServer::Start(Listen("127.0.0.1:0"),
                                     std::make_shared<AgentCollectable>(FakeSources()));
  ASSERT_OK(server);
  ASSERT_GT((*server)->port(), 0);
  ASSERT_OK_AND_ASSIGN(const test::HttpResponse response,
                       test::HttpGet((*server)->port(), "/metrics"));
  EXPECT_EQ(response.status_code, 200) << response.head;
  const std::string& body = response.body;
  EXPECT_NE(body.find("# TYPE stepwatch_agent_events_rejected_total counter"), std::string::npos)
      << body;
  EXPECT_NE(body.find("stepwatch_agent_gpu_utilization_ratio{node=\"node-7\",gpu=\"0\",namespace="
                      "\"\",pod=\"\",container=\"\"} 0.93"),
            std::string::npos)
      << body;
  if (::access("/usr/bin/promtool", X_OK) != 0) GTEST_SKIP() << "promtool not installed";
  const test::TempDir dir("stepwatch-agent-test");
  ASSERT_FALSE(dir.path().empty());
  const std::string file = dir.File("scrape.txt");
  std::ofstream(file) << body;
  const std::string cmd = "/usr/bin/promtool check metrics < " + file + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << out;
}

TEST(AgentMetricsTest, BadListenAddressesFail) {
  auto collectable = std::make_shared<AgentCollectable>(FakeSources());
  EXPECT_FALSE(MetricsServer::Start(Listen("no-port"), collectable).ok());
  auto first = MetricsServer::Start(Listen("127.0.0.1:0"), collectable);
  ASSERT_OK(first);
  auto second =
      MetricsServer::Start(Listen(absl::StrCat("127.0.0.1:", (*first)->port())), collectable);
  EXPECT_FALSE(second.ok());
}

}  // namespace
}  // namespace stepwatch::agent
