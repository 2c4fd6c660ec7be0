// null-ingest-server: the anchor for the collector's ingest cost. It serves the same Ingest.Report
// stream on the same gRPC callback API and acknowledges every ReportBatch at once (acked_seq =
// its seq), doing nothing else with it: what it costs per step event is what the transport and
// protobuf parsing cost (bench/collector/measure_ingest_cpu.py).
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "grpcpp/grpcpp.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "HOST:PORT to serve Ingest on (0: a free port).");

namespace {

using stepwatch::v1::IngestAck;
using stepwatch::v1::ReportBatch;

// Reads a batch, writes its acknowledgement, reads the next: one operation outstanding at a time.
class AckEverything final : public grpc::ServerBidiReactor<ReportBatch, IngestAck> {
 public:
  AckEverything() { StartRead(&batch_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    ack_.set_boot_id(batch_.boot_id());
    ack_.set_acked_seq(batch_.seq());
    StartWrite(&ack_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "cannot send acknowledgement"));
      return;
    }
    StartRead(&batch_);
  }
  void OnDone() override { delete this; }

 private:
  ReportBatch batch_;
  IngestAck ack_;
};

class NullIngest final : public stepwatch::v1::Ingest::CallbackService {
  grpc::ServerBidiReactor<ReportBatch, IngestAck>* Report(grpc::CallbackServerContext*) override {
    return new AckEverything();
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  NullIngest service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(8 << 20);  // the collector's default
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "cannot listen on %s\n", absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }
  std::printf("port %d\n", port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  server->Shutdown();
  return 0;
}
