// A fixed set of threads running queued tasks, for work that must not run on an event loop (bcrypt
// verification). The queue is bounded so that a flood of requests costs memory only up to a cap.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace stepwatch::security {

class WorkerPool {
 public:
  WorkerPool(int threads, size_t max_queued);
  // Stops the threads after their current task; queued tasks are dropped.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False (and `task` is not run) when max_queued tasks are already waiting.
  bool TrySubmit(std::function<void()> task);

 private:
  void Run();

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace stepwatch::security
