// A kubelet stand-in for the integration tests: serves v1.PodResourcesLister/List on a unix
// socket from a text file re-read at every call, one container per line:
//   NAMESPACE POD CONTAINER RESOURCE DEVICE_ID[,DEVICE_ID...]
// A line "fail" makes List answer UNAVAILABLE. Runs until SIGINT or SIGTERM.
//   stepwatch-fake-kubelet SOCKET_PATH PODS_FILE
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "kubelet/podresources/v1/api.grpc.pb.h"

namespace {

class FileKubelet final : public v1::PodResourcesLister::Service {
 public:
  explicit FileKubelet(std::string path) : path_(std::move(path)) {}

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
      if (line == "fail") return grpc::Status(grpc::StatusCode::UNAVAILABLE, "told to fail");
      std::istringstream fields(line);
      std::string ns, pod, container, resource, ids;
      if (!(fields >> ns >> pod >> container >> resource >> ids)) continue;
      v1::PodResources* p = nullptr;
      for (v1::PodResources& existing : *response->mutable_pod_resources()) {
        if (existing.namespace_() == ns && existing.name() == pod) p = &existing;
      }
      if (p == nullptr) {
        p = response->add_pod_resources();
        p->set_namespace_(ns);
        p->set_name(pod);
      }
      v1::ContainerResources* c = p->add_containers();
      c->set_name(container);
      v1::ContainerDevices* d = c->add_devices();
      d->set_resource_name(resource);
      for (absl::string_view id : absl::StrSplit(ids, ',', absl::SkipEmpty())) {
        d->add_device_ids(std::string(id));
      }
    }
    return grpc::Status::OK;
  }

 private:
  const std::string path_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: stepwatch-fake-kubelet SOCKET_PATH PODS_FILE\n");
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  FileKubelet service(argv[2]);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(std::string("unix:") + argv[1], grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "cannot listen on unix:%s\n", argv[1]);
    return 1;
  }
  std::fprintf(stderr, "fake kubelet serving on unix:%s\n", argv[1]);
  int sig = 0;
  sigwait(&signals, &sig);
  server->Shutdown();
  return 0;
}
