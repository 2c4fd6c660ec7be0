#include "agent/collector_link.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "absl/time/clock.h"
#include "agent/backoff.h"
#include "agent/node_reading.h"
#include "agent/spool.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/agent/fake_collector.h"
#include "tests/agent/test_util.h"
#include "tests/testing/net.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::agent {
namespace {

using test::StatusIs;

using testing::WaitFor;

v1::StepEvent Step(int64_t step) {
  v1::StepEvent e;
  e.set_job("job");
  e.set_rank(0);
  e.set_world_size(1);
  e.set_step(step);
  e.set_step_seconds(0.1);
  return e;
}

// Options without a clock (the system clock).
CollectorLinkOptions RealTimeOptions(int port) {
  CollectorLinkOptions o;
  o.collector = "127.0.0.1:" + std::to_string(port);
  o.agent_id = MakeAgentId("node-a", "/tmp/a.sock");
  o.backoff.initial = absl::Milliseconds(10);
  o.backoff.max = absl::Milliseconds(100);
  o.connect_timeout = absl::Milliseconds(500);
  return o;
}

// Steps first, first + 1, ..., first + n - 1.
std::vector<v1::StepEvent> Steps(int64_t first, int n) {
  std::vector<v1::StepEvent> out;
  for (int64_t i = first; i < first + n; ++i) out.push_back(Step(i));
  return out;
}

std::set<int64_t> AsSet(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// Every link here runs on a SimulatedClock: the backoff and the timeouts pass
// only when a test moves the time. Real time passes only for loopback gRPC.
class CollectorLinkTest : public ::testing::Test {
 protected:
  CollectorLinkOptions Options(int port) {
    CollectorLinkOptions o = RealTimeOptions(port);
    o.clock = &clock_;
    return o;
  }

  // The time until the earliest sleeper or waiter wakes, once one (other than the 15 s
  // acknowledgement wait) is there: the reconnect backoff. Bounded in real time.
  std::optional<absl::Duration> PendingBackoff() {
    std::optional<absl::Duration> d;
    testing::WaitFor([&] {
      const absl::Duration left = clock_.next_deadline() - clock_.TimeNow();
      if (left > absl::Seconds(1)) return false;
      d = left;
      return true;
    });
    return d;
  }

  bool AdvanceUntil(const std::function<bool()>& pred,
                    absl::Duration horizon = absl::Milliseconds(100)) {
    return testing::AdvanceUntil(clock_, pred, horizon);
  }

  // A cut as the router makes one for a link: `steps`, and node-a as ReadNode reads it now with
  // `gpus` and `host` (either may be nullptr). Rank exits and released jobs are added by the test.
  CutContents Cut(std::vector<v1::StepEvent> steps, gpu::GpuSource* gpus = nullptr,
                  host::HostSampler* host = nullptr) {
    v1::NodeInfo info;
    info.set_node("node-a");
    const int64_t now = clock_.NowUnixNanos();
    NodeReading reading = ReadNode(info, gpus, host, now, /*with_samples=*/true);
    CutContents cut;
    cut.created_unix_nanos = now;
    cut.node = std::move(reading.node);
    cut.gpus = std::move(reading.gpus);
    cut.host = std::move(reading.host);
    cut.steps = std::move(steps);
    return cut;
  }

  SimulatedClock clock_;
};

TEST(AgentIdTest, StableAndDistinct) {
  EXPECT_EQ(MakeAgentId("n", "/run/a.sock"), MakeAgentId("n", "/run/a.sock"));
  EXPECT_NE(MakeAgentId("n", "/run/a.sock"), MakeAgentId("n", "/run/b.sock"));
  EXPECT_NE(MakeAgentId("n", "/run/a.sock"), MakeAgentId("m", "/run/a.sock"));
  EXPECT_EQ(MakeAgentId("n", "/run/a.sock").rfind("n-", 0), 0u);
  EXPECT_NE(MakeBootId(), MakeBootId());
  EXPECT_EQ(MakeBootId().size(), 32u);
}

TEST(BackoffTest, GrowsWithJitterAndIsCapped) {
  BackoffOptions o;
  o.initial = absl::Milliseconds(100);
  o.max = absl::Seconds(1);
  o.multiplier = 2;
  o.jitter = 0.5;
  Backoff b(o);
  absl::Duration base = o.initial;
  for (int i = 0; i < 20; ++i) {
    const absl::Duration d = b.Next();
    EXPECT_LE(d, base);
    EXPECT_GE(d, base / 2);
    EXPECT_LE(d, o.max);
    base = std::min(base * 2, o.max);
  }
  b.Reset();
  EXPECT_LE(b.Next(), o.initial);
}

TEST(BackoffTest, JitterSpreadsDelays) {
  Backoff b({absl::Milliseconds(100), absl::Milliseconds(100), 2.0, 0.5});
  std::set<int64_t> distinct;
  for (int i = 0; i < 50; ++i) distinct.insert(absl::ToInt64Microseconds(b.Next()));
  EXPECT_GT(distinct.size(), 10u);
}

TEST_F(CollectorLinkTest, DeliversStepsAndSamplesInOrderAndDrainsOnAck) {
  FakeCollector collector;
  const int port = collector.Start(0, {});
  ASSERT_GT(port, 0);
  FakeGpus gpus;
  FakeHost host;
  CollectorLink link(Options(port));
  ASSERT_OK(link.Start());
  link.Enqueue(Cut(Steps(0, 3), &gpus, &host));
  link.Enqueue(Cut(Steps(3, 1), &gpus, &host));
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().batches_acknowledged_total == 2; }));
  const std::vector<v1::ReportBatch> batches = collector.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].seq(), 1u);
  EXPECT_EQ(batches[1].seq(), 2u);
  EXPECT_EQ(batches[0].agent_id(), MakeAgentId("node-a", "/tmp/a.sock"));
  EXPECT_EQ(batches[0].boot_id(), link.boot_id());
  EXPECT_EQ(batches[0].steps_size(), 3);
  EXPECT_EQ(batches[1].steps_size(), 1);
  EXPECT_EQ(batches[0].gpus_size(), 2);
  EXPECT_DOUBLE_EQ(batches[0].gpus(1).utilization_gpu_ratio(), 0.75);
  ASSERT_TRUE(batches[0].has_host());
  EXPECT_EQ(batches[0].host().cpu_count(), 16u);
  EXPECT_EQ(batches[0].node().node(), "node-a");
  EXPECT_TRUE(batches[0].node().nvml_available());
  EXPECT_EQ(batches[0].node().gpu_count(), 2);
  EXPECT_EQ(batches[0].base_seq(), 1u);
  const CollectorLinkStats s = link.stats();
  EXPECT_EQ(s.buffered_batches, 0u);
  EXPECT_EQ(s.buffered_bytes, 0u);
  EXPECT_EQ(s.acked_seq, 2u);
  EXPECT_EQ(s.batches_resent_total, 0u);
  EXPECT_EQ(s.batches_created_total, 2u);
  EXPECT_EQ(s.events_shipped_total, 4u);
  EXPECT_TRUE(s.connected);
}

// The acknowledgement timeout too: a step forward does not replace a healthy stream, a step back
// does not keep a stuck one.
TEST_F(CollectorLinkTest, AckTimeoutIgnoresWallClockSteps) {
  FakeCollector collector;
  const int port = collector.Start(0, {/*ack=*/false});
  ASSERT_GT(port, 0);
  CollectorLinkOptions o = Options(port);
  o.ack_timeout = absl::Milliseconds(300);
  CollectorLink link(o);
  ASSERT_OK(link.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().connected; }));
  link.Enqueue(Cut(Steps(0, 1)));
  ASSERT_TRUE(WaitFor([&] { return collector.batches().size() == 1; }));
  ASSERT_TRUE(WaitFor([&] { return clock_.next_deadline() == clock_.TimeNow() + o.ack_timeout; }));
  clock_.StepWallTime(absl::Hours(1));
  clock_.AdvanceTime(o.ack_timeout / 2);
  EXPECT_TRUE(link.stats().connected);
  EXPECT_EQ(link.stats().connects_total, 1u);
  clock_.StepWallTime(-absl::Hours(2));
  clock_.AdvanceTime(o.ack_timeout / 2);
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().connects_total == 2; }));
}

TEST_F(CollectorLinkTest, CollectorRestartLosesNothingWithinTheBuffer) {
  FakeCollector first;
  const int port = first.Start(0, {/*ack=*/false});
  ASSERT_GT(port, 0);
  CollectorLink link(Options(port));
  ASSERT_OK(link.Start());
  int64_t step = 0;
  for (int b = 0; b < 5; ++b) {
    link.Enqueue(Cut(Steps(step, 2)));
    step += 2;
  }
  // Written but never acknowledged: all five are still held.
  ASSERT_TRUE(AdvanceUntil([&] { return first.batches().size() == 5; }));
  EXPECT_EQ(link.stats().buffered_batches, 5u);
  first.Shutdown();
  ASSERT_TRUE(WaitFor([&] { return !link.stats().connected; }));
  // While the collector is away, more batches pile up.
  for (int b = 0; b < 3; ++b) link.Enqueue(Cut(Steps(step++, 1)));
  FakeCollector second;
  ASSERT_EQ(second.Start(port, {/*ack=*/true}), port);
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().buffered_batches == 0; }))
      << link.stats().buffered_batches;
  // Every batch arrived at the new collector, in order, each once.
  std::vector<uint64_t> seqs;
  for (const auto& b : second.batches()) seqs.push_back(b.seq());
  EXPECT_EQ(seqs, std::vector<uint64_t>({1, 2, 3, 4, 5, 6, 7, 8}));
  std::set<int64_t> expected;
  for (int64_t i = 0; i < step; ++i) expected.insert(i);
  EXPECT_EQ(AsSet(second.unique_steps()), expected);
  EXPECT_EQ(second.unique_steps().size(), expected.size());
  const CollectorLinkStats s = link.stats();
  EXPECT_EQ(s.batches_resent_total, 5u);
  EXPECT_EQ(s.batches_acknowledged_total, 8u);
  EXPECT_EQ(s.batches_dropped_total, 0u);
  EXPECT_GE(s.connects_total, 2u);
}

TEST_F(CollectorLinkTest, StreamDroppedByServerIsReopenedAndNothingIsLost) {
  FakeCollector collector;
  FakeCollector::Behaviour b;
  b.drop_stream_after = 2;
  const int port = collector.Start(0, b);
  ASSERT_GT(port, 0);
  CollectorLink link(Options(port));
  ASSERT_OK(link.Start());
  for (int i = 0; i < 10; ++i) link.Enqueue(Cut(Steps(i, 1)));
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().buffered_batches == 0; }));
  std::set<int64_t> expected;
  for (int64_t i = 0; i < 10; ++i) expected.insert(i);
  EXPECT_EQ(AsSet(collector.unique_steps()), expected);
  EXPECT_GE(collector.streams(), 5);
}

TEST_F(CollectorLinkTest, FullBufferDropsOldestAndTellsTheCollector) {
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  ASSERT_GT(port, 0);
  CollectorLinkOptions o = Options(port);
  o.max_buffered_batches = 3;
  CollectorLink link(o);
  ASSERT_OK(link.Start());
  for (int i = 0; i < 10; ++i) link.Enqueue(Cut(Steps(i, 1)));
  CollectorLinkStats s = link.stats();
  EXPECT_EQ(s.batches_created_total, 10u);
  EXPECT_EQ(s.batches_dropped_total, 7u);
  EXPECT_EQ(s.buffered_batches, 3u);
  FakeCollector collector;
  ASSERT_EQ(collector.Start(port, {}), port);
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().buffered_batches == 0; }));
  const auto batches = collector.batches();
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].seq(), 8u);
  // base_seq lets the collector skip the dropped 1..7 instead of waiting for them.
  EXPECT_EQ(batches[0].base_seq(), 8u);
  EXPECT_EQ(AsSet(collector.unique_steps()), std::set<int64_t>({7, 8, 9}));
  EXPECT_EQ(link.stats().acked_seq, 10u);
}

TEST_F(CollectorLinkTest, ByteBoundAlsoDropsOldest) {
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  CollectorLinkOptions o = Options(port);
  o.max_buffered_bytes = 2000;
  CollectorLink link(o);
  ASSERT_OK(link.Start());
  for (int b = 0; b < 10; ++b) link.Enqueue(Cut(Steps(0, 20)));
  const CollectorLinkStats s = link.stats();
  EXPECT_GT(s.batches_dropped_total, 0u);
  EXPECT_LE(s.buffered_bytes, 2000u);
  EXPECT_GE(s.buffered_batches, 1u);
}

// Each failed attempt is followed by one sleep on the clock, doubling from `initial` with up to
// 50% jitter and capped at `max`; nothing else moves the time.
TEST_F(CollectorLinkTest, ReconnectBackoffGrowsAndIsCapped) {
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  ASSERT_GT(port, 0);
  CollectorLinkOptions o = Options(port);
  o.backoff.initial = absl::Milliseconds(4);
  o.backoff.max = absl::Milliseconds(16);
  CollectorLink link(o);
  ASSERT_OK(link.Start());
  absl::Duration base = o.backoff.initial;
  for (int attempt = 1; attempt <= 5; ++attempt) {
    const std::optional<absl::Duration> delay = PendingBackoff();
    ASSERT_TRUE(delay.has_value()) << attempt;
    EXPECT_EQ(link.stats().connect_attempts_total, static_cast<uint64_t>(attempt));
    EXPECT_LE(*delay, base) << attempt;
    EXPECT_GE(*delay, base / 2 - absl::Milliseconds(1)) << attempt;  // whole milliseconds
    // Just short of the wake-up, no new attempt.
    clock_.AdvanceTime(*delay - absl::Nanoseconds(1));
    EXPECT_EQ(clock_.next_deadline() - clock_.TimeNow(), absl::Nanoseconds(1));
    clock_.AdvanceTime(absl::Nanoseconds(1));
    ASSERT_TRUE(WaitFor(
        [&] { return link.stats().connect_attempts_total == static_cast<uint64_t>(attempt + 1); }));
    base = std::min(base * 2, o.backoff.max);
  }
  EXPECT_FALSE(link.stats().connected);
  // A collector that appears late is found after at most one more backoff.
  FakeCollector collector;
  ASSERT_EQ(collector.Start(port, {}), port);
  const absl::Time appeared = clock_.TimeNow();
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().connected; }));
  EXPECT_LE(clock_.TimeNow() - appeared, o.backoff.max);
}

TEST_F(CollectorLinkTest, StuckStreamIsReplacedAfterAckTimeout) {
  FakeCollector collector;
  const int port = collector.Start(0, {/*ack=*/false});
  ASSERT_GT(port, 0);
  CollectorLinkOptions o = Options(port);
  o.ack_timeout = absl::Milliseconds(300);
  CollectorLink link(o);
  ASSERT_OK(link.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().connected; }));
  link.Enqueue(Cut(Steps(0, 1)));
  for (uint64_t stream = 1; stream <= 3; ++stream) {
    // Written on this stream (again on each new one), then waiting for its acknowledgement.
    ASSERT_TRUE(WaitFor([&] {
      const CollectorLinkStats s = link.stats();
      return s.connects_total == stream && s.batches_sent_total == stream;
    })) << stream;
    // A written batch is only handed to gRPC: until the collector has read it, the cancel that
    // follows the timeout can discard it on the way (RST_STREAM drops unread messages), and this
    // stream would then never show up in collector.batches().
    ASSERT_TRUE(WaitFor([&] { return collector.batches().size() == stream; })) << stream;
    const absl::Time written = clock_.TimeNow();
    ASSERT_TRUE(WaitFor([&] { return clock_.next_deadline() == written + o.ack_timeout; }));
    clock_.AdvanceTime(o.ack_timeout - absl::Milliseconds(1));
    EXPECT_TRUE(link.stats().connected);
    EXPECT_EQ(link.stats().connects_total, stream);
    // The timeout, then the reconnect backoff.
    clock_.AdvanceTime(absl::Milliseconds(1));
    ASSERT_TRUE(AdvanceUntil([&] { return link.stats().connects_total == stream + 1; }));
  }
  // Four streams, each carrying the one batch, none acknowledging it. The collector may read the
  // batch before the link's Write returns and counts it: wait for both.
  ASSERT_TRUE(WaitFor(
      [&] { return collector.batches().size() == 4 && link.stats().batches_sent_total == 4; }));
  const CollectorLinkStats s = link.stats();
  EXPECT_EQ(s.batches_sent_total, 4u);
  EXPECT_EQ(s.batches_resent_total, 3u);
  EXPECT_EQ(s.buffered_batches, 1u);
}

// Each cut becomes batches with their own seqs, the rank exits and released jobs in the last one;
// the link state says since when it is connected.
TEST_F(CollectorLinkTest, FedLinkNumbersEnqueuedCutsAndReportsItsState) {
  FakeCollector collector;
  const int port = collector.Start(0, {});
  ASSERT_GT(port, 0);
  CollectorLinkOptions o = Options(port);
  o.max_events_per_batch = 2;
  const absl::Duration start = clock_.MonotonicNow();
  CollectorLink link(o);
  EXPECT_FALSE(link.link_state().connected);
  ASSERT_OK(link.Start());
  EXPECT_EQ(link.link_state().since, start);
  ASSERT_TRUE(AdvanceUntil([&] { return link.link_state().connected; }));
  const absl::Duration connected_at = link.link_state().since;
  EXPECT_GE(connected_at, start);
  // A link has no schedule of its own: nothing waits.
  EXPECT_EQ(clock_.next_deadline(), absl::InfiniteFuture());
  CutContents cut = Cut(Steps(0, 3));
  cut.created_unix_nanos = 42;
  cut.gpus.resize(1);
  v1::RankExit exit;
  exit.set_job("job");
  cut.rank_exits.push_back(exit);
  cut.released_jobs.push_back("moved-job");
  link.Enqueue(std::move(cut));
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().batches_acknowledged_total == 2; }));
  const auto batches = collector.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].seq(), 1u);
  EXPECT_EQ(batches[1].seq(), 2u);
  EXPECT_EQ(batches[0].created_unix_nanos(), 42);
  EXPECT_EQ(batches[0].gpus_size(), 1);
  EXPECT_EQ(batches[1].gpus_size(), 0);
  EXPECT_EQ(batches[0].rank_exits_size(), 0);
  EXPECT_EQ(batches[1].rank_exits_size(), 1);
  EXPECT_EQ(batches[0].released_jobs_size(), 0);
  ASSERT_EQ(batches[1].released_jobs_size(), 1);
  EXPECT_EQ(batches[1].released_jobs(0), "moved-job");
  EXPECT_EQ(batches[1].node().node(), "node-a");
  EXPECT_EQ(collector.unique_steps().size(), 3u);
  collector.Shutdown();
  ASSERT_TRUE(WaitFor([&] { return !link.link_state().connected; }));
  EXPECT_GE(link.link_state().since, connected_at);
}

TEST_F(CollectorLinkTest, LargeIntervalsAreSplitIntoSeveralBatches) {
  FakeCollector collector;
  const int port = collector.Start(0, {});
  CollectorLinkOptions o = Options(port);
  o.max_events_per_batch = 4;
  FakeGpus gpus;
  CollectorLink link(o);
  ASSERT_OK(link.Start());
  link.Enqueue(Cut(Steps(0, 10), &gpus));
  ASSERT_TRUE(AdvanceUntil([&] { return collector.batches().size() == 3; }));
  const auto batches = collector.batches();
  EXPECT_EQ(batches[0].steps_size(), 4);
  EXPECT_EQ(batches[1].steps_size(), 4);
  EXPECT_EQ(batches[2].steps_size(), 2);
  EXPECT_EQ(batches[0].gpus_size(), 2);
  EXPECT_EQ(batches[1].gpus_size(), 0);  // samples go once per cut
  EXPECT_EQ(collector.unique_steps().size(), 10u);
}

// Stop waits for what was queued; the acknowledgement ends the flush: no time passes.
TEST_F(CollectorLinkTest, StopFlushesQueuedBatches) {
  FakeCollector collector;
  const int port = collector.Start(0, {});
  CollectorLink link(Options(port));
  ASSERT_OK(link.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().connected; }));
  link.Enqueue(Cut(Steps(42, 1)));
  const absl::Time start = clock_.TimeNow();
  link.Stop(absl::Seconds(5));
  EXPECT_EQ(clock_.TimeNow(), start);
  EXPECT_EQ(AsSet(collector.unique_steps()), std::set<int64_t>({42}));
  EXPECT_EQ(link.stats().buffered_batches, 0u);
}

// Stop runs on another thread; returns whether it returned within 10 s of real time (if not, the
// time is moved far ahead so that it does, and the test fails).
bool StopsWithin(
    CollectorLink* link, absl::Duration flush_timeout, SimulatedClock* clock,
    const std::function<void(const std::atomic<bool>& done)>& while_stopping =
        [](const std::atomic<bool>&) {}) {
  std::atomic<bool> done{false};
  std::thread stopper([&] {
    link->Stop(flush_timeout);
    done = true;
  });
  while_stopping(done);
  const bool ok = WaitFor([&] { return done.load(); });
  if (!ok) clock->AdvanceTime(absl::Hours(24));
  stopper.join();
  return ok;
}

// Without a collector there is nothing to wait for: Stop returns without the time moving.
TEST_F(CollectorLinkTest, StopIsBoundedWithoutCollector) {
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  CollectorLink link(Options(port));
  ASSERT_OK(link.Start());
  link.Enqueue(Cut(Steps(1, 1)));
  const absl::Time start = clock_.TimeNow();
  EXPECT_TRUE(StopsWithin(&link, absl::Seconds(30), &clock_));
  EXPECT_EQ(clock_.TimeNow(), start);
  EXPECT_EQ(link.stats().buffered_batches, 1u);
}

// A connected collector that never acknowledges holds Stop for exactly the flush timeout.
TEST_F(CollectorLinkTest, StopWaitsForTheFlushTimeoutWhenNothingIsAcknowledged) {
  FakeCollector collector;
  const int port = collector.Start(0, {/*ack=*/false});
  ASSERT_GT(port, 0);
  CollectorLink link(Options(port));
  ASSERT_OK(link.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().connected; }));
  link.Enqueue(Cut(Steps(7, 1)));
  const absl::Time start = clock_.TimeNow();
  const absl::Duration flush_timeout = absl::Seconds(2);
  bool held_until_timeout = false;
  EXPECT_TRUE(StopsWithin(&link, flush_timeout, &clock_, [&](const std::atomic<bool>& done) {
    // The stream writes the queued batch, and Stop waits for its acknowledgement.
    if (!WaitFor([&] {
          return collector.batches().size() == 1 && clock_.next_deadline() == start + flush_timeout;
        })) {
      return;
    }
    clock_.AdvanceTime(flush_timeout - absl::Milliseconds(1));
    // Still waiting: its deadline not reached, its condition (all acknowledged) still false.
    held_until_timeout =
        !done && clock_.next_deadline() == start + flush_timeout && link.stats().connected;
    clock_.AdvanceTime(absl::Milliseconds(1));
  }));
  EXPECT_TRUE(held_until_timeout);
  EXPECT_EQ(clock_.TimeNow(), start + flush_timeout);
  EXPECT_EQ(link.stats().buffered_batches, 1u);
  EXPECT_EQ(AsSet(collector.unique_steps()), std::set<int64_t>({7}));
}

TEST_F(CollectorLinkTest, RejectsBadOptions) {
  CollectorLinkOptions o = Options(1);
  o.agent_id.clear();
  EXPECT_THAT(CollectorLink(o).Start(), StatusIs(absl::StatusCode::kInvalidArgument));
  o = Options(1);
  o.max_buffered_batches = 0;
  EXPECT_THAT(CollectorLink(o).Start(), StatusIs(absl::StatusCode::kInvalidArgument));
}

// A spooled link that dies before the collector acknowledges anything: the next one, on the
// same directory, sends those batches first under the same boot_id and seqs, then its own above.
TEST_F(CollectorLinkTest, SpooledBatchesOutliveTheLinkAndKeepTheirIds) {
  const test::TempDir temp_dir("stepwatch-agent-test");
  const std::string& dir = temp_dir.path();
  ASSERT_FALSE(dir.empty());
  SpoolOptions spool_options;
  spool_options.dir = dir + "/spool";
  spool_options.sync = false;
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  std::string boot_id;
  {
    absl::StatusOr<std::unique_ptr<Spool>> spool =
        Spool::Open(spool_options, Options(port).agent_id);
    ASSERT_OK(spool);
    CollectorLinkOptions o = Options(port);
    o.spool = spool->get();
    CollectorLink link(o);
    ASSERT_OK(link.Start());
    boot_id = link.boot_id();
    for (int64_t step = 0; step < 6; step += 2) link.Enqueue(Cut(Steps(step, 2)));
    EXPECT_EQ((*spool)->stats().batches, 3u);
    link.Stop(absl::ZeroDuration());
  }
  FakeCollector collector;
  ASSERT_EQ(collector.Start(port, {}), port);
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(spool_options, Options(port).agent_id);
  ASSERT_OK(spool);
  CollectorLinkOptions o = Options(port);
  o.spool = spool->get();
  o.boot_id = "ignored-with-a-spool";
  CollectorLink link(o);
  EXPECT_EQ(link.boot_id(), boot_id);
  ASSERT_OK(link.Start());
  link.Enqueue(Cut(Steps(6, 1)));
  ASSERT_TRUE(AdvanceUntil([&] { return link.stats().buffered_batches == 0; }));
  EXPECT_EQ((*spool)->stats().batches, 0u);
  EXPECT_EQ((*spool)->stats().replayed_batches_total, 3u);
  std::vector<uint64_t> seqs;
  for (const auto& b : collector.batches()) {
    EXPECT_EQ(b.boot_id(), boot_id);
    seqs.push_back(b.seq());
  }
  // The new batch skips the old process's lease; it is written again once the old ones are
  // acknowledged, so that the collector learns the seqs in between will never come.
  ASSERT_GE(seqs.size(), 4u);
  EXPECT_EQ(std::vector<uint64_t>(seqs.begin(), seqs.begin() + 3),
            std::vector<uint64_t>({1, 2, 3}));
  for (size_t i = 3; i < seqs.size(); ++i) EXPECT_GT(seqs[i], 3u);
  EXPECT_EQ(AsSet(collector.unique_steps()), std::set<int64_t>({0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(collector.unique_steps().size(), 7u);
  link.Stop(absl::ZeroDuration());
}

// A batch the spool cannot take (a full disk; here a directory squats on its temporary file) is
// held in memory, counted as at risk, and written on a later cut once the spool takes it again.
TEST_F(CollectorLinkTest, BatchesTheSpoolRefusedAreHeldCountedAndSpooledLater) {
  const test::TempDir temp_dir("stepwatch-agent-test");
  const std::string& dir = temp_dir.path();
  ASSERT_FALSE(dir.empty());
  SpoolOptions spool_options;
  spool_options.dir = dir + "/spool";
  spool_options.sync = false;
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  {
    absl::StatusOr<std::unique_ptr<Spool>> spool =
        Spool::Open(spool_options, Options(port).agent_id);
    ASSERT_OK(spool);
    const std::string squat = spool_options.dir + "/batch-00000000000000000001.tmp";
    ASSERT_TRUE(std::filesystem::create_directory(squat));
    { std::ofstream keep(squat + "/x"); }
    CollectorLinkOptions o = Options(port);
    o.spool = spool->get();
    CollectorLink link(o);
    ASSERT_OK(link.Start());
    link.Enqueue(Cut(Steps(1, 2)));
    CollectorLinkStats s = link.stats();
    EXPECT_EQ(s.unspooled_batches, 1u);
    EXPECT_EQ(s.unspooled_events, 2u);
    EXPECT_EQ(s.events_unspooled_total, 2u);
    EXPECT_EQ(s.spool->batches, 0u);
    EXPECT_GT(s.spool->write_errors_total, 0u);
    std::filesystem::remove_all(squat);
    link.Enqueue(Cut(Steps(3, 1)));
    s = link.stats();
    EXPECT_EQ(s.unspooled_batches, 0u);
    EXPECT_EQ(s.unspooled_events, 0u);
    EXPECT_EQ(s.events_unspooled_total, 2u);
    EXPECT_EQ(s.batches_respooled_total, 1u);
    EXPECT_EQ(s.spool->batches, 2u);
    link.Stop(absl::ZeroDuration());
  }
  // Both survive the link.
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(spool_options, Options(port).agent_id);
  ASSERT_OK(spool);
  std::vector<std::shared_ptr<v1::ReportBatch>> left = (*spool)->TakeRecovered();
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0]->steps_size(), 2);
  EXPECT_EQ(left[1]->steps(0).step(), 3);
}

// The spool holds what the buffer holds: beyond the byte bound the oldest batches leave both,
// counted, and the next process replays only the newest.
TEST_F(CollectorLinkTest, FullSpoolDropsOldestFirstAndCountsThem) {
  const test::TempDir temp_dir("stepwatch-agent-test");
  const std::string& dir = temp_dir.path();
  ASSERT_FALSE(dir.empty());
  SpoolOptions spool_options;
  spool_options.dir = dir + "/spool";
  spool_options.sync = false;
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  {
    absl::StatusOr<std::unique_ptr<Spool>> spool =
        Spool::Open(spool_options, Options(port).agent_id);
    ASSERT_OK(spool);
    CollectorLinkOptions o = Options(port);
    o.spool = spool->get();
    o.max_buffered_bytes = 2000;
    CollectorLink link(o);
    ASSERT_OK(link.Start());
    for (int b = 0; b < 10; ++b) link.Enqueue(Cut(Steps(b * 100, 20)));
    const CollectorLinkStats s = link.stats();
    ASSERT_TRUE(s.spool.has_value());
    EXPECT_GT(s.batches_dropped_total, 0u);
    EXPECT_EQ(s.spool->dropped_batches_total, s.batches_dropped_total);
    EXPECT_EQ(s.spool->batches, s.buffered_batches);
    EXPECT_EQ(s.spool->batches + s.spool->dropped_batches_total, 10u);
    link.Stop(absl::ZeroDuration());
  }
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(spool_options, Options(port).agent_id);
  ASSERT_OK(spool);
  std::vector<std::shared_ptr<v1::ReportBatch>> left = (*spool)->TakeRecovered();
  ASSERT_FALSE(left.empty());
  EXPECT_EQ(left.back()->seq(), 10u);
  EXPECT_EQ(left.back()->steps(0).step(), 900);
}

}  // namespace
}  // namespace stepwatch::agent
