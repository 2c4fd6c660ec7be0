// The kubelet's PodResources answer as a GPU UUID -> pod map. Apart from agent/kubelet_pods.h:
// the kubelet's generated code lives in a top-level namespace `v1` that would make stepwatch's
// `v1` ambiguous wherever both are visible.
#pragma once

#include "agent/kubelet_pods.h"
#include "kubelet/podresources/v1/api.pb.h"

namespace stepwatch::agent {

// The GPUs of `response` (devices of resource kGpuResourceName) and their pods; names are
// bounded like every peer string. A UUID listed twice keeps its first pod.
GpuPods GpuPodsFromResponse(const ::v1::ListPodResourcesResponse& response);

}  // namespace stepwatch::agent
