// Robust statistics shared by the detectors and the step window.
#pragma once

#include <algorithm>
#include <vector>

namespace stepwatch::analysis {

// Median absolute deviation to standard deviation, for normally distributed noise.
inline constexpr double kMadToSigma = 1.4826;
inline constexpr double kNanosPerSecond = 1e9;

// The median of `v`, reordering it (0 when empty); the mean of the two middle values when even.
inline double MedianInPlace(std::vector<double>& v) {
  if (v.empty()) return 0;
  size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  double lo = *std::max_element(v.begin(), v.begin() + mid);
  return (lo + hi) / 2;
}

}  // namespace stepwatch::analysis
