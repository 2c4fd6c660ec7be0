// A fixed set of threads running queued tasks, for work that must not run on an event loop (bcrypt
// verification). The queue is bounded so that a flood of requests costs memory only up to a cap.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace stepwatch::http {

class WorkerPool {
 public:
  WorkerPool(int threads, size_t max_queued);
  // Stops the threads after their current task; queued tasks are dropped.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False (and `task` is not run) when max_queued tasks are already waiting.
  bool TrySubmit(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  bool StoppingOrQueued() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace stepwatch::http
