// Small helpers shared by the agent tests.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace stepwatch::agent::testing {

// Polls `condition` every 5 ms until it holds or `timeout` passes. Returns whether it held.
inline bool WaitFor(const std::function<bool()>& condition,
                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

// Until `pred` holds (for at most 10 s of real time): whenever the code under test waits on
// `clock` for less than `horizon` (a reconnect backoff), moves the time to that wake-up; otherwise
// lets gRPC work in real time.
inline bool AdvanceUntil(SimulatedClock& clock, const std::function<bool()>& pred,
                         absl::Duration horizon = absl::Milliseconds(100)) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up) {
    if (pred()) return true;
    const absl::Time next = clock.next_deadline();
    if (next <= clock.TimeNow() + horizon) {
      clock.SetTime(std::max(next, clock.TimeNow()));
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  return pred();
}

// Sends one datagram to a Unix socket path; returns whether the kernel took it.
inline bool SendDatagram(const std::string& path, const std::string& payload) {
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const ssize_t n = ::sendto(fd, payload.data(), payload.size(), 0,
                             reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  ::close(fd);
  return n == static_cast<ssize_t>(payload.size());
}

}  // namespace stepwatch::agent::testing
