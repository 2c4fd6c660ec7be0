// Agent ingest cost: parsing one step-event datagram, and events per second accepted end to end
// through the real Unix socket (sender -> kernel -> IngestServer -> parser ->
// CollectorRouter::AddStep).
//
//   build-*/bench/agent/agent_ingest_bench --benchmark_min_time=2
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "agent/collector_router.h"
#include "agent/ingest_server.h"
#include "agent/step_event_parser.h"
#include "benchmark/benchmark.h"

namespace stepwatch::agent {
namespace {

// What the Python client sends for a rank that reports the full breakdown.
std::string TypicalEvent(int64_t step) {
  return R"({"job":"llama-70b-pretrain","rank":13,"world_size":64,"step":)" + std::to_string(step) +
         R"(,"step_s":0.5123,"data_s":0.0121,"compute_s":0.4012,"comm_s":0.099,"samples":32,)"
         R"("local_rank":5,"gpu":5})";
}

void BM_ParseStepEvent(benchmark::State& state) {
  const std::string datagram = TypicalEvent(123456);
  v1::StepEvent event;
  for (auto _ : state) {
    auto rejection = ParseStepEvent(datagram, &event);
    benchmark::DoNotOptimize(rejection);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ParseStepEvent);

// The same datagram through the general JSON parser only (what a nested or escaped datagram
// costs).
void BM_ParseStepEventGeneralParser(benchmark::State& state) {
  const std::string datagram = TypicalEvent(123456);
  v1::StepEvent event;
  for (auto _ : state) {
    auto rejection = ParseStepEventWithoutFastPath(datagram, &event);
    benchmark::DoNotOptimize(rejection);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ParseStepEventGeneralParser);

void BM_ParseRejectedNotJson(benchmark::State& state) {
  const std::string datagram = R"({"job":"j","rank":1,"world_size":)";
  v1::StepEvent event;
  for (auto _ : state) {
    auto rejection = ParseStepEvent(datagram, &event);
    benchmark::DoNotOptimize(rejection);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ParseRejectedNotJson);

std::string TempSocketPath() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/stepwatch-bench-XXXXXX";
  char* dir = ::mkdtemp(templ.data());
  return std::string(dir ? dir : "/tmp") + "/agent.sock";
}

// Events/s accepted through the socket. Arg 0: a counting sink; arg 1: the agent's real router
// and its link (not connected; the buffer bound drops old batches so memory stays flat).
void BM_SocketIngest(benchmark::State& state) {
  const bool with_link = state.range(0) == 1;
  CollectorRouterOptions router_options;
  router_options.resolve = [] { return std::vector<std::string>{"127.0.0.1:1"}; };
  router_options.replicas = 1;
  router_options.interval = absl::Milliseconds(100);
  router_options.link.agent_id = "bench";
  router_options.link.max_buffered_batches = 4;
  CollectorRouter router(router_options, nullptr, nullptr);
  if (with_link && !router.Start().ok()) {
    state.SkipWithError("router did not start");
    return;
  }
  std::atomic<uint64_t> received{0};
  IngestServerOptions options;
  options.socket_path = TempSocketPath();
  auto server = IngestServer::Start(options, [&](v1::StepEvent&& e) {
    if (with_link) router.AddStep(std::move(e));
    received.fetch_add(1, std::memory_order_relaxed);
  });
  if (!server.ok()) {
    state.SkipWithError(std::string(server.status().message()).c_str());
    return;
  }
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, options.socket_path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    state.SkipWithError("connect failed");
    return;
  }
  const std::string datagram = TypicalEvent(1000);
  uint64_t sent = 0;
  for (auto _ : state) {
    // Blocking send: when the agent falls behind the sender waits, so the rate measured is the
    // rate the agent sustains, not the rate the kernel drops at.
    if (::send(fd, datagram.data(), datagram.size(), 0) == static_cast<ssize_t>(datagram.size())) {
      ++sent;
    }
  }
  // Count only what the agent has taken in.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (received.load() < sent && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ::close(fd);
  state.SetItemsProcessed(static_cast<int64_t>(received.load()));
  state.counters["lost"] = static_cast<double>(sent - received.load());
  (*server)->Stop();
  router.Stop(absl::ZeroDuration());
}
BENCHMARK(BM_SocketIngest)->Arg(0)->Arg(1)->UseRealTime()->MinTime(2.0);

}  // namespace
}  // namespace stepwatch::agent

BENCHMARK_MAIN();
