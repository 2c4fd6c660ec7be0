// stepwatch-agent: one per training node. Receives step events from training processes on a Unix
// datagram socket, samples GPUs (NVML) and the host, and streams it all to the collector.
#include <grp.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/agent_metrics.h"
#include "agent/backoff.h"
#include "agent/collector_link.h"
#include "agent/collector_router.h"
#include "agent/ingest_server.h"
#include "agent/kubelet_pods.h"
#include "agent/node_reading.h"
#include "agent/peer_strings.h"
#include "agent/rank_owners.h"
#include "agent/spool.h"
#include "common/clock.h"
#include "common/collectors.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/mutex_mode.h"
#include "common/net.h"
#include "common/startup_checks.h"
#include "common/version.h"
#include "gpu/gpu_source.h"
#include "host/host_sampler.h"
#include "http/metrics_endpoint.h"
#include "http/metrics_endpoint_flags.h"
#include "security/client_security.h"
#include "security/tls_client_flags.h"
#include "security/tls_credentials.h"
#include "security/tls_errors.h"
#include "security/tls_flags.h"

ABSL_FLAG(std::string, collector, "127.0.0.1:7070",
          "Collectors to ship to: HOST:PORT[,HOST:PORT...] ([V6]:PORT for IPv6), or "
          "dns:///NAME:PORT where every address NAME resolves to is a collector (a Kubernetes "
          "headless Service), re-resolved every --collector-resolve-interval. Each job goes to "
          "--replicas of them (rendezvous hashing on the job id), each over its own stream.");
ABSL_FLAG(double, collector_resolve_interval, 30.0,
          "Seconds (1..86400) between resolutions of --collector (dns:/// names; a plain list "
          "never changes). A collector that appears gets a link, one that disappears has its link "
          "flushed and closed; a failed resolution keeps the last list.");
ABSL_FLAG(int32_t, replicas, 2,
          "Collectors that receive each job's step events (1..16; capped at the number of "
          "collectors). The node's GPU and host samples go to every collector holding one of its "
          "recent jobs.");
ABSL_FLAG(double, failover_after, 2.0,
          "Seconds (0.1..86400) a collector must be unreachable before its jobs move to the next "
          "collector in their order (they move back once it reconnects). Shorter outages are only "
          "buffered.");
ABSL_FLAG(std::string, socket, "/run/stepwatch/agent.sock",
          "Unix datagram socket that training processes send step events to (clients read "
          "STEPWATCH_SOCKET). The parent directory is created; a stale socket file is replaced. "
          "Who may send is set by --socket-mode and --socket-group.");
ABSL_FLAG(std::string, socket_mode, "0660",
          "Octal mode of the socket file. The default lets the agent's user and --socket-group "
          "send; 0666 lets every local user send, and so forge steps of jobs not theirs.");
ABSL_FLAG(std::string, socket_group, "",
          "Group (name or number) given the socket file: the group of the users whose training "
          "processes report. Empty: the agent's own group.");
ABSL_FLAG(std::string, node, "", "Node name used in every series. Default: the host name.");
ABSL_FLAG(double, interval, 1.0,
          "Seconds between report batches (and GPU/host samples); fractions such as 0.2 allowed.");
ABSL_FLAG(int64_t, buffer, 600,
          "Most unacknowledged report batches held per collector for resending after an outage; "
          "when full the oldest are dropped and counted.");
ABSL_FLAG(int64_t, buffer_bytes, 64 << 20,
          "Most bytes of unacknowledged report batches held per collector (a second bound next "
          "to --buffer).");
ABSL_FLAG(std::string, spool_dir, "",
          "Directory where every report batch is written before it is sent and kept until the "
          "collector acknowledges it; a restarted agent sends what it finds there first, under "
          "the original ids. One directory per agent, with one subdirectory per collector "
          "(collector-IP_PORT); the subdirectory of a collector that left the list stays and is "
          "replayed if that address returns (delete it by hand otherwise). Empty: unacknowledged "
          "batches are held in memory only and lost if the agent dies.");
ABSL_FLAG(int64_t, spool_max_mib, 64,
          "Most MiB of batches per collector in --spool-dir (replaces --buffer-bytes when a spool "
          "is used); when full the oldest are deleted and counted.");
ABSL_FLAG(int64_t, max_pending_events, 200000,
          "Most step events waiting for the next batch; more are dropped and counted.");
ABSL_FLAG(std::string, nvml_library, "libnvidia-ml.so.1",
          "NVML library to load with dlopen. Without it the agent runs without GPU metrics.");
ABSL_FLAG(std::string, host_root, "",
          "Filesystem root under which /proc and /sys are read (for tests and containers that "
          "mount the host's /proc elsewhere). Empty: the real root.");
ABSL_FLAG(double, reconnect_max_backoff, 2.0,
          "Longest wait, in seconds, between attempts to reach the collector (exponential "
          "backoff with jitter from 0.1 s up to this).");
ABSL_FLAG(double, shutdown_timeout, 2.0,
          "On SIGINT/SIGTERM, seconds to wait for the collector to acknowledge the last batches.");
ABSL_FLAG(int64_t, receive_buffer_bytes, 16 << 20,
          "Requested kernel receive buffer of the ingest socket (absorbs bursts of step events).");
ABSL_FLAG(std::string, seqpacket_socket, "",
          "Unix SOCK_SEQPACKET socket taking the same step events over a connection per client "
          "(no loss in bursts, unlike the datagram queue). Default: --socket plus \".seq\", "
          "where clients look for it; \"none\": datagrams only. Same mode and group as --socket.");
ABSL_FLAG(int64_t, max_connections, 512,
          "Most open connections on --seqpacket-socket; more are refused and counted.");
ABSL_FLAG(int64_t, max_ranks_per_process, 4096,
          "Most (job, rank) pairs one live sender process may own; its new ones beyond are "
          "refused (reason tenant_limit) and counted by uid, so that one tenant of a shared node "
          "cannot fill the agent's table.");
ABSL_FLAG(int64_t, max_ranks_per_user, 16384,
          "Most (job, rank) pairs the live processes of one uid may own together (of 65536 in "
          "all); beyond, that user's new ranks are refused and counted, the others' admitted.");

ABSL_FLAG(std::string, kubelet_socket, "/var/lib/kubelet/pod-resources/kubelet.sock",
          "The kubelet's PodResources socket: each GPU's namespace, pod and container (devices "
          "of nvidia.com/gpu) go with its samples and its ranks' steps. Absent: no attribution "
          "(said once in the log). Empty: never read.");
ABSL_FLAG(double, kubelet_interval, 0,
          "Seconds (0.1..86400) between reads of --kubelet-socket; 0: --interval.");

namespace {

// A group name or number as a gid.
absl::StatusOr<gid_t> LookUpGroup(const std::string& group) {
  char* end = nullptr;
  const unsigned long number = std::strtoul(group.c_str(), &end, 10);
  if (*end == '\0') return static_cast<gid_t>(number);
  std::vector<char> buffer(16384);
  struct group entry;
  struct group* found = nullptr;
  if (getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr) {
    return absl::NotFoundError(absl::StrCat("no group named \"", group, "\""));
  }
  return found->gr_gid;
}

constexpr char kProgram[] = "stepwatch-agent";

[[noreturn]] void UsageError(const std::string& message) {
  stepwatch::UsageError(kProgram, message);
}

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

absl::Duration SecondsFlag(double seconds, const char* name, double min_seconds) {
  if (!std::isfinite(seconds) || seconds < min_seconds || seconds > 86400) {
    UsageError(absl::StrFormat("--%s must be between %g and 86400 seconds, got %g", name,
                               min_seconds, seconds));
  }
  return absl::Seconds(seconds);
}

// The ingest sockets' options from their flags; a bad value is a usage error.
stepwatch::agent::IngestServerOptions IngestOptionsFromFlags(const std::string& socket_path,
                                                             int64_t rcvbuf) {
  stepwatch::agent::IngestServerOptions ingest_options;
  ingest_options.socket_path = socket_path;
  {
    const std::string mode = absl::GetFlag(FLAGS_socket_mode);
    char* end = nullptr;
    const long parsed = std::strtol(mode.c_str(), &end, 8);
    if (mode.empty() || *end != '\0' || parsed < 0 || parsed > 0777) {
      UsageError(
          absl::StrCat("--socket-mode must be an octal mode such as 0660, got \"", mode, "\""));
    }
    ingest_options.socket_mode = static_cast<mode_t>(parsed);
    if ((parsed & 0002) != 0) {
      SW_LOG_WARNING << "--socket-mode=" << mode
                     << ": every local user may send step events, and forge other jobs' ranks";
    }
    const std::string group = absl::GetFlag(FLAGS_socket_group);
    if (!group.empty()) {
      absl::StatusOr<gid_t> gid = LookUpGroup(group);
      if (!gid.ok()) UsageError(absl::StrCat("--socket-group: ", gid.status().message()));
      ingest_options.socket_group = *gid;
    }
  }
  ingest_options.receive_buffer_bytes = static_cast<int>(rcvbuf);
  {
    const std::string seqpacket = absl::GetFlag(FLAGS_seqpacket_socket);
    if (seqpacket != "none") {
      ingest_options.seqpacket_path =
          seqpacket.empty() ? stepwatch::agent::SeqpacketPathFor(socket_path) : seqpacket;
    }
    const int64_t max_connections = absl::GetFlag(FLAGS_max_connections);
    if (max_connections < 1 || max_connections > 65536) {
      UsageError("--max-connections must be between 1 and 65536");
    }
    ingest_options.max_connections = static_cast<int>(max_connections);
    const int64_t per_process = absl::GetFlag(FLAGS_max_ranks_per_process);
    const int64_t per_user = absl::GetFlag(FLAGS_max_ranks_per_user);
    const int64_t table = static_cast<int64_t>(ingest_options.owners.max_bindings);
    if (per_process < 1 || per_process > table) {
      UsageError(absl::StrCat("--max-ranks-per-process must be between 1 and ", table));
    }
    if (per_user < 1 || per_user > table) {
      UsageError(absl::StrCat("--max-ranks-per-user must be between 1 and ", table));
    }
    ingest_options.owners.max_per_process = static_cast<size_t>(per_process);
    ingest_options.owners.max_per_user = static_cast<size_t>(per_user);
  }
  return ingest_options;
}

// The node as every batch describes it; logs what NVML reports.
stepwatch::v1::NodeInfo DescribeNodeAtStart(stepwatch::gpu::GpuSource* gpus,
                                            const std::string& node,
                                            const std::string& nvml_library,
                                            absl::Duration interval) {
  stepwatch::v1::NodeInfo node_info;
  node_info.set_node(node);
  node_info.set_hostname(HostName());
  node_info.set_agent_version(stepwatch::kVersion);
  {
    stepwatch::v1::NodeInfo described = node_info;
    gpus->DescribeNode(&described);
    // The driver's strings reach this log too: bounded and printable first.
    stepwatch::agent::PeerStringCounts ignored{};
    stepwatch::agent::BoundPeerStrings(&described, nullptr, &ignored);
    if (described.nvml_available()) {
      SW_LOG_INFO << "NVML loaded from " << nvml_library << ": " << described.gpu_count()
                  << " GPUs, driver " << described.driver_version();
      // NVIDIA documents 100 ms as the shortest GPM sample interval: GPM readings are refreshed
      // at most that often and repeat in between.
      if (interval < absl::Nanoseconds(stepwatch::gpu::kGpmMinIntervalNanos)) {
        SW_LOG_WARNING << "--interval=" << absl::FormatDuration(interval)
                       << " is below GPM's 100 ms minimum: GPM metrics are sampled every 100 ms";
      }
    } else {
      SW_LOG_WARNING << "NVML unavailable (" << described.nvml_error()
                     << "); running without GPU metrics";
    }
  }
  return node_info;
}

// Serves the agent's /metrics; `ingest` and `router` must outlive the server.
absl::StatusOr<std::unique_ptr<stepwatch::agent::MetricsServer>> StartMetrics(
    const std::string& metrics_listen, const std::string& node, int64_t buffer,
    stepwatch::agent::IngestServer* ingest, stepwatch::agent::CollectorRouter* router,
    std::shared_ptr<stepwatch::security::CheckedKeyCertPair> identity,
    const stepwatch::agent::KubeletPods* pods) {
  stepwatch::agent::AgentMetricsSources sources;
  sources.node = node;
  sources.buffer_capacity_batches = static_cast<uint64_t>(buffer);
  sources.ingest = [ingest] { return ingest->stats(); };
  sources.collectors = [router] { return router->stats(); };
  sources.samples = [router] { return router->LatestSamples(); };
  if (identity != nullptr) {
    sources.tls = [identity = std::move(identity)] { return identity->stats(); };
  }
  stepwatch::http::MetricsEndpointOptions endpoint =
      stepwatch::http::MetricsEndpointOptionsFromFlags();
  endpoint.listen = metrics_listen;
  return stepwatch::agent::MetricsServer::Start(
      endpoint,
      std::make_shared<stepwatch::agent::KubeletPodsCollectable>(
          std::make_shared<stepwatch::agent::AgentCollectable>(std::move(sources)), pods, node));
}

// The flags' values, checked before anything starts: a bad one is a usage error.
struct AgentSettings {
  std::string collector;
  stepwatch::CollectorTargets collector_targets;
  int32_t replicas = 0;
  absl::Duration resolve_interval, failover_after, interval, max_backoff, shutdown_timeout;
  std::string metrics_listen, socket_path, node, spool_dir;
  int64_t buffer = 0, buffer_bytes = 0, spool_max_mib = 0, max_pending = 0, rcvbuf = 0;
};

AgentSettings ValidatedSettings(const char* program) {
  AgentSettings f;
  f.collector = absl::GetFlag(FLAGS_collector);
  absl::StatusOr<stepwatch::CollectorTargets> collector_targets =
      stepwatch::ParseCollectorTargets(f.collector);
  if (!collector_targets.ok()) {
    UsageError(absl::StrCat("--collector must be HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT (",
                            collector_targets.status().message(), "), got \"", f.collector, "\""));
  }
  f.collector_targets = *std::move(collector_targets);
  f.replicas = absl::GetFlag(FLAGS_replicas);
  if (f.replicas < 1 || f.replicas > 16) {
    UsageError(absl::StrCat("--replicas must be between 1 and 16, got ", f.replicas));
  }
  f.resolve_interval =
      SecondsFlag(absl::GetFlag(FLAGS_collector_resolve_interval), "collector-resolve-interval", 1);
  f.failover_after = SecondsFlag(absl::GetFlag(FLAGS_failover_after), "failover-after", 0.1);
  f.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!f.metrics_listen.empty() && !stepwatch::ParseHostPort(f.metrics_listen).ok()) {
    UsageError(absl::StrCat("--metrics-listen must be HOST:PORT or :PORT, got \"", f.metrics_listen,
                            "\""));
  }
  if (!f.metrics_listen.empty()) {
    // Checked before anything starts: a busy port must fail the start, not only log.
    if (absl::Status st = stepwatch::CheckCanListen(f.metrics_listen); !st.ok()) {
      stepwatch::StartupError(
          program, absl::StrCat("--metrics-listen=", f.metrics_listen, ": ", st.message()));
    }
  }
  f.socket_path = absl::GetFlag(FLAGS_socket);
  if (f.socket_path.empty()) UsageError("--socket must not be empty");
  f.node = absl::GetFlag(FLAGS_node);
  if (f.node.empty()) f.node = HostName();
  f.interval = SecondsFlag(absl::GetFlag(FLAGS_interval), "interval", 0.01);
  f.max_backoff =
      SecondsFlag(absl::GetFlag(FLAGS_reconnect_max_backoff), "reconnect-max-backoff", 0.1);
  f.shutdown_timeout = SecondsFlag(absl::GetFlag(FLAGS_shutdown_timeout), "shutdown-timeout", 0);
  f.buffer = absl::GetFlag(FLAGS_buffer);
  if (f.buffer < 1 || f.buffer > 1000000) UsageError("--buffer must be between 1 and 1000000");
  f.buffer_bytes = absl::GetFlag(FLAGS_buffer_bytes);
  if (f.buffer_bytes < 1) UsageError("--buffer-bytes must be positive");
  f.spool_dir = absl::GetFlag(FLAGS_spool_dir);
  f.spool_max_mib = absl::GetFlag(FLAGS_spool_max_mib);
  if (f.spool_max_mib < 1 || f.spool_max_mib > (1 << 20)) {
    UsageError("--spool-max-mib must be between 1 and 1048576");
  }
  f.max_pending = absl::GetFlag(FLAGS_max_pending_events);
  if (f.max_pending < 1) UsageError("--max-pending-events must be positive");
  if (absl::Status metrics = stepwatch::http::CheckMetricsEndpointFlags(); !metrics.ok()) {
    UsageError(std::string(metrics.message()));
  }
  f.rcvbuf = absl::GetFlag(FLAGS_receive_buffer_bytes);
  if (f.rcvbuf < 0 || f.rcvbuf > (1 << 30)) {
    UsageError("--receive-buffer-bytes must be between 0 and 1 GiB");
  }
  return f;
}

// The router's and its links' options.
stepwatch::agent::CollectorRouterOptions RouterOptionsFor(
    const AgentSettings& f, const stepwatch::security::ClientSecurity& security,
    const stepwatch::security::ClientTlsConfig& tls, const stepwatch::v1::NodeInfo& node_info,
    const stepwatch::Clock* clock) {
  stepwatch::agent::CollectorLinkOptions link_options;
  link_options.clock = clock;
  link_options.collector = f.collector;
  link_options.credentials = security.credentials;
  link_options.token = security.token;
  link_options.tls_flags = {stepwatch::security::Enabled(tls), !tls.cert_file.empty()};
  link_options.agent_id = stepwatch::agent::MakeAgentId(f.node, f.socket_path);
  link_options.node_info = node_info;
  link_options.max_buffered_batches = static_cast<size_t>(f.buffer);
  link_options.max_buffered_bytes = static_cast<size_t>(f.buffer_bytes);
  link_options.max_pending_events = static_cast<size_t>(f.max_pending);
  link_options.backoff.max = f.max_backoff;
  link_options.backoff.initial = std::min(absl::Milliseconds(100), f.max_backoff);
  stepwatch::agent::CollectorRouterOptions router_options;
  router_options.targets = f.collector_targets;
  router_options.interval = f.interval;
  router_options.resolve_interval = f.resolve_interval;
  router_options.replicas = f.replicas;
  router_options.failover_after = f.failover_after;
  router_options.link = link_options;
  // Links to resolved addresses verify the certificate against the name that was resolved.
  router_options.link.tls_server_name = f.collector_targets.dns_name;
  if (!f.spool_dir.empty()) {
    router_options.spool.dir = f.spool_dir;
    router_options.link.max_buffered_bytes = static_cast<size_t>(f.spool_max_mib) << 20;
  }
  return router_options;
}

void ParseFlags(int argc, char** argv) {
  stepwatch::FlagsSpec spec;
  spec.program = kProgram;
  spec.main_file = "agent/main.cc";
  spec.shared_flag_files = {stepwatch::http::kMetricsEndpointFlagsFile,
                            stepwatch::security::kTlsFlagsFile,
                            stepwatch::security::kTlsClientFlagsFile};
  spec.usage =
      "stepwatch-agent --collector=HOST:PORT[,HOST:PORT...]|dns:///NAME:PORT --socket=PATH\n"
      "    [--replicas=N] [--node=NAME] [--interval=SECONDS] [--buffer=N] [--spool-dir=DIR]\n"
      "    [--nvml-library=PATH] [--metrics-listen=HOST:PORT]\n\n"
      "Receives step events (one JSON object per datagram) from training processes on a Unix\n"
      "socket, samples the node's GPUs (NVML) and host, and streams both to the stepwatch\n"
      "collectors: each job to --replicas of them. Flag names may be written with dashes or\n"
      "underscores.";
  stepwatch::ParseFlagsOrExit(argc, argv, spec);
}

sigset_t BlockSignals() {
  // Signals are taken synchronously by the main thread; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

// What the links need to talk to the collectors (`tls` is filled in from the flags).
absl::StatusOr<stepwatch::security::ClientSecurity> ClientSecurityFromFlags(
    const AgentSettings& f, stepwatch::security::ClientTlsConfig* tls) {
  tls->ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls->cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls->key_file = absl::GetFlag(FLAGS_tls_key);
  absl::StatusOr<stepwatch::security::ClientSecurity> client_security =
      stepwatch::security::MakeClientSecurity(*tls, absl::GetFlag(FLAGS_auth_token_file));
  if (!client_security.ok()) return client_security.status();
  if (!stepwatch::security::Enabled(*tls)) {
    SW_LOG_WARNING << "shipping to collector " << f.collector
                   << " in PLAINTEXT (no --tls-ca): step timings and GPU readings can be read "
                      "and forged on the network";
  }
  return client_security;
}

// The agent's /metrics when --metrics-listen asks for it; nullptr when not.
absl::StatusOr<std::unique_ptr<stepwatch::agent::MetricsServer>> StartMetricsIfAsked(
    const AgentSettings& f, stepwatch::agent::IngestServer* ingest,
    stepwatch::agent::CollectorRouter* router,
    std::shared_ptr<stepwatch::security::CheckedKeyCertPair> identity,
    stepwatch::agent::KubeletPods* pods) {
  if (f.metrics_listen.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<stepwatch::agent::MetricsServer>> metrics =
      StartMetrics(f.metrics_listen, f.node, f.buffer, ingest, router, std::move(identity), pods);
  if (metrics.ok()) {
    SW_LOG_INFO << "serving metrics on " << f.metrics_listen << " (port " << (*metrics)->port()
                << ")";
  }
  return metrics;
}

stepwatch::agent::KubeletPodsOptions KubeletOptionsFromFlags(absl::Duration sample_interval) {
  stepwatch::agent::KubeletPodsOptions options;
  options.socket_path = absl::GetFlag(FLAGS_kubelet_socket);
  const double interval = absl::GetFlag(FLAGS_kubelet_interval);
  options.interval =
      interval == 0 ? sample_interval : SecondsFlag(interval, "kubelet-interval", 0.1);
  return options;
}

void LogReady(const AgentSettings& f, const stepwatch::agent::IngestServer& ingest,
              const stepwatch::agent::CollectorRouter& router, const std::string& agent_id) {
  SW_LOG_INFO << "stepwatch-agent ready: node " << f.node << ", listening on " << f.socket_path
              << (ingest.seqpacket_path().empty() ? std::string()
                                                  : absl::StrCat(" and ", ingest.seqpacket_path()))
              << " (receive buffer " << ingest.receive_buffer_bytes() << " bytes), shipping to "
              << f.collector << " (" << router.collectors().size() << " collectors now, "
              << f.replicas << " per job) every " << absl::FormatDuration(f.interval)
              << " (agent_id " << agent_id << ")";
}

void LogStopped(const stepwatch::agent::CollectorLinkStats& s) {
  SW_LOG_INFO << "stopped: " << s.events_shipped_total << " events shipped, "
              << s.batches_acknowledged_total << " of " << s.batches_created_total
              << " batches acknowledged, " << s.batches_dropped_total << " dropped";
}

}  // namespace

int main(int argc, char** argv) {
  stepwatch::DisableMutexDeadlockDetectionInReleaseBuilds();
  ParseFlags(argc, argv);

  const AgentSettings f = ValidatedSettings(kProgram);

  const sigset_t signals = BlockSignals();

  using namespace stepwatch;  // NOLINT: main only wires parts together.

  gpu::GpuSourceOptions gpu_options;
  gpu_options.nvml_library = absl::GetFlag(FLAGS_nvml_library);
  std::unique_ptr<gpu::GpuSource> gpus = gpu::OpenNvmlGpuSource(gpu_options);
  const v1::NodeInfo node_info =
      DescribeNodeAtStart(gpus.get(), f.node, gpu_options.nvml_library, f.interval);
  host::HostSamplerOptions host_options;
  host_options.root = absl::GetFlag(FLAGS_host_root);
  std::unique_ptr<host::HostSampler> host = host::MakeHostSampler(host_options);
  agent::KubeletPods kubelet_pods(KubeletOptionsFromFlags(f.interval));
  if (!absl::GetFlag(FLAGS_kubelet_socket).empty()) kubelet_pods.Start();
  agent::AttributingGpuSource attributed_gpus(gpus.get(), &kubelet_pods);

  security::ClientTlsConfig tls;
  absl::StatusOr<security::ClientSecurity> client_security = ClientSecurityFromFlags(f, &tls);
  if (!client_security.ok()) {
    SW_LOG_ERROR << "cannot set up the connection to the collector: "
                 << client_security.status().message();
    return 2;
  }

  // One clock for every time reading and wait of the links and the router.
  const stepwatch::RealClock clock;
  const agent::CollectorRouterOptions router_options =
      RouterOptionsFor(f, *client_security, tls, node_info, &clock);
  agent::CollectorRouter router(router_options, &attributed_gpus, host.get());
  // Fails on a --spool-dir that cannot be used: that must fail the start, not only log.
  if (absl::Status st = router.Start(); !st.ok()) {
    SW_LOG_ERROR << "cannot start shipping"
                 << (f.spool_dir.empty() ? std::string()
                                         : absl::StrCat(" (--spool-dir=", f.spool_dir, ")"))
                 << ": " << st;
    return 1;
  }

  const agent::IngestServerOptions ingest_options = IngestOptionsFromFlags(f.socket_path, f.rcvbuf);
  absl::StatusOr<std::unique_ptr<agent::IngestServer>> ingest = agent::IngestServer::Start(
      ingest_options, [&router, &attributed_gpus](v1::StepEvent&& event) {
        attributed_gpus.AttributeStep(&event);
        router.AddStep(std::move(event));
      });
  if (!ingest.ok()) {
    SW_LOG_ERROR << "cannot open the ingest socket: " << ingest.status();
    router.Stop(absl::ZeroDuration());
    return 1;
  }

  absl::StatusOr<std::unique_ptr<agent::MetricsServer>> metrics =
      StartMetricsIfAsked(f, ingest->get(), &router, client_security->identity, &kubelet_pods);
  if (!metrics.ok()) {
    SW_LOG_ERROR << metrics.status();
    (*ingest)->Stop();
    router.Stop(absl::ZeroDuration());
    return 1;
  }

  LogReady(f, **ingest, router, router_options.link.agent_id);

  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  SW_LOG_INFO << "received " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down";
  // Stop taking events first, then flush what was taken.
  (*ingest)->Stop();
  router.Stop(f.shutdown_timeout);
  kubelet_pods.Stop();
  metrics->reset();
  LogStopped(router.stats().total);
  return 0;
}
