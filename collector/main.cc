// stepwatch-collector: receives ReportBatches from agents, runs the diagnosis engine, serves the
// Query service for stepwatchctl and /metrics for Prometheus.
#include <signal.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "collector/server.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/net.h"

ABSL_FLAG(std::string, grpc_listen, "0.0.0.0:7070",
          "HOST:PORT for the gRPC services (Ingest from agents, Query for stepwatchctl, health). "
          "Port 0 picks a free port, logged at start.");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9464",
          "HOST:PORT for Prometheus /metrics; empty disables it. Port 0 picks a free port.");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for the state file (scaling history per job name); it is loaded at start, "
          "written every --save_interval and at shutdown. Empty: nothing survives a restart.");
ABSL_FLAG(double, expire, 300,
          "Seconds after which a job or node that sent nothing is forgotten with its series.");
ABSL_FLAG(double, node_down_after, 15,
          "Seconds of silence after which stepwatch_node_up reads 0 (before --expire removes it).");
ABSL_FLAG(int32_t, max_jobs, 1000, "Most jobs tracked; steps of further jobs are dropped.");
ABSL_FLAG(int32_t, max_ranks_per_job, 65536, "Most ranks tracked per job.");
ABSL_FLAG(int32_t, max_nodes, 10000,
          "Most nodes tracked; further nodes' GPU/host data is dropped.");
ABSL_FLAG(int32_t, max_gpus_per_node, 64, "Most GPUs tracked per node.");
ABSL_FLAG(int32_t, top_ranks, 5,
          "Per job, how many of the slowest ranks get per-rank series on /metrics "
          "(stepwatch_rank_busy_vs_median_ratio); 0 disables them.");
ABSL_FLAG(int32_t, max_finding_series, 1000, "Most stepwatch_finding series on /metrics.");
ABSL_FLAG(double, tick, 1.0,
          "Seconds between runs of the time-driven analysis (step grace, stalls, "
          "underutilization windows) and expiry.");
ABSL_FLAG(double, save_interval, 60, "Seconds between writes of the state file.");
ABSL_FLAG(double, shutdown_grace, 2,
          "Seconds open streams get to finish at SIGINT/SIGTERM before they are cancelled.");
ABSL_FLAG(int32_t, window_steps, 64, "Steps of history kept per job and rank.");
ABSL_FLAG(double, step_grace, 5,
          "Seconds after a step's first report when it counts as complete even if ranks are "
          "missing.");
ABSL_FLAG(double, underutil_threshold, 0.5,
          "A job's GPU whose utilization (or SM activity where known) stays below this fraction "
          "for --underutil_window is underutilized.");
ABSL_FLAG(double, underutil_window, 30, "Seconds below --underutil_threshold before a finding.");
ABSL_FLAG(double, scaling_threshold, 0.8, "Scaling efficiency below this is a finding.");
ABSL_FLAG(double, regression_threshold, 0.10,
          "A sustained step-time increase of this fraction or more is a regression finding.");
ABSL_FLAG(double, stall_multiple, 10,
          "No step progress for this many median step times (and at least --stall_floor) is a "
          "stall.");
ABSL_FLAG(double, stall_floor, 30, "Minimum seconds without progress before a stall finding.");
ABSL_FLAG(int32_t, straggler_window, 16,
          "Steps over which a rank's busy time is compared with its peers' median.");
ABSL_FLAG(double, straggler_margin, 0.06,
          "Least relative excess of busy time over the peers' median that flags a straggler "
          "(it grows with the job's own noise).");
ABSL_FLAG(double, straggler_min_seconds, 0.002,
          "Least absolute excess of busy time, in seconds, that flags a straggler (keeps the "
          "small, noisy busy times of fast jobs from flagging healthy ranks).");

namespace {

int64_t SecondsToNanos(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

bool Positive(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

int main(int argc, char** argv) {
  stepwatch::FlagsSpec spec;
  spec.program = "stepwatch-collector";
  spec.main_file = "collector/main.cc";
  spec.usage =
      "gathers step timings and GPU/host samples from stepwatch agents, "
      "finds stragglers, underutilized GPUs and lost scaling, and serves them to Prometheus "
      "(/metrics) and stepwatchctl (gRPC Query).\n"
      "Usage: stepwatch-collector --grpc-listen=HOST:PORT --metrics-listen=HOST:PORT "
      "[--state-dir=DIR] [--expire=SECONDS] ...\n"
      "Flags may be spelled with dashes or underscores; durations are seconds, fractions "
      "allowed.";
  stepwatch::ParseFlagsOrExit(argc, argv, spec);
  for (const std::string& address :
       {absl::GetFlag(FLAGS_grpc_listen), absl::GetFlag(FLAGS_metrics_listen)}) {
    if (absl::StatusOr<stepwatch::HostPort> parsed = stepwatch::ParseHostPort(address);
        !parsed.ok()) {
      stepwatch::UsageError(spec.program, parsed.status().message());
    }
  }

  stepwatch::collector::CollectorServerOptions options;
  options.grpc_listen = absl::GetFlag(FLAGS_grpc_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  const std::pair<const char*, double> must_be_positive[] = {
      {"expire", absl::GetFlag(FLAGS_expire)},
      {"node_down_after", absl::GetFlag(FLAGS_node_down_after)},
      {"tick", absl::GetFlag(FLAGS_tick)},
      {"save_interval", absl::GetFlag(FLAGS_save_interval)},
      {"step_grace", absl::GetFlag(FLAGS_step_grace)},
      {"underutil_window", absl::GetFlag(FLAGS_underutil_window)},
      {"stall_multiple", absl::GetFlag(FLAGS_stall_multiple)},
      {"stall_floor", absl::GetFlag(FLAGS_stall_floor)},
      {"underutil_threshold", absl::GetFlag(FLAGS_underutil_threshold)},
      {"scaling_threshold", absl::GetFlag(FLAGS_scaling_threshold)},
      {"regression_threshold", absl::GetFlag(FLAGS_regression_threshold)},
      {"straggler_margin", absl::GetFlag(FLAGS_straggler_margin)},
      {"straggler_min_seconds", absl::GetFlag(FLAGS_straggler_min_seconds)},
  };
  for (const auto& [name, value] : must_be_positive) {
    if (!Positive(value)) {
      SW_LOG_ERROR << "--" << name << " must be a positive number, got " << value;
      return 2;
    }
  }
  const std::pair<const char*, int32_t> limits[] = {
      {"max_jobs", absl::GetFlag(FLAGS_max_jobs)},
      {"max_ranks_per_job", absl::GetFlag(FLAGS_max_ranks_per_job)},
      {"max_nodes", absl::GetFlag(FLAGS_max_nodes)},
      {"max_gpus_per_node", absl::GetFlag(FLAGS_max_gpus_per_node)},
      {"window_steps", absl::GetFlag(FLAGS_window_steps)},
      {"straggler_window", absl::GetFlag(FLAGS_straggler_window)},
  };
  for (const auto& [name, value] : limits) {
    if (value <= 0) {
      SW_LOG_ERROR << "--" << name << " must be positive, got " << value;
      return 2;
    }
  }
  if (absl::GetFlag(FLAGS_shutdown_grace) < 0 || absl::GetFlag(FLAGS_max_finding_series) < 0 ||
      absl::GetFlag(FLAGS_top_ranks) < 0) {
    SW_LOG_ERROR << "--shutdown_grace, --max_finding_series and --top_ranks must not be negative";
    return 2;
  }
  options.tick_nanos = SecondsToNanos(absl::GetFlag(FLAGS_tick));
  options.save_interval_nanos = SecondsToNanos(absl::GetFlag(FLAGS_save_interval));
  options.metrics.max_finding_series = absl::GetFlag(FLAGS_max_finding_series);
  stepwatch::collector::CollectorStateOptions& st = options.state;
  st.expire_nanos = SecondsToNanos(absl::GetFlag(FLAGS_expire));
  st.node_down_nanos = SecondsToNanos(absl::GetFlag(FLAGS_node_down_after));
  st.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  st.max_ranks_per_job = absl::GetFlag(FLAGS_max_ranks_per_job);
  st.max_nodes = absl::GetFlag(FLAGS_max_nodes);
  st.max_gpus_per_node = absl::GetFlag(FLAGS_max_gpus_per_node);
  st.top_ranks_per_job = absl::GetFlag(FLAGS_top_ranks);
  st.engine.window_steps = absl::GetFlag(FLAGS_window_steps);
  st.engine.step_grace_nanos = SecondsToNanos(absl::GetFlag(FLAGS_step_grace));
  st.engine.underutil_threshold = absl::GetFlag(FLAGS_underutil_threshold);
  st.engine.underutil_window_nanos = SecondsToNanos(absl::GetFlag(FLAGS_underutil_window));
  st.engine.scaling_threshold = absl::GetFlag(FLAGS_scaling_threshold);
  st.engine.regression_threshold = absl::GetFlag(FLAGS_regression_threshold);
  st.engine.stall_multiple = absl::GetFlag(FLAGS_stall_multiple);
  st.engine.stall_floor_nanos = SecondsToNanos(absl::GetFlag(FLAGS_stall_floor));
  st.engine.straggler_window = absl::GetFlag(FLAGS_straggler_window);
  st.engine.straggler_rel_margin = absl::GetFlag(FLAGS_straggler_margin);
  st.engine.straggler_abs_margin_s = absl::GetFlag(FLAGS_straggler_min_seconds);

  // Block the stop signals in every thread (gRPC and civetweb threads inherit this mask) and
  // collect them with sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  stepwatch::SystemClock clock;
  auto server = stepwatch::collector::CollectorServer::Start(options, &clock);
  if (!server.ok()) {
    SW_LOG_ERROR << "cannot start: " << server.status();
    return 1;
  }
  SW_LOG_INFO << "stepwatch-collector ready: grpc=" << (*server)->grpc_port()
              << " metrics=" << (*server)->metrics_port();

  int sig = 0;
  sigwait(&stop_signals, &sig);
  SW_LOG_INFO << "received " << strsignal(sig) << ", shutting down";
  (*server)->Shutdown(SecondsToNanos(absl::GetFlag(FLAGS_shutdown_grace)));
  SW_LOG_INFO << "stopped";
  return 0;
}
