#include "agent/collector_router.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/node_reading.h"
#include "common/clock.h"
#include "common/collectors.h"
#include "gtest/gtest.h"
#include "tests/agent/fake_collector.h"
#include "tests/agent/test_util.h"
#include "tests/testing/net.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::agent {
namespace {

using ::testing::HasSubstr;
using testing::WaitFor;

constexpr char kNode[] = "node-a";

v1::StepEvent JobStep(const std::string& job, int64_t step) {
  v1::StepEvent e;
  e.set_job(job);
  e.set_rank(0);
  e.set_world_size(1);
  e.set_step(step);
  e.set_step_seconds(0.1);
  return e;
}

std::string Address(int port) { return "127.0.0.1:" + std::to_string(port); }

using Counts = std::multiset<std::pair<std::string, int64_t>>;

// The (job, step) pairs a collector counted, as a multiset (a pair twice is a double count).
Counts Counted(FakeCollector* c) {
  const auto v = c->unique_job_steps();
  return {v.begin(), v.end()};
}

std::set<int64_t> AsSet(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// A collector list the test changes; the router resolves it through options.resolve.
class FakeResolver {
 public:
  void Set(std::vector<std::string> list) {
    absl::MutexLock lock(&mu_);
    list_ = std::move(list);
    fail_ = false;
  }
  void Fail() {
    absl::MutexLock lock(&mu_);
    fail_ = true;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  CollectorResolver AsResolver() {
    return [this]() -> absl::StatusOr<std::vector<std::string>> {
      absl::MutexLock lock(&mu_);
      ++calls_;
      if (fail_) return absl::UnavailableError("no such name (test)");
      return list_;
    };
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> list_ ABSL_GUARDED_BY(mu_);
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// Every router here runs on a SimulatedClock (see CollectorLinkTest): the ticker (an hour), the
// resolver, the failover delay and the links' backoffs move only when the test moves the time.
class CollectorRouterTest : public ::testing::Test {
 protected:
  void StartCollectors(int n, FakeCollector::Behaviour b = {}) {
    for (int i = 0; i < n; ++i) {
      collectors_.push_back(std::make_unique<FakeCollector>());
      const int port = collectors_.back()->Start(0, b);
      ASSERT_GT(port, 0);
      ports_.push_back(port);
      addresses_.push_back(Address(port));
    }
  }

  FakeCollector* ByAddress(const std::string& address) {
    for (size_t i = 0; i < addresses_.size(); ++i) {
      if (addresses_[i] == address) return collectors_[i].get();
    }
    return nullptr;
  }

  CollectorRouterOptions Options(int replicas) {
    CollectorRouterOptions o;
    o.resolve = resolver_.AsResolver();
    o.replicas = replicas;
    o.failover_after = absl::Seconds(2);
    o.link.agent_id = MakeAgentId(kNode, "/tmp/a.sock");
    o.link.node_info.set_node(kNode);
    o.interval = absl::Hours(1);
    o.link.clock = &clock_;
    o.link.backoff.initial = absl::Milliseconds(10);
    o.link.backoff.max = absl::Milliseconds(100);
    o.link.connect_timeout = absl::Milliseconds(500);
    return o;
  }

  bool AdvanceUntil(const std::function<bool()>& pred,
                    absl::Duration horizon = absl::Milliseconds(100)) {
    return testing::AdvanceUntil(clock_, pred, horizon);
  }

  static bool AllConnected(const CollectorRouter& router, size_t n) {
    const CollectorRouterStats s = router.stats();
    if (s.links.size() != n) return false;
    for (const auto& l : s.links) {
      if (!l.connected) return false;
    }
    return true;
  }

  // A copy: the stats are a temporary.
  static std::optional<CollectorLinkStats> Link(const CollectorRouterStats& s,
                                                const std::string& a) {
    for (const auto& l : s.links) {
      if (l.collector == a) return l;
    }
    return std::nullopt;
  }

  SimulatedClock clock_;
  FakeResolver resolver_;
  std::vector<std::unique_ptr<FakeCollector>> collectors_;
  std::vector<int> ports_;
  std::vector<std::string> addresses_;
};

TEST(LinkSpoolNameTest, KeepsOnlySafeCharacters) {
  EXPECT_EQ(LinkSpoolName("10.0.0.1:7070"), "collector-10.0.0.1_7070");
  EXPECT_EQ(LinkSpoolName("[fd00::1]:7070"), "collector-_fd00__1__7070");
  EXPECT_EQ(LinkSpoolName("../../etc:1"), "collector-.._.._etc_1");
  EXPECT_EQ(LinkSpoolName("../../etc:1").find('/'), std::string::npos);
}

// Jobs go to their R rendezvous owners and nowhere else; the node's samples go to the owners of
// NodePlacementKey(node) while no job runs, then to the union of the owners of its jobs.
TEST_F(CollectorRouterTest, PlacesJobsAndNodeSamplesOnRendezvousOwners) {
  StartCollectors(3);
  resolver_.Set(addresses_);
  FakeGpus gpus;
  FakeHost host;
  CollectorRouter router(Options(2), &gpus, &host);
  ASSERT_OK(router.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 3); }));

  // No job yet: the samples follow the node's own key.
  router.FlushNow();
  const std::vector<std::string> node_owners =
      RendezvousOwners(NodePlacementKey(kNode), addresses_, 2);
  ASSERT_EQ(node_owners.size(), 2u);
  for (const std::string& a : node_owners) {
    ASSERT_TRUE(WaitFor([&] { return ByAddress(a)->batches_with_gpus() == 1; })) << a;
  }
  // A job whose owners are not the node's owners, so that the samples visibly follow the job.
  std::string job;
  for (int i = 0; i < 100 && job.empty(); ++i) {
    const std::string candidate = "job-" + std::to_string(i);
    if (RendezvousOwners(candidate, addresses_, 2) != node_owners) job = candidate;
  }
  ASSERT_FALSE(job.empty());
  const std::vector<std::string> job_owners = RendezvousOwners(job, addresses_, 2);
  EXPECT_EQ(router.OwnersOf(job), job_owners);

  // Several jobs, each on its own owners, once on each.
  const std::vector<std::string> jobs = {job, "other-1", "other-2", "other-3"};
  for (const std::string& j : jobs) {
    for (int64_t s = 0; s < 3; ++s) router.AddStep(JobStep(j, s));
  }
  router.FlushNow();
  for (size_t i = 0; i < addresses_.size(); ++i) {
    Counts expected;
    for (const std::string& j : jobs) {
      const std::vector<std::string> o = RendezvousOwners(j, addresses_, 2);
      if (std::find(o.begin(), o.end(), addresses_[i]) == o.end()) continue;
      for (int64_t s = 0; s < 3; ++s) expected.insert({j, s});
    }
    ASSERT_TRUE(WaitFor([&] { return Counted(collectors_[i].get()) == expected; }))
        << addresses_[i];
  }

  // With one job only, the samples go to that job's owners.
  std::unique_ptr<CollectorRouter> single;
  {
    // A second agent on the same collectors (another node) with one job.
    CollectorRouterOptions o = Options(2);
    o.link.agent_id = MakeAgentId("node-b", "/tmp/a.sock");
    o.link.node_info.set_node("node-b");
    single = std::make_unique<CollectorRouter>(o, &gpus, &host);
  }
  std::map<std::string, size_t> gpus_before;
  for (const std::string& a : addresses_) gpus_before[a] = ByAddress(a)->batches_with_gpus();
  ASSERT_OK(single->Start());
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(*single, 3); }));
  single->AddStep(JobStep(job, 100));
  single->FlushNow();
  for (const std::string& a : job_owners) {
    ASSERT_TRUE(WaitFor([&] { return ByAddress(a)->batches_with_gpus() == gpus_before[a] + 1; }))
        << a;
  }
  for (const std::string& a : addresses_) {
    if (std::find(job_owners.begin(), job_owners.end(), a) != job_owners.end()) continue;
    EXPECT_EQ(ByAddress(a)->batches_with_gpus(), gpus_before[a]) << a;
  }
  EXPECT_TRUE(single->stats().total.connected);
  single->Stop(absl::Seconds(1));
  router.Stop(absl::Seconds(1));
}

// A job that stops stepping while its processes still run (hung, or checkpointing) keeps the
// node's samples on its collectors; once its processes exited they go back to the node's owners.
TEST_F(CollectorRouterTest, HungJobKeepsTheNodeSamplesWhileItsProcessesRun) {
  StartCollectors(3);
  resolver_.Set(addresses_);
  FakeGpus gpus;
  FakeHost host;
  std::atomic<bool> gone{false};
  CollectorRouterOptions o = Options(2);
  o.recent_job_window = absl::Seconds(1);
  o.link.rank_exits.process_gone = [&gone](pid_t) { return gone.load(); };
  CollectorRouter router(o, &gpus, &host);
  ASSERT_OK(router.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 3); }));
  const std::vector<std::string> node_owners =
      RendezvousOwners(NodePlacementKey(kNode), addresses_, 2);
  std::string job;
  for (int i = 0; i < 100 && job.empty(); ++i) {
    const std::string candidate = "job-" + std::to_string(i);
    if (RendezvousOwners(candidate, addresses_, 2) != node_owners) job = candidate;
  }
  ASSERT_FALSE(job.empty());
  const std::vector<std::string> job_owners = RendezvousOwners(job, addresses_, 2);
  std::map<std::string, size_t> expected;
  for (const std::string& a : addresses_) expected[a] = 0;
  // One cut: the samples go to `to`, and to no one else.
  auto cut_goes_to = [&](const std::vector<std::string>& to) {
    router.FlushNow();
    for (const std::string& a : to) ++expected[a];
    for (const std::string& a : addresses_) {
      if (!WaitFor([&] { return ByAddress(a)->batches_with_gpus() == expected[a]; })) return false;
    }
    return true;
  };
  v1::StepEvent step = JobStep(job, 0);
  step.set_pid(static_cast<int32_t>(::getpid()));
  router.AddStep(std::move(step));
  EXPECT_TRUE(cut_goes_to(job_owners));
  // Silent for longer than the recent-job window, its process still running.
  clock_.AdvanceTime(absl::Seconds(5));
  EXPECT_TRUE(cut_goes_to(job_owners));
  // The process exits: its exit still goes to the job's owners with the samples, then the node's
  // samples return to the node's own owners.
  gone = true;
  clock_.AdvanceTime(absl::Seconds(5));
  EXPECT_TRUE(cut_goes_to(job_owners));
  clock_.AdvanceTime(absl::Seconds(5));
  EXPECT_TRUE(cut_goes_to(node_owners));
  router.Stop(absl::Seconds(1));
}

// A collector that goes away keeps its jobs for --failover-after (buffered, not moved); after
// that they go to the next collector in their order, and back when it returns. Nothing is
// counted twice by any collector.
TEST_F(CollectorRouterTest, FailsOverAfterTheDelayAndMovesBack) {
  StartCollectors(3);
  resolver_.Set(addresses_);
  CollectorRouter router(Options(1), nullptr, nullptr);
  ASSERT_OK(router.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 3); }));
  const std::string job = "job-x";
  const std::vector<std::string> order = RendezvousOrder(job, addresses_);
  const size_t first_index =
      std::find(addresses_.begin(), addresses_.end(), order[0]) - addresses_.begin();
  FakeCollector* second = ByAddress(order[1]);

  router.AddStep(JobStep(job, 0));
  router.FlushNow();
  ASSERT_TRUE(WaitFor([&] { return Counted(ByAddress(order[0])).size() == 1; }));

  collectors_[first_index]->Shutdown();
  ASSERT_TRUE(WaitFor([&] { return !Link(router.stats(), order[0])->connected; }));
  // Down, but not for --failover-after yet: the job stays, its batch is buffered.
  EXPECT_EQ(router.OwnersOf(job), std::vector<std::string>({order[0]}));
  router.AddStep(JobStep(job, 1));
  router.FlushNow();
  EXPECT_FALSE(router.stats().total.connected);
  EXPECT_EQ(Link(router.stats(), order[0])->buffered_batches, 1u);

  clock_.AdvanceTime(absl::Seconds(2));
  EXPECT_EQ(router.OwnersOf(job), std::vector<std::string>({order[1]}));
  EXPECT_FALSE(Link(router.stats(), order[0])->reachable);
  router.AddStep(JobStep(job, 2));
  router.FlushNow();
  ASSERT_TRUE(WaitFor([&] { return Counted(second).size() == 1; }));
  EXPECT_EQ(Counted(second).count({job, 2}), 1u);
  EXPECT_EQ(router.stats().job_moves_total, 1u);
  // The owner needed now (the second) is connected.
  EXPECT_TRUE(router.stats().total.connected);

  // The first collector returns (a restarted process on the same address).
  FakeCollector back;
  ASSERT_EQ(back.Start(ports_[first_index], {}), ports_[first_index]);
  ASSERT_TRUE(AdvanceUntil([&] { return Link(router.stats(), order[0])->connected; }));
  EXPECT_EQ(router.OwnersOf(job), std::vector<std::string>({order[0]}));
  router.AddStep(JobStep(job, 3));
  router.FlushNow();
  // It gets what was buffered during the outage and the new step, each counted once.
  ASSERT_TRUE(WaitFor([&] {
    return Counted(&back) == Counts({{job, 1}, {job, 3}});
  })) << Counted(&back).size();
  EXPECT_EQ(Counted(second), Counts({{job, 2}}));
  EXPECT_EQ(router.stats().job_moves_total, 2u);
  // The collector that held the job meanwhile is told it left (and forgets it, instead of
  // keeping stale findings); the one that was away was not told, so it goes on with its history.
  ASSERT_TRUE(WaitFor([&] { return second->released_jobs() == std::vector<std::string>{job}; }));
  EXPECT_TRUE(back.released_jobs().empty());
  router.Stop(absl::Seconds(1));
}

// A link that never connected counts as down --failover-after from its start.
TEST_F(CollectorRouterTest, NeverConnectedCollectorIsSkippedAfterTheDelay) {
  StartCollectors(1);
  ASSERT_OK_AND_ASSIGN(const int dead_port, test::FreeLoopbackPort());
  const std::string dead = Address(dead_port);
  resolver_.Set({addresses_[0], dead});
  CollectorRouter router(Options(1), nullptr, nullptr);
  ASSERT_OK(router.Start());
  // A job the dead collector would hold.
  std::string job;
  for (int i = 0; i < 100 && job.empty(); ++i) {
    const std::string candidate = "job-" + std::to_string(i);
    if (RendezvousOrder(candidate, {addresses_[0], dead})[0] == dead) job = candidate;
  }
  ASSERT_FALSE(job.empty());
  // The live one connects at its first attempt (no time passes); the dead one is still within
  // its first --failover-after.
  ASSERT_TRUE(WaitFor([&] { return Link(router.stats(), addresses_[0])->connected; }));
  EXPECT_EQ(router.OwnersOf(job), std::vector<std::string>({dead}));
  clock_.AdvanceTime(absl::Seconds(2));
  EXPECT_EQ(router.OwnersOf(job), std::vector<std::string>({addresses_[0]}));
  router.AddStep(JobStep(job, 7));
  router.FlushNow();
  ASSERT_TRUE(AdvanceUntil([&] { return Counted(collectors_[0].get()).size() == 1; }));
  router.Stop(absl::ZeroDuration());
}

// The list is re-resolved every resolve_interval: a new address gets a link, a gone one loses
// it, a failed resolution keeps the last list. A collector that leaves and returns is fed by a
// new link under a new boot_id, so its batches (numbered from 1 again) are not taken for ones it
// has already counted.
TEST_F(CollectorRouterTest, ReResolvesAddsAndRemovesLinksWithoutDoubleCounting) {
  StartCollectors(2);
  resolver_.Set({addresses_[0]});
  CollectorRouterOptions o = Options(2);
  o.resolve_interval = absl::Seconds(30);
  const absl::Time start = clock_.TimeNow();
  CollectorRouter router(o, nullptr, nullptr);
  ASSERT_OK(router.Start());
  EXPECT_EQ(router.collectors(), std::vector<std::string>({addresses_[0]}));
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 1); }));

  const std::string job = "job-r";
  router.AddStep(JobStep(job, 0));
  router.FlushNow();
  // Acknowledged: no acknowledgement wait is pending on the clock.
  ASSERT_TRUE(WaitFor([&] { return router.stats().total.batches_acknowledged_total == 1; }));

  // The second collector appears at the next resolution, not before.
  resolver_.Set(addresses_);
  const int calls = resolver_.calls();
  // The resolver waits 30 s from its start (a few ms of backoff after `start` at most).
  clock_.SetTime(start + absl::Seconds(29));
  EXPECT_EQ(router.collectors().size(), 1u);
  EXPECT_EQ(resolver_.calls(), calls);
  clock_.SetTime(start + absl::Seconds(31));
  // On a loaded machine the resolver may enter its wait after the connection backoffs above moved
  // the clock on, so its wake-up can be past start + 31 s: move on to it (one resolution).
  ASSERT_TRUE(AdvanceUntil([&] { return router.collectors().size() == 2u; }, absl::Seconds(31)));
  EXPECT_EQ(resolver_.calls(), calls + 1);
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 2); }));
  const std::string first_boot = Link(router.stats(), addresses_[1])->boot_id;
  router.AddStep(JobStep(job, 1));
  router.FlushNow();
  ASSERT_TRUE(WaitFor([&] { return Counted(collectors_[1].get()).size() == 1; }));

  // A failed resolution changes nothing.
  resolver_.Fail();
  clock_.AdvanceTime(absl::Seconds(31));
  ASSERT_TRUE(WaitFor([&] { return router.stats().resolve_errors_total == 1; }));
  EXPECT_EQ(router.collectors().size(), 2u);

  // Gone, then back.
  resolver_.Set({addresses_[0]});
  router.ResolveNow();
  EXPECT_EQ(router.collectors(), std::vector<std::string>({addresses_[0]}));
  router.AddStep(JobStep(job, 2));
  router.FlushNow();
  resolver_.Set(addresses_);
  router.ResolveNow();
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 2); }));
  EXPECT_NE(Link(router.stats(), addresses_[1])->boot_id, first_boot);
  router.AddStep(JobStep(job, 3));
  router.FlushNow();
  ASSERT_TRUE(WaitFor([&] { return Counted(collectors_[1].get()).size() == 2; }))
      << Counted(collectors_[1].get()).size();
  EXPECT_EQ(Counted(collectors_[1].get()), Counts({{job, 1}, {job, 3}}));
  ASSERT_TRUE(WaitFor([&] { return Counted(collectors_[0].get()).size() == 4; }));
  const CollectorRouterStats s = router.stats();
  EXPECT_EQ(s.links_added_total, 3u);
  EXPECT_EQ(s.links_removed_total, 1u);
  // Counters include the removed link: its one batch was created and acknowledged.
  EXPECT_EQ(s.total.batches_created_total, 4u + 2u);
  router.Stop(absl::Seconds(1));
}

// dns:///localhost:PORT through the real resolver: the address the name resolves to gets a link.
TEST_F(CollectorRouterTest, ResolvesADnsName) {
  StartCollectors(1);
  absl::StatusOr<CollectorTargets> targets =
      ParseCollectorTargets("dns:///localhost:" + std::to_string(ports_[0]));
  ASSERT_OK(targets);
  CollectorRouterOptions o = Options(1);
  o.resolve = nullptr;
  o.targets = *targets;
  CollectorRouter router(o, nullptr, nullptr);
  ASSERT_OK(router.Start());
  const std::vector<std::string> links = router.collectors();
  EXPECT_NE(std::find(links.begin(), links.end(), addresses_[0]), links.end());
  router.Stop(absl::ZeroDuration());
}

// Each link spools under its own subdirectory; a later agent replays each one to its collector,
// under the boot_id that link had.
TEST_F(CollectorRouterTest, SpoolsPerCollectorAndReplaysToTheSameCollector) {
  const test::TempDir temp_dir("stepwatch-agent-test");
  const std::string& dir = temp_dir.path();
  ASSERT_FALSE(dir.empty());
  ASSERT_OK_AND_ASSIGN(const int first_port, test::FreeLoopbackPort());
  ASSERT_OK_AND_ASSIGN(const int second_port, test::FreeLoopbackPort());
  const std::vector<int> ports = {first_port, second_port};
  ASSERT_NE(ports[0], ports[1]);
  const std::vector<std::string> addresses = {Address(ports[0]), Address(ports[1])};
  resolver_.Set(addresses);
  CollectorRouterOptions o = Options(2);
  o.spool.dir = dir + "/spool";
  o.spool.sync = false;
  std::map<std::string, std::string> boot_ids;
  {
    CollectorRouter router(o, nullptr, nullptr);
    ASSERT_OK(router.Start());
    router.AddStep(JobStep("job-s", 0));
    router.AddStep(JobStep("job-s", 1));
    router.FlushNow();
    const CollectorRouterStats s = router.stats();
    ASSERT_EQ(s.links.size(), 2u);
    for (const auto& l : s.links) {
      boot_ids[l.collector] = l.boot_id;
      ASSERT_TRUE(l.spool.has_value());
      EXPECT_EQ(l.spool->batches, 1u) << l.collector;
    }
    ASSERT_TRUE(s.total.spool.has_value());
    EXPECT_EQ(s.total.spool->batches, 2u);
    EXPECT_NE(boot_ids[addresses[0]], boot_ids[addresses[1]]);
    router.Stop(absl::ZeroDuration());
  }
  for (const std::string& a : addresses) {
    EXPECT_TRUE(std::filesystem::is_directory(o.spool.dir + "/" + LinkSpoolName(a))) << a;
  }
  FakeCollector collector;
  ASSERT_EQ(collector.Start(ports[0], {}), ports[0]);
  CollectorRouter router(o, nullptr, nullptr);
  ASSERT_OK(router.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return collector.unique_steps().size() == 2; }));
  for (const auto& b : collector.batches()) EXPECT_EQ(b.boot_id(), boot_ids[addresses[0]]);
  EXPECT_EQ(AsSet(collector.unique_steps()), std::set<int64_t>({0, 1}));
  ASSERT_TRUE(WaitFor([&] {
    const std::optional<CollectorLinkStats> l = Link(router.stats(), addresses[0]);
    return l && l->spool && l->spool->batches == 0;
  }));
  const std::optional<CollectorLinkStats> other = Link(router.stats(), addresses[1]);
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->spool->batches, 1u);
  router.Stop(absl::ZeroDuration());
}

// One agent per --spool-dir, as with the single-collector layout: a second one fails to start.
TEST_F(CollectorRouterTest, SpoolDirectoryInUseFailsTheStart) {
  const test::TempDir temp_dir("stepwatch-agent-test");
  const std::string& dir = temp_dir.path();
  ASSERT_FALSE(dir.empty());
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  resolver_.Set({Address(port)});
  CollectorRouterOptions o = Options(1);
  o.spool.dir = dir + "/spool";
  o.spool.sync = false;
  CollectorRouter first(o, nullptr, nullptr);
  ASSERT_OK(first.Start());
  CollectorRouter second(o, nullptr, nullptr);
  const absl::Status st = second.Start();
  EXPECT_THAT(st, test::StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in use")));
  first.Stop(absl::ZeroDuration());
}

TEST_F(CollectorRouterTest, StepsWaitWhileNoCollectorResolved) {
  resolver_.Fail();
  CollectorRouter router(Options(2), nullptr, nullptr);
  ASSERT_OK(router.Start());
  router.AddStep(JobStep("job-w", 0));
  router.FlushNow();
  EXPECT_EQ(router.stats().total.pending_events, 1u);
  EXPECT_FALSE(router.stats().total.connected);
  EXPECT_GE(router.stats().resolve_errors_total, 1u);
  StartCollectors(1);
  resolver_.Set(addresses_);
  // Retried every initial_resolve_retry (1 s) until it first succeeds.
  ASSERT_TRUE(
      WaitFor([&] { return clock_.next_deadline() == clock_.TimeNow() + absl::Seconds(1); }));
  clock_.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return router.collectors().size() == 1; }));
  router.FlushNow();
  ASSERT_TRUE(AdvanceUntil([&] { return collectors_[0]->unique_steps().size() == 1; }));
  router.Stop(absl::ZeroDuration());
}

// A sender process that exited is reported once, in the last batch of the cut that carries the
// steps it sent before, and counted.
TEST_F(CollectorRouterTest, ExitedSenderIsReportedOnceAfterItsSteps) {
  StartCollectors(1);
  resolver_.Set(addresses_);
  CollectorRouterOptions o = Options(1);
  o.link.max_events_per_batch = 2;
  CollectorRouter router(o, nullptr, nullptr);
  ASSERT_OK(router.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 1); }));
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);
  for (int64_t i = 0; i < 3; ++i) {
    v1::StepEvent e = JobStep("job", i);
    e.set_pid(dead);
    router.AddStep(std::move(e));
  }
  v1::StepEvent alive = JobStep("job", 0);
  alive.set_rank(1);
  alive.set_world_size(2);
  alive.set_pid(::getpid());
  router.AddStep(std::move(alive));
  router.FlushNow();
  router.FlushNow();
  ASSERT_TRUE(AdvanceUntil([&] { return router.stats().total.batches_acknowledged_total == 3; }));
  const auto batches = collectors_[0]->batches();
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].steps_size(), 2);
  EXPECT_EQ(batches[0].rank_exits_size(), 0);
  // The exit rides in the last batch of its cut, after the steps the process sent.
  EXPECT_EQ(batches[1].steps_size(), 2);
  ASSERT_EQ(batches[1].rank_exits_size(), 1);
  EXPECT_EQ(batches[1].rank_exits(0).job(), "job");
  EXPECT_EQ(batches[1].rank_exits(0).rank(), 0);
  EXPECT_EQ(batches[1].rank_exits(0).pid(), dead);
  EXPECT_EQ(batches[2].rank_exits_size(), 0);  // once
  EXPECT_EQ(router.stats().total.rank_exits_total, 1u);
  router.Stop(absl::ZeroDuration());
}

// Beyond max_pending_events the steps waiting for the next cut are dropped and counted; the cut
// takes the rest.
TEST_F(CollectorRouterTest, PendingStepsAreBounded) {
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  resolver_.Set({Address(port)});
  CollectorRouterOptions o = Options(1);
  o.link.max_pending_events = 5;
  CollectorRouter router(o, nullptr, nullptr);
  ASSERT_OK(router.Start());
  ASSERT_EQ(router.collectors().size(), 1u);
  for (int64_t i = 0; i < 8; ++i) router.AddStep(JobStep("job-p", i));
  EXPECT_EQ(router.stats().total.pending_events, 5u);
  EXPECT_EQ(router.stats().total.events_dropped_total, 3u);
  router.FlushNow();
  EXPECT_EQ(router.stats().total.pending_events, 0u);
  EXPECT_EQ(router.stats().total.events_shipped_total, 5u);
  router.Stop(absl::ZeroDuration());
}

// The node as the last cut read it is kept for the agent's own /metrics.
TEST_F(CollectorRouterTest, KeepsTheLatestReadingsForMetrics) {
  ASSERT_OK_AND_ASSIGN(const int port, test::FreeLoopbackPort());
  resolver_.Set({Address(port)});
  FakeGpus gpus;
  FakeHost host;
  CollectorRouter router(Options(1), &gpus, &host);
  ASSERT_OK(router.Start());
  const NodeReading before = router.LatestSamples();
  EXPECT_EQ(before.node.node(), kNode);
  EXPECT_TRUE(before.gpus.empty());
  EXPECT_FALSE(before.host.has_value());
  router.FlushNow();
  const NodeReading latest = router.LatestSamples();
  EXPECT_EQ(latest.node.node(), kNode);
  EXPECT_TRUE(latest.node.nvml_available());
  EXPECT_EQ(latest.node.gpu_count(), 2);
  ASSERT_EQ(latest.gpus.size(), 2u);
  EXPECT_DOUBLE_EQ(latest.gpus[1].utilization_gpu_ratio(), 0.75);
  ASSERT_TRUE(latest.host.has_value());
  EXPECT_EQ(latest.host->cpu_count(), 16u);
  router.Stop(absl::ZeroDuration());
}

// The ticker and the failover delay are measured on the monotonic clock: with the wall clock
// stepped back or forward an hour between ticks, every tick still comes one interval later, and
// a collector that just went away is still within its failover delay (its job stays put).
// The only schedule: one cut at every interval exactly (a fractional one too), none before it; a
// stall of ten intervals gives one cut, not ten, and the schedule restarts from it.
TEST_F(CollectorRouterTest, CutsOnItsScheduleWithFractionalInterval) {
  StartCollectors(1);
  resolver_.Set(addresses_);
  CollectorRouterOptions o = Options(1);
  o.interval = absl::Milliseconds(50);
  const absl::Time start = clock_.TimeNow();
  CollectorRouter router(o, nullptr, nullptr);
  ASSERT_OK(router.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 1); }, absl::Milliseconds(20)));
  FakeCollector* collector = collectors_[0].get();
  router.AddStep(JobStep("job-s", 1));
  for (int k = 1; k <= 3; ++k) {
    const absl::Time tick = start + k * o.interval;
    ASSERT_TRUE(WaitFor([&] { return clock_.next_deadline() == tick; })) << k;
    EXPECT_EQ(router.stats().total.batches_created_total, static_cast<uint64_t>(k - 1));
    clock_.AdvanceTime(tick - clock_.TimeNow());
    ASSERT_TRUE(WaitFor([&] { return collector->batches().size() == static_cast<size_t>(k); }));
    EXPECT_EQ(collector->batches().back().created_unix_nanos(), absl::ToUnixNanos(tick));
  }
  EXPECT_EQ(collector->batches()[0].steps_size(), 1);
  // Without sources a batch carries no GPUs and no host.
  EXPECT_EQ(collector->batches()[0].gpus_size(), 0);
  EXPECT_FALSE(collector->batches()[0].has_host());

  clock_.AdvanceTime(10 * o.interval);
  const absl::Time resumed = clock_.TimeNow();
  ASSERT_TRUE(WaitFor([&] { return clock_.next_deadline() == resumed + o.interval; }));
  EXPECT_EQ(router.stats().total.batches_created_total, 4u);
  router.Stop(absl::ZeroDuration());
}

TEST_F(CollectorRouterTest, WallClockStepsMoveNoTickAndNoJob) {
  StartCollectors(2);
  resolver_.Set(addresses_);
  CollectorRouterOptions o = Options(1);
  o.interval = absl::Milliseconds(50);
  CollectorRouter router(o, nullptr, nullptr);
  ASSERT_OK(router.Start());
  ASSERT_TRUE(AdvanceUntil([&] { return AllConnected(router, 2); }, absl::Milliseconds(20)));
  const std::string job = "job-w";
  const std::vector<std::string> owners = router.OwnersOf(job);
  ASSERT_EQ(owners.size(), 1u);
  FakeCollector* owner = ByAddress(owners[0]);
  for (int k = 1; k <= 3; ++k) {
    router.AddStep(JobStep(job, k));
    clock_.StepWallTime((k % 2 == 1 ? -1 : 2) * absl::Hours(1));
    ASSERT_TRUE(WaitFor([&] {
      const absl::Duration left = clock_.next_deadline() - clock_.TimeNow();
      return left > absl::ZeroDuration() && left <= o.interval;
    })) << k
        << ": " << clock_.next_deadline() - clock_.TimeNow();
    clock_.AdvanceTime(clock_.next_deadline() - clock_.TimeNow());
    ASSERT_TRUE(WaitFor([&] { return Counted(owner).size() == static_cast<size_t>(k); })) << k;
  }
  owner->Shutdown();
  ASSERT_TRUE(WaitFor([&] { return !Link(router.stats(), owners[0])->connected; }));
  clock_.StepWallTime(absl::Hours(1));
  EXPECT_EQ(router.OwnersOf(job), owners);
  EXPECT_TRUE(Link(router.stats(), owners[0])->reachable);
  router.Stop(absl::ZeroDuration());
}

}  // namespace
}  // namespace stepwatch::agent
