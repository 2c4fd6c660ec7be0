// Kubernetes attribution in the collector: the pod each rank's steps name (StepEvent's
// kubernetes_pod, set by the agent from the kubelet), and the namespace, pod and container that a
// finding, a rank or a GPU is labelled with. Names are peer strings: bounded and charged.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/published_state.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

// Kubernetes names are at most 253 bytes (a DNS subdomain); longer ones refuse their field.
inline constexpr size_t kMaxKubernetesNameBytes = 253;

// A KubernetesPod's names out of bounds or holding control characters, as field `field`.
std::optional<FieldProblem> CheckKubernetesPod(const v1::KubernetesPod& pod, const char* field);
// Heap bytes a kept copy of the pod's names takes.
int64_t KeptBytes(const v1::KubernetesPod& pod);

// Namespace, pod and container; any of them empty when unknown.
struct PodNames {
  std::string namespace_name;
  std::string pod;
  std::string container;
  bool empty() const { return namespace_name.empty() && pod.empty() && container.empty(); }
  bool operator==(const PodNames& o) const {
    return namespace_name == o.namespace_name && pod == o.pod && container == o.container;
  }
};
PodNames NamesOf(const v1::KubernetesPod& pod);
// Sets `*out`'s kubernetes_pod; leaves it unset when `names` is empty.
void SetKubernetesPod(const PodNames& names, v1::KubernetesPod* out);

// Which pod each rank runs in, as its last step said. Not thread-safe: the collector keeps it
// under its ingest mutex and publishes copies.
class PodIndex {
 public:
  // Bytes the index would keep more (negative: less) if the rank's pod became `pod`.
  int64_t BytesIfSet(const std::string& job, int rank, const PodNames& pod) const;
  // Sets the rank's pod (an empty one forgets it); true when that changed anything.
  bool SetRank(const std::string& job, int rank, PodNames pod);
  void EraseJob(const std::string& job);
  // The rank's pod, or null when unknown.
  const PodNames* OfRank(absl::string_view job, int rank) const;
  // What the given ranks of the job share, name by name (every known rank when `ranks` is
  // empty); a name differing between them, or unknown for one of them, is empty.
  PodNames Shared(absl::string_view job, const std::vector<int>& ranks) const;

 private:
  absl::flat_hash_map<std::string, absl::flat_hash_map<int, PodNames>> jobs_;
};

// The GPU's pod from its node's last sample, or null.
using GpuPodLookup = std::function<const v1::KubernetesPod*(absl::string_view node, int gpu)>;
// A GpuPodLookup over nodes ordered by name (StateSnapshot::nodes); `nodes` must outlive it.
GpuPodLookup GpuPodsOf(const std::vector<NodeSnapshot>& nodes);

// A finding's pod: its rank's, else its GPU's, else what its ranks share (a finding about no
// rank in particular: every rank of its job). Null `ranks`: no rank is attributed.
PodNames AttributeFinding(const analysis::Finding& finding, const PodIndex* ranks,
                          const GpuPodLookup& gpus);
// A finding's pod, as the reports take it.
using FindingAttribution = std::function<PodNames(const analysis::Finding&)>;

}  // namespace stepwatch::collector
