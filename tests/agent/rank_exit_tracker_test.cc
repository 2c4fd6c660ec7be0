#include "agent/rank_exit_tracker.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace stepwatch::agent {
namespace {

constexpr int64_t kT0 = 1'700'000'000'000'000'000;
constexpr int64_t kSec = 1'000'000'000;

// A child that has exited; reaped when `reap`, otherwise left a zombie (the caller reaps it).
pid_t ExitedChild(bool reap) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  if (reap) {
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  return pid;
}

TEST(ProcessGoneTest, LiveProcessesRunAndExitedOnesAreGone) {
  EXPECT_FALSE(ProcessGone(::getpid()));
  EXPECT_FALSE(ProcessGone(1));  // runs, whether or not we may signal it
  EXPECT_FALSE(ProcessGone(0));
  EXPECT_TRUE(ProcessGone(ExitedChild(/*reap=*/true)));
}

TEST(ProcessGoneTest, AZombieIsGone) {
  const pid_t child = ExitedChild(/*reap=*/false);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {  // until the child has run to its exit (<= 5 s)
    gone = ProcessGone(child);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone);
  int status = 0;
  ::waitpid(child, &status, 0);
}

TEST(RankExitTrackerTest, ReportsEachRankOfAnExitedProcessOnce) {
  RankExitTracker tracker;
  const pid_t dead = ExitedChild(/*reap=*/true);
  // One process sent for ranks 0 and 1 (a simulator); this test process sends for rank 2.
  tracker.Observe("job", 0, dead, kT0);
  tracker.Observe("job", 1, dead, kT0);
  tracker.Observe("job", 2, ::getpid(), kT0);
  tracker.Observe("other", 0, ::getpid(), kT0);
  EXPECT_EQ(tracker.size(), 4u);
  std::vector<v1::RankExit> exits = tracker.Check(kT0 + kSec);
  ASSERT_EQ(exits.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exits[r].job(), "job");
    EXPECT_EQ(exits[r].rank(), r);
    EXPECT_EQ(exits[r].pid(), dead);
    EXPECT_EQ(exits[r].exited_unix_nanos(), kT0 + kSec);
  }
  EXPECT_EQ(tracker.size(), 2u);
  // Once only; the live ranks are never reported.
  EXPECT_TRUE(tracker.Check(kT0 + 2 * kSec).empty());
  EXPECT_TRUE(tracker.Check(kT0 + 3 * kSec).empty());
  EXPECT_EQ(tracker.size(), 2u);
}

TEST(RankExitTrackerTest, JobsWithLiveSendersLeaveOutJobsWhoseProcessesExited) {
  RankExitTracker tracker;
  const pid_t dead = ExitedChild(/*reap=*/true);
  tracker.Observe("ended", 0, dead, kT0);
  tracker.Observe("hung", 0, ::getpid(), kT0);
  tracker.Observe("hung", 1, dead, kT0);
  std::vector<std::string> jobs = tracker.JobsWithLiveSenders();
  std::sort(jobs.begin(), jobs.end());
  EXPECT_EQ(jobs, (std::vector<std::string>{"ended", "hung"}));  // not checked yet
  tracker.Check(kT0 + kSec);
  EXPECT_EQ(tracker.JobsWithLiveSenders(), std::vector<std::string>{"hung"});
}

TEST(RankExitTrackerTest, TheLastSenderOfARankCounts) {
  RankExitTracker tracker;
  const pid_t dead = ExitedChild(/*reap=*/true);
  tracker.Observe("job", 0, dead, kT0);
  tracker.Observe("job", 0, ::getpid(), kT0 + kSec);  // restarted in a new process
  EXPECT_TRUE(tracker.Check(kT0 + 2 * kSec).empty());
  // A step again from a process that is gone (a datagram read late) is reported again.
  tracker.Observe("job", 0, dead, kT0 + 3 * kSec);
  EXPECT_EQ(tracker.Check(kT0 + 4 * kSec).size(), 1u);
  // Unknown senders (pid 0) are not tracked.
  tracker.Observe("job", 1, 0, kT0);
  EXPECT_EQ(tracker.size(), 0u);
}

TEST(RankExitTrackerTest, ChecksEachPidOnce) {
  int checks = 0;
  RankExitTrackerOptions o;
  o.process_gone = [&](pid_t) {
    ++checks;
    return false;
  };
  RankExitTracker tracker(o);
  for (int r = 0; r < 100; ++r) tracker.Observe("sim", r, 4242, kT0);
  EXPECT_TRUE(tracker.Check(kT0).empty());
  EXPECT_EQ(checks, 1);
}

TEST(RankExitTrackerTest, BoundedKeepingTheMostRecentlySeen) {
  RankExitTrackerOptions o;
  o.max_tracked = 16;
  o.process_gone = [](pid_t) { return true; };
  RankExitTracker tracker(o);
  for (int r = 0; r < 1000; ++r) {
    tracker.Observe("job", r, 100 + r, kT0 + r);
    ASSERT_LE(tracker.size(), 16u);
  }
  std::vector<v1::RankExit> exits = tracker.Check(kT0 + kSec);
  ASSERT_FALSE(exits.empty());
  EXPECT_LE(exits.size(), 16u);
  EXPECT_EQ(exits.back().rank(), 999);  // the newest survived
  for (const auto& x : exits) EXPECT_GE(x.rank(), 1000 - 16);
  EXPECT_EQ(tracker.size(), 0u);
}

TEST(RankExitTrackerTest, ForgetsRanksSilentForLong) {
  bool gone = false;
  RankExitTrackerOptions o;
  o.forget_after = absl::Minutes(10);
  o.process_gone = [&](pid_t) { return gone; };
  RankExitTracker tracker(o);
  tracker.Observe("old", 0, 100, kT0);
  tracker.Observe("new", 0, 101, kT0 + 9 * 60 * kSec);
  EXPECT_TRUE(tracker.Check(kT0 + 10 * 60 * kSec + 1).empty());
  EXPECT_EQ(tracker.size(), 1u);  // "old" forgotten, without a report
  gone = true;
  std::vector<v1::RankExit> exits = tracker.Check(kT0 + 10 * 60 * kSec + 2);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].job(), "new");
}

}  // namespace
}  // namespace stepwatch::agent
