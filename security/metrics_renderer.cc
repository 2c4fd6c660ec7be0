#include "security/metrics_renderer.h"

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace stepwatch::security {

MetricsRenderer::MetricsRenderer(CollectFn collect)
    : collect_(std::move(collect)), thread_([this] { Run(); }) {}

MetricsRenderer::~MetricsRenderer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MetricsRenderer::Request(Done done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(done));
  }
  cv_.notify_one();
}

MetricsRenderer::Stats MetricsRenderer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void MetricsRenderer::Run() {
  while (true) {
    std::vector<Done> batch;
    Stats stats;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
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
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.renders;
      stats_.last_render_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    for (Done& done : batch) done(body);
  }
}

}  // namespace stepwatch::security
