// Cost to a training loop of reporting one step with stepwatch/client.h, against a real bound
// socket that a separate thread drains (as the agent would).
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "benchmark/benchmark.h"
#include "stepwatch/client.h"

namespace {

class DrainedSocket {
 public:
  DrainedSocket() {
    char tmpl[] = "/tmp/sw-bench-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/agent.sock";
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path_.c_str());
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    timeval tv{0, 50 * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    reader_ = std::thread([this] {
      char buf[65536];
      while (!stop_.load(std::memory_order_relaxed)) {
        if (::recv(fd_, buf, sizeof(buf), 0) > 0) received_.fetch_add(1);
      }
    });
  }
  ~DrainedSocket() {
    stop_.store(true);
    reader_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }
  uint64_t received() const { return received_.load(); }

 private:
  std::string dir_;
  std::string path_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> received_{0};
  std::thread reader_;
};

stepwatch::ReporterOptions Options(const std::string& path, bool background) {
  stepwatch::ReporterOptions o;
  o.job = "bench-job";
  o.rank = 3;
  o.world_size = 8;
  o.local_rank = 3;
  o.gpu = 3;
  o.socket_path = path;
  o.use_environment = false;
  o.background = background;
  o.warn_on_stderr = false;
  return o;
}

stepwatch::StepRecord Record(int64_t step) {
  stepwatch::StepRecord r;
  r.step = step;
  r.step_s = 0.123456789;
  r.data_s = 0.0012345;
  r.compute_s = 0.0987654321;
  r.comm_s = 0.0234567;
  r.samples = 256;
  return r;
}

void ReportCounters(benchmark::State& state, const stepwatch::Reporter& reporter) {
  state.counters["sent"] = static_cast<double>(reporter.sent());
  state.counters["dropped"] = static_cast<double>(reporter.dropped());
}

// Formatting alone.
void BM_Encode(benchmark::State& state) {
  stepwatch::Reporter reporter(Options("/nonexistent/agent.sock", false));
  char buf[1024];
  int64_t step = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(reporter.Encode(Record(step++), buf, sizeof(buf)));
  }
}
BENCHMARK(BM_Encode);

// The default: Send() queues; the owned thread formats and sends. Events go in bursts that fit
// the queue, and the timer is paused while the sender catches up, so that this measures queued
// events rather than the (cheaper) drops of a full queue.
constexpr int kBurst = 256;

void BM_SendBackground(benchmark::State& state) {
  DrainedSocket agent;
  stepwatch::Reporter reporter(Options(agent.path(), true));
  int64_t step = 0;
  for (auto _ : state) {
    for (int i = 0; i < kBurst; ++i) benchmark::DoNotOptimize(reporter.Send(Record(step++)));
    state.PauseTiming();
    reporter.Flush();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kBurst);
  ReportCounters(state, reporter);
}
BENCHMARK(BM_SendBackground)->UseRealTime();

// Send() formats and makes the non-blocking send itself.
void BM_SendInline(benchmark::State& state) {
  DrainedSocket agent;
  stepwatch::Reporter reporter(Options(agent.path(), false));
  int64_t step = 0;
  for (auto _ : state) benchmark::DoNotOptimize(reporter.Send(Record(step++)));
  ReportCounters(state, reporter);
}
BENCHMARK(BM_SendInline)->UseRealTime();

// What a loop pays per step: a StepScope with three PhaseScopes (clock reads included).
void BM_StepScopeWithPhases(benchmark::State& state) {
  DrainedSocket agent;
  stepwatch::Reporter reporter(Options(agent.path(), true));
  for (auto _ : state) {
    for (int i = 0; i < kBurst; ++i) {
      stepwatch::StepScope step(reporter, 256);
      { stepwatch::PhaseScope data(step, stepwatch::Phase::kData); }
      { stepwatch::PhaseScope compute(step, stepwatch::Phase::kCompute); }
      { stepwatch::PhaseScope comm(step, stepwatch::Phase::kComm); }
    }
    state.PauseTiming();
    reporter.Flush();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kBurst);
  ReportCounters(state, reporter);
}
BENCHMARK(BM_StepScopeWithPhases)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
