// stepwatchctl: asks a stepwatch collector what it knows (Query service) and prints it for people
// or, with --json, for programs.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/net.h"
#include "common/text.h"
#include "ctl/format.h"
#include "ctl/report_format.h"
#include "grpcpp/grpcpp.h"
#include "security/client_security.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that signed the collector's certificate: query over TLS and verify it "
          "(its certificate must name the host in --collector). Empty: plaintext.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate, for a collector that requires them (--tls-client-ca).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File whose first line is a bearer token with the reader role. Empty: no token.");
ABSL_FLAG(std::string, collector, "",
          "HOST:PORT of the collector's gRPC listener. Default: $STEPWATCH_COLLECTOR, else "
          "127.0.0.1:7070.");
ABSL_FLAG(bool, json, false, "Print the answer as JSON (proto3 JSON, .proto field names).");
ABSL_FLAG(double, timeout, 3, "Seconds to wait for the collector before giving up.");

namespace {

constexpr char kUsage[] =
    "shows what a stepwatch collector found.\n"
    "Usage: stepwatchctl [--collector=HOST:PORT] [--json] COMMAND\n"
    "Commands:\n"
    "  status         jobs (world size, last step, step time, throughput, findings) and nodes\n"
    "                 (GPUs with utilization)\n"
    "  findings [JOB] active findings, of every job or of JOB\n"
    "  explain JOB    where JOB's step time goes, what-if speed-ups, per-rank table, findings\n"
    "  report [JOB]   JOB's whole life, also after it ended: every finding it had (with the\n"
    "                 steps it started and cleared at), efficiency, breakdown, what-ifs;\n"
    "                 without JOB, the recent reports";

std::string CollectorAddress() {
  std::string flag = absl::GetFlag(FLAGS_collector);
  if (!flag.empty()) return flag;
  const char* env = std::getenv("STEPWATCH_COLLECTOR");
  if (env != nullptr && *env != '\0') return env;
  return "127.0.0.1:7070";
}

int Fail(const std::string& message) {
  std::cerr << "stepwatchctl: " << stepwatch::EscapeControlCharacters(message) << "\n";
  return 1;
}

int Usage(const std::string& message) {
  std::cerr << "stepwatchctl: " << message << "\n\n" << kUsage << "\n";
  return 2;
}

// Prints `response` as JSON or with `format`; returns the exit code.
template <typename Response, typename Format>
int Print(const Response& response, Format format) {
  if (absl::GetFlag(FLAGS_json)) {
    absl::StatusOr<std::string> json = stepwatch::ctl::ToJson(response);
    if (!json.ok()) return Fail(std::string(json.status().message()));
    std::cout << *json;
    if (json->empty() || json->back() != '\n') std::cout << "\n";
  } else {
    // Names and summaries come from senders: no escape sequence reaches the terminal.
    std::cout << stepwatch::EscapeControlCharacters(format(response));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  stepwatch::FlagsSpec spec;
  spec.program = "stepwatchctl";
  spec.main_file = "ctl/main.cc";
  spec.usage = kUsage;
  const std::vector<std::string> positional =
      stepwatch::ParseFlagsOrExit(argc, argv, spec, /*allow_positional=*/true);
  if (positional.empty()) return Usage("missing command");
  const std::string command = positional[0];
  const std::vector<std::string> rest(positional.begin() + 1, positional.end());

  const std::string address = CollectorAddress();
  absl::StatusOr<stepwatch::HostPort> hp = stepwatch::ParseHostPort(address);
  if (!hp.ok() || hp->host.empty() || hp->port == 0) {
    return Usage(absl::StrCat("bad --collector \"", address, "\": want HOST:PORT"));
  }
  const double timeout_s = absl::GetFlag(FLAGS_timeout);
  if (!(timeout_s > 0)) return Usage("--timeout must be positive");

  stepwatch::security::ClientTlsConfig tls;
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  absl::StatusOr<stepwatch::security::ClientSecurity> security =
      stepwatch::security::MakeClientSecurity(tls, absl::GetFlag(FLAGS_auth_token_file));
  if (!security.ok()) return Usage(std::string(security.status().message()));
  grpc::ChannelArguments channel_args;
  // Replies about large jobs exceed gRPC's default 4 MiB; the collector caps what it sends.
  channel_args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, security->credentials, channel_args);
  stepwatch::v1::Query::Stub stub(channel);
  grpc::ClientContext context;
  if (security->token != nullptr) {
    context.AddMetadata("authorization", security->token->AuthorizationHeader());
  }
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));

  auto rpc_error = [&](const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return Fail(absl::StrCat("cannot reach collector at ", address, ": ", s.error_message()));
    }
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      return Fail(absl::StrCat("collector at ", address, " refused the request: ",
                               s.error_message(), " (see --auth-token-file, --tls-cert)"));
    }
    return Fail(s.error_message());
  };

  if (command == "status") {
    if (!rest.empty()) return Usage("status takes no arguments");
    stepwatch::v1::StatusResponse response;
    grpc::Status s = stub.Status(&context, stepwatch::v1::StatusRequest(), &response);
    if (!s.ok()) return rpc_error(s);
    const int64_t now = stepwatch::SystemClock().NowUnixNanos();
    return Print(response, [now](const stepwatch::v1::StatusResponse& r) {
      return stepwatch::ctl::FormatStatus(r, now);
    });
  }
  if (command == "findings") {
    if (rest.size() > 1) return Usage("findings takes at most one JOB");
    stepwatch::v1::FindingsRequest request;
    if (!rest.empty()) request.set_job(rest[0]);
    stepwatch::v1::FindingsResponse response;
    grpc::Status s = stub.Findings(&context, request, &response);
    if (!s.ok()) return rpc_error(s);
    if (!rest.empty() && response.findings().empty()) {
      // No findings of a job the collector does not know is a typo, not a healthy job.
      grpc::ClientContext status_context;
      if (security->token != nullptr) {
        status_context.AddMetadata("authorization", security->token->AuthorizationHeader());
      }
      status_context.set_deadline(context.deadline());
      stepwatch::v1::StatusResponse status;
      s = stub.Status(&status_context, stepwatch::v1::StatusRequest(), &status);
      if (!s.ok()) return rpc_error(s);
      bool known = false;
      for (const stepwatch::v1::JobStatus& j : status.jobs()) known = known || j.job() == rest[0];
      if (!known) return Fail(absl::StrCat("no job named \"", rest[0], "\""));
    }
    return Print(response, [](const stepwatch::v1::FindingsResponse& r) {
      return stepwatch::ctl::FormatFindings(r);
    });
  }
  if (command == "explain") {
    if (rest.size() != 1) return Usage("explain needs exactly one JOB");
    stepwatch::v1::ExplainRequest request;
    request.set_job(rest[0]);
    stepwatch::v1::ExplainResponse response;
    grpc::Status s = stub.Explain(&context, request, &response);
    if (!s.ok()) return rpc_error(s);
    return Print(response, [](const stepwatch::v1::ExplainResponse& r) {
      return stepwatch::ctl::FormatExplain(r);
    });
  }
  if (command == "report") {
    if (rest.size() > 1) return Usage("report takes at most one JOB");
    stepwatch::v1::ReportRequest request;
    if (!rest.empty()) request.set_job(rest[0]);
    stepwatch::v1::ReportResponse response;
    grpc::Status s = stub.Report(&context, request, &response);
    if (!s.ok()) return rpc_error(s);
    const bool json = absl::GetFlag(FLAGS_json);
    if (rest.empty()) {
      std::cout << (json ? stepwatch::ctl::ReportListToJson(response)
                         : stepwatch::ctl::FormatReportList(response));
    } else {
      std::cout << (json ? stepwatch::ctl::ReportToJson(response.report())
                         : stepwatch::ctl::FormatReport(response.report()));
    }
    return 0;
  }
  return Usage(absl::StrCat("unknown command \"", command, "\""));
}
