// Per-detector time accounting behind Engine::DetectorTimings(): steady-clock time spent in each
// detector's calls, for watching the engine itself. No verdict depends on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "analysis/engine.h"

namespace stepwatch::analysis {

class DetectorClock {
 public:
  explicit DetectorClock(size_t detectors) : timings_(detectors) {}

  // Detector i's account.
  const DetectorTiming& timing(size_t i) const { return timings_[i]; }

  // Runs fn(i) for each detector index of `which`, in order, adding each call's time to that
  // detector's account: one clock read per call, plus one.
  template <typename Fn>
  void Timed(const std::vector<size_t>& which, Fn&& fn) {
    if (which.empty()) return;
    auto start = std::chrono::steady_clock::now();
    for (size_t i : which) {
      fn(i);
      const auto end = std::chrono::steady_clock::now();
      timings_[i].seconds += std::chrono::duration<double>(end - start).count();
      ++timings_[i].runs;
      start = end;
    }
  }

  // As Timed, for calls too frequent and short to read the clock around each (one per GPU
  // reading): one call in kSampleEvery is timed and counts for kSampleEvery.
  template <typename Fn>
  void Sampled(const std::vector<size_t>& which, Fn&& fn) {
    const bool sample = ++sampled_calls_ % kSampleEvery == 0;
    for (size_t i : which) {
      ++timings_[i].runs;
      if (!sample) {
        fn(i);
        continue;
      }
      const auto start = std::chrono::steady_clock::now();
      fn(i);
      timings_[i].seconds +=
          kSampleEvery *
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }

  static constexpr int kSampleEvery = 8;

 private:
  std::vector<DetectorTiming> timings_;
  int64_t sampled_calls_ = 0;
};

}  // namespace stepwatch::analysis
