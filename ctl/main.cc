// stepwatchctl: asks stepwatch collectors what they know (Query service) and prints it for people
// or, with --json, for programs. Jobs are sharded over collectors: a command about one job asks its
// owners, the others every collector, and the answers are merged (ctl/merge.h).
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
#include "common/flags.h"
#include "common/text.h"
#include "ctl/fanout.h"
#include "ctl/format.h"
#include "ctl/merge.h"
#include "ctl/report_format.h"
#include "grpcpp/grpcpp.h"
#include "security/client_security.h"
#include "security/tls_credentials.h"
#include "security/tls_errors.h"
#include "security/tokens.h"
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
ABSL_FLAG(double, timeout, 3,
          "Seconds to wait for each collector before giving up on it (they are asked at once).");

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
    "                 without JOB, the recent reports";

namespace v1 = stepwatch::v1;
namespace ctl = stepwatch::ctl;
using ctl::Answer;

std::string CollectorFlag() {
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

// Why a collector gave no answer, in words that say what to check.
std::string DescribeFailure(const std::string& address, const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    // gRPC often says only "Socket closed" for a refused handshake: name the likely cause.
    const std::string cause = stepwatch::security::ExplainTlsFailure(
        s.error_message(),
        {!absl::GetFlag(FLAGS_tls_ca).empty(), !absl::GetFlag(FLAGS_tls_cert).empty()});
    return absl::StrCat("cannot reach collector at ", address, ": ", s.error_message(),
                        cause.empty() ? "" : absl::StrCat(" (likely cause: ", cause, ")"));
  }
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return absl::StrCat("collector at ", address, " refused the request: ", s.error_message(),
                        " (see --auth-token-file, --tls-cert)");
  }
  return s.error_message();
}

// The same, always naming the collector (with several, the reader must know which one).
std::string DescribeFailureOf(const std::string& address, const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return DescribeFailure(address, s);
    default:
      return absl::StrCat("collector at ", address, ": ", s.error_message());
  }
}

// The collectors of this run and how to print what they said.
struct Session {
  // As ResolveCollectorTargets gives them: in flag order, or the sorted addresses of a name.
  std::vector<std::string> collectors;
  int replicas = 1;
  bool json = false;
  // --collector=dns:///NAME:PORT: every collector NAME resolves to is in `collectors`.
  bool dns = false;
  const ctl::CollectorClients* clients = nullptr;

  // With one collector the output stays what it always was; with several it names who answered.
  bool several() const { return collectors.size() > 1; }
};

// Nobody answered: with one collector, why (as stepwatchctl always said); with several, each.
template <typename Response>
int FailNoAnswer(const Session& session, const std::vector<Answer<Response>>& failed) {
  if (!session.several() && failed.size() == 1) {
    const Answer<Response>& a = failed[0];
    return Fail(DescribeFailure(a.collector, a.status));
  }
  std::vector<std::string> why;
  for (const Answer<Response>& a : failed) why.push_back(DescribeFailureOf(a.collector, a.status));
  return Fail(absl::StrCat("no collector answered (", absl::StrJoin(why, "; "), ")"));
}

// A collector that did not answer while others did: a warning, not a failure.
template <typename Response>
void WarnNoAnswer(const std::vector<Answer<Response>>& failed) {
  for (const Answer<Response>& a : failed) {
    std::cerr << "stepwatchctl: warning: "
              << stepwatch::EscapeControlCharacters(DescribeFailureOf(a.collector, a.status))
              << "; showing what the other collectors know\n";
  }
}

template <typename Response>
std::string Collectors(const std::vector<Answer<Response>>& answers) {
  std::vector<std::string> names;
  for (const Answer<Response>& a : answers) names.push_back(a.collector);
  return absl::StrJoin(names, ", ");
}

// The last line of a text answer from several collectors: who answered and who did not.
template <typename Response>
std::string Footer(const std::vector<Answer<Response>>& answered,
                   const std::vector<Answer<Response>>& unknown,
                   const std::vector<Answer<Response>>& failed, const std::string& job) {
  std::string out = absl::StrCat("\nCollectors: ", job.empty() ? "answered " : job + " from ",
                                 Collectors(answered));
  if (!unknown.empty()) absl::StrAppend(&out, "; did not know it: ", Collectors(unknown));
  if (!failed.empty()) absl::StrAppend(&out, "; not answering: ", Collectors(failed));
  return out + "\n";
}

// Prints `response` as JSON or with `format` (then `footer`); returns the exit code.
template <typename Response, typename Format>
int Print(const Session& session, const Response& response, Format format,
          const std::string& footer) {
  if (session.json) {
    absl::StatusOr<std::string> json = ctl::ToJson(response);
    if (!json.ok()) return Fail(std::string(json.status().message()));
    std::cout << *json;
    if (json->empty() || json->back() != '\n') std::cout << "\n";
  } else {
    // Names and summaries come from senders: no escape sequence reaches the terminal.
    std::cout << stepwatch::EscapeControlCharacters(format(response));
    if (session.several()) std::cout << stepwatch::EscapeControlCharacters(footer);
  }
  return 0;
}

// A fleet-wide command: every collector at once. On success fills `ok` with the answers (in
// collector order) and `footer`; else returns the exit code.
template <typename Request, typename Response>
std::optional<int> AskEveryone(const Session& session, const Request& request,
                               const ctl::CollectorClients::AsyncCall<Request, Response>& call,
                               std::vector<Response>* ok, std::string* footer,
                               std::vector<std::string>* who = nullptr) {
  std::vector<Answer<Response>> answered, failed;
  for (Answer<Response>& a : session.clients->Ask(session.collectors, request, call)) {
    (a.status.ok() ? answered : failed).push_back(std::move(a));
  }
  if (answered.empty()) return FailNoAnswer(session, failed);
  WarnNoAnswer(failed);
  for (Answer<Response>& a : answered) {
    if (who != nullptr) who->push_back(a.collector);
    ok->push_back(std::move(a.response));
  }
  *footer = Footer(answered, {}, failed, "");
  return std::nullopt;
}

// Which collectors were asked about a job none of them knows, and, where the user named them one by
// one, how to ask every collector: a job lives on only --replicas of them, and a list of some of
// them (a port-forward to one pod) misses the others' jobs.
std::string AskedOnly(const Session& session, const std::string& asked) {
  if (session.dns) return "";
  return absl::StrCat(" on ",
                      session.several() ? "the collectors asked (" : "the collector asked (", asked,
                      "); each job lives on --replicas of the collectors: to ask every one, give "
                      "them all, --collector=HOST:PORT,HOST:PORT,..., or "
                      "--collector=dns:///NAME:PORT");
}

// A command about one job: its owners, in its rendezvous order, past those that do not answer or
// do not know it. On success fills `ok` with the answers of those that know the job and `footer`;
// else returns the exit code. `finished`, when given, says whether those collectors hold a
// report of the job (it ended): then the error points to `stepwatchctl report JOB`.
template <typename Response>
std::optional<int> AskOwners(
    const Session& session, const std::string& job,
    const std::function<std::vector<Answer<Response>>(const std::vector<std::string>&)>& ask,
    std::vector<Response>* ok, std::string* footer,
    const std::function<bool(const std::vector<std::string>&)>& finished = nullptr) {
  ctl::OwnersAnswers<Response> owners = ctl::AskOwners<Response>(
      stepwatch::RendezvousOrder(job, session.collectors), session.replicas, ask);
  if (owners.known.empty()) {
    if (owners.unknown.empty()) return FailNoAnswer(session, owners.failed);
    std::vector<std::string> answered;
    for (const Answer<Response>& a : owners.unknown) answered.push_back(a.collector);
    if (finished && finished(answered)) {
      return Fail(absl::StrCat("job \"", job, "\" has ended: its report says what it had, run `",
                               "stepwatchctl report ", job, "`"));
    }
    // What the collector says about an unknown job (NOT_FOUND), else what stepwatchctl says.
    std::string message = absl::StrCat("no job named \"", job, "\"");
    for (const Answer<Response>& a : owners.unknown) {
      if (!a.status.ok() && !a.status.error_message().empty()) {
        message = a.status.error_message();
        break;
      }
    }
    if (owners.failed.empty())
      return Fail(message + AskedOnly(session, Collectors(owners.unknown)));
    return Fail(absl::StrCat(message, " on the collectors that answered (",
                             Collectors(owners.unknown),
                             "); not answering: ", Collectors(owners.failed)));
  }
  WarnNoAnswer(owners.failed);
  for (Answer<Response>& a : owners.known) ok->push_back(std::move(a.response));
  *footer = Footer(owners.known, owners.unknown, owners.failed, job);
  return std::nullopt;
}

// The Query service's calls, in the shape CollectorClients::Ask takes.
using StatusCall = ctl::CollectorClients::AsyncCall<v1::StatusRequest, v1::StatusResponse>;
using FindingsCall = ctl::CollectorClients::AsyncCall<v1::FindingsRequest, v1::FindingsResponse>;
using ExplainCall = ctl::CollectorClients::AsyncCall<v1::ExplainRequest, v1::ExplainResponse>;
using ReportCall = ctl::CollectorClients::AsyncCall<v1::ReportRequest, v1::ReportResponse>;
const StatusCall kStatus = [](auto* stub, grpc::ClientContext* c, const v1::StatusRequest* r,
                              v1::StatusResponse* out, std::function<void(grpc::Status)> done) {
  stub->Status(c, r, out, std::move(done));
};
const FindingsCall kFindings =
    [](auto* stub, grpc::ClientContext* c, const v1::FindingsRequest* r, v1::FindingsResponse* out,
       std::function<void(grpc::Status)> done) { stub->Findings(c, r, out, std::move(done)); };
const ExplainCall kExplain = [](auto* stub, grpc::ClientContext* c, const v1::ExplainRequest* r,
                                v1::ExplainResponse* out, std::function<void(grpc::Status)> done) {
  stub->Explain(c, r, out, std::move(done));
};
const ReportCall kReport = [](auto* stub, grpc::ClientContext* c, const v1::ReportRequest* r,
                              v1::ReportResponse* out, std::function<void(grpc::Status)> done) {
  stub->Report(c, r, out, std::move(done));
};

// Whether any of `collectors` holds a report of `job`: it ran and ended.
std::function<bool(const std::vector<std::string>&)> HasReport(const Session& session,
                                                               const std::string& job) {
  return [&session, job](const std::vector<std::string>& collectors) {
    v1::ReportRequest request;
    request.set_job(job);
    for (const Answer<v1::ReportResponse>& a : session.clients->Ask(collectors, request, kReport)) {
      if (a.status.ok() && a.response.report().job() == job) return true;
    }
    return false;
  };
}

bool ListsJob(const v1::StatusResponse& status, const std::string& job) {
  for (const v1::JobStatus& j : status.jobs()) {
    if (j.job() == job) return true;
  }
  return false;
}

int RunStatus(const Session& session, const std::vector<std::string>& rest) {
  std::vector<v1::StatusResponse> answers;
  std::string footer;
  if (rest.empty()) {
    if (auto rc = AskEveryone(session, v1::StatusRequest(), kStatus, &answers, &footer)) return *rc;
    const int64_t now = stepwatch::SystemClock().NowUnixNanos();
    return Print(
        session, ctl::MergeStatus(answers),
        [now](const v1::StatusResponse& r) { return ctl::FormatStatus(r, now); }, footer);
  }
  const std::string& job = rest[0];
  auto ask = [&](const std::vector<std::string>& round) {
    std::vector<Answer<v1::StatusResponse>> answers =
        session.clients->Ask(round, v1::StatusRequest(), kStatus);
    for (Answer<v1::StatusResponse>& a : answers) {
      // Only the job's row: the nodes are every job's on that collector.
      a.response.clear_nodes();
      auto* jobs = a.response.mutable_jobs();
      jobs->erase(std::remove_if(jobs->begin(), jobs->end(),
                                 [&](const v1::JobStatus& j) { return j.job() != job; }),
                  jobs->end());
      a.job_known = !jobs->empty();
    }
    return answers;
  };
  if (auto rc = AskOwners<v1::StatusResponse>(session, job, ask, &answers, &footer,
                                              HasReport(session, job))) {
    return *rc;
  }
  return Print(session, ctl::MergeStatus(answers), ctl::FormatJobs, footer);
}

int RunFindings(const Session& session, const std::vector<std::string>& rest) {
  std::vector<v1::FindingsResponse> answers;
  std::string footer;
  if (rest.empty()) {
    std::vector<std::string> who;
    if (auto rc = AskEveryone(session, v1::FindingsRequest(), kFindings, &answers, &footer, &who)) {
      return *rc;
    }
    if (answers.size() > 1) {
      // A collector a job moved away from keeps its last findings until it expires the job:
      // only replicas that still receive a job speak for it.
      std::vector<Answer<v1::StatusResponse>> statuses =
          session.clients->Ask(who, v1::StatusRequest(), kStatus);
      std::vector<const v1::StatusResponse*> by_answer;
      for (const Answer<v1::StatusResponse>& s : statuses) {
        by_answer.push_back(s.status.ok() ? &s.response : nullptr);
      }
      answers = ctl::WithoutStaleReplicas(std::move(answers), by_answer);
    }
    return Print(session, ctl::MergeFindings(answers), ctl::FormatFindings, footer);
  }
  const std::string& job = rest[0];
  auto ask = [&](const std::vector<std::string>& round) {
    v1::FindingsRequest request;
    request.set_job(job);
    std::vector<Answer<v1::FindingsResponse>> answers =
        session.clients->Ask(round, request, kFindings);
    // No findings of a job the collector does not know is a typo (or another collector's job),
    // not a healthy job.
    std::vector<std::string> check;
    for (const Answer<v1::FindingsResponse>& a : answers) {
      if (a.status.ok() && a.response.findings().empty()) check.push_back(a.collector);
    }
    if (check.empty()) return answers;
    for (const Answer<v1::StatusResponse>& s :
         session.clients->Ask(check, v1::StatusRequest(), kStatus)) {
      for (Answer<v1::FindingsResponse>& a : answers) {
        if (a.collector != s.collector) continue;
        if (!s.status.ok()) a.status = s.status;
        a.job_known = s.status.ok() && ListsJob(s.response, job);
      }
    }
    return answers;
  };
  if (auto rc = AskOwners<v1::FindingsResponse>(session, job, ask, &answers, &footer,
                                                HasReport(session, job))) {
    return *rc;
  }
  return Print(session, ctl::MergeFindings(answers), ctl::FormatFindings, footer);
}

int RunExplain(const Session& session, const std::string& job) {
  std::vector<v1::ExplainResponse> answers;
  std::string footer;
  auto ask = [&](const std::vector<std::string>& round) {
    v1::ExplainRequest request;
    request.set_job(job);
    return session.clients->Ask(round, request, kExplain);
  };
  if (auto rc = AskOwners<v1::ExplainResponse>(session, job, ask, &answers, &footer,
                                               HasReport(session, job))) {
    return *rc;
  }
  return Print(
      session, ctl::MergeExplain(answers),
      [](const v1::ExplainResponse& r) { return ctl::FormatExplain(r); }, footer);
}

int RunReport(const Session& session, const std::vector<std::string>& rest) {
  std::vector<v1::ReportResponse> answers;
  std::string footer;
  std::string text;
  if (rest.empty()) {
    if (auto rc = AskEveryone(session, v1::ReportRequest(), kReport, &answers, &footer)) {
      return *rc;
    }
    const v1::ReportResponse merged = ctl::MergeReportLists(answers);
    text = session.json ? ctl::ReportListToJson(merged) : ctl::FormatReportList(merged);
  } else {
    const std::string& job = rest[0];
    auto ask = [&](const std::vector<std::string>& round) {
      v1::ReportRequest request;
      request.set_job(job);
      return session.clients->Ask(round, request, kReport);
    };
    if (auto rc = AskOwners<v1::ReportResponse>(session, job, ask, &answers, &footer)) return *rc;
    std::vector<v1::JobReport> reports;
    for (const v1::ReportResponse& a : answers) reports.push_back(a.report());
    const v1::JobReport merged = ctl::MergeReports(reports);
    text = session.json ? ctl::ReportToJson(merged) : ctl::FormatReport(merged);
  }
  std::cout << text;
  if (!session.json && session.several()) {
    std::cout << stepwatch::EscapeControlCharacters(footer);
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
  const std::string& command = positional[0];
  const std::vector<std::string> rest(positional.begin() + 1, positional.end());
  // The arguments first: a usage error never waits for a collector.
  if (command == "status" && rest.size() > 1) return Usage("status takes at most one JOB");
  if (command == "findings" && rest.size() > 1) return Usage("findings takes at most one JOB");
  if (command == "explain" && rest.size() != 1) return Usage("explain needs exactly one JOB");
  if (command == "report" && rest.size() > 1) return Usage("report takes at most one JOB");
  if (command != "status" && command != "findings" && command != "explain" && command != "report") {
    return Usage(absl::StrCat("unknown command \"", command, "\""));
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
  if (!collectors.ok()) return Fail(std::string(collectors.status().message()));
  if (collectors->empty()) return Fail(absl::StrCat("--collector=", flag, " names no collector"));

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

  Session session;
  session.collectors = *collectors;
  session.replicas = ctl::EffectiveReplicas(absl::GetFlag(FLAGS_replicas), collectors->size());
  session.json = absl::GetFlag(FLAGS_json);
  session.dns = targets->is_dns();
  session.clients = &clients;
  if (command == "status") return RunStatus(session, rest);
  if (command == "findings") return RunFindings(session, rest);
  if (command == "explain") return RunExplain(session, rest[0]);
  return RunReport(session, rest);
}
