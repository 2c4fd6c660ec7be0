// ingest_probe: a raw Ingest client for tests/integration/test_identity.py, sending what no agent
// sends, each message on its own stream (plaintext):
//
//   ingest_probe --collector=HOST:PORT --mode=garbage
//       bytes that are no ReportBatch protobuf
//   ingest_probe --collector=HOST:PORT --mode=big-ids --count=80 --bytes=4194304
//       batches whose boot id and host name are BYTES long (each boot id distinct)
//   ingest_probe --collector=HOST:PORT --mode=big-descriptions --count=80 --bytes=4194304
//       batches with short identifiers and a host name, GPU name and uuid of BYTES each
//
// Prints one line per final status, "status=CODE streams=N acks=M", and exits 0 when every stream
// got an answer (whatever its status).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    default:
      return "OTHER";
  }
}

struct Outcome {
  grpc::StatusCode code = grpc::StatusCode::OK;
  int acks = 0;
};

// One stream: writes `message`, reads what comes back, closes and returns the status.
Outcome Send(grpc::Channel* channel, const std::string& message) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::internal::RpcMethod method("/stepwatch.v1.Ingest/Report",
                                         grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel, method, &ctx));
  grpc::Slice slice(message);
  grpc::ByteBuffer request(&slice, 1);
  Outcome out;
  if (stream->Write(request)) {
    grpc::ByteBuffer ack;
    if (stream->Read(&ack)) ++out.acks;
    stream->WritesDone();
  }
  out.code = stream->Finish().error_code();
  return out;
}

stepwatch::v1::ReportBatch Batch(int i, const std::string& boot_id, const std::string& hostname) {
  stepwatch::v1::ReportBatch b;
  b.set_agent_id(absl::StrCat("probe-agent-", i % 4));
  b.set_boot_id(boot_id);
  b.set_seq(1);
  b.set_base_seq(1);
  b.mutable_node()->set_node(absl::StrCat("probe-node-", i % 4));
  b.mutable_node()->set_hostname(hostname);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"collector", ""}, {"mode", "garbage"}, {"count", "1"}, {"bytes", "4194304"}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos || !flags.count(arg.substr(2, eq - 2))) {
      std::fprintf(stderr, "ingest_probe: unknown argument %s\n", argv[i]);
      return 2;
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  const int count = std::atoi(flags["count"].c_str());
  const size_t bytes = std::strtoull(flags["bytes"].c_str(), nullptr, 10);
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(flags["collector"], grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::fprintf(stderr, "ingest_probe: cannot reach %s\n", flags["collector"].c_str());
    return 1;
  }
  std::map<std::string, std::pair<int, int>> tally;  // status -> streams, acks
  for (int i = 0; i < count; ++i) {
    std::string message;
    const std::string& mode = flags["mode"];
    if (mode == "garbage") {
      // Field 1 (agent_id) claims 100 bytes and carries 3, then an invalid wire type.
      message = std::string("\x0a\x64xyz\x0f\xff\xff", 8);
    } else if (mode == "big-ids") {
      message = Batch(i, absl::StrCat(i, "-", std::string(bytes, 'b')), std::string(bytes, 'h'))
                    .SerializeAsString();
    } else if (mode == "big-descriptions") {
      stepwatch::v1::ReportBatch b = Batch(i, absl::StrCat("boot-", i), std::string(bytes, 'h'));
      stepwatch::v1::GpuSample* g = b.add_gpus();
      g->set_index(0);
      g->set_name(std::string(bytes / 2, 'g'));
      g->set_uuid(std::string(bytes / 2, 'u'));
      message = b.SerializeAsString();
    } else {
      std::fprintf(stderr, "ingest_probe: unknown --mode=%s\n", mode.c_str());
      return 2;
    }
    const Outcome o = Send(channel.get(), message);
    auto& t = tally[CodeName(o.code)];
    ++t.first;
    t.second += o.acks;
  }
  for (const auto& [status, t] : tally) {
    std::printf("status=%s streams=%d acks=%d\n", status.c_str(), t.first, t.second);
  }
  return 0;
}
