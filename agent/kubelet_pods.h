// Kubernetes attribution: which pod and container each GPU is allocated to, read from the
// kubelet's PodResources API (v1.PodResourcesLister/List on a unix socket) on the agent's own
// thread, and attached to the GPU samples and the steps of the ranks that drive them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "gpu/gpu_source.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

// The device plugin resource whose device ids are GPU UUIDs (the NVIDIA device plugin's).
inline constexpr char kGpuResourceName[] = "nvidia.com/gpu";
// Kubernetes names are at most 253 bytes; longer ones are cut (and printable UTF-8 enforced).
inline constexpr size_t kMaxKubernetesNameBytes = 253;

// GPU UUID (as NVML reports it) -> the pod and container it is allocated to (built from the
// kubelet's answer by agent/kubelet_pod_map.h, which alone sees the kubelet's package `v1`).
using GpuPods = absl::flat_hash_map<std::string, v1::KubernetesPod>;

struct KubeletPodsOptions {
  // The kubelet's PodResources socket; the agent connects over "unix:" + path.
  std::string socket_path = "/var/lib/kubelet/pod-resources/kubelet.sock";
  // Between two List calls.
  absl::Duration interval = absl::Seconds(1);
  // Bound on each List call.
  absl::Duration deadline = absl::Seconds(2);
};

struct KubeletPodsStats {
  uint64_t lists_total = 0;
  uint64_t list_errors_total = 0;
  // Whether the socket existed at the last try, and GPUs attributed by the last answer.
  bool socket_present = false;
  uint64_t gpus_attributed = 0;
};

// Reads the PodResources API every interval on its own thread. An absent socket means no
// attribution (logged once, and again only after it appeared); a failing call is counted and
// logged at a bounded rate, and the last good answer is kept. Thread-safe.
class KubeletPods {
 public:
  explicit KubeletPods(KubeletPodsOptions options);
  ~KubeletPods();
  KubeletPods(const KubeletPods&) = delete;
  KubeletPods& operator=(const KubeletPods&) = delete;

  void Start();
  void Stop();
  // The last answer's map (empty before the first, or while the socket is absent); never null.
  std::shared_ptr<const GpuPods> Current() const;
  KubeletPodsStats stats() const;

 private:
  void Run();
  void RefreshOnce();

  const KubeletPodsOptions options_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::shared_ptr<const GpuPods> current_;
  KubeletPodsStats stats_;
  // What was last logged about the socket: -1 nothing yet, 0 absent, 1 present.
  int socket_logged_ = -1;
  LogRateLimiter failure_log_limiter_{1, std::chrono::minutes(1)};
  std::thread thread_;
};

// A GpuSource that attaches each GPU's pod (by UUID) to its samples, and remembers which pod each
// GPU index and process holds so that steps can be attributed without waiting for the kubelet.
class AttributingGpuSource : public gpu::GpuSource {
 public:
  // `inner` and `pods` must outlive this source.
  AttributingGpuSource(gpu::GpuSource* inner, const KubeletPods* pods)
      : inner_(inner), pods_(pods) {}
  absl::StatusOr<std::vector<v1::GpuSample>> Sample(int64_t now_unix_nanos) override;
  void DescribeNode(v1::NodeInfo* node) const override { inner_->DescribeNode(node); }
  std::string NvmlVersion() const override { return inner_->NvmlVersion(); }

  // Sets the step's kubernetes_pod from the GPU its rank drives: its gpu index, else its
  // local_rank, else the GPU whose processes include its pid (as of the last sample). Cheap: a
  // lookup under a lock held only for lookups and for swapping the last sample's maps.
  void AttributeStep(v1::StepEvent* step) const;

 private:
  gpu::GpuSource* const inner_;
  const KubeletPods* const pods_;
  mutable std::mutex mu_;
  absl::flat_hash_map<int, v1::KubernetesPod> by_index_;
  absl::flat_hash_map<uint32_t, v1::KubernetesPod> by_pid_;
};

// Appends the kubelet families (stepwatch_agent_kubelet_*) to what `inner` collects.
class KubeletPodsCollectable : public prometheus::Collectable {
 public:
  KubeletPodsCollectable(std::shared_ptr<prometheus::Collectable> inner, const KubeletPods* pods,
                         std::string node)
      : inner_(std::move(inner)), pods_(pods), node_(std::move(node)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::shared_ptr<prometheus::Collectable> inner_;
  const KubeletPods* const pods_;
  const std::string node_;
};

}  // namespace stepwatch::agent
