// What stepwatchctl's commands share: the collectors of the run, how a collector that did not
// answer is reported, and the two ways of asking (every collector, or a job's owners in its
// rendezvous order), with the answers printed as text or JSON.
#pragma once

#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/collectors.h"
#include "common/text.h"
#include "ctl/fanout.h"
#include "ctl/format.h"
#include "ctl/proto_json.h"
#include "grpcpp/grpcpp.h"

namespace stepwatch::ctl {

// The collectors of this run and how to print what they said.
struct Session {
  // As ResolveCollectorTargets gives them: in flag order, or the sorted addresses of a name.
  std::vector<std::string> collectors;
  int replicas = 1;
  bool json = false;
  // report: --html, and the file of --output (empty: stdout).
  bool html = false;
  std::string output;
  // --collector=dns:///NAME:PORT: every collector NAME resolves to is in `collectors`.
  bool dns = false;
  const CollectorClients* clients = nullptr;
  // --tls-ca and --tls-cert given: what the likely cause of a failed handshake is.
  bool tls_ca = false;
  bool tls_cert = false;

  // With one collector the output stays what it always was; with several it names who answered.
  bool several() const { return collectors.size() > 1; }
};

// Prints "stepwatchctl: MESSAGE" (control characters escaped) to stderr; returns 1.
int Fail(const std::string& message);

// Why a collector gave no answer, in words that say what to check.
std::string DescribeFailure(const Session& session, const std::string& address,
                            const grpc::Status& s);
// The same, always naming the collector (with several, the reader must know which one).
std::string DescribeFailureOf(const Session& session, const std::string& address,
                              const grpc::Status& s);

// Which collectors were asked about a job none of them knows, and how to ask them all.
std::string AskedOnly(const Session& session, const std::string& asked);

// Nobody answered: with one collector, why (as stepwatchctl always said); with several, each.
template <typename Response>
int FailNoAnswer(const Session& session, const std::vector<Answer<Response>>& failed) {
  if (!session.several() && failed.size() == 1) {
    const Answer<Response>& a = failed[0];
    return Fail(DescribeFailure(session, a.collector, a.status));
  }
  std::vector<std::string> why;
  why.reserve(failed.size());
  for (const Answer<Response>& a : failed)
    why.push_back(DescribeFailureOf(session, a.collector, a.status));
  return Fail(absl::StrCat("no collector answered (", absl::StrJoin(why, "; "), ")"));
}

// A collector that did not answer while others did: a warning, not a failure.
template <typename Response>
void WarnNoAnswer(const Session& session, const std::vector<Answer<Response>>& failed) {
  for (const Answer<Response>& a : failed) {
    std::cerr << "stepwatchctl: warning: "
              << EscapeControlCharacters(DescribeFailureOf(session, a.collector, a.status))
              << "; showing what the other collectors know\n";
  }
}

template <typename Response>
std::string Collectors(const std::vector<Answer<Response>>& answers) {
  std::vector<std::string> names;
  names.reserve(answers.size());
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
    absl::StatusOr<std::string> json = ToJson(response);
    if (!json.ok()) return Fail(std::string(json.status().message()));
    std::cout << *json;
    if (json->empty() || json->back() != '\n') std::cout << "\n";
  } else {
    // Names and summaries come from senders: no escape sequence reaches the terminal.
    std::cout << EscapeControlCharacters(format(response));
    if (session.several()) std::cout << EscapeControlCharacters(footer);
  }
  return 0;
}

// A fleet-wide command: every collector at once. On success fills `ok` with the answers (in
// collector order) and `footer`; else returns the exit code.
template <typename Request, typename Response>
std::optional<int> AskEveryone(const Session& session, const Request& request,
                               const CollectorClients::AsyncCall<Request, Response>& call,
                               std::vector<Response>* ok, std::string* footer,
                               std::vector<std::string>* who = nullptr) {
  std::vector<Answer<Response>> answered, failed;
  for (Answer<Response>& a : session.clients->Ask(session.collectors, request, call)) {
    (a.status.ok() ? answered : failed).push_back(std::move(a));
  }
  if (answered.empty()) return FailNoAnswer(session, failed);
  WarnNoAnswer(session, failed);
  for (Answer<Response>& a : answered) {
    if (who != nullptr) who->push_back(a.collector);
    ok->push_back(std::move(a.response));
  }
  *footer = Footer(answered, {}, failed, "");
  return std::nullopt;
}

// A command about one job: its owners, in its rendezvous order, past those that do not answer or
// do not know it. On success fills `ok` with the answers of those that know the job and `footer`;
// else returns the exit code. `finished`, when given, says whether those collectors hold a
// report of the job (it ended): then the error points to `stepwatchctl report JOB`.
template <typename Response>
std::optional<int> AskJobOwners(
    const Session& session, const std::string& job,
    const std::function<std::vector<Answer<Response>>(const std::vector<std::string>&)>& ask,
    std::vector<Response>* ok, std::string* footer,
    const std::function<bool(const std::vector<std::string>&)>& finished = nullptr) {
  OwnersAnswers<Response> owners = ::stepwatch::ctl::AskOwners<Response>(
      RendezvousOrder(job, session.collectors), session.replicas, ask);
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
  WarnNoAnswer(session, owners.failed);
  for (Answer<Response>& a : owners.known) ok->push_back(std::move(a.response));
  *footer = Footer(owners.known, owners.unknown, owners.failed, job);
  return std::nullopt;
}

}  // namespace stepwatch::ctl
