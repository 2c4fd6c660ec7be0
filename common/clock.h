// Time comes from an injected source: what reads the time, sleeps, or waits with a deadline takes
// a Clock, so that tests drive tickers, backoffs and timeouts with a SimulatedClock instead of
// waiting for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stepwatch {

// The methods are const so that the many readers that hold a `const Clock*` can also wait on it;
// a SimulatedClock's own state is moved by AdvanceTime/SetTime only. Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;

  virtual absl::Time TimeNow() const = 0;
  // Returns at once for a duration <= 0 or a time already reached.
  virtual void SleepFor(absl::Duration d) const = 0;
  virtual void SleepUntil(absl::Time wakeup) const = 0;
  // Waits until `cond` holds or this clock reaches `deadline`, whichever is first. `mu` is held
  // on entry and on return and released while waiting, like absl::Mutex::AwaitWithDeadline;
  // `cond` is evaluated with `mu` held and must only read state that `mu` guards. Returns whether
  // `cond` holds on return.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                 absl::Time deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // TimeNow() as Unix nanoseconds, the unit of the wire format.
  int64_t NowUnixNanos() const { return absl::ToUnixNanos(TimeNow()); }

  // Time since an arbitrary fixed point on the monotonic clock, which a step of the wall clock
  // (NTP, `date -s`, libfaketime) does not move: schedules, timeouts and windows are measured on
  // it; TimeNow() is for timestamps.
  virtual absl::Duration MonotonicNow() const = 0;
  // AwaitWithDeadline with a deadline `timeout` from now on the monotonic clock
  // (absl::InfiniteDuration(): no deadline).
  virtual bool AwaitFor(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

namespace clock_internal {
// One thread blocked in an AwaitWithDeadline, as the clock that wakes it at its deadline sees it.
struct DeadlineWaiter;
// RealClock's waker: a thread that measures deadlines on the monotonic clock (clock.cc).
class SteadyTimer;
}  // namespace clock_internal

// The system's clock. TimeNow is the wall clock (absl::Now), but every wait measures elapsed time
// on the monotonic clock, so that a step of the wall clock (NTP, libfaketime) neither stretches
// nor cuts a wait short: a deadline is turned into "this long from now" when the wait starts.
// (absl::Mutex's own deadline waits sleep until an absolute CLOCK_REALTIME time: a step back
// stretches them, and a process that sees the wall clock an hour fast waits an hour longer.)
class RealClock final : public Clock {
 public:
  RealClock();
  ~RealClock() override;
  RealClock(const RealClock&) = delete;
  RealClock& operator=(const RealClock&) = delete;

  absl::Time TimeNow() const override;
  // Relative sleeps (nanosleep), which Linux measures on the monotonic clock.
  void SleepFor(absl::Duration d) const override;
  void SleepUntil(absl::Time wakeup) const override;
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override;
  // std::chrono::steady_clock (CLOCK_MONOTONIC).
  absl::Duration MonotonicNow() const override;
  bool AwaitFor(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override;

 private:
  // Its thread starts with the first wait that has a finite deadline.
  const std::unique_ptr<clock_internal::SteadyTimer> timer_;
};
// The earlier name of RealClock, kept for the callers that only read the time.
using SystemClock = RealClock;

// A clock whose time moves only by AdvanceTime/SetTime/StepWallTime. It keeps a wall time and a
// monotonic time; every wait is measured on the monotonic one, a wall-clock deadline being turned
// into "this long from now" when the wait starts, as RealClock does. Sleepers, and
// AwaitWithDeadline waiters whose condition is still false, wake once the time reaches their
// deadline; a waiter whose condition becomes true wakes on the next unlock of its mutex, as with
// absl::Mutex, without any change of time. A waiter's mutex is never locked while the clock's own
// lock is held, so code may read the time with its own lock held.
class SimulatedClock : public Clock {
 public:
  explicit SimulatedClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000));
  ~SimulatedClock() override;
  SimulatedClock(const SimulatedClock&) = delete;
  SimulatedClock& operator=(const SimulatedClock&) = delete;

  absl::Time TimeNow() const override;
  void SleepFor(absl::Duration d) const override;
  void SleepUntil(absl::Time wakeup) const override;
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override;

  absl::Duration MonotonicNow() const override;
  bool AwaitFor(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override;

  // Moves both times forward by `d` (ignored when negative) and wakes whoever it reached; returns
  // once every woken AwaitWithDeadline waiter has been told (it may not have run yet).
  void AdvanceTime(absl::Duration d);
  // Sets the wall time, also backwards. Forwards, the monotonic time moves as much (time passed);
  // backwards it stays (nobody wakes then).
  void SetTime(absl::Time t);
  // Steps the wall time alone by `d` (either sign), as NTP or an operator does: the monotonic
  // time, and so every wait, is unaffected and nobody wakes.
  void StepWallTime(absl::Duration d);

  // Threads blocked in SleepFor/SleepUntil/AwaitWithDeadline with a deadline not yet reached,
  // so that a test can advance time once the code under test is actually waiting.
  size_t num_waiters() const;
  // The earliest deadline of those threads, or absl::InfiniteFuture().
  absl::Time next_deadline() const;

 private:
  using WaiterMap = std::multimap<absl::Duration, std::shared_ptr<clock_internal::DeadlineWaiter>>;

  // Registers a waiter whose monotonic deadline is `timeout` after now, or `deadline` on the wall
  // clock when `timeout` is unset.
  bool Await(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline,
             std::optional<absl::Duration> timeout) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration mono_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // Registered AwaitWithDeadline waiters and sleepers, by monotonic deadline.
  mutable WaiterMap waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stepwatch
