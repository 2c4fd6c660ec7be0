#include "common/clock.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace stepwatch {
namespace {

// Polls (in real time) until `pred` holds, for at most 10 s: only for "the other thread has got
// as far as blocking", never for a timeout of the code under test.
bool Eventually(const std::function<bool()>& pred) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return pred();
}

TEST(RealClockTest, ReadsTheSystemClockAndWaitsForReal) {
  RealClock clock;
  const absl::Time before = absl::Now();
  const absl::Time now = clock.TimeNow();
  EXPECT_GE(now, before);
  EXPECT_LE(now, absl::Now());
  EXPECT_NEAR(clock.NowUnixNanos(), absl::ToUnixNanos(absl::Now()), 1e9);

  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  const bool yes = true, no = false;
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&yes), absl::InfiniteFuture()));
  const absl::Time start = absl::Now();
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&no), start + absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  clock.SleepFor(absl::Milliseconds(-5));  // returns at once
}

// Elapsed time on the monotonic clock, which the tests below measure with: under libfaketime
// (tests/common/CMakeLists.txt) the wall clock runs an hour fast.
absl::Duration Since(std::chrono::steady_clock::time_point start) {
  return absl::FromChrono(std::chrono::steady_clock::now() - start);
}

// A deadline 200 ms away ends the wait after 200 ms, not before and not much later, also when
// the process sees the wall clock an hour fast (absl::Mutex's own deadline wait then lasts an
// hour and 200 ms).
TEST(RealClockTest, DeadlineWaitLastsItsDurationOnTheMonotonicClock) {
  RealClock clock;
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  const bool never = false;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&never),
                                         clock.TimeNow() + absl::Milliseconds(200)));
    const absl::Duration took = Since(start);
    EXPECT_GE(took, absl::Milliseconds(199));
    EXPECT_LT(took, absl::Seconds(2)) << "a wait of 200 ms took " << took;
  }
  const auto start = std::chrono::steady_clock::now();
  clock.SleepFor(absl::Milliseconds(200));
  clock.SleepUntil(clock.TimeNow() + absl::Milliseconds(200));
  EXPECT_GE(Since(start), absl::Milliseconds(399));
  EXPECT_LT(Since(start), absl::Seconds(3));
}

// The condition becomes true through another thread's unlock: the waiter wakes at once, long
// before its deadline, holding the mutex and seeing what that thread wrote.
TEST(RealClockTest, AwaitWakesPromptlyWhenAnotherThreadMakesTheConditionTrue) {
  RealClock clock;
  absl::Mutex mu;
  bool waiting = false, ready = false;
  int guarded = 0, seen_by_waiter = -1;
  bool result = false;
  std::chrono::steady_clock::time_point woke;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    waiting = true;
    result =
        clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.TimeNow() + absl::Seconds(30));
    woke = std::chrono::steady_clock::now();
    mu.AssertHeld();
    seen_by_waiter = guarded;
  });
  // Once `waiting` is seen under `mu`, the waiter has released it inside the wait.
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return waiting;
  }));
  absl::SleepFor(absl::Milliseconds(50));  // well inside the wait, not about to enter it
  std::chrono::steady_clock::time_point set;
  {
    absl::MutexLock lock(&mu);
    guarded = 7;
    ready = true;
    set = std::chrono::steady_clock::now();
  }
  waiter.join();
  EXPECT_TRUE(result);
  EXPECT_EQ(seen_by_waiter, 7);
  EXPECT_LT(absl::FromChrono(woke - set), absl::Milliseconds(500));
}

// A later deadline is registered first: the timer must look again when the earlier one arrives,
// and the first waiter still wakes by its condition.
TEST(RealClockTest, EarlierDeadlineArrivingLaterIsStillKept) {
  RealClock clock;
  absl::Mutex mu;
  bool release = false, long_waiting = false;
  bool long_result = false;
  std::thread long_waiter([&] {
    absl::MutexLock lock(&mu);
    long_waiting = true;
    long_result = clock.AwaitWithDeadline(&mu, absl::Condition(&release),
                                          clock.TimeNow() + absl::Seconds(30));
  });
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return long_waiting;
  }));
  {
    absl::Mutex short_mu;
    absl::MutexLock lock(&short_mu);
    const bool never = false;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(clock.AwaitWithDeadline(&short_mu, absl::Condition(&never),
                                         clock.TimeNow() + absl::Milliseconds(100)));
    EXPECT_GE(Since(start), absl::Milliseconds(99));
    EXPECT_LT(Since(start), absl::Seconds(2));
  }
  {
    absl::MutexLock lock(&mu);
    release = true;
  }
  long_waiter.join();
  EXPECT_TRUE(long_result);

  // Deadlines already passed, or infinitely far, never reach the timer.
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&release), absl::InfinitePast()));
  release = false;
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&release), clock.TimeNow()));
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&release), absl::InfinitePast()));
}

// Waiters with deadlines of a few ms race a thread that makes their conditions true; each may
// destroy its mutex right after the wait returned (under ASan, a late touch by the timer's thread
// would be reported). Every wait returns, by one or the other.
TEST(RealClockTest, ConcurrentConditionsAndDeadlinesNeverLoseAWaiter) {
  RealClock clock;
  constexpr int kThreads = 4;
  constexpr int kRounds = 100;
  std::atomic<int> done{0}, by_condition{0}, by_time{0};
  struct Slot {
    absl::Mutex mu;
    bool ready = false;
  };
  std::vector<std::atomic<Slot*>> current(kThreads);
  for (auto& c : current) c = nullptr;
  absl::Mutex slots_mu;  // keeps a slot alive while the notifier touches it
  std::vector<std::thread> waiters;
  for (int t = 0; t < kThreads; ++t) {
    waiters.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        auto slot = std::make_unique<Slot>();
        {
          absl::MutexLock lock(&slots_mu);
          current[t] = slot.get();
        }
        {
          absl::MutexLock lock(&slot->mu);
          const bool held = clock.AwaitWithDeadline(
              &slot->mu, absl::Condition(&slot->ready),
              clock.TimeNow() + absl::Microseconds(500 * (1 + t + round % 3)));
          (held ? by_condition : by_time)++;
        }
        absl::MutexLock lock(&slots_mu);
        current[t] = nullptr;
      }
      ++done;
    });
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  std::thread notifier([&] {
    for (int i = 0; done < kThreads && absl::Now() < give_up; ++i) {
      {
        absl::MutexLock lock(&slots_mu);
        Slot* slot = current[i % kThreads];
        if (slot != nullptr) {
          absl::MutexLock slot_lock(&slot->mu);
          slot->ready = (i % 3 == 0);
        }
      }
      absl::SleepFor(absl::Microseconds(250));  // each slot every ~1 ms, true every ~3 ms
    }
  });
  notifier.join();
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(done, kThreads);
  EXPECT_EQ(by_condition + by_time, kThreads * kRounds);
  // The rates above make both ends common; each has happened.
  EXPECT_GT(by_condition, 0);
  EXPECT_GT(by_time, 0);
}

TEST(SimulatedClockTest, TimeMovesOnlyWhenTold) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  SimulatedClock clock(start);
  EXPECT_EQ(clock.TimeNow(), start);
  absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ(clock.TimeNow(), start);
  clock.AdvanceTime(absl::Milliseconds(1500));
  EXPECT_EQ(clock.TimeNow(), start + absl::Milliseconds(1500));
  EXPECT_EQ(clock.NowUnixNanos(), 1'001'500'000'000);
  clock.AdvanceTime(-absl::Seconds(10));  // ignored
  EXPECT_EQ(clock.TimeNow(), start + absl::Milliseconds(1500));
  clock.SetTime(start - absl::Seconds(1));  // backwards is allowed
  EXPECT_EQ(clock.TimeNow(), start - absl::Seconds(1));
  EXPECT_EQ(clock.num_waiters(), 0u);
  EXPECT_EQ(clock.next_deadline(), absl::InfiniteFuture());
}

TEST(SimulatedClockTest, SpeaksUnixNanoseconds) {
  SimulatedClock clock(absl::FromUnixNanos(5'000));
  EXPECT_EQ(clock.NowUnixNanos(), 5'000);
  clock.AdvanceTime(absl::Nanoseconds(250));
  EXPECT_EQ(clock.NowUnixNanos(), 5'250);
  clock.SetTime(absl::FromUnixNanos(1'000'000));
  EXPECT_EQ(clock.NowUnixNanos(), 1'000'000);
}

TEST(SimulatedClockTest, SleeperWakesExactlyWhenTheTimeReachesItsDeadline) {
  SimulatedClock clock;
  const absl::Time start = clock.TimeNow();
  std::atomic<bool> awake{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(10));
    awake = true;
  });
  ASSERT_TRUE(Eventually([&] { return clock.num_waiters() == 1; }));
  EXPECT_EQ(clock.next_deadline(), start + absl::Seconds(10));
  clock.AdvanceTime(absl::Seconds(9));
  // Still registered, so still asleep: the advance did not reach it.
  EXPECT_EQ(clock.num_waiters(), 1u);
  EXPECT_FALSE(awake);
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_EQ(clock.num_waiters(), 0u);
  sleeper.join();
  EXPECT_TRUE(awake);

  // Sleeping into the past or for nothing does not block.
  clock.SleepUntil(start);
  clock.SleepFor(absl::ZeroDuration());
  EXPECT_EQ(clock.num_waiters(), 0u);
}

TEST(SimulatedClockTest, SetTimeWakesOnlyGoingForward) {
  SimulatedClock clock(absl::FromUnixSeconds(100));
  std::thread sleeper([&] { clock.SleepUntil(absl::FromUnixSeconds(105)); });
  ASSERT_TRUE(Eventually([&] { return clock.num_waiters() == 1; }));
  clock.SetTime(absl::FromUnixSeconds(50));
  EXPECT_EQ(clock.num_waiters(), 1u);
  clock.SetTime(absl::FromUnixSeconds(200));
  EXPECT_EQ(clock.num_waiters(), 0u);
  sleeper.join();
}

TEST(SimulatedClockTest, AwaitReturnsAtOnceWhenTheConditionHoldsOrTheDeadlinePassed) {
  SimulatedClock clock;
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  const bool yes = true, no = false;
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&yes), absl::InfiniteFuture()));
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&no), clock.TimeNow()));
  EXPECT_FALSE(
      clock.AwaitWithDeadline(&mu, absl::Condition(&no), clock.TimeNow() - absl::Seconds(1)));
  EXPECT_EQ(clock.num_waiters(), 0u);
}

// The condition becomes true through another thread's unlock: the waiter wakes with the time
// unchanged, holding the mutex, and deregisters.
TEST(SimulatedClockTest, AwaitWakesOnConditionWithoutAnyChangeOfTime) {
  SimulatedClock clock;
  const absl::Time start = clock.TimeNow();
  absl::Mutex mu;
  bool ready = false;
  int seen_by_waiter = -1;
  int guarded = 0;
  bool result = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&ready), start + absl::Hours(1));
    mu.AssertHeld();
    seen_by_waiter = guarded;
  });
  ASSERT_TRUE(Eventually([&] { return clock.num_waiters() == 1; }));
  {
    absl::MutexLock lock(&mu);
    guarded = 7;
    ready = true;
  }
  waiter.join();
  EXPECT_TRUE(result);
  EXPECT_EQ(seen_by_waiter, 7);
  EXPECT_EQ(clock.TimeNow(), start);
  EXPECT_EQ(clock.num_waiters(), 0u);
}

TEST(SimulatedClockTest, AwaitTimesOutWhenTheTimeReachesTheDeadline) {
  SimulatedClock clock;
  absl::Mutex mu;
  const bool never = false;
  std::atomic<int> result{-1};
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&never),
                                     clock.TimeNow() + absl::Milliseconds(300))
                 ? 1
                 : 0;
  });
  ASSERT_TRUE(Eventually([&] { return clock.num_waiters() == 1; }));
  clock.AdvanceTime(absl::Milliseconds(299));
  EXPECT_EQ(result, -1);
  clock.AdvanceTime(absl::Milliseconds(1));
  waiter.join();
  EXPECT_EQ(result, 0);
}

// Eight waiters on one mutex with deadlines 1..8 s: each advance of 1 s wakes exactly one, in
// deadline order, and none of the others.
TEST(SimulatedClockTest, ManyWaitersWakeInDeadlineOrder) {
  SimulatedClock clock;
  const absl::Time start = clock.TimeNow();
  constexpr int kWaiters = 8;
  absl::Mutex mu;
  const bool never = false;
  std::vector<int> order;  // guarded by mu
  std::vector<std::thread> threads;
  for (int i = kWaiters; i >= 1; --i) {  // registered out of order on purpose
    threads.emplace_back([&, i] {
      absl::MutexLock lock(&mu);
      EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&never), start + absl::Seconds(i)));
      order.push_back(i);
    });
  }
  ASSERT_TRUE(Eventually([&] { return clock.num_waiters() == kWaiters; }));
  for (int k = 1; k <= kWaiters; ++k) {
    clock.AdvanceTime(absl::Seconds(1));
    EXPECT_EQ(clock.num_waiters(), static_cast<size_t>(kWaiters - k));
    ASSERT_TRUE(Eventually([&] {
      absl::MutexLock lock(&mu);
      return order.size() == static_cast<size_t>(k);
    }));
    absl::MutexLock lock(&mu);
    EXPECT_EQ(order.back(), k);
  }
  for (std::thread& t : threads) t.join();
}

// Waiters, a thread that makes their conditions true and a thread that moves the time, all at
// once. Each waiter returns by one or the other, and may destroy its mutex as soon as it has
// returned (under ASan, a late touch by the clock would be reported).
TEST(SimulatedClockTest, ConcurrentConditionsAndTimeChangesNeverLoseAWaiter) {
  SimulatedClock clock;
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  std::atomic<int> done{0};
  std::atomic<int> by_condition{0}, by_time{0};
  struct Slot {
    absl::Mutex mu;
    bool ready = false;
  };
  // The current slot of each waiter, for the notifier.
  std::vector<std::atomic<Slot*>> current(kThreads);
  for (auto& c : current) c = nullptr;
  absl::Mutex slots_mu;  // keeps a slot alive while the notifier touches it

  std::vector<std::thread> waiters;
  for (int t = 0; t < kThreads; ++t) {
    waiters.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        auto slot = std::make_unique<Slot>();
        {
          absl::MutexLock lock(&slots_mu);
          current[t] = slot.get();
        }
        {
          absl::MutexLock lock(&slot->mu);
          const bool held = clock.AwaitWithDeadline(&slot->mu, absl::Condition(&slot->ready),
                                                    clock.TimeNow() + absl::Milliseconds(1 + t));
          (held ? by_condition : by_time)++;
        }
        absl::MutexLock lock(&slots_mu);
        current[t] = nullptr;
        // `slot` (and its mutex) is destroyed here, right after the wait returned.
      }
      ++done;
    });
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  std::thread notifier([&] {
    for (int i = 0; done < kThreads && absl::Now() < give_up; ++i) {
      absl::MutexLock lock(&slots_mu);
      Slot* slot = current[i % kThreads];
      if (slot == nullptr) continue;
      absl::MutexLock slot_lock(&slot->mu);
      slot->ready = (i % 3 == 0);
    }
  });
  while (done < kThreads && absl::Now() < give_up) {
    clock.AdvanceTime(absl::Milliseconds(1));
    std::this_thread::yield();
  }
  notifier.join();
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(done, kThreads);
  EXPECT_EQ(by_condition + by_time, kThreads * kRounds);
  EXPECT_EQ(clock.num_waiters(), 0u);
}

// A step of the wall clock (NTP, `date -s`) moves TimeNow only: the monotonic time, and every
// wait measured on it, go on as if nothing happened.
TEST(SimulatedClockTest, WallStepsMoveNeitherTheMonotonicTimeNorAnyWait) {
  SimulatedClock clock(absl::FromUnixSeconds(10'000));
  const absl::Duration mono = clock.MonotonicNow();
  absl::Mutex mu;
  bool woke = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    const bool never = false;
    EXPECT_FALSE(clock.AwaitFor(&mu, absl::Condition(&never), absl::Seconds(5)));
    woke = true;
  });
  ASSERT_TRUE(Eventually([&] { return clock.num_waiters() == 1; }));
  clock.StepWallTime(-absl::Hours(1));
  EXPECT_EQ(clock.TimeNow(), absl::FromUnixSeconds(10'000 - 3600));
  EXPECT_EQ(clock.MonotonicNow(), mono);
  // The wait still ends 5 s from its start, said in (stepped) wall time.
  EXPECT_EQ(clock.next_deadline(), clock.TimeNow() + absl::Seconds(5));
  clock.StepWallTime(absl::Hours(2));
  EXPECT_EQ(clock.num_waiters(), 1u);
  clock.AdvanceTime(absl::Seconds(4));
  EXPECT_EQ(clock.num_waiters(), 1u);
  EXPECT_EQ(clock.MonotonicNow(), mono + absl::Seconds(4));
  clock.AdvanceTime(absl::Seconds(1));
  waiter.join();
  EXPECT_TRUE(woke);
  EXPECT_EQ(clock.TimeNow(), absl::FromUnixSeconds(10'000 + 3600 + 5));
}

// A wall-clock deadline becomes "this long from now" when the wait starts, as on RealClock: a
// later step back does not stretch it. SetTime forward is time passing (both clocks move).
TEST(SimulatedClockTest, WallDeadlinesAreMeasuredOnTheMonotonicClock) {
  SimulatedClock clock(absl::FromUnixSeconds(100));
  std::thread sleeper([&] { clock.SleepUntil(absl::FromUnixSeconds(110)); });
  ASSERT_TRUE(Eventually([&] { return clock.num_waiters() == 1; }));
  clock.StepWallTime(-absl::Hours(1));
  clock.AdvanceTime(absl::Seconds(10));
  sleeper.join();
  EXPECT_EQ(clock.num_waiters(), 0u);
  const absl::Duration mono = clock.MonotonicNow();
  clock.SetTime(clock.TimeNow() + absl::Seconds(3));
  EXPECT_EQ(clock.MonotonicNow(), mono + absl::Seconds(3));
  clock.SetTime(clock.TimeNow() - absl::Seconds(30));
  EXPECT_EQ(clock.MonotonicNow(), mono + absl::Seconds(3));
}

TEST(RealClockTest, MonotonicTimeAdvancesAndAwaitForWaitsItsDuration) {
  const RealClock clock;
  const absl::Duration before = clock.MonotonicNow();
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  const bool never = false;
  EXPECT_FALSE(clock.AwaitFor(&mu, absl::Condition(&never), absl::Milliseconds(30)));
  EXPECT_GE(clock.MonotonicNow() - before, absl::Milliseconds(30));
  EXPECT_FALSE(clock.AwaitFor(&mu, absl::Condition(&never), -absl::Seconds(1)));
  const bool yes = true;
  EXPECT_TRUE(clock.AwaitFor(&mu, absl::Condition(&yes), absl::InfiniteDuration()));
}

}  // namespace
}  // namespace stepwatch
