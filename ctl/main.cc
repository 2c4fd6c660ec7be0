// stepwatchctl: asks stepwatch collectors what they know (Query service) and prints it for people
// or, with --json, for programs. Jobs are sharded over collectors: a command about one job asks its
// owners, the others every collector, and the answers are merged (ctl/merge.h).
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/collectors.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/text.h"
#include "ctl/commands.h"
#include "ctl/fanout.h"
#include "ctl/format.h"
#include "ctl/merge.h"
#include "ctl/report_format.h"
#include "ctl/report_html.h"
#include "ctl/serve.h"
#include "ctl/serve_pages.h"
#include "ctl/session.h"
#include "grpcpp/grpcpp.h"
#include "security/client_security.h"
#include "security/tls_client_flags.h"
#include "security/tls_credentials.h"
#include "security/tls_errors.h"
#include "security/tls_flags.h"
#include "security/tokens.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

ABSL_FLAG(std::string, collector, "",
          "The collectors: HOST:PORT[,HOST:PORT...], or dns:///NAME:PORT for every address NAME "
          "resolves to (a headless Service). A command about one job asks the job's owners (as "
          "the agents place it); the others ask every collector and merge the answers. Default: "
          "$STEPWATCH_COLLECTOR, else 127.0.0.1:7070.");
ABSL_FLAG(int, replicas, 2,
          "How many collectors hold each job (the agents' --replicas): a command about one job "
          "asks its first R owners, and the next ones in its order for each that does not answer "
          "or does not know the job.");
ABSL_FLAG(bool, json, false,
          "Print the answer as JSON (.proto field names, defaults printed, integers as numbers).");
ABSL_FLAG(bool, html, false,
          "report JOB: print the report as one self-contained HTML page (charts as SVG, nothing "
          "fetched when it is opened; docs/report.md).");
ABSL_FLAG(std::string, output, "",
          "report: write the report to this file (a temporary file, then renamed onto it) "
          "instead of stdout; -o FILE is the same.");
ABSL_FLAG(double, timeout, 3,
          "Seconds to wait for each collector before giving up on it (they are asked at once).");
ABSL_FLAG(std::string, listen, stepwatch::ctl::kDefaultServeListen,
          "serve: HOST:PORT of the web view; port 0 picks a free one (the log names it). It has "
          "no authentication: an address other than loopback is served with a warning.");
ABSL_FLAG(int, refresh, 5, "serve: seconds between reloads of the pages; 0: never.");

namespace {

constexpr char kUsage[] =
    "shows what stepwatch collectors found.\n"
    "Usage: stepwatchctl [--collector=HOST:PORT[,HOST:PORT...]|dns:///NAME:PORT] [--json] "
    "COMMAND\n"
    "Commands:\n"
    "  status [JOB]   jobs (world size, last step, step time, throughput, findings) and nodes\n"
    "                 (GPUs with utilization); with JOB, that job's row\n"
    "  findings [JOB] active findings, of every job or of JOB\n"
    "  explain JOB    where JOB's step time goes, what-if speed-ups, per-rank table, findings\n"
    "  report [JOB]   JOB's whole life, also after it ended: every finding it had (with the\n"
    "                 steps it started and cleared at), efficiency, breakdown, what-ifs;\n"
    "                 without JOB, the recent reports\n"
    "  report JOB --html [-o FILE]\n"
    "                 the same as one self-contained HTML page (heatmap of ranks over steps,\n"
    "                 step time with the findings, breakdown, what-ifs, GPUs), to FILE or stdout\n"
    "  serve          a read-only web view until SIGINT/SIGTERM, on --listen (default\n"
    "                 127.0.0.1:9470, no authentication): / lists the jobs with their\n"
    "                 findings, /jobs/JOB shows JOB's report; both reload every --refresh s";

namespace ctl = stepwatch::ctl;

std::string CollectorFlag() {
  std::string flag = absl::GetFlag(FLAGS_collector);
  if (!flag.empty()) return flag;
  const char* env = std::getenv("STEPWATCH_COLLECTOR");
  if (env != nullptr && *env != '\0') return env;
  return "127.0.0.1:7070";
}

int Usage(const std::string& message) {
  std::cerr << "stepwatchctl: " << message << "\n\n" << kUsage << "\n";
  return 2;
}

// What is wrong with the command's arguments and flags, if anything.
std::optional<std::string> ArgumentMistake(const std::string& command,
                                           const std::vector<std::string>& rest) {
  if (command == "status" && rest.size() > 1) return std::string("status takes at most one JOB");
  if (command == "findings" && rest.size() > 1)
    return std::string("findings takes at most one JOB");
  if (command == "explain" && rest.size() != 1) return std::string("explain needs exactly one JOB");
  if (command == "report" && rest.size() > 1) return std::string("report takes at most one JOB");
  if (absl::GetFlag(FLAGS_html) && (command != "report" || rest.empty())) {
    return std::string("--html needs a job: stepwatchctl report JOB --html [-o FILE]");
  }
  if (absl::GetFlag(FLAGS_html) && absl::GetFlag(FLAGS_json)) {
    return std::string("--html and --json: choose one");
  }
  if (!absl::GetFlag(FLAGS_output).empty() && command != "report") {
    return std::string("--output (-o) is for report");
  }
  if (command == "serve" && !rest.empty()) return std::string("serve takes no arguments");
  if (command == "serve" && absl::GetFlag(FLAGS_refresh) < 0) {
    return std::string("--refresh must be 0 or more");
  }
  if (command != "status" && command != "findings" && command != "explain" && command != "report" &&
      command != "serve") {
    return std::string(absl::StrCat("unknown command \"", command, "\""));
  }
  return std::nullopt;
}

// Parses the command line (-o FILE is --output FILE: flags have long names only); returns the
// positional arguments.
std::vector<std::string> ParseCommandLine(int argc, char** argv) {
  stepwatch::FlagsSpec spec;
  spec.program = "stepwatchctl";
  spec.main_file = "ctl/main.cc";
  spec.shared_flag_files = {stepwatch::security::kTlsFlagsFile,
                            stepwatch::security::kTlsClientFlagsFile};
  spec.usage = kUsage;
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "-o") args[i] = "--output";
    if (absl::StartsWith(args[i], "-o=")) args[i] = "--output=" + args[i].substr(3);
  }
  std::vector<char*> arg_pointers;
  arg_pointers.reserve(args.size());
  for (std::string& a : args) arg_pointers.push_back(a.data());
  return stepwatch::ParseFlagsOrExit(argc, arg_pointers.data(), spec, /*allow_positional=*/true);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> positional = ParseCommandLine(argc, argv);
  if (positional.empty()) return Usage("missing command");
  const std::string& command = positional[0];
  const std::vector<std::string> rest(positional.begin() + 1, positional.end());
  // The arguments first: a usage error never waits for a collector.
  if (std::optional<std::string> mistake = ArgumentMistake(command, rest)) return Usage(*mistake);
  // serve stops at SIGINT/SIGTERM: blocked here, before gRPC starts any thread, so that every
  // thread inherits the mask and the signal reaches sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  if (command == "serve") {
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    signal(SIGPIPE, SIG_IGN);
  }

  const std::string flag = CollectorFlag();
  absl::StatusOr<stepwatch::CollectorTargets> targets = stepwatch::ParseCollectorTargets(flag);
  if (!targets.ok()) {
    return Usage(absl::StrCat("bad --collector \"", flag,
                              "\": want HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT (",
                              targets.status().message(), ")"));
  }
  const double timeout_s = absl::GetFlag(FLAGS_timeout);
  if (!(timeout_s > 0)) return Usage("--timeout must be positive");
  if (absl::GetFlag(FLAGS_replicas) < 1) return Usage("--replicas must be at least 1");
  absl::StatusOr<std::vector<std::string>> collectors =
      stepwatch::ResolveCollectorTargets(*targets);
  if (!collectors.ok()) return ctl::Fail(std::string(collectors.status().message()));
  if (collectors->empty())
    return ctl::Fail(absl::StrCat("--collector=", flag, " names no collector"));

  stepwatch::security::ClientTlsConfig tls;
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  absl::StatusOr<stepwatch::security::ClientSecurity> security =
      stepwatch::security::MakeClientSecurity(tls, absl::GetFlag(FLAGS_auth_token_file));
  if (!security.ok()) return Usage(std::string(security.status().message()));
  // Each collector of dns:///NAME:PORT is dialled by its address; its certificate names NAME.
  const grpc::ChannelArguments channel_args = ctl::QueryChannelArguments(
      targets->is_dns() && !tls.ca_file.empty() ? targets->dns_name : "");
  const std::string authorization =
      security->token != nullptr ? security->token->AuthorizationHeader() : "";
  const ctl::CollectorClients clients(*collectors, security->credentials, channel_args,
                                      authorization, absl::Milliseconds(timeout_s * 1000));

  ctl::Session session;
  session.collectors = *collectors;
  session.replicas = ctl::EffectiveReplicas(absl::GetFlag(FLAGS_replicas), collectors->size());
  session.json = absl::GetFlag(FLAGS_json);
  session.html = absl::GetFlag(FLAGS_html);
  session.output = absl::GetFlag(FLAGS_output);
  session.dns = targets->is_dns();
  session.clients = &clients;
  session.tls_ca = !tls.ca_file.empty();
  session.tls_cert = !tls.cert_file.empty();
  if (command == "status") return ctl::RunStatus(session, rest);
  if (command == "findings") return ctl::RunFindings(session, rest);
  if (command == "explain") return ctl::RunExplain(session, rest[0]);
  if (command == "serve") {
    ctl::ServeOptions options;
    options.listen = absl::GetFlag(FLAGS_listen);
    options.refresh = absl::Seconds(absl::GetFlag(FLAGS_refresh));
    return ctl::RunServe(session, options, stop_signals);
  }
  return ctl::RunReport(session, rest);
}
