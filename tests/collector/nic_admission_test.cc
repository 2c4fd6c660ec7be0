// The NIC ports of a host sample at the collector: the list, its strings and its maps are bounded
// (the host sample refused, counted by field and reason, the rest of the batch applied), and what
// is kept is charged and given back when the node is forgotten.
#include <string>

#include "collector/convert.h"
#include "collector/state.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/collector/test_util.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

using testing::StepBatch;

constexpr int64_t kSecond = 1'000'000'000;

v1::NicPort* AddPort(v1::HostSample* h, int n) {
  v1::NicPort* p = h->add_nic_ports();
  p->set_device("mlx5_" + std::to_string(n) + ":1");
  p->set_link_layer("InfiniBand");
  p->set_state(4);
  p->set_symbol_errors_total(1);
  return p;
}

uint64_t Refused(CollectorState& state, const char* field, const char* reason) {
  state.Tick();
  const StateSnapshot s = state.Snapshot();
  const auto& refused = s.counters.fields_refused;
  const auto it = refused.find(std::make_pair(std::string(field), std::string(reason)));
  return it == refused.end() ? 0 : it->second;
}

TEST(NicAdmissionTest, PortsBeyondTheBoundsRefuseTheHostSample) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  struct Case {
    const char* field;
    const char* reason;
    void (*spoil)(v1::HostSample*);
  };
  const Case cases[] = {
      {"host_nic_ports", "too_long",
       [](v1::HostSample* h) {
         for (int i = 0; i <= kMaxNicPorts; ++i) AddPort(h, i);
       }},
      {"nic_port_device", "too_long",
       [](v1::HostSample* h) {
         AddPort(h, 0)->set_device(std::string(kMaxNicTextBytes + 1, 'd'));
       }},
      {"nic_port_device", "control_character",
       [](v1::HostSample* h) { AddPort(h, 0)->set_device("mlx5_0\n:1"); }},
      {"nic_port_link_layer", "too_long",
       [](v1::HostSample* h) {
         AddPort(h, 0)->set_link_layer(std::string(kMaxNicTextBytes + 1, 'l'));
       }},
      {"nic_port_hw_counters", "too_long",
       [](v1::HostSample* h) {
         v1::NicPort* p = AddPort(h, 0);
         for (int i = 0; i <= kMaxNicHwCounters; ++i) {
           (*p->mutable_hw_counters())["c" + std::to_string(i)] = 1;
         }
       }},
      {"nic_port_hw_counters", "too_long",
       [](v1::HostSample* h) {
         (*AddPort(h, 0)->mutable_hw_counters())[std::string(kMaxNicTextBytes + 1, 'c')] = 1;
       }},
      {"nic_port_unavailable", "too_long",
       [](v1::HostSample* h) {
         v1::NicPort* p = AddPort(h, 0);
         for (int i = 0; i <= kMaxNicUnavailable; ++i) p->add_unavailable("state");
       }},
  };
  uint64_t seq = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    const uint64_t before = Refused(state, c.field, c.reason);
    ++seq;
    v1::ReportBatch b = StepBatch("n0", seq, "job", 2, static_cast<int64_t>(seq), 0.1);
    c.spoil(b.mutable_host());
    ASSERT_OK(state.Apply(b));
    EXPECT_EQ(Refused(state, c.field, c.reason), before + 1);
    state.Tick();
    const StateSnapshot s = state.Snapshot();
    ASSERT_EQ(s.nodes.size(), 1u);
    EXPECT_FALSE(s.nodes[0].host.has_value());
    EXPECT_EQ(s.jobs.size(), 1u);  // the steps were applied
  }
}

TEST(NicAdmissionTest, KeptPortsAreChargedAndGivenBack) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.expire_nanos = 60 * kSecond;
  CollectorState state(o, &clock);

  v1::ReportBatch b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  ASSERT_OK(state.Apply(b));
  const int64_t without_host = state.MemoryAccountedBytes();

  // The largest host sample a peer may send: every bound at its limit.
  v1::HostSample big;
  v1::HostSample* h = &big;
  for (int i = 0; i < kMaxNicPorts; ++i) {
    v1::NicPort* p = AddPort(h, i);
    p->set_device(std::string(kMaxNicTextBytes - 3, 'd') + ":" + std::to_string(i % 10) + "1");
    p->set_link_layer(std::string(kMaxNicTextBytes, 'l'));
    for (int c = 0; c < kMaxNicHwCounters; ++c) {
      (*p->mutable_hw_counters())[std::string(kMaxNicTextBytes - 2, 'c') + std::to_string(c % 10) +
                                  std::to_string(c / 10)] = c;
    }
    for (int u = 0; u < kMaxNicUnavailable; ++u) {
      p->add_unavailable(std::string(kMaxNicTextBytes, 'u'));
    }
  }
  b = StepBatch("n0", 2, "job", 2, 1, 0.1);
  *b.mutable_host() = big;
  ASSERT_OK(state.Apply(b));
  state.Tick();
  ASSERT_EQ(state.Snapshot().nodes.size(), 1u);
  ASSERT_TRUE(state.Snapshot().nodes[0].host.has_value());
  EXPECT_EQ(state.Snapshot().nodes[0].host->nic_ports_size(), kMaxNicPorts);
  // The job's timeline, charged at the tick, is not the host sample's.
  const int64_t timeline = state.reports().timeline_bytes();
  const int64_t charged = state.MemoryAccountedBytes() - without_host - timeline;
  EXPECT_EQ(charged, KeptBytes(big));
  // At least every port message and the heap of every string it holds.
  const int64_t strings_per_port =
      2 * (kMaxNicTextBytes + 1) +
      (kMaxNicHwCounters + kMaxNicUnavailable) * (kMaxNicTextBytes + 1);
  EXPECT_GE(charged, kMaxNicPorts * (static_cast<int64_t>(sizeof(v1::NicPort)) + strings_per_port));

  // A host sample without ports gives the difference back; forgetting the node, everything.
  b = StepBatch("n0", 3, "job", 2, 2, 0.1);
  b.mutable_host()->set_cpu_count(8);
  ASSERT_OK(state.Apply(b));
  EXPECT_EQ(state.MemoryAccountedBytes(), without_host + timeline);
  b = StepBatch("n0", 4, "job", 2, 3, 0.1);
  *b.mutable_host() = big;
  ASSERT_OK(state.Apply(b));
  EXPECT_EQ(state.MemoryAccountedBytes(), without_host + timeline + charged);
  clock.AdvanceTime(absl::Seconds(61));
  state.Tick();
  // The finished report keeps the job's timeline, and its charge.
  EXPECT_EQ(state.MemoryAccountedBytes(), state.reports().timeline_bytes());
}

}  // namespace
}  // namespace stepwatch::collector
