// A thread-safe sink that keeps what a server under test delivers (step events, batches), for
// tests that wait until enough has arrived.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace stepwatch::test {

template <typename T>
class Received {
 public:
  // A callback that keeps each item it is given; valid while this object lives.
  std::function<void(T&&)> Sink() {
    return [this](T&& item) {
      absl::MutexLock lock(&mu_);
      items_.push_back(std::move(item));
    };
  }
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return items_.size();
  }
  std::vector<T> items() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return items_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<T> items_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stepwatch::test
