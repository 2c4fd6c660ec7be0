// Kubernetes attribution in CollectorState: the pod each admitted step names for its rank, kept
// under the ingest mutex and charged to the rank's job, and what findings are labelled with.
#include <memory>
#include <string>

#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/pod_index.h"
#include "collector/published_state.h"
#include "collector/state.h"

namespace stepwatch::collector {

void CollectorState::KeepRankPod(const v1::StepEvent& event, const std::string& node_name) {
  const PodNames* known = rank_pods_.OfRank(event.job(), event.rank());
  if (!event.has_kubernetes_pod() && known == nullptr) return;  // off Kubernetes: one lookup
  PodNames names;
  if (event.has_kubernetes_pod()) {
    if (const std::optional<FieldProblem> bad =
            CheckKubernetesPod(event.kubernetes_pod(), "step_kubernetes_pod");
        bad.has_value()) {
      // The step counts; only its pod is refused (the rank keeps the one it had).
      CountFieldRefused(*bad, node_name, "step's pod");
      return;
    }
    names = NamesOf(event.kubernetes_pod());
  }
  if (known != nullptr && *known == names) return;
  auto job = jobs_.find(event.job());
  if (job == jobs_.end()) return;
  const int64_t delta = rank_pods_.BytesIfSet(event.job(), event.rank(), names);
  if (delta > 0 && !Charge(delta, "pod")) return;
  if (delta < 0) accounted_bytes_ += delta;
  job->second.charged_bytes += delta;
  rank_pods_changed_ |= rank_pods_.SetRank(event.job(), event.rank(), std::move(names));
}

std::shared_ptr<const PodIndex> CollectorState::PublishedRankPods() {
  if (rank_pods_changed_ || published_rank_pods_ == nullptr) {
    published_rank_pods_ = std::make_shared<const PodIndex>(rank_pods_);
    rank_pods_changed_ = false;
  }
  return published_rank_pods_;
}

FindingAttribution CollectorState::AttributionNow() const {
  const PodIndex* ranks = &rank_pods_;
  const std::map<std::string, NodeTrack>* nodes = &nodes_;
  // Used only while the caller holds mu_ (the reports' Observe and Finish under it).
  GpuPodLookup gpus = [nodes](absl::string_view node, int gpu) -> const v1::KubernetesPod* {
    auto it = nodes->find(std::string(node));
    if (it == nodes->end()) return nullptr;
    auto slot = it->second.gpu_slot.find(gpu);
    if (slot == it->second.gpu_slot.end()) return nullptr;
    const v1::GpuSample& g = it->second.view.gpus[slot->second];
    return g.has_kubernetes_pod() ? &g.kubernetes_pod() : nullptr;
  };
  return [ranks, gpus = std::move(gpus)](const analysis::Finding& f) {
    return AttributeFinding(f, ranks, gpus);
  };
}

}  // namespace stepwatch::collector
