// Exponential reconnect backoff with jitter, so that many agents reconnecting to a restarted
// collector spread out instead of arriving together.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace stepwatch::agent {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(2);
  double multiplier = 2.0;
  // Each delay is drawn uniformly from [(1 - jitter) * d, d].
  double jitter = 0.5;
};

class Backoff {
 public:
  explicit Backoff(const BackoffOptions& options) : options_(options), next_(options.initial) {}

  // The delay before the next attempt; grows until it reaches options.max.
  absl::Duration Next() {
    const absl::Duration base = std::min(next_, options_.max);
    next_ = std::min(base * options_.multiplier, options_.max);
    const double low = std::clamp(1.0 - options_.jitter, 0.0, 1.0);
    return base * absl::Uniform(rng_, low, 1.0);
  }

  // After a success the next failure starts small again.
  void Reset() { next_ = options_.initial; }

 private:
  const BackoffOptions options_;
  absl::Duration next_;
  absl::BitGen rng_;
};

}  // namespace stepwatch::agent
