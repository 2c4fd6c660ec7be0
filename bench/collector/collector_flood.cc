// Drives a real collector over gRPC as a fleet of agents would (bench/collector/fleet.h): one
// Ingest stream per node, `--steps` batches each, acknowledged one by one. For the memory-budget
// flood test and the /metrics and stepwatchctl size measurements.
//
//   collector_flood --collector=127.0.0.1:7070 --nodes=300 --ranks-per-node=1000 --gpus=0
//       --world-size=60000 --steps=1 --threads=4 [--job-prefix=flood] [--slow-rank=-1]
//       [--node-prefix=node] [--first-node=0] [--first-step=0]
//
// Prints one line: nodes, batches acknowledged, streams failed, seconds. Exits 1 when a stream
// could not be opened at all (collector unreachable), 0 otherwise: a collector over its budget
// still acknowledges what it refuses.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench/collector/fleet.h"
#include "grpcpp/grpcpp.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

namespace {

using stepwatch::collector::bench::FleetBatch;
using stepwatch::collector::bench::FleetSpec;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"collector", "127.0.0.1:7070"},
                                              {"nodes", "10"},
                                              {"gpus", "8"},
                                              {"ranks-per-node", "8"},
                                              {"world-size", "512"},
                                              {"steps", "1"},
                                              {"threads", "4"},
                                              {"job-prefix", "job"},
                                              {"node-prefix", "node"},
                                              {"slow-rank", "-1"},
                                              {"first-node", "0"},
                                              {"first-step", "0"}};
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (!absl::ConsumePrefix(&arg, "--") || arg.find('=') == absl::string_view::npos) {
      std::fprintf(stderr, "usage: collector_flood --KEY=VALUE ... (see the source)\n");
      return 2;
    }
    const size_t eq = arg.find('=');
    const std::string key(arg.substr(0, eq));
    if (flags.find(key) == flags.end()) {
      std::fprintf(stderr, "collector_flood: unknown flag --%s\n", key.c_str());
      return 2;
    }
    flags[key] = std::string(arg.substr(eq + 1));
  }
  auto num = [&](const char* key) {
    int v = 0;
    if (!absl::SimpleAtoi(flags[key], &v)) {
      std::fprintf(stderr, "collector_flood: --%s needs an integer\n", key);
      std::exit(2);
    }
    return v;
  };
  FleetSpec spec;
  spec.nodes = num("nodes");
  spec.gpus = num("gpus");
  spec.ranks_per_node = num("ranks-per-node");
  spec.world_size = num("world-size");
  spec.job_prefix = flags["job-prefix"];
  spec.node_prefix = flags["node-prefix"];
  spec.slow_rank = num("slow-rank");
  // Every run is a new boot of its agents, so that a rerun is not taken for resent batches.
  spec.boot_id = absl::StrCat("flood-", getpid(), "-", NowNanos());
  const int steps = num("steps");
  const int threads = std::max(1, num("threads"));
  const int first_node = num("first-node");
  const int first_step = num("first-step");

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(flags["collector"], grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<stepwatch::v1::Ingest::Stub> stub = stepwatch::v1::Ingest::NewStub(channel);

  std::atomic<int> next{0};
  std::atomic<int64_t> acked{0};
  std::atomic<int> failed{0};
  std::atomic<int> unreachable{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int n = next++; n < spec.nodes; n = next++) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        auto stream = stub->Report(&ctx);
        bool ok = true;
        for (int s = 0; s < steps && ok; ++s) {
          const stepwatch::v1::ReportBatch batch =
              FleetBatch(spec, first_node + n, first_step + s, s + 1, NowNanos());
          stepwatch::v1::IngestAck ack;
          ok = stream->Write(batch) && stream->Read(&ack);
          if (ok) ++acked;
        }
        stream->WritesDone();
        const grpc::Status status = stream->Finish();
        if (!status.ok()) {
          ++failed;
          if (status.error_code() == grpc::StatusCode::UNAVAILABLE) ++unreachable;
          if (failed.load() <= 3) {
            std::fprintf(stderr, "collector_flood: node %d: %s\n", first_node + n,
                         status.error_message().c_str());
          }
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("nodes=%d batches_acked=%lld streams_failed=%d seconds=%.2f\n", spec.nodes,
              static_cast<long long>(acked.load()), failed.load(), secs);
  return unreachable.load() == spec.nodes ? 1 : 0;
}
