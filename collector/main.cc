// stepwatch-collector: receives ReportBatches from agents, runs the diagnosis engine, serves the
// Query service for stepwatchctl and /metrics for Prometheus.
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/dedupe.h"
#include "collector/job_timeline.h"
#include "collector/metrics.h"
#include "collector/report_store.h"
#include "collector/server.h"
#include "collector/state.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/mutex_mode.h"
#include "common/net.h"
#include "common/startup_checks.h"
#include "http/metrics_endpoint.h"
#include "http/metrics_endpoint_flags.h"
#include "security/tls_credentials.h"
#include "security/tls_flags.h"

ABSL_FLAG(std::string, grpc_listen, "0.0.0.0:7070",
          "HOST:PORT for the gRPC services (Ingest from agents, Query for stepwatchctl, health). "
          "Port 0 picks a free port, logged at start.");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for the state file (scaling history per job name); it is loaded at start, "
          "written every --save_interval and at shutdown; finished jobs' reports go to "
          "DIR/reports; the batches applied (deduplication across restarts) to "
          "DIR/dedupe.journal. Empty: nothing survives a restart.");
ABSL_FLAG(double, journal_commit_interval, 0.01,
          "Seconds an applied batch waits for the batches of other streams to share one "
          "fdatasync of DIR/dedupe.journal (group commit); each is acknowledged after the sync "
          "that covers it. 0: each batch syncs at once on its stream's thread.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: every client (agent, stepwatchctl) must present a certificate signed "
          "by it, and (with --verify-node-identity) an agent's batches must claim the node its "
          "certificate names (first DNS name, else common name).");
ABSL_FLAG(bool, verify_node_identity, true,
          "With --tls-client-ca, refuse batches whose node is not the agent certificate's "
          "identity, and agent certificates that name no node (no DNS name, no common name; "
          "stepwatch_collector_requests_refused_total{reason=\"no_identity\"}). Turn off only "
          "where agents share one certificate: then any holder of a valid client certificate "
          "may report for any node (warned at start).");
ABSL_FLAG(double, tls_reload_interval, 10,
          "Seconds between checks of the TLS files for changes (certificate rotation).");
ABSL_FLAG(double, max_clock_skew, 30,
          "Seconds: sender timestamps further than this from the collector's clock are replaced "
          "by the collector's time and counted (stepwatch_collector_clock_skew_corrected_total), "
          "so a node with a wrong clock cannot disturb the analysis of any job.");
ABSL_FLAG(double, expire, 300,
          "Seconds after which a job or node that sent nothing is forgotten with its series.");
ABSL_FLAG(double, report_retention, 604800,
          "Seconds a finished job's report (stepwatchctl report) is kept after the job ends; "
          "with --state-dir the reports are files under DIR/reports and survive restarts.");
ABSL_FLAG(double, running_report_save_interval, 10,
          "Seconds between writes of running jobs' reports under --state-dir (DIR/reports/running; "
          "also at shutdown), so that a restarted collector continues them, the stretch it missed "
          "marked as a gap. 0: only at shutdown.");
ABSL_FLAG(int32_t, max_reports, 1000,
          "Most finished job reports kept; the oldest are dropped first.");
ABSL_FLAG(int32_t, max_report_findings, 1000,
          "Most findings kept in one job's report; beyond it the oldest cleared ones are dropped "
          "(and counted in the report).");
ABSL_FLAG(double, node_down_after, 15,
          "Seconds of silence after which stepwatch_node_up reads 0 (before --expire removes it).");
ABSL_FLAG(int32_t, max_jobs, 1000, "Most jobs tracked; steps of further jobs are dropped.");
ABSL_FLAG(int32_t, max_ranks_per_job, 100000,
          "Most ranks per job (world size); steps of larger jobs are dropped.");
ABSL_FLAG(int32_t, max_nodes, 20000,
          "Most nodes tracked; further nodes' GPU/host samples are dropped and counted "
          "(stepwatch_collector_limit_hits_total{limit=\"nodes\"}), the first refusal logged as "
          "a warning.");
ABSL_FLAG(int32_t, max_gpus_per_node, 64, "Most GPUs tracked per node.");
ABSL_FLAG(int32_t, max_jobs_per_node, 64,
          "Most of the tracked jobs one node may have opened (sent their first step), so that one "
          "node inventing job ids cannot take every --max-jobs slot: its further new jobs are "
          "refused and counted (stepwatch_collector_limit_hits_total{limit=\"jobs_per_node\"}, "
          "stepwatch_collector_node_refusals_total{node,reason=\"jobs_per_node\"}) while other "
          "nodes' new jobs are admitted. 0: no per-node cap.");
ABSL_FLAG(int32_t, max_memory_mib, -1,
          "Memory budget in MiB for the jobs, ranks, nodes and GPUs tracked, each charged its "
          "measured worst-case cost when first seen (a rank about 10 KiB at the default windows, "
          "a GPU 1.5 KiB). Beyond it, new ones are refused and counted "
          "(stepwatch_collector_limit_hits_total{limit=\"memory\"}); what is tracked keeps "
          "being analysed. It bounds this tracked state only, not gRPC's buffers "
          "(--grpc-memory-mib) nor batches in flight; measured peaks: docs/reliability.md. -1: "
          "half of the cgroup memory limit or of MemTotal, whichever is smaller, clamped to "
          "[256, 16384]; 0: no budget.");
ABSL_FLAG(int32_t, max_receive_message_mib, 8,
          "Largest gRPC message (report batch or request) accepted, MiB; an agent's largest "
          "batch is about 6.2 MB.");
ABSL_FLAG(int32_t, max_concurrent_streams, 16,
          "Most concurrent gRPC streams per connection (an agent holds one).");
ABSL_FLAG(int32_t, grpc_memory_mib, 64,
          "gRPC's resource quota, MiB: the transport buffers gRPC reads into and writes from, "
          "across all connections. Not counted in it: decoded batches (at most "
          "--max-receive-message-mib each, --max-concurrent-streams per connection) and header "
          "fields being decoded (16 KiB a call for peers that acknowledge the collector's "
          "SETTINGS; what gRPC 1.51 leaves open: docs/security.md, \"Header floods\").");
ABSL_FLAG(int32_t, max_series, 100000,
          "Most series on /metrics in all (0: no cap), the collector's own aside; filled in "
          "order of importance (findings, flagged ranks, jobs, per-rank series, node up, GPU "
          "utilization, SM activity, other node and GPU series, hosts), those left out counted "
          "in stepwatch_collector_series_dropped_total{family}. With --export-node-metrics=all "
          "the default keeps 10,000 nodes of 8 GPUs under 10 MB.");
ABSL_FLAG(std::string, export_node_metrics, "findings",
          "Which GPU and host readings /metrics re-exports. findings: only those of the nodes "
          "and GPUs that current findings name (a straggler's GPU, a slow node's GPUs, an "
          "underutilized or idle GPU, with their node's host readings), plus "
          "stepwatch_node_up of those nodes and of nodes gone quiet; its size follows the "
          "findings, not the fleet. Every node's raw readings are on its agent's /metrics "
          "(agent --metrics-listen), scraped per node. all: every node's and GPU's readings, "
          "for a small fleet served by one collector.");
ABSL_FLAG(int32_t, top_ranks, 5,
          "Per job, how many of the slowest ranks get per-rank series on /metrics "
          "(stepwatch_rank_busy_vs_median_ratio) besides every flagged rank; 0: flagged ranks "
          "only.");
ABSL_FLAG(int32_t, max_rank_series, 2000,
          "Most ranks with per-rank series on /metrics in all (flagged ranks first); those left "
          "out are counted in stepwatch_collector_series_dropped_total{family=\"rank\"}.");
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

namespace collector = stepwatch::collector;

constexpr char kProgram[] = "stepwatch-collector";

int64_t SecondsToNanos(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

bool Positive(double v) { return std::isfinite(v) && v > 0; }

// A flag error as main reports it, by code: InvalidArgument, a malformed value (a usage error,
// exit 2); OutOfRange, a value out of its range (logged, exit 2); FailedPrecondition, what the
// process cannot use (a startup error, exit 1). Returns the exit status where it does not exit.
int ReportFlagError(const absl::Status& error) {
  if (error.code() == absl::StatusCode::kInvalidArgument) {
    stepwatch::UsageError(kProgram, error.message());
  }
  if (error.code() == absl::StatusCode::kFailedPrecondition) {
    stepwatch::StartupError(kProgram, error.message());
  }
  SW_LOG_ERROR << error.message();
  return 2;
}

// The listen addresses parse, their ports are free and --state-dir is writable: before anything
// starts, since gRPC reports a busy port only as log noise.
absl::Status CheckAddressesAndStateDir() {
  const std::pair<const char*, std::string> listeners[] = {
      {"--grpc-listen", absl::GetFlag(FLAGS_grpc_listen)},
      {"--metrics-listen", absl::GetFlag(FLAGS_metrics_listen)}};
  for (const auto& [flag, address] : listeners) {
    if (address.empty() && std::string(flag) == "--metrics-listen") continue;  // disabled
    if (absl::StatusOr<stepwatch::HostPort> parsed = stepwatch::ParseHostPort(address);
        !parsed.ok()) {
      return absl::InvalidArgumentError(parsed.status().message());
    }
  }
  for (const auto& [flag, address] : listeners) {
    if (address.empty()) continue;
    if (absl::Status st = stepwatch::CheckCanListen(address); !st.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(flag, "=", address, ": ", st.message()));
    }
  }
  if (const std::string dir = absl::GetFlag(FLAGS_state_dir); !dir.empty()) {
    if (absl::Status st = stepwatch::EnsureWritableDirectory(dir); !st.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--state-dir=", dir, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

// Durations, fractions and counts within their ranges (OutOfRange otherwise).
absl::Status CheckRanges() {
  const std::pair<const char*, double> must_be_positive[] = {
      {"expire", absl::GetFlag(FLAGS_expire)},
      {"node_down_after", absl::GetFlag(FLAGS_node_down_after)},
      {"report_retention", absl::GetFlag(FLAGS_report_retention)},
      {"tick", absl::GetFlag(FLAGS_tick)},
      {"save_interval", absl::GetFlag(FLAGS_save_interval)},
      {"tls_reload_interval", absl::GetFlag(FLAGS_tls_reload_interval)},
      {"max_clock_skew", absl::GetFlag(FLAGS_max_clock_skew)},
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
      return absl::OutOfRangeError(
          absl::StrCat("--", name, " must be a positive number, got ", value));
    }
  }
  const std::pair<const char*, int32_t> limits[] = {
      {"max_jobs", absl::GetFlag(FLAGS_max_jobs)},
      {"max_ranks_per_job", absl::GetFlag(FLAGS_max_ranks_per_job)},
      {"max_nodes", absl::GetFlag(FLAGS_max_nodes)},
      {"max_gpus_per_node", absl::GetFlag(FLAGS_max_gpus_per_node)},
      {"max_reports", absl::GetFlag(FLAGS_max_reports)},
      {"max_report_findings", absl::GetFlag(FLAGS_max_report_findings)},
      {"window_steps", absl::GetFlag(FLAGS_window_steps)},
      {"max_receive_message_mib", absl::GetFlag(FLAGS_max_receive_message_mib)},
      {"max_concurrent_streams", absl::GetFlag(FLAGS_max_concurrent_streams)},
      {"grpc_memory_mib", absl::GetFlag(FLAGS_grpc_memory_mib)},
      {"straggler_window", absl::GetFlag(FLAGS_straggler_window)},
      {"metrics_threads", absl::GetFlag(FLAGS_metrics_threads)},
      {"metrics_max_connections", absl::GetFlag(FLAGS_metrics_max_connections)},
  };
  for (const auto& [name, value] : limits) {
    if (value <= 0)
      return absl::OutOfRangeError(absl::StrCat("--", name, " must be positive, got ", value));
  }
  if (const double interval = absl::GetFlag(FLAGS_journal_commit_interval);
      !(interval >= 0 && interval <= 1)) {
    return absl::OutOfRangeError(
        absl::StrCat("--journal_commit_interval must be between 0 and 1 second, got ", interval));
  }
  if (!(absl::GetFlag(FLAGS_running_report_save_interval) >= 0)) {
    return absl::OutOfRangeError(
        "--running-report-save-interval must be 0 or a positive number of seconds");
  }
  if (absl::GetFlag(FLAGS_shutdown_grace) < 0 || absl::GetFlag(FLAGS_max_finding_series) < 0 ||
      absl::GetFlag(FLAGS_top_ranks) < 0 || absl::GetFlag(FLAGS_max_rank_series) < 0) {
    return absl::OutOfRangeError(
        "--shutdown_grace, --max_finding_series, --top_ranks and --max_rank_series must not be "
        "negative");
  }
  return absl::OkStatus();
}

// The listeners, TLS, authentication, /metrics and gRPC limits (state options aside).
absl::StatusOr<collector::CollectorServerOptions> ServerOptionsFromFlags() {
  collector::CollectorServerOptions options;
  options.grpc_listen = absl::GetFlag(FLAGS_grpc_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.tls.reload_interval_seconds =
      static_cast<unsigned int>(std::max(1.0, std::ceil(absl::GetFlag(FLAGS_tls_reload_interval))));
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.verify_node_identity = absl::GetFlag(FLAGS_verify_node_identity);
  options.metrics_endpoint = stepwatch::http::MetricsEndpointOptionsFromFlags();
  options.tick_nanos = SecondsToNanos(absl::GetFlag(FLAGS_tick));
  options.save_interval_nanos = SecondsToNanos(absl::GetFlag(FLAGS_save_interval));
  options.metrics.max_finding_series = absl::GetFlag(FLAGS_max_finding_series);
  options.metrics.max_series = std::max(0, absl::GetFlag(FLAGS_max_series));
  if (const std::string scope = absl::GetFlag(FLAGS_export_node_metrics); scope == "findings") {
    options.metrics.export_node_metrics = collector::NodeMetricsExport::kFindings;
  } else if (scope == "all") {
    options.metrics.export_node_metrics = collector::NodeMetricsExport::kAll;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--export-node-metrics must be findings or all, got \"", scope, "\""));
  }
  options.max_receive_message_bytes = std::min(absl::GetFlag(FLAGS_max_receive_message_mib), 1024)
                                      << 20;
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.grpc_memory_bytes = int64_t{absl::GetFlag(FLAGS_grpc_memory_mib)} << 20;
  return options;
}

// The diagnosis engine's windows, thresholds and limits on jobs and ranks.
stepwatch::analysis::EngineOptions EngineOptionsFromFlags() {
  stepwatch::analysis::EngineOptions e;
  e.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  e.max_ranks_per_job = absl::GetFlag(FLAGS_max_ranks_per_job);
  e.window_steps = absl::GetFlag(FLAGS_window_steps);
  e.step_grace = absl::Nanoseconds(SecondsToNanos(absl::GetFlag(FLAGS_step_grace)));
  e.underutil_threshold = absl::GetFlag(FLAGS_underutil_threshold);
  e.underutil_window = absl::Nanoseconds(SecondsToNanos(absl::GetFlag(FLAGS_underutil_window)));
  e.scaling_threshold = absl::GetFlag(FLAGS_scaling_threshold);
  e.regression_threshold = absl::GetFlag(FLAGS_regression_threshold);
  e.stall_multiple = absl::GetFlag(FLAGS_stall_multiple);
  e.stall_floor = absl::Nanoseconds(SecondsToNanos(absl::GetFlag(FLAGS_stall_floor)));
  e.straggler_window = absl::GetFlag(FLAGS_straggler_window);
  e.straggler_rel_margin = absl::GetFlag(FLAGS_straggler_margin);
  e.straggler_abs_margin_seconds = absl::GetFlag(FLAGS_straggler_min_seconds);
  return e;
}

// Expiry, limits, the memory budget, per-rank series, reports and deduplication under
// `state_dir` (empty: none).
absl::StatusOr<collector::CollectorStateOptions> StateOptionsFromFlags(
    const std::string& state_dir) {
  collector::CollectorStateOptions st;
  st.engine = EngineOptionsFromFlags();
  st.expire_nanos = SecondsToNanos(absl::GetFlag(FLAGS_expire));
  st.max_clock_skew_nanos = SecondsToNanos(absl::GetFlag(FLAGS_max_clock_skew));
  st.node_down_nanos = SecondsToNanos(absl::GetFlag(FLAGS_node_down_after));
  st.max_nodes = absl::GetFlag(FLAGS_max_nodes);
  st.max_gpus_per_node = absl::GetFlag(FLAGS_max_gpus_per_node);
  st.max_jobs_per_node = absl::GetFlag(FLAGS_max_jobs_per_node);
  if (st.max_jobs_per_node < 0) {
    return absl::OutOfRangeError(
        absl::StrCat("--max_jobs_per_node must not be negative, got ", st.max_jobs_per_node));
  }
  st.max_memory_bytes = absl::GetFlag(FLAGS_max_memory_mib) < 0
                            ? collector::DefaultMemoryBudgetBytes()
                            : int64_t{absl::GetFlag(FLAGS_max_memory_mib)} << 20;
  if (st.max_memory_bytes > 0) {
    SW_LOG_INFO << "memory budget " << (st.max_memory_bytes >> 20) << " MiB (--max-memory-mib)";
  }
  st.top_ranks_per_job = absl::GetFlag(FLAGS_top_ranks);
  st.max_rank_series = absl::GetFlag(FLAGS_max_rank_series);
  if (!state_dir.empty()) {
    st.reports.dir = absl::StrCat(state_dir, "/reports");
    st.dedupe.journal_path = absl::StrCat(state_dir, "/dedupe.journal");
    st.dedupe.journal_sync.commit_interval =
        absl::Nanoseconds(SecondsToNanos(absl::GetFlag(FLAGS_journal_commit_interval)));
  }
  st.reports.retention_nanos = SecondsToNanos(absl::GetFlag(FLAGS_report_retention));
  st.reports.max_reports = absl::GetFlag(FLAGS_max_reports);
  st.reports.running_save_interval_nanos =
      SecondsToNanos(std::max(0.0, absl::GetFlag(FLAGS_running_report_save_interval)));
  st.reports.max_findings_per_report = absl::GetFlag(FLAGS_max_report_findings);
  // Timelines are sampled at ticks: at first at every one.
  st.reports.timeline.initial_sample_interval_nanos = SecondsToNanos(absl::GetFlag(FLAGS_tick));
  return st;
}

// Every option from the flags, checked in the order errors are reported.
absl::StatusOr<collector::CollectorServerOptions> OptionsFromFlags() {
  if (absl::Status st = CheckAddressesAndStateDir(); !st.ok()) return st;
  if (absl::Status st = CheckRanges(); !st.ok()) return st;
  absl::StatusOr<collector::CollectorServerOptions> options = ServerOptionsFromFlags();
  if (!options.ok()) return options.status();
  absl::StatusOr<collector::CollectorStateOptions> state =
      StateOptionsFromFlags(options->state_dir);
  if (!state.ok()) return state.status();
  options->state = *std::move(state);
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  stepwatch::DisableMutexDeadlockDetectionInReleaseBuilds();
  stepwatch::FlagsSpec spec;
  spec.program = kProgram;
  spec.main_file = "collector/main.cc";
  spec.shared_flag_files = {stepwatch::http::kMetricsEndpointFlagsFile,
                            stepwatch::security::kTlsFlagsFile};
  spec.defaults = {{"metrics_listen", "0.0.0.0:9464"}};
  spec.usage =
      "gathers step timings and GPU/host samples from stepwatch agents, "
      "finds stragglers, underutilized GPUs and lost scaling, and serves them to Prometheus "
      "(/metrics) and stepwatchctl (gRPC Query).\n"
      "Usage: stepwatch-collector --grpc-listen=HOST:PORT --metrics-listen=HOST:PORT "
      "[--state-dir=DIR] [--expire=SECONDS] ...\n"
      "Flags may be spelled with dashes or underscores; durations are seconds, fractions "
      "allowed.";
  stepwatch::ParseFlagsOrExit(argc, argv, spec);
  absl::StatusOr<collector::CollectorServerOptions> options = OptionsFromFlags();
  if (!options.ok()) return ReportFlagError(options.status());

  // Block the stop signals in every thread (gRPC and /metrics threads inherit this mask) and
  // collect them with sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Buffers of 1 MiB and more (a flood's header buffers, big batches) come from mmap and go back
  // to the system when freed; a fixed threshold stops glibc from raising it after such a free.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 8 << 20);

  stepwatch::RealClock clock;
  auto server = collector::CollectorServer::Start(*options, &clock);
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
