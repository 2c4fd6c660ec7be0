// Renders the /metrics body (Collect() + the text format) on its own thread, coalescing requests:
// every request that arrives while a render runs shares the next render's body. However many
// scrapers there are, at most one render runs and about two bodies exist at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/metric_family.h"

namespace stepwatch::http {

class MetricsRenderer {
 public:
  struct Stats {
    uint64_t renders = 0;            // renders finished
    double last_render_seconds = 0;  // duration of the previous one
  };
  // The families to render, given the renderer's own stats; called on the renderer's thread. May
  // throw (the render then fails).
  using CollectFn = std::function<std::vector<prometheus::MetricFamily>(const Stats&)>;
  // Receives the body, or an error when collecting failed; called on the renderer's thread.
  using Done = std::function<void(absl::StatusOr<std::shared_ptr<const std::string>>)>;

  explicit MetricsRenderer(CollectFn collect);
  // Joins the thread; requests not yet rendered are dropped without a call.
  ~MetricsRenderer();
  MetricsRenderer(const MetricsRenderer&) = delete;
  MetricsRenderer& operator=(const MetricsRenderer&) = delete;

  void Request(Done done) ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  bool StoppingOrPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CollectFn collect_;
  mutable absl::Mutex mu_;
  std::vector<Done> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace stepwatch::http
