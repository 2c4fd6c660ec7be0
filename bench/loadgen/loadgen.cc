// stepwatch-loadgen: many simulated nodes' agents in one process, speaking the agent protocol
// (Ingest.Report streams of ReportBatch, one acknowledgement per batch, a seq per agent and
// collector link) to one or several collectors, placed as the agent places them
// (common/collectors.h): each job's steps go to the first --replicas reachable collectors of
// RendezvousOrder(job), each node's GPU and host samples to the union of its jobs' owners. A
// collector whose stream broke and that has not been reachable again for --failover-after is
// skipped, its jobs going to the next in their order.
//
// Measures, for docs/scale.md (bench/loadgen/measure_scale.sh): throughput (progress lines on
// stderr, one per second), collector CPU and RSS from /proc (--collector-pids), /metrics size and
// scrape time, the detection latency of injected stragglers, and failover after a SIGKILL of one
// collector (--kill-pid). The JSON summary is the one line written to stdout.
//
// Simplifications against the real agent, none of which changes what the collector does per
// event: batches of a broken stream are not resent (counted as lost), no spool, plaintext only.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/collector/fleet.h"
#include "bench/loadgen/metrics_probe.h"
#include "common/collectors.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

ABSL_FLAG(std::string, collector, "127.0.0.1:7070",
          "Collectors, HOST:PORT[,HOST:PORT...] (common/collectors.h; dns:/// is not resolved "
          "here). Their order does not matter: placement hashes the addresses.");
ABSL_FLAG(int32_t, replicas, 2, "Collectors each job is sent to (capped at their number).");
ABSL_FLAG(std::string, metrics, "",
          "The collectors' /metrics addresses HOST:PORT, in --collector order: polled for "
          "straggler findings (detection latency, failover) and scrape size/time. Empty: none.");
ABSL_FLAG(std::string, collector_pids, "",
          "The collectors' process ids, in --collector order: CPU time and RSS read from /proc "
          "over the measurement window.");
ABSL_FLAG(int32_t, nodes, 16, "Simulated nodes (one agent each).");
ABSL_FLAG(int32_t, gpus, 8, "GPUs per node (one sample each per step).");
ABSL_FLAG(int32_t, ranks_per_node, 8, "Ranks per node (one step event each per step).");
ABSL_FLAG(int32_t, world_size, 64,
          "Ranks per job; global rank g is rank g % world_size of job g / world_size.");
ABSL_FLAG(double, steps_per_second, 1, "Steps per second of every rank (one batch per step).");
ABSL_FLAG(double, duration, 60, "Seconds to run.");
ABSL_FLAG(double, measure_after, 10,
          "Seconds of warm-up before the measurement window (rates, CPU) starts.");
ABSL_FLAG(double, measure_for, 0,
          "Seconds the measurement window lasts (0: to the end). End it before the /metrics "
          "polls start to keep their cost out of the CPU figure.");
ABSL_FLAG(int32_t, straggler_rank, -1,
          "Rank (within its job) made slow from --straggler-after on; -1: none.");
ABSL_FLAG(int32_t, straggler_jobs, 1, "How many jobs (from job 0) get that straggler; 0: all.");
ABSL_FLAG(double, straggler_after, 20, "Seconds after start when the straggler turns slow.");
ABSL_FLAG(double, straggler_extra, 0.5, "The straggler's extra busy time, fraction of normal.");
ABSL_FLAG(double, failover_after, 2,
          "Seconds a collector stays a target after its stream broke (as the agent's flag).");
ABSL_FLAG(double, poll_interval, 1,
          "Seconds between /metrics polls (from shortly before the "
          "straggler turns slow, or the kill).");
ABSL_FLAG(int32_t, kill_pid, 0, "SIGKILL this collector process at --kill-at (failover test).");
ABSL_FLAG(int32_t, kill_index, 0, "Which --collector entry --kill-pid is (0-based).");
ABSL_FLAG(double, kill_at, -1, "Seconds after start of the SIGKILL; -1: none.");
ABSL_FLAG(int32_t, threads, 4, "Sender threads (nodes are split among them).");
ABSL_FLAG(int32_t, nodes_per_connection, 8,
          "Simulated nodes sharing one HTTP/2 connection per collector (a collector allows 16 "
          "streams per connection by default; a real agent has its own).");
ABSL_FLAG(std::string, job_prefix, "lg", "Job names are PREFIX-INDEX.");
ABSL_FLAG(std::string, node_prefix, "lgnode", "Node names are PREFIX-INDEX.");

namespace {

using Clock = std::chrono::steady_clock;
using stepwatch::v1::IngestAck;
using stepwatch::v1::ReportBatch;

int64_t WallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) out.emplace_back(p);
  return out;
}

// utime + stime of a process in seconds, and VmRSS / VmHWM in KiB; -1 when unreadable.
double ProcCpuSeconds(int pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(f, line)) return -1;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ');
  // After "pid (comm) ": state is field 0, utime field 11, stime field 12.
  if (fields.size() < 13) return -1;
  double ut = 0, st = 0;
  if (!absl::SimpleAtod(fields[11], &ut) || !absl::SimpleAtod(fields[12], &st)) return -1;
  return (ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int64_t ProcStatusKib(int pid, const std::string& key) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      int64_t v = -1;
      std::istringstream(line.substr(key.size() + 1)) >> v;
      return v;
    }
  }
  return -1;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(
      std::min<double>(v.size() - 1, std::floor(p * (v.size() - 1) + 0.5)))];
}

struct Collector {
  std::string address;
  std::string metrics;
  int pid = 0;
  std::shared_ptr<grpc::Channel> probe;
  // Wall nanos when its stream (or the probe) first failed since it was last reachable; 0: up.
  std::atomic<int64_t> down_since{0};
  std::atomic<int64_t> steps_acked{0};
  std::atomic<int64_t> samples_acked{0};  // GPU + host samples
  std::atomic<int64_t> batches_acked{0};
  std::atomic<int64_t> streams_broken{0};
  // Measurement window.
  double cpu_start = -1, cpu_end = -1;
  int64_t steps_start = 0, samples_start = 0, steps_end = 0, samples_end = 0;
  int64_t rss_start_kib = -1, rss_end_kib = -1, hwm_end_kib = -1;
  std::vector<double> scrape_seconds, scrape_bytes;
};

struct Fleet {
  std::vector<std::unique_ptr<Collector>> collectors;
  // Flag values read once: the send loop runs per event.
  std::string job_prefix;
  int gpus = 0;
  int replicas = 2;
  int64_t failover_after_ns = 2'000'000'000;
  int jobs = 0;
  std::vector<std::vector<int>> job_order;  // collector indices, rendezvous order
  std::vector<int> job_ranks;               // ranks of each job in this fleet
  std::vector<char> job_has_straggler;
  std::vector<std::atomic<int64_t>> first_slow_ns;  // wall nanos of the first slow step sent

  bool Reachable(int c, int64_t now) const {
    const int64_t d = collectors[c]->down_since.load();
    return d == 0 || now - d < failover_after_ns;
  }
  void MarkDown(int c, int64_t now) {
    int64_t expected = 0;
    collectors[c]->down_since.compare_exchange_strong(expected, now);
  }
  // The first R reachable collectors of the job's order (the agent's placement).
  std::vector<int> Owners(int job, int64_t now, int exclude = -1) const {
    std::vector<int> out;
    for (int c : job_order[job]) {
      if (static_cast<int>(out.size()) >= replicas) break;
      if (c != exclude && Reachable(c, now)) out.push_back(c);
    }
    return out;
  }
  std::string JobName(int job) const { return absl::StrCat(job_prefix, "-", job); }
};

struct Link {
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReaderWriter<ReportBatch, IngestAck>> stream;
  uint64_t seq = 0;
  int64_t retry_at = 0;
  bool awaiting_ack = false;
  int pending_steps = 0, pending_samples = 0;
};

struct Node {
  int index = 0;
  std::string name, agent_id;
  std::vector<std::pair<int, std::vector<int>>> jobs;  // job -> global ranks on this node
  std::vector<Link> links;                             // per collector
  int group = 0;                                       // connection group within its worker
};

struct Totals {
  std::atomic<int64_t> steps_sent{0}, steps_acked{0}, batches_failed{0}, steps_unplaced{0};
  std::atomic<int64_t> max_lag_ns{0}, last_lag_ns{0};
};

class Worker {
 public:
  Worker(Fleet* fleet, Totals* totals, std::vector<Node> nodes, std::string boot_id)
      : fleet_(fleet), totals_(totals), nodes_(std::move(nodes)), boot_id_(std::move(boot_id)) {
    const int per_conn = std::max(1, absl::GetFlag(FLAGS_nodes_per_connection));
    const size_t n_collectors = fleet_->collectors.size();
    int groups = 0;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      nodes_[i].group = static_cast<int>(i) / per_conn;
      nodes_[i].links.resize(n_collectors);
      groups = nodes_[i].group + 1;
    }
    stubs_.resize(groups);
    for (int g = 0; g < groups; ++g) {
      for (size_t c = 0; c < n_collectors; ++c) {
        grpc::ChannelArguments args;
        args.SetMaxSendMessageSize(64 << 20);
        args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
        args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
        args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
        // A distinct argument per group: its own subchannel, so its own TCP connection.
        args.SetString("stepwatch.loadgen.connection",
                       absl::StrCat(reinterpret_cast<uintptr_t>(this), "-", g));
        stubs_[g].push_back(stepwatch::v1::Ingest::NewStub(grpc::CreateCustomChannel(
            fleet_->collectors[c]->address, grpc::InsecureChannelCredentials(), args)));
      }
    }
  }

  void Run(Clock::time_point start, double period_s, double duration_s, double straggler_after,
           double straggler_extra, int straggler_rank, int world_size, double step_s) {
    for (int64_t k = 0;; ++k) {
      const auto due = start + std::chrono::nanoseconds(static_cast<int64_t>(k * period_s * 1e9));
      if (std::chrono::duration<double>(due - start).count() >= duration_s) break;
      std::this_thread::sleep_until(due);
      const int64_t lag =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - due).count();
      totals_->last_lag_ns = lag;
      if (lag > totals_->max_lag_ns.load()) totals_->max_lag_ns = lag;
      const bool slow = Since(start) >= straggler_after;
      for (Node& n : nodes_) Send(n, k, slow, straggler_extra, straggler_rank, world_size, step_s);
      for (Node& n : nodes_) {
        for (size_t c = 0; c < n.links.size(); ++c) ReadAck(n, static_cast<int>(c));
      }
    }
    for (Node& n : nodes_) {
      for (Link& l : n.links) {
        if (!l.stream) continue;
        l.stream->WritesDone();
        l.stream->Finish();
      }
    }
  }

 private:
  void Break(Link& l, int c) {
    l.ctx->TryCancel();
    l.stream->Finish();
    l.stream.reset();
    l.ctx.reset();
    l.awaiting_ack = false;
    l.retry_at = WallNanos() + 500'000'000;
    fleet_->MarkDown(c, WallNanos());
    ++fleet_->collectors[c]->streams_broken;
    ++totals_->batches_failed;
  }

  void Send(Node& n, int64_t step, bool slow, double extra, int straggler_rank, int world_size,
            double step_s) {
    const int64_t now = WallNanos();
    const size_t nc = fleet_->collectors.size();
    std::vector<ReportBatch> batches(nc);
    std::vector<char> target(nc, 0);
    auto add_samples_to = [&](int c) { target[c] = 1; };
    if (n.jobs.empty()) {
      // A node without jobs: its samples go to the owners of its own placement key.
      std::vector<std::string> addrs;
      for (auto& col : fleet_->collectors) addrs.push_back(col->address);
      for (const std::string& a :
           stepwatch::RendezvousOrder(stepwatch::NodePlacementKey(n.name), addrs)) {
        int c = 0;
        while (fleet_->collectors[c]->address != a) ++c;
        if (!fleet_->Reachable(c, now)) continue;
        add_samples_to(c);
        if (std::count(target.begin(), target.end(), 1) >= fleet_->replicas) break;
      }
    }
    for (const auto& [job, ranks] : n.jobs) {
      const std::vector<int> owners = fleet_->Owners(job, now);
      if (owners.empty()) totals_->steps_unplaced += static_cast<int64_t>(ranks.size());
      const bool job_slow = slow && fleet_->job_has_straggler[job];
      for (int c : owners) {
        add_samples_to(c);
        for (size_t i = 0; i < ranks.size(); ++i) {
          const int g = ranks[i];
          const int rank = g % world_size;
          double busy = 0.5 * step_s * (1 + 0.004 * (g % 5));
          if (job_slow && rank == straggler_rank) {
            busy *= 1 + extra;
            int64_t zero = 0;
            fleet_->first_slow_ns[job].compare_exchange_strong(zero, now);
          }
          stepwatch::v1::StepEvent* e = batches[c].add_steps();
          e->set_job(fleet_->JobName(job));
          e->set_rank(rank);
          e->set_world_size(world_size);
          e->set_step(step);
          e->set_step_seconds(step_s);
          e->set_data_seconds(0.01 * step_s);
          e->set_compute_seconds(busy - 0.01 * step_s);
          e->set_comm_seconds(std::max(0.0, step_s - busy));
          e->set_samples(64);
          e->set_local_rank(static_cast<int>(i));
          if (fleet_->gpus > 0) e->set_gpu(static_cast<int>(i) % fleet_->gpus);
          e->set_pid(10000 + static_cast<int>(i));
          e->set_received_unix_nanos(now);
        }
      }
    }
    for (size_t c = 0; c < nc; ++c) {
      if (!target[c]) continue;
      Link& l = n.links[c];
      if (!l.stream) {
        if (now < l.retry_at) {
          totals_->steps_unplaced += batches[c].steps_size();
          continue;
        }
        l.ctx = std::make_unique<grpc::ClientContext>();
        l.stream = stubs_[n.group][c]->Report(l.ctx.get());
      }
      ReportBatch& b = batches[c];
      FillSamples(n, b, now);
      b.set_agent_id(n.agent_id);
      b.set_boot_id(boot_id_);
      b.set_seq(++l.seq);
      b.set_base_seq(l.seq);  // nothing older is held: unacknowledged batches are not resent
      b.set_created_unix_nanos(now);
      totals_->steps_sent += b.steps_size();
      if (!l.stream->Write(b)) {
        Break(l, static_cast<int>(c));
        continue;
      }
      l.awaiting_ack = true;
      l.pending_steps = b.steps_size();
      l.pending_samples = b.gpus_size() + (b.has_host() ? 1 : 0);
    }
  }

  void FillSamples(const Node& n, ReportBatch& b, int64_t now) {
    const int gpus = fleet_->gpus;
    b.mutable_node()->set_node(n.name);
    b.mutable_node()->set_nvml_available(gpus > 0);
    b.mutable_node()->set_gpu_count(gpus);
    for (int g = 0; g < gpus; ++g) {
      stepwatch::collector::bench::FillBusyGpuSample(n.index, g, now, b.add_gpus());
    }
    stepwatch::collector::bench::FillBusyHostSample(now, b.mutable_host());
  }

  void ReadAck(Node& n, int c) {
    Link& l = n.links[c];
    if (!l.stream || !l.awaiting_ack) return;
    IngestAck ack;
    if (!l.stream->Read(&ack)) {
      Break(l, c);
      return;
    }
    l.awaiting_ack = false;
    Collector& col = *fleet_->collectors[c];
    col.steps_acked += l.pending_steps;
    col.samples_acked += l.pending_samples;
    ++col.batches_acked;
    totals_->steps_acked += l.pending_steps;
  }

  Fleet* fleet_;
  Totals* totals_;
  std::vector<Node> nodes_;
  std::string boot_id_;
  std::vector<std::vector<std::unique_ptr<stepwatch::v1::Ingest::Stub>>> stubs_;  // [group][c]
};

// A job the killed collector held: who holds it once the victim is skipped, and when (wall nanos,
// 0: not within the run) a survivor, then every new owner, analysed it and flagged its straggler.
struct MovedJob {
  int job = 0;
  std::vector<int> new_owners;
  std::vector<char> owner_analyses, owner_flags;  // per new owner, seen at least once
  int64_t any_analyses_ns = 0, all_analyse_ns = 0, any_flags_ns = 0, all_flag_ns = 0;
};

// What the /metrics poller learned, for the summary.
struct PollResults {
  absl::Mutex mu;
  // Per job, the first poll showing its straggler's finding; 0: not yet.
  std::vector<int64_t> detected_ns ABSL_GUARDED_BY(mu);
  int64_t kill_ns ABSL_GUARDED_BY(mu) = 0;
  int64_t kill_step ABSL_GUARDED_BY(mu) = 0;  // the step being sent at the kill
  std::vector<MovedJob> moved ABSL_GUARDED_BY(mu);
};

}  // namespace

int main(int argc, char** argv) {
  stepwatch::FlagsSpec spec;
  spec.program = "stepwatch-loadgen";
  spec.usage =
      "stepwatch-loadgen --collector=HOST:PORT[,...] [--replicas=2] --nodes=N --ranks-per-node=R "
      "--world-size=W [...]\n"
      "Simulates N nodes' agents sending to collectors as the agent does; progress on stderr, "
      "one JSON summary line on stdout.";
  spec.main_file = "bench/loadgen/loadgen.cc";
  stepwatch::ParseFlagsOrExit(argc, argv, spec);

  auto targets = stepwatch::ParseCollectorTargets(absl::GetFlag(FLAGS_collector));
  if (!targets.ok() || targets->is_dns()) {
    stepwatch::UsageError(spec.program,
                          targets.ok() ? "dns:/// targets are not supported by the load generator"
                                       : targets.status().message());
  }
  const int n_nodes = absl::GetFlag(FLAGS_nodes);
  const int rpn = absl::GetFlag(FLAGS_ranks_per_node);
  const int world = absl::GetFlag(FLAGS_world_size);
  const double sps = absl::GetFlag(FLAGS_steps_per_second);
  const double duration = absl::GetFlag(FLAGS_duration);
  if (n_nodes < 1 || rpn < 0 || world < 1 || !(sps > 0) || !(duration > 0)) {
    stepwatch::UsageError(spec.program,
                          "--nodes, --world-size, --steps-per-second and --duration "
                          "must be positive, --ranks-per-node >= 0");
  }
  const std::vector<std::string> metrics = SplitList(absl::GetFlag(FLAGS_metrics));
  const std::vector<std::string> pids = SplitList(absl::GetFlag(FLAGS_collector_pids));
  const size_t nc = targets->addresses.size();
  if ((!metrics.empty() && metrics.size() != nc) || (!pids.empty() && pids.size() != nc)) {
    stepwatch::UsageError(spec.program,
                          "--metrics and --collector-pids need one entry per collector");
  }

  Fleet fleet;
  fleet.job_prefix = absl::GetFlag(FLAGS_job_prefix);
  fleet.gpus = std::max(0, absl::GetFlag(FLAGS_gpus));
  fleet.replicas = std::max(1, std::min<int>(absl::GetFlag(FLAGS_replicas), static_cast<int>(nc)));
  fleet.failover_after_ns = static_cast<int64_t>(absl::GetFlag(FLAGS_failover_after) * 1e9);
  for (size_t c = 0; c < nc; ++c) {
    auto col = std::make_unique<Collector>();
    col->address = targets->addresses[c];
    if (!metrics.empty()) col->metrics = metrics[c];
    if (!pids.empty() && !absl::SimpleAtoi(pids[c], &col->pid)) {
      stepwatch::UsageError(spec.program, "--collector-pids: not a number");
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetString("stepwatch.loadgen.connection", "probe");
    col->probe = grpc::CreateCustomChannel(col->address, grpc::InsecureChannelCredentials(), args);
    fleet.collectors.push_back(std::move(col));
  }
  const int64_t total_ranks = static_cast<int64_t>(n_nodes) * rpn;
  fleet.jobs = static_cast<int>((total_ranks + world - 1) / world);
  fleet.job_ranks.assign(fleet.jobs, 0);
  fleet.job_has_straggler.assign(fleet.jobs, 0);
  fleet.first_slow_ns = std::vector<std::atomic<int64_t>>(fleet.jobs);
  const int straggler_rank = absl::GetFlag(FLAGS_straggler_rank);
  const int straggler_jobs = absl::GetFlag(FLAGS_straggler_jobs);
  for (int j = 0; j < fleet.jobs; ++j) {
    fleet.job_ranks[j] =
        static_cast<int>(std::min<int64_t>(world, total_ranks - int64_t{j} * world));
    fleet.job_has_straggler[j] = straggler_rank >= 0 && straggler_rank < fleet.job_ranks[j] &&
                                 (straggler_jobs <= 0 || j < straggler_jobs);
    std::vector<int> order;
    for (const std::string& a : stepwatch::RendezvousOrder(fleet.JobName(j), targets->addresses)) {
      order.push_back(
          static_cast<int>(std::find(targets->addresses.begin(), targets->addresses.end(), a) -
                           targets->addresses.begin()));
    }
    fleet.job_order.push_back(std::move(order));
  }

  // Nodes, split into contiguous runs per worker so a job's nodes share few workers.
  const int n_threads = std::max(1, std::min(absl::GetFlag(FLAGS_threads), n_nodes));
  const std::string boot_id = absl::StrCat("loadgen-", getpid(), "-", WallNanos());
  std::vector<std::unique_ptr<Worker>> workers;
  Totals totals;
  for (int t = 0; t < n_threads; ++t) {
    std::vector<Node> nodes;
    for (int i = static_cast<int>(int64_t{n_nodes} * t / n_threads);
         i < static_cast<int>(int64_t{n_nodes} * (t + 1) / n_threads); ++i) {
      Node n;
      n.index = i;
      n.name = absl::StrFormat("%s-%05d", absl::GetFlag(FLAGS_node_prefix), i);
      n.agent_id = absl::StrCat("agent-", n.name);
      for (int r = 0; r < rpn; ++r) {
        const int g = i * rpn + r;
        const int job = g / world;
        if (n.jobs.empty() || n.jobs.back().first != job) n.jobs.push_back({job, {}});
        n.jobs.back().second.push_back(g);
      }
      nodes.push_back(std::move(n));
    }
    workers.push_back(std::make_unique<Worker>(&fleet, &totals, std::move(nodes), boot_id));
  }

  for (auto& col : fleet.collectors) {
    if (col->pid > 0) col->rss_start_kib = ProcStatusKib(col->pid, "VmRSS");
  }
  const auto start = Clock::now();
  const double straggler_after = absl::GetFlag(FLAGS_straggler_after);
  const double step_s = 1.0 / sps;
  std::vector<std::thread> threads;
  for (auto& w : workers) {
    threads.emplace_back([&, w = w.get()] {
      w->Run(start, step_s, duration, straggler_after, absl::GetFlag(FLAGS_straggler_extra),
             straggler_rank, world, step_s);
    });
  }

  // /metrics poller: straggler detection and failover.
  PollResults poll;
  {
    absl::MutexLock lock(&poll.mu);
    poll.detected_ns.assign(fleet.jobs, 0);
  }
  std::atomic<bool> stop{false};
  const double kill_at = absl::GetFlag(FLAGS_kill_at);
  const int kill_index = absl::GetFlag(FLAGS_kill_index);
  const bool polling = !metrics.empty();
  std::thread poller([&] {
    if (!polling) return;
    const double poll_interval = absl::GetFlag(FLAGS_poll_interval);
    double first = straggler_after - 1;
    if (kill_at >= 0) first = std::min(first, kill_at - 1);
    while (!stop && Since(start) < first)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    while (!stop) {
      const auto round = Clock::now();
      for (size_t c = 0; c < nc && !stop; ++c) {
        Collector& col = *fleet.collectors[c];
        auto view = stepwatch::loadgen::ScrapeMetrics(col.metrics, 10);
        if (!view.ok()) continue;
        const int64_t now = WallNanos();
        col.scrape_seconds.push_back(view->seconds);
        col.scrape_bytes.push_back(static_cast<double>(view->bytes));
        absl::MutexLock lock(&poll.mu);
        for (int j = 0; j < fleet.jobs; ++j) {
          if (!fleet.job_has_straggler[j] || poll.detected_ns[j] != 0) continue;
          if (fleet.first_slow_ns[j].load() == 0) continue;
          if (view->stragglers.count({fleet.JobName(j), straggler_rank})) poll.detected_ns[j] = now;
        }
        if (poll.kill_ns == 0 || static_cast<int>(c) == kill_index) continue;
        for (MovedJob& mj : poll.moved) {
          const std::string name = fleet.JobName(mj.job);
          auto it = view->last_step.find(name);
          const bool analysed = it != view->last_step.end() && it->second > poll.kill_step;
          const bool flagged =
              fleet.job_has_straggler[mj.job] && view->stragglers.count({name, straggler_rank}) > 0;
          if (analysed && mj.any_analyses_ns == 0) mj.any_analyses_ns = now;
          if (flagged && mj.any_flags_ns == 0) mj.any_flags_ns = now;
          const auto owner =
              std::find(mj.new_owners.begin(), mj.new_owners.end(), static_cast<int>(c));
          if (owner == mj.new_owners.end()) continue;
          const size_t i = static_cast<size_t>(owner - mj.new_owners.begin());
          if (analysed) mj.owner_analyses[i] = 1;
          if (flagged) mj.owner_flags[i] = 1;
          auto all = [](const std::vector<char>& v) {
            return std::all_of(v.begin(), v.end(), [](char x) { return x != 0; });
          };
          if (mj.all_analyse_ns == 0 && all(mj.owner_analyses)) mj.all_analyse_ns = now;
          if (mj.all_flag_ns == 0 && all(mj.owner_flags)) mj.all_flag_ns = now;
        }
      }
      const auto next =
          round + std::chrono::milliseconds(static_cast<int64_t>(poll_interval * 1000));
      while (!stop && Clock::now() < next)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  // Main thread: reachability probes, measurement window, the kill, progress lines.
  const double measure_after = absl::GetFlag(FLAGS_measure_after);
  const double measure_end =
      absl::GetFlag(FLAGS_measure_for) > 0
          ? std::min(duration, measure_after + absl::GetFlag(FLAGS_measure_for))
          : duration;
  bool window_started = false, window_ended = false, killed = false;
  auto end_window = [&] {
    window_ended = true;
    for (auto& col : fleet.collectors) {
      col->steps_end = col->steps_acked;
      col->samples_end = col->samples_acked;
      if (col->pid > 0) {
        col->cpu_end = ProcCpuSeconds(col->pid);
        col->rss_end_kib = ProcStatusKib(col->pid, "VmRSS");
        col->hwm_end_kib = ProcStatusKib(col->pid, "VmHWM");
      }
    }
  };
  int64_t prev_sent = 0, prev_acked = 0;
  auto next_print = start + std::chrono::seconds(1);
  while (Since(start) < duration) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int64_t now = WallNanos();
    for (auto& col : fleet.collectors) {
      if (col->probe->GetState(true) == GRPC_CHANNEL_READY) {
        col->down_since = 0;
      } else {
        int64_t zero = 0;
        col->down_since.compare_exchange_strong(zero, now);
      }
    }
    if (!window_started && Since(start) >= measure_after) {
      window_started = true;
      for (auto& col : fleet.collectors) {
        col->steps_start = col->steps_acked;
        col->samples_start = col->samples_acked;
        if (col->pid > 0) col->cpu_start = ProcCpuSeconds(col->pid);
      }
    }
    if (window_started && !window_ended && Since(start) >= measure_end) end_window();
    if (!killed && kill_at >= 0 && Since(start) >= kill_at && absl::GetFlag(FLAGS_kill_pid) > 0) {
      killed = true;
      // Which jobs the victim holds now, and who holds them once it is skipped.
      absl::MutexLock lock(&poll.mu);
      kill(absl::GetFlag(FLAGS_kill_pid), SIGKILL);
      poll.kill_ns = WallNanos();
      poll.kill_step = static_cast<int64_t>(Since(start) * sps);
      for (int j = 0; j < fleet.jobs; ++j) {
        const std::vector<int> owners = fleet.Owners(j, now);
        if (std::find(owners.begin(), owners.end(), kill_index) == owners.end()) continue;
        MovedJob mj;
        mj.job = j;
        mj.new_owners = fleet.Owners(j, now, kill_index);
        mj.owner_analyses.assign(mj.new_owners.size(), 0);
        mj.owner_flags.assign(mj.new_owners.size(), 0);
        poll.moved.push_back(std::move(mj));
      }
      std::fprintf(stderr, "killed collector %s (pid %d): %zu jobs to move\n",
                   fleet.collectors[kill_index]->address.c_str(), absl::GetFlag(FLAGS_kill_pid),
                   poll.moved.size());
    }
    if (Clock::now() >= next_print) {
      next_print += std::chrono::seconds(1);
      const int64_t sent = totals.steps_sent, acked = totals.steps_acked;
      std::string up;
      for (size_t c = 0; c < nc; ++c) up += fleet.Reachable(static_cast<int>(c), now) ? '+' : '-';
      std::fprintf(stderr, "t=%.0fs steps_sent/s=%lld steps_acked/s=%lld lag=%.2fs collectors=%s\n",
                   Since(start), static_cast<long long>(sent - prev_sent),
                   static_cast<long long>(acked - prev_acked), totals.last_lag_ns.load() / 1e9,
                   up.c_str());
      prev_sent = sent;
      prev_acked = acked;
    }
  }
  if (!window_ended) end_window();
  const double window_s = measure_end - measure_after;
  for (std::thread& t : threads) t.join();
  stop = true;
  poller.join();

  // Ranks each collector holds at the end (placement as now).
  std::vector<int64_t> ranks_held(nc, 0), jobs_held(nc, 0);
  for (int j = 0; j < fleet.jobs; ++j) {
    for (int c : fleet.Owners(j, WallNanos())) {
      ranks_held[c] += fleet.job_ranks[j];
      ++jobs_held[c];
    }
  }

  std::string json = absl::StrFormat(
      "{\"nodes\":%d,\"gpus_per_node\":%d,\"ranks_per_node\":%d,\"world_size\":%d,\"ranks\":%lld,"
      "\"jobs\":%d,\"collectors\":%zu,\"replicas\":%d,\"steps_per_second\":%g,\"duration_s\":%g,"
      "\"window_s\":%.1f,\"steps_sent\":%lld,\"steps_acked\":%lld,\"steps_unplaced\":%lld,"
      "\"batches_failed\":%lld,\"max_lag_s\":%.3f,\"final_lag_s\":%.3f",
      n_nodes, absl::GetFlag(FLAGS_gpus), rpn, world, static_cast<long long>(total_ranks),
      fleet.jobs, nc, fleet.replicas, sps, duration, window_s,
      static_cast<long long>(totals.steps_sent.load()),
      static_cast<long long>(totals.steps_acked.load()),
      static_cast<long long>(totals.steps_unplaced.load()),
      static_cast<long long>(totals.batches_failed.load()), totals.max_lag_ns.load() / 1e9,
      totals.last_lag_ns.load() / 1e9);
  std::vector<std::string> cols;
  for (size_t c = 0; c < nc; ++c) {
    Collector& col = *fleet.collectors[c];
    const double steps = static_cast<double>(col.steps_end - col.steps_start);
    const double samples = static_cast<double>(col.samples_end - col.samples_start);
    const double cpu = col.cpu_start >= 0 && col.cpu_end >= 0 ? col.cpu_end - col.cpu_start : -1;
    cols.push_back(absl::StrFormat(
        "{\"address\":\"%s\",\"jobs_held\":%lld,\"ranks_held\":%lld,\"steps_per_s\":%.0f,"
        "\"samples_per_s\":%.0f,\"cpu_s\":%.2f,\"cpu_share\":%.4f,\"step_events_per_cpu_s\":%.0f,"
        "\"events_per_cpu_s\":%.0f,\"rss_start_kib\":%lld,\"rss_kib\":%lld,\"hwm_kib\":%lld,"
        "\"streams_broken\":%lld,"
        "\"scrapes\":%zu,\"scrape_bytes_p50\":%.0f,\"scrape_s_p50\":%.4f,\"scrape_s_max\":%.4f}",
        col.address, static_cast<long long>(jobs_held[c]), static_cast<long long>(ranks_held[c]),
        steps / window_s, samples / window_s, cpu, cpu / window_s, cpu > 0 ? steps / cpu : -1,
        cpu > 0 ? (steps + samples) / cpu : -1, static_cast<long long>(col.rss_start_kib),
        static_cast<long long>(col.rss_end_kib), static_cast<long long>(col.hwm_end_kib),
        static_cast<long long>(col.streams_broken.load()), col.scrape_seconds.size(),
        Percentile(col.scrape_bytes, 0.5), Percentile(col.scrape_seconds, 0.5),
        Percentile(col.scrape_seconds, 1.0)));
  }
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  absl::StrAppend(&json, ",\"loadgen_cpu_s\":",
                  absl::StrFormat("%.2f", self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 +
                                              self.ru_stime.tv_sec + self.ru_stime.tv_usec / 1e6));
  absl::StrAppend(&json, ",\"per_collector\":[", absl::StrJoin(cols, ","), "]");
  {
    absl::MutexLock lock(&poll.mu);
    std::vector<double> lat;
    int undetected = 0, straggling = 0;
    for (int j = 0; j < fleet.jobs; ++j) {
      if (!fleet.job_has_straggler[j] || fleet.first_slow_ns[j].load() == 0) continue;
      ++straggling;
      if (poll.detected_ns[j] == 0) {
        ++undetected;
      } else {
        lat.push_back((poll.detected_ns[j] - fleet.first_slow_ns[j].load()) / 1e9);
      }
    }
    absl::StrAppend(
        &json,
        absl::StrFormat(
            ",\"detection\":{\"straggler_jobs\":%d,\"undetected\":%d,\"poll_interval_s\":%g,"
            "\"seconds_min\":%.2f,\"seconds_p50\":%.2f,\"seconds_max\":%.2f,\"steps_p50\":%.1f,"
            "\"steps_max\":%.1f}",
            straggling, undetected, absl::GetFlag(FLAGS_poll_interval), Percentile(lat, 0),
            Percentile(lat, 0.5), Percentile(lat, 1), Percentile(lat, 0.5) * sps,
            Percentile(lat, 1) * sps));
    if (poll.kill_ns != 0) {
      // Seconds from the kill to each moved job's event (stragglers_only: jobs with one).
      auto summarize = [&](int64_t MovedJob::*field, bool stragglers_only) {
        std::vector<double> s;
        int missing = 0;
        for (const MovedJob& mj : poll.moved) {
          if (stragglers_only && !fleet.job_has_straggler[mj.job]) continue;
          if (mj.*field == 0) {
            ++missing;
          } else {
            s.push_back((mj.*field - poll.kill_ns) / 1e9);
          }
        }
        return absl::StrFormat("{\"p50_s\":%.2f,\"max_s\":%.2f,\"missing\":%d}", Percentile(s, 0.5),
                               Percentile(s, 1), missing);
      };
      absl::StrAppend(&json, ",\"failover\":{\"killed\":\"", fleet.collectors[kill_index]->address,
                      "\",\"moved_jobs\":", poll.moved.size(),
                      ",\"any_survivor_analyses\":", summarize(&MovedJob::any_analyses_ns, false),
                      ",\"all_owners_analyse\":", summarize(&MovedJob::all_analyse_ns, false),
                      ",\"any_survivor_flags\":", summarize(&MovedJob::any_flags_ns, true),
                      ",\"all_owners_flag\":", summarize(&MovedJob::all_flag_ns, true), "}");
    }
  }
  absl::StrAppend(&json, "}");
  std::printf("%s\n", json.c_str());
  return 0;
}
