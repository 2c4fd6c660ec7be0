#include "http/metrics_renderer.h"

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace stepwatch::http {

MetricsRenderer::MetricsRenderer(CollectFn collect)
    : collect_(std::move(collect)), thread_([this] { Run(); }) {}

MetricsRenderer::~MetricsRenderer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MetricsRenderer::Request(Done done) {
  absl::MutexLock lock(&mu_);
  pending_.push_back(std::move(done));
}

MetricsRenderer::Stats MetricsRenderer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool MetricsRenderer::StoppingOrPending() const { return stop_ || !pending_.empty(); }

void MetricsRenderer::Run() {
  while (true) {
    std::vector<Done> batch;
    Stats stats;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &MetricsRenderer::StoppingOrPending));
      if (stop_) return;
      // Everyone waiting now gets this render; later arrivals wait for the next one, so that no
      // request is answered with data collected before it arrived.
      batch.swap(pending_);
      stats = stats_;
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::shared_ptr<const std::string>> body;
    try {
      body = std::make_shared<const std::string>(
          prometheus::TextSerializer().Serialize(collect_(stats)));
    } catch (const std::exception& e) {
      body = absl::InternalError(absl::StrCat("rendering /metrics failed: ", e.what()));
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.renders;
      stats_.last_render_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    for (Done& done : batch) done(body);
  }
}

}  // namespace stepwatch::http
