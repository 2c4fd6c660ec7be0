#include "agent/kubelet_pods.h"

#include <sys/stat.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/kubelet_pod_map.h"
#include "agent/peer_strings.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "kubelet/podresources/v1/api.grpc.pb.h"

namespace stepwatch::agent {
namespace {

// The kubelet answers with every pod of the node; far below this even on a full node.
constexpr int kMaxListAnswerBytes = 16 << 20;

bool SocketExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return std::chrono::nanoseconds(absl::ToInt64Nanoseconds(d));
}

}  // namespace

GpuPods GpuPodsFromResponse(const ::v1::ListPodResourcesResponse& response) {
  GpuPods out;
  for (const ::v1::PodResources& pod : response.pod_resources()) {
    for (const ::v1::ContainerResources& container : pod.containers()) {
      for (const ::v1::ContainerDevices& devices : container.devices()) {
        if (devices.resource_name() != kGpuResourceName) continue;
        for (const std::string& uuid : devices.device_ids()) {
          if (uuid.empty() || out.contains(uuid)) continue;
          v1::KubernetesPod where;
          where.set_namespace_(pod.namespace_());
          where.set_pod(pod.name());
          where.set_container(container.name());
          BoundPeerString(where.mutable_namespace_(), kMaxKubernetesNameBytes);
          BoundPeerString(where.mutable_pod(), kMaxKubernetesNameBytes);
          BoundPeerString(where.mutable_container(), kMaxKubernetesNameBytes);
          std::string key = uuid;
          // Matched against NVML's UUIDs, which are bounded the same way.
          BoundPeerString(&key, PeerStringLimit(PeerStringField::kGpuUuid));
          out.emplace(std::move(key), std::move(where));
        }
      }
    }
  }
  return out;
}

KubeletPods::KubeletPods(KubeletPodsOptions options)
    : options_(std::move(options)), current_(std::make_shared<const GpuPods>()) {}

KubeletPods::~KubeletPods() { Stop(); }

void KubeletPods::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Run(); });
}

void KubeletPods::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<const GpuPods> KubeletPods::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

KubeletPodsStats KubeletPods::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void KubeletPods::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    RefreshOnce();
    lock.lock();
    wake_.wait_for(lock, ToChrono(options_.interval), [this] { return stopping_; });
  }
}

void KubeletPods::RefreshOnce() {
  const bool present = SocketExists(options_.socket_path);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.socket_present = present;
    if (socket_logged_ != (present ? 1 : 0)) {
      // Said once per change, not at every interval: most nodes never run a kubelet.
      if (present) {
        SW_LOG_INFO << "reading the kubelet's pod resources on " << options_.socket_path
                    << ": GPU samples and steps carry their namespace, pod and container";
      } else {
        SW_LOG_INFO << "no kubelet pod-resources socket at " << options_.socket_path
                    << ": running without Kubernetes attribution";
      }
      socket_logged_ = present ? 1 : 0;
    }
    if (!present) {
      current_ = std::make_shared<const GpuPods>();
      stats_.gpus_attributed = 0;
      return;
    }
  }
  // A channel per call: the kubelet restarts (and recreates its socket) independently of us.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxListAnswerBytes);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      absl::StrCat("unix:", options_.socket_path), grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<::v1::PodResourcesLister::Stub> stub = ::v1::PodResourcesLister::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::nanoseconds(absl::ToInt64Nanoseconds(options_.deadline)));
  ::v1::ListPodResourcesResponse response;
  const grpc::Status status = stub->List(&context, ::v1::ListPodResourcesRequest(), &response);
  if (!status.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.lists_total;
      ++stats_.list_errors_total;
    }
    uint64_t suppressed = 0;
    if (failure_log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "kubelet PodResources List on " << options_.socket_path
                     << " failed: " << status.error_message() << " (code "
                     << static_cast<int>(status.error_code()) << "); keeping the last attribution"
                     << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                        : std::string());
    }
    return;
  }
  auto pods = std::make_shared<const GpuPods>(GpuPodsFromResponse(response));
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.lists_total;
  stats_.gpus_attributed = pods->size();
  current_ = std::move(pods);
}

absl::StatusOr<std::vector<v1::GpuSample>> AttributingGpuSource::Sample(int64_t now_unix_nanos) {
  absl::StatusOr<std::vector<v1::GpuSample>> samples = inner_->Sample(now_unix_nanos);
  if (!samples.ok()) return samples;
  const std::shared_ptr<const GpuPods> pods = pods_->Current();
  absl::flat_hash_map<int, v1::KubernetesPod> by_index;
  absl::flat_hash_map<uint32_t, v1::KubernetesPod> by_pid;
  for (v1::GpuSample& g : *samples) {
    auto it = pods->find(g.uuid());
    if (it == pods->end()) continue;
    *g.mutable_kubernetes_pod() = it->second;
    by_index.emplace(g.index(), it->second);
    for (uint32_t pid : g.pids()) by_pid.emplace(pid, it->second);
  }
  std::lock_guard<std::mutex> lock(mu_);
  by_index_.swap(by_index);
  by_pid_.swap(by_pid);
  return samples;
}

void AttributingGpuSource::AttributeStep(v1::StepEvent* step) const {
  // The same association as the collector's: gpu, else local_rank, else the pid.
  const int index = step->has_gpu()          ? step->gpu()
                    : step->has_local_rank() ? step->local_rank()
                                             : -1;
  std::lock_guard<std::mutex> lock(mu_);
  if (index >= 0) {
    if (auto it = by_index_.find(index); it != by_index_.end()) {
      *step->mutable_kubernetes_pod() = it->second;
    }
    return;
  }
  if (step->pid() > 0) {
    if (auto it = by_pid_.find(static_cast<uint32_t>(step->pid())); it != by_pid_.end()) {
      *step->mutable_kubernetes_pod() = it->second;
    }
  }
}

std::vector<prometheus::MetricFamily> KubeletPodsCollectable::Collect() const {
  std::vector<prometheus::MetricFamily> out = inner_->Collect();
  const KubeletPodsStats s = pods_->stats();
  const std::vector<prometheus::ClientMetric::Label> node{{"node", node_}};
  auto add = [&](const char* name, const char* help, prometheus::MetricType type, double value) {
    prometheus::ClientMetric m;
    m.label = node;
    if (type == prometheus::MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    out.push_back(prometheus::MetricFamily{name, help, type, {m}});
  };
  add("stepwatch_agent_kubelet_lists_total",
      "Calls of the kubelet's PodResources List (Kubernetes attribution).",
      prometheus::MetricType::Counter, static_cast<double>(s.lists_total));
  add("stepwatch_agent_kubelet_list_errors_total",
      "PodResources List calls that failed (the last attribution is kept).",
      prometheus::MetricType::Counter, static_cast<double>(s.list_errors_total));
  add("stepwatch_agent_kubelet_socket_present",
      "1 when the kubelet's pod-resources socket (--kubelet-socket) exists.",
      prometheus::MetricType::Gauge, s.socket_present ? 1 : 0);
  add("stepwatch_agent_kubelet_gpus_attributed",
      "GPUs allocated to a pod in the kubelet's last answer.", prometheus::MetricType::Gauge,
      static_cast<double>(s.gpus_attributed));
  return out;
}

}  // namespace stepwatch::agent
