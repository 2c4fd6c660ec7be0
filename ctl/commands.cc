#include "ctl/commands.h"

#include <algorithm>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/text.h"
#include "ctl/fanout.h"
#include "ctl/format.h"
#include "ctl/merge.h"
#include "ctl/query_calls.h"
#include "ctl/report_format.h"
#include "ctl/report_html.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

namespace stepwatch::ctl {
namespace {

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

}  // namespace

int RunStatus(const Session& session, const std::vector<std::string>& rest) {
  std::vector<v1::StatusResponse> answers;
  std::string footer;
  if (rest.empty()) {
    if (auto rc = AskEveryone(session, v1::StatusRequest(), kStatus, &answers, &footer)) return *rc;
    const int64_t now = SystemClock().NowUnixNanos();
    return Print(
        session, MergeStatus(answers),
        [now](const v1::StatusResponse& r) { return FormatStatus(r, now); }, footer);
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
  if (auto rc = AskJobOwners<v1::StatusResponse>(session, job, ask, &answers, &footer,
                                                 HasReport(session, job))) {
    return *rc;
  }
  return Print(session, MergeStatus(answers), FormatJobs, footer);
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
      by_answer.reserve(statuses.size());
      for (const Answer<v1::StatusResponse>& s : statuses) {
        by_answer.push_back(s.status.ok() ? &s.response : nullptr);
      }
      answers = WithoutStaleReplicas(std::move(answers), by_answer);
    }
    return Print(session, MergeFindings(answers), FormatFindings, footer);
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
  if (auto rc = AskJobOwners<v1::FindingsResponse>(session, job, ask, &answers, &footer,
                                                   HasReport(session, job))) {
    return *rc;
  }
  return Print(session, MergeFindings(answers), FormatFindings, footer);
}

int RunExplain(const Session& session, const std::string& job) {
  std::vector<v1::ExplainResponse> answers;
  std::string footer;
  auto ask = [&](const std::vector<std::string>& round) {
    v1::ExplainRequest request;
    request.set_job(job);
    return session.clients->Ask(round, request, kExplain);
  };
  if (auto rc = AskJobOwners<v1::ExplainResponse>(session, job, ask, &answers, &footer,
                                                  HasReport(session, job))) {
    return *rc;
  }
  return Print(
      session, MergeExplain(answers), [](const v1::ExplainResponse& r) { return FormatExplain(r); },
      footer);
}

int RunReport(const Session& session, const std::vector<std::string>& rest) {
  std::vector<v1::ReportResponse> answers;
  std::string footer;
  std::string text;
  if (rest.empty()) {
    if (auto rc = AskEveryone(session, v1::ReportRequest(), kReport, &answers, &footer)) {
      return *rc;
    }
    const v1::ReportResponse merged = MergeReportLists(answers);
    text = session.json ? ReportListToJson(merged) : FormatReportList(merged);
  } else {
    const std::string& job = rest[0];
    auto ask = [&](const std::vector<std::string>& round) {
      v1::ReportRequest request;
      request.set_job(job);
      return session.clients->Ask(round, request, kReport);
    };
    if (auto rc = AskJobOwners<v1::ReportResponse>(session, job, ask, &answers, &footer))
      return *rc;
    std::vector<v1::JobReport> reports;
    reports.reserve(answers.size());
    for (const v1::ReportResponse& a : answers) reports.push_back(a.report());
    const v1::JobReport merged = MergeReports(reports);
    text = session.html   ? RenderReportHtml(merged)
           : session.json ? ReportToJson(merged)
                          : FormatReport(merged);
  }
  if (!session.output.empty()) {
    if (absl::Status s = WriteFileAtomically(session.output, text); !s.ok()) {
      return Fail(absl::StrCat("cannot write the report to ", session.output, ": ", s.message()));
    }
    return 0;
  }
  std::cout << text;
  if (!session.json && !session.html && session.several()) {
    std::cout << EscapeControlCharacters(footer);
  }
  return 0;
}

int RunServe(const Session& session, const ServeOptions& options, const sigset_t& stop_signals) {
  ServeCollectors collectors;
  collectors.collectors = session.collectors;
  collectors.replicas = session.replicas;
  collectors.clients = session.clients;
  collectors.describe_failure = [session](const std::string& address, const grpc::Status& s) {
    return DescribeFailureOf(session, address, s);
  };
  if (absl::Status s = ServeUntilSignalled(options, std::move(collectors), stop_signals); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  return 0;
}

}  // namespace stepwatch::ctl
