#include "agent/node_reading.h"

#include <utility>

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace stepwatch::agent {
namespace {

// FNV-1a: a hash that, unlike std::hash or absl::Hash, is the same in every process.
uint64_t StableHash(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

NodeReading ReadNode(const v1::NodeInfo& info, gpu::GpuSource* gpus, host::HostSampler* host,
                     int64_t now_unix_nanos, bool with_samples) {
  NodeReading r;
  r.node = info;
  if (gpus != nullptr) gpus->DescribeNode(&r.node);
  if (with_samples && gpus != nullptr) {
    absl::StatusOr<std::vector<v1::GpuSample>> s = gpus->Sample(now_unix_nanos);
    if (s.ok()) {
      r.gpus = *std::move(s);
    } else {
      ++r.gpu_errors;
    }
  }
  if (with_samples && host != nullptr) {
    absl::StatusOr<v1::HostSample> s = host->Sample(now_unix_nanos);
    if (s.ok()) {
      r.host = *std::move(s);
    } else {
      ++r.host_errors;
    }
  }
  BoundPeerStrings(&r.node, &r.gpus, &r.strings_bounded);
  return r;
}

std::string MakeAgentId(const std::string& node, const std::string& socket_path) {
  return absl::StrFormat("%s-%016x", node, StableHash(socket_path));
}

std::string MakeBootId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

}  // namespace stepwatch::agent
