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
#include "ctl/format.h"
#include "grpcpp/grpcpp.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

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
    "  explain JOB    where JOB's step time goes, what-if speed-ups, per-rank table, findings";

std::string CollectorAddress() {
  std::string flag = absl::GetFlag(FLAGS_collector);
  if (!flag.empty()) return flag;
  const char* env = std::getenv("STEPWATCH_COLLECTOR");
  if (env != nullptr && *env != '\0') return env;
  return "127.0.0.1:7070";
}

int Fail(const std::string& message) {
  std::cerr << "stepwatchctl: " << message << "\n";
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
    std::cout << format(response);
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

  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  stepwatch::v1::Query::Stub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));

  auto rpc_error = [&](const grpc::Status& s) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return Fail(absl::StrCat("cannot reach collector at ", address, ": ", s.error_message()));
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
  return Usage(absl::StrCat("unknown command \"", command, "\""));
}
