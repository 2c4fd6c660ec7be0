#include "common/clock.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"

namespace stepwatch {
namespace clock_internal {

// While `registered`, the waiter is in its clock's deadline map and only the clock may take it
// out; once taken out at its deadline, the waiter may not return before `fired` is set, because
// the clock's thread is about to lock `mu` (which the waiter's owner may destroy once the waiter
// has returned).
struct DeadlineWaiter {
  explicit DeadlineWaiter(absl::Mutex* m) : mu(m) {}
  absl::Mutex* const mu;
  bool registered = true;  // guarded by the clock's lock
  bool fired = false;      // guarded by *mu
};

namespace {

using WaiterList = std::vector<std::shared_ptr<DeadlineWaiter>>;

// Removes from `waiters` (a multimap by deadline, under the clock's lock) those whose deadline
// `now` has reached, in deadline order.
template <typename Map>
WaiterList TakeDue(Map& waiters, const typename Map::key_type& now) {
  WaiterList due;
  while (!waiters.empty() && waiters.begin()->first <= now) {
    waiters.begin()->second->registered = false;
    due.push_back(std::move(waiters.begin()->second));
    waiters.erase(waiters.begin());
  }
  return due;
}

// Tells each waiter, under its own mutex, that its deadline has passed. Called without the
// clock's lock: the lock order is the waiter's mutex, then the clock's.
void Fire(const WaiterList& due) {
  for (const std::shared_ptr<DeadlineWaiter>& waiter : due) {
    // The unlock is what makes absl::Mutex re-evaluate the waiter's condition.
    absl::MutexLock lock(waiter->mu);
    waiter->fired = true;
  }
}

// The wait of a registered `waiter`: until `cond` holds or its clock fires it. `deregister`
// takes it out of the clock's map under the clock's lock and returns whether it was still there.
template <typename Deregister>
bool AwaitFiredOrCondition(absl::Mutex* mu, const absl::Condition& cond,
                           const DeadlineWaiter& waiter, Deregister deregister)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  // Re-evaluated by absl::Mutex on every unlock of `mu`: by code that makes `cond` true, or by
  // Fire() at the deadline.
  struct Woken {
    const absl::Condition* cond;
    const DeadlineWaiter* waiter;
    bool operator()() const { return waiter->fired || cond->Eval(); }
  } woken{&cond, &waiter};
  mu->Await(absl::Condition(&woken));
  // Taken out by the clock: let its thread through `mu` before returning (see DeadlineWaiter).
  if (!deregister()) mu->Await(absl::Condition(&waiter.fired));
  return cond.Eval();
}

}  // namespace

// Wakes waiters at deadlines on the monotonic clock. Its thread sleeps in ppoll() with a relative
// timeout, measured by the kernel on the monotonic clock, on an eventfd that is written when an
// earlier deadline arrives or the timer stops. A relative timeout also holds under libfaketime,
// which offsets what clock_gettime(CLOCK_MONOTONIC) returns unless told not to; an absolute
// monotonic deadline (std::condition_variable::wait_until) would then be an hour late.
class SteadyTimer {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  SteadyTimer() = default;
  ~SteadyTimer() {
    bool started;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      started = started_;
      if (started) Poke();
    }
    if (started) {
      thread_.join();
      close(wake_fd_);
    }
  }
  SteadyTimer(const SteadyTimer&) = delete;
  SteadyTimer& operator=(const SteadyTimer&) = delete;

  // Waits as Clock::AwaitWithDeadline does, with `cond` false on entry and `deadline` later than
  // now. Returns false without waiting only when the timer's thread cannot start (no eventfd);
  // then `*result` is unset.
  bool Await(absl::Mutex* mu, const absl::Condition& cond, TimePoint deadline, bool* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto waiter = std::make_shared<DeadlineWaiter>(mu);
    Map::iterator entry;
    {
      // Lock order: the waiter's mutex, then the timer's (never the other way round).
      absl::MutexLock lock(&mu_);
      if (!Start()) return false;
      entry = waiters_.emplace(deadline, waiter);
      // The thread sleeps until the earliest deadline: it must look again at a new earliest.
      if (entry == waiters_.begin()) Poke();
    }
    *result = AwaitFiredOrCondition(mu, cond, *waiter, [&] {
      absl::MutexLock lock(&mu_);
      if (!waiter->registered) return false;
      waiters_.erase(entry);
      waiter->registered = false;
      return true;
    });
    return true;
  }

 private:
  using Map = std::multimap<TimePoint, std::shared_ptr<DeadlineWaiter>>;

  // Starts the thread once; false when the eventfd cannot be had.
  bool Start() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (started_) return true;
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) return false;
    started_ = true;
    thread_ = std::thread([this] { Run(); });
    return true;
  }

  // Makes the thread's ppoll() return (the eventfd stays readable until Run() reads it).
  void Poke() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t one = 1;
    // Fails only when the counter is near overflow, and then it is readable anyway.
    [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof(one));
  }

  void Run() {
    for (;;) {
      WaiterList due;
      TimePoint next = TimePoint::max();
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        due = TakeDue(waiters_, std::chrono::steady_clock::now());
        if (!waiters_.empty()) next = waiters_.begin()->first;
      }
      if (!due.empty()) {
        Fire(due);
        continue;  // the time moved while firing
      }
      Sleep(next);
    }
  }

  // Sleeps until `next` (TimePoint::max(): indefinitely) or a Poke().
  void Sleep(TimePoint next) {
    timespec timeout{};
    timespec* timeout_ptr = nullptr;
    if (next != TimePoint::max()) {
      // Clamped to a day: the loop looks again then.
      const int64_t ns = std::clamp<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                 next - std::chrono::steady_clock::now())
                                                 .count(),
                                             0, int64_t{86'400} * 1'000'000'000);
      timeout.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
      timeout.tv_nsec = static_cast<long>(ns % 1'000'000'000);
      timeout_ptr = &timeout;
    }
    pollfd fd{wake_fd_, POLLIN, 0};
    if (ppoll(&fd, 1, timeout_ptr, nullptr) > 0) {
      uint64_t count;
      [[maybe_unused]] const ssize_t n = read(wake_fd_, &count, sizeof(count));
    }
  }

  absl::Mutex mu_;
  Map waiters_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // Set once by Start(), before the thread exists; closed by the destructor after the join.
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace clock_internal

using clock_internal::AwaitFiredOrCondition;
using clock_internal::DeadlineWaiter;
using clock_internal::Fire;
using clock_internal::TakeDue;

RealClock::RealClock() : timer_(std::make_unique<clock_internal::SteadyTimer>()) {}

RealClock::~RealClock() = default;

absl::Time RealClock::TimeNow() const { return absl::Now(); }

void RealClock::SleepFor(absl::Duration d) const {
  if (d > absl::ZeroDuration()) absl::SleepFor(d);
}

void RealClock::SleepUntil(absl::Time wakeup) const { SleepFor(wakeup - absl::Now()); }

bool RealClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                  absl::Time deadline) const {
  if (deadline == absl::InfiniteFuture()) return AwaitFor(mu, cond, absl::InfiniteDuration());
  return AwaitFor(mu, cond, deadline - absl::Now());
}

absl::Duration RealClock::MonotonicNow() const {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

bool RealClock::AwaitFor(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Duration timeout) const {
  if (cond.Eval()) return true;
  if (timeout == absl::InfiniteDuration()) {
    mu->Await(cond);
    return true;
  }
  // Beyond a century it makes no difference, and the monotonic time cannot overflow.
  const absl::Duration left = std::min(timeout, absl::Hours(24 * 365 * 100));
  if (left <= absl::ZeroDuration()) return false;
  const auto steady_deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(left);
  bool result = false;
  if (timer_->Await(mu, cond, steady_deadline, &result)) return result;
  // No timer (out of file descriptors): absl's own relative wait.
  return mu->AwaitWithTimeout(cond, left);
}

SimulatedClock::SimulatedClock(absl::Time start) : now_(start) {}

SimulatedClock::~SimulatedClock() = default;

absl::Time SimulatedClock::TimeNow() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

absl::Duration SimulatedClock::MonotonicNow() const {
  absl::MutexLock lock(&mu_);
  return mono_;
}

void SimulatedClock::SleepFor(absl::Duration d) const {
  // A sleeper is a waiter on a private mutex whose condition never holds.
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  const bool never = false;
  AwaitFor(&mu, absl::Condition(&never), d);
}

void SimulatedClock::SleepUntil(absl::Time wakeup) const {
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  const bool never = false;
  AwaitWithDeadline(&mu, absl::Condition(&never), wakeup);
}

bool SimulatedClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                       absl::Time deadline) const {
  return Await(mu, cond, deadline, std::nullopt);
}

bool SimulatedClock::AwaitFor(absl::Mutex* mu, const absl::Condition& cond,
                              absl::Duration timeout) const {
  return Await(mu, cond, absl::InfinitePast(), timeout);
}

bool SimulatedClock::Await(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline,
                           std::optional<absl::Duration> timeout) const {
  if (cond.Eval()) return true;
  auto waiter = std::make_shared<DeadlineWaiter>(mu);
  WaiterMap::iterator entry;
  {
    // Lock order: the waiter's mutex, then the clock's (never the other way round).
    absl::MutexLock lock(&mu_);
    const absl::Duration left = timeout ? *timeout : deadline - now_;
    if (left <= absl::ZeroDuration()) return false;
    entry = waiters_.emplace(mono_ + left, waiter);
  }
  return AwaitFiredOrCondition(mu, cond, *waiter, [&] {
    absl::MutexLock lock(&mu_);
    if (!waiter->registered) return false;
    waiters_.erase(entry);
    waiter->registered = false;
    return true;
  });
}

// Moving the time and taking out whom it reached is one step, so that a concurrent SetTime
// cannot hide a waiter from the change of time that reached it.
void SimulatedClock::AdvanceTime(absl::Duration d) {
  clock_internal::WaiterList due;
  {
    absl::MutexLock lock(&mu_);
    if (d > absl::ZeroDuration()) {
      now_ += d;
      mono_ += d;
    }
    due = TakeDue(waiters_, mono_);
  }
  Fire(due);
}

void SimulatedClock::SetTime(absl::Time t) {
  clock_internal::WaiterList due;
  {
    absl::MutexLock lock(&mu_);
    if (t > now_) mono_ += t - now_;
    now_ = t;
    due = TakeDue(waiters_, mono_);
  }
  Fire(due);
}

void SimulatedClock::StepWallTime(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

size_t SimulatedClock::num_waiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

absl::Time SimulatedClock::next_deadline() const {
  absl::MutexLock lock(&mu_);
  return waiters_.empty() ? absl::InfiniteFuture() : now_ + (waiters_.begin()->first - mono_);
}

}  // namespace stepwatch
