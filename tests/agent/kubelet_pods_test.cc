// Kubernetes attribution in the agent: the kubelet's answer as a GPU UUID -> pod map, the client
// against an in-test PodResourcesLister on a unix socket, and GPU samples and steps attributed.
#include "agent/kubelet_pods.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/kubelet_pod_map.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kubelet/podresources/v1/api.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::agent {
namespace {

void AddContainer(::v1::PodResources* pod, const std::string& name, const std::string& resource,
                  const std::vector<std::string>& ids) {
  ::v1::ContainerResources* c = pod->add_containers();
  c->set_name(name);
  ::v1::ContainerDevices* d = c->add_devices();
  d->set_resource_name(resource);
  for (const std::string& id : ids) d->add_device_ids(id);
}

::v1::ListPodResourcesResponse TwoPods() {
  ::v1::ListPodResourcesResponse r;
  ::v1::PodResources* train = r.add_pod_resources();
  train->set_namespace_("team-a");
  train->set_name("train-0");
  AddContainer(train, "trainer", "nvidia.com/gpu", {"GPU-aaaa", "GPU-bbbb"});
  AddContainer(train, "sidecar", "example.com/nic", {"mlx5_0"});
  ::v1::PodResources* eval = r.add_pod_resources();
  eval->set_namespace_("team-b");
  eval->set_name("eval-1");
  // A UUID the kubelet listed twice keeps its first pod.
  AddContainer(eval, "eval", "nvidia.com/gpu", {"GPU-cccc", "GPU-aaaa"});
  return r;
}

TEST(GpuPodsFromResponseTest, MapsEveryNvidiaGpuToItsPodAndContainer) {
  const GpuPods pods = GpuPodsFromResponse(TwoPods());
  ASSERT_EQ(pods.size(), 3u);
  EXPECT_EQ(pods.at("GPU-aaaa").namespace_(), "team-a");
  EXPECT_EQ(pods.at("GPU-aaaa").pod(), "train-0");
  EXPECT_EQ(pods.at("GPU-aaaa").container(), "trainer");
  EXPECT_EQ(pods.at("GPU-bbbb").pod(), "train-0");
  EXPECT_EQ(pods.at("GPU-cccc").namespace_(), "team-b");
  EXPECT_EQ(pods.at("GPU-cccc").container(), "eval");
  EXPECT_FALSE(pods.contains("mlx5_0"));  // not a GPU resource
}

TEST(GpuPodsFromResponseTest, BoundsNamesLikePeerStrings) {
  ::v1::ListPodResourcesResponse r;
  ::v1::PodResources* pod = r.add_pod_resources();
  pod->set_namespace_(std::string(1000, 'n'));
  pod->set_name("bad\x1bname");
  AddContainer(pod, "c", "nvidia.com/gpu", {"GPU-dddd"});
  const GpuPods pods = GpuPodsFromResponse(r);
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods.at("GPU-dddd").namespace_().size(), kMaxKubernetesNameBytes);
  EXPECT_EQ(pods.at("GPU-dddd").pod(), "bad?name");
}

// The kubelet's side of the API, answering what the test sets.
class FakeKubelet final : public ::v1::PodResourcesLister::Service {
 public:
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    if (fail_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet restarting");
    *response = answer_;
    return grpc::Status::OK;
  }
  void Set(::v1::ListPodResourcesResponse answer, bool fail) {
    std::lock_guard<std::mutex> lock(mu_);
    answer_ = std::move(answer);
    fail_ = fail;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  ::v1::ListPodResourcesResponse answer_;
  bool fail_ = false;
  int calls_ = 0;
};

// Waits (at most 10 s, 10 ms apart) until `done` holds.
template <typename Done>
bool WaitFor(Done done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST(KubeletPodsTest, ReadsTheKubeletOverItsUnixSocketAndKeepsTheLastAnswerOnFailure) {
  test::TempDir dir("kubelet");
  const std::string socket = dir.File("kubelet.sock");
  FakeKubelet kubelet;
  kubelet.Set(TwoPods(), false);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&kubelet);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  KubeletPodsOptions options;
  options.socket_path = socket;
  options.interval = absl::Milliseconds(20);
  KubeletPods pods(options);
  pods.Start();
  ASSERT_TRUE(WaitFor([&] { return pods.Current()->size() == 3; }));
  EXPECT_EQ(pods.Current()->at("GPU-bbbb").pod(), "train-0");
  EXPECT_TRUE(pods.stats().socket_present);
  EXPECT_EQ(pods.stats().gpus_attributed, 3u);

  kubelet.Set(::v1::ListPodResourcesResponse(), true);
  ASSERT_TRUE(WaitFor([&] { return pods.stats().list_errors_total >= 2; }));
  EXPECT_EQ(pods.Current()->size(), 3u);  // a failing kubelet does not erase what was known
  pods.Stop();
  server->Shutdown();
}

TEST(KubeletPodsTest, AnAbsentSocketMeansNoAttributionAndNoErrors) {
  test::TempDir dir("kubelet");
  KubeletPodsOptions options;
  options.socket_path = dir.File("absent.sock");
  options.interval = absl::Milliseconds(10);
  KubeletPods pods(options);
  pods.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  pods.Stop();
  EXPECT_TRUE(pods.Current()->empty());
  EXPECT_FALSE(pods.stats().socket_present);
  EXPECT_EQ(pods.stats().lists_total, 0u);
  EXPECT_EQ(pods.stats().list_errors_total, 0u);
}

// Two GPUs with fixed UUIDs; GPU 1 runs process 4242.
class TwoGpus : public gpu::GpuSource {
 public:
  absl::StatusOr<std::vector<v1::GpuSample>> Sample(int64_t now) override {
    std::vector<v1::GpuSample> out(3);
    out[0].set_index(0);
    out[0].set_uuid("GPU-aaaa");
    out[1].set_index(1);
    out[1].set_uuid("GPU-cccc");
    out[1].add_pids(4242);
    out[2].set_index(2);
    out[2].set_uuid("GPU-free");
    return out;
  }
  void DescribeNode(v1::NodeInfo*) const override {}
};

TEST(AttributingGpuSourceTest, GpuSamplesAndStepsCarryTheirPod) {
  test::TempDir dir("kubelet");
  const std::string socket = dir.File("kubelet.sock");
  FakeKubelet kubelet;
  kubelet.Set(TwoPods(), false);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&kubelet);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  KubeletPodsOptions options;
  options.socket_path = socket;
  options.interval = absl::Milliseconds(20);
  KubeletPods pods(options);
  pods.Start();
  ASSERT_TRUE(WaitFor([&] { return pods.Current()->size() == 3; }));

  TwoGpus gpus;
  AttributingGpuSource source(&gpus, &pods);
  absl::StatusOr<std::vector<v1::GpuSample>> samples = source.Sample(0);
  ASSERT_OK(samples);
  EXPECT_EQ((*samples)[0].kubernetes_pod().pod(), "train-0");
  EXPECT_EQ((*samples)[1].kubernetes_pod().namespace_(), "team-b");
  EXPECT_FALSE((*samples)[2].has_kubernetes_pod());

  v1::StepEvent by_gpu;
  by_gpu.set_gpu(1);
  source.AttributeStep(&by_gpu);
  EXPECT_EQ(by_gpu.kubernetes_pod().pod(), "eval-1");
  v1::StepEvent by_local_rank;
  by_local_rank.set_local_rank(0);
  source.AttributeStep(&by_local_rank);
  EXPECT_EQ(by_local_rank.kubernetes_pod().container(), "trainer");
  v1::StepEvent by_pid;
  by_pid.set_pid(4242);
  source.AttributeStep(&by_pid);
  EXPECT_EQ(by_pid.kubernetes_pod().pod(), "eval-1");
  v1::StepEvent unallocated;
  unallocated.set_gpu(2);
  source.AttributeStep(&unallocated);
  EXPECT_FALSE(unallocated.has_kubernetes_pod());
  pods.Stop();
  server->Shutdown();
}

}  // namespace
}  // namespace stepwatch::agent
