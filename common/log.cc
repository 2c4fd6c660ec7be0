#include "common/log.h"

#include <unistd.h>

#include <cstring>
#include <ctime>

#include "absl/strings/str_format.h"

namespace stepwatch {

void WriteLogLine(LogLevel level, const char* file, int line, absl::string_view message) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc;
  gmtime_r(&ts.tv_sec, &utc);
  char level_char = level == LogLevel::kInfo ? 'I' : level == LogLevel::kWarning ? 'W' : 'E';
  std::string out =
      absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %c %s:%d] %s\n", utc.tm_year + 1900,
                      utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                      static_cast<int>(ts.tv_nsec / 1000000), level_char, base, line, message);
  // One write() per line keeps lines from concurrent threads whole.
  ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
  (void)ignored;
}

bool LogRateLimiter::Allow(uint64_t* suppressed) {
  absl::MutexLock lock(&mu_);
  auto now = std::chrono::steady_clock::now();
  if (now - window_start_ >= period_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ < burst_) {
    ++in_window_;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }
  ++suppressed_;
  return false;
}

}  // namespace stepwatch
