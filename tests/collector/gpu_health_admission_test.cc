// The health part of a GPU sample at the collector: its lists are bounded (the GPU sample refused,
// counted by field and reason, the rest of the batch applied), and what is kept is charged and
// given back when the node is forgotten.
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

v1::GpuSample* AddGpu(v1::ReportBatch* b, int links, int xids) {
  v1::GpuSample* g = b->add_gpus();
  g->set_index(0);
  g->set_uuid("GPU-0");
  v1::GpuHealth* h = g->mutable_health();
  h->set_pcie_link_generation_current(5);
  h->mutable_ecc()->set_uncorrected_volatile(1);
  h->mutable_remapped_rows()->set_pending(true);
  for (int l = 0; l < links; ++l) {
    v1::GpuHealth::NvLink* link = h->add_nvlinks();
    link->set_link(static_cast<uint32_t>(l));
    link->set_up(true);
    link->set_replay_errors_total(1);
  }
  for (int x = 0; x < xids; ++x) {
    v1::GpuHealth::Xid* xid = h->add_xids();
    xid->set_xid(static_cast<uint32_t>(x + 1));
    xid->set_count(1);
  }
  return g;
}

uint64_t Refused(const CollectorState& state, const char* field) {
  const auto& refused = state.Snapshot().counters.fields_refused;
  const auto it = refused.find(std::make_pair(std::string(field), std::string("too_long")));
  return it == refused.end() ? 0 : it->second;
}

TEST(GpuHealthAdmissionTest, ListsBeyondTheBoundsRefuseTheGpuSample) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  struct Case {
    const char* field;
    int links;
    int xids;
  };
  const Case cases[] = {{"gpu_health_nvlinks", kMaxGpuNvlinks + 1, 0},
                        {"gpu_health_xids", 0, kMaxGpuXids + 1}};
  uint64_t seq = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    ++seq;
    v1::ReportBatch b = StepBatch("n0", seq, "job", 2, static_cast<int64_t>(seq), 0.1);
    AddGpu(&b, c.links, c.xids);
    ASSERT_OK(state.Apply(b));
    state.Tick();  // publishes the view Snapshot() answers from
    EXPECT_EQ(Refused(state, c.field), 1u);
    const StateSnapshot s = state.Snapshot();
    ASSERT_EQ(s.nodes.size(), 1u);
    EXPECT_TRUE(s.nodes[0].gpus.empty());
    EXPECT_EQ(s.jobs.size(), 1u);  // the steps were applied
  }
  // At the bounds the sample is kept.
  ++seq;
  v1::ReportBatch b = StepBatch("n0", seq, "job", 2, static_cast<int64_t>(seq), 0.1);
  AddGpu(&b, kMaxGpuNvlinks, kMaxGpuXids);
  ASSERT_OK(state.Apply(b));
  state.Tick();
  const StateSnapshot s = state.Snapshot();
  ASSERT_EQ(s.nodes[0].gpus.size(), 1u);
  EXPECT_EQ(s.nodes[0].gpus[0].health().nvlinks_size(), kMaxGpuNvlinks);
  EXPECT_EQ(s.nodes[0].gpus[0].health().xids_size(), kMaxGpuXids);
}

TEST(GpuHealthAdmissionTest, KeptHealthIsChargedAndGivenBack) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.expire_nanos = 60 * kSecond;
  CollectorState state(o, &clock);

  v1::ReportBatch b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  v1::GpuSample plain;
  plain.set_index(0);
  plain.set_uuid("GPU-0");
  *b.add_gpus() = plain;
  ASSERT_OK(state.Apply(b));
  const int64_t without_health = state.MemoryAccountedBytes();

  b = StepBatch("n0", 2, "job", 2, 1, 0.1);
  const v1::GpuSample full = *AddGpu(&b, kMaxGpuNvlinks, kMaxGpuXids);
  ASSERT_OK(state.Apply(b));
  const int64_t charged = state.MemoryAccountedBytes() - without_health;
  EXPECT_EQ(charged, KeptBytes(full) - KeptBytes(plain));
  // At least every link and Xid message.
  EXPECT_GE(charged, kMaxGpuNvlinks * static_cast<int64_t>(sizeof(v1::GpuHealth::NvLink)) +
                         kMaxGpuXids * static_cast<int64_t>(sizeof(v1::GpuHealth::Xid)));

  // A sample without health gives the difference back; forgetting the node, everything.
  b = StepBatch("n0", 3, "job", 2, 2, 0.1);
  *b.add_gpus() = plain;
  ASSERT_OK(state.Apply(b));
  EXPECT_EQ(state.MemoryAccountedBytes(), without_health);
  clock.AdvanceTime(absl::Seconds(61));
  state.Tick();
  EXPECT_EQ(state.MemoryAccountedBytes(), 0);
}

}  // namespace
}  // namespace stepwatch::collector
