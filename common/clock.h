// Time comes from an injected source so that tests control it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace stepwatch {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time, Unix nanoseconds.
  virtual int64_t NowUnixNanos() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t NowUnixNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

// A clock that only moves when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_unix_nanos = 1'700'000'000'000'000'000)
      : now_(start_unix_nanos) {}
  int64_t NowUnixNanos() const override { return now_.load(); }
  void Advance(int64_t nanos) { now_.fetch_add(nanos); }
  void Set(int64_t unix_nanos) { now_.store(unix_nanos); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace stepwatch
