#include "http/worker_pool.h"

#include <algorithm>

namespace stepwatch::http {

WorkerPool::WorkerPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
  }
  for (std::thread& t : threads_) t.join();
}

bool WorkerPool::TrySubmit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stop_ || queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(task));
  return true;
}

bool WorkerPool::StoppingOrQueued() const { return stop_ || !queue_.empty(); }

void WorkerPool::Run() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      // Await re-evaluates the condition whenever mu_ is released: no notify calls to forget.
      mu_.Await(absl::Condition(this, &WorkerPool::StoppingOrQueued));
      if (stop_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace stepwatch::http
