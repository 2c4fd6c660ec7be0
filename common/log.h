// Minimal leveled logging to stderr (Debian's Abseil 20220623 has no absl/log), plus a rate limiter
// so that a flood of bad input cannot flood the log.
#pragma once

#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace stepwatch {

enum class LogLevel { kInfo, kWarning, kError };

// Writes one line "2026-01-01T00:00:00.000Z W file.cc:12] message" to stderr atomically.
void WriteLogLine(LogLevel level, const char* file, int line, absl::string_view message);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line)
      : level_(level), file_(file), line_(line) {}
  ~LogMessage() { WriteLogLine(level_, file_, line_, stream_.str()); }
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Allows at most `burst` messages per `period`; counts what it suppressed so that the next allowed
// message can say how many were dropped. Thread-safe.
class LogRateLimiter {
 public:
  LogRateLimiter(int burst, std::chrono::steady_clock::duration period)
      : burst_(burst), period_(period) {}
  // True when a message may be logged now; `*suppressed` receives the number of messages
  // suppressed since the last allowed one.
  bool Allow(uint64_t* suppressed) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int burst_;
  const std::chrono::steady_clock::duration period_;
  absl::Mutex mu_;
  std::chrono::steady_clock::time_point window_start_ ABSL_GUARDED_BY(mu_) = {};
  int in_window_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stepwatch

#define SW_LOG_INFO \
  ::stepwatch::LogMessage(::stepwatch::LogLevel::kInfo, __FILE__, __LINE__).stream()
#define SW_LOG_WARNING \
  ::stepwatch::LogMessage(::stepwatch::LogLevel::kWarning, __FILE__, __LINE__).stream()
#define SW_LOG_ERROR \
  ::stepwatch::LogMessage(::stepwatch::LogLevel::kError, __FILE__, __LINE__).stream()
