#include "ctl/serve.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/collectors.h"
#include "common/log.h"
#include "common/net.h"
#include "common/text.h"
#include "ctl/merge.h"
#include "ctl/query_calls.h"
#include "ctl/report_html.h"
#include "http/http_request.h"
#include "http/http_server.h"
#include "http/worker_pool.h"

namespace stepwatch::ctl {
namespace {

// The job list links each finding to its row on the job's page, which takes one Report per job
// with findings; past this many such jobs the rest link to the page without the row.
constexpr size_t kMaxAnchoredJobs = 16;

// Scripts, frames, forms and anything fetched are refused: the pages are self-contained, and a
// name that escaped its escaping still could not run.
constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

http::HttpResponse HtmlResponse(int status, std::string body) {
  http::HttpResponse r;
  r.status = status;
  r.content_type = "text/html; charset=utf-8";
  r.headers.emplace_back("Cache-Control", "no-store");
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("Content-Security-Policy", kContentSecurityPolicy);
  r.body = std::make_shared<const std::string>(std::move(body));
  return r;
}

}  // namespace

class LiveView::Impl {
 public:
  Impl(const ServeOptions& options, ServeCollectors collectors)
      : options_(options),
        refresh_seconds_(static_cast<int>(absl::ToInt64Seconds(options.refresh))),
        collectors_(std::move(collectors)) {}

  ~Impl() {
    // No new requests first; then the workers (their answers to a stopped server are dropped);
    // the server last, since the workers' answers go to it.
    if (server_ != nullptr) server_->Stop();
    pool_.reset();
    server_.reset();
  }

  absl::Status Start() {
    pool_ = std::make_unique<http::WorkerPool>(std::max(1, options_.threads),
                                               std::max<size_t>(1, options_.max_queued));
    http::HttpServerOptions http;
    http.listen = options_.listen;
    absl::StatusOr<std::unique_ptr<http::HttpServer>> server = http::HttpServer::Start(
        http, [this](const http::HttpRequest& request, http::HttpResponder responder) {
          Handle(request, responder);
        });
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    return absl::OkStatus();
  }

  int port() const { return server_->port(); }

 private:
  // On the server's loop thread: routing only; the collectors are asked from a worker.
  void Handle(const http::HttpRequest& request, http::HttpResponder responder) {
    Route route = RouteRequest(request.method, request.path);
    switch (route.kind) {
      case PageKind::kMethodNotAllowed: {
        http::HttpResponse r = HtmlResponse(
            405, RenderErrorHtml(405, "Method Not Allowed",
                                 "This view is read-only: only GET and HEAD are answered."));
        r.headers.emplace_back("Allow", "GET, HEAD");
        responder.Send(std::move(r));
        return;
      }
      case PageKind::kNotFound:
        responder.Send(HtmlResponse(
            404, RenderErrorHtml(404, "Not Found",
                                 "No such page: the jobs are at / and each job at /jobs/JOB.")));
        return;
      case PageKind::kJobList:
      case PageKind::kJob:
        break;
    }
    const bool queued = pool_->TrySubmit([this, route = std::move(route), responder] {
      responder.Send(route.kind == PageKind::kJob ? JobPage(route.job) : ListPage());
    });
    if (!queued) {
      http::HttpResponse r = HtmlResponse(
          503, RenderErrorHtml(503, "Busy", "Too many pages are being prepared; retry."));
      r.headers.emplace_back("Retry-After", "1");
      responder.Send(std::move(r));
    }
  }

  template <typename Response>
  CollectorProblem Problem(const Answer<Response>& a) const {
    return {a.collector, collectors_.describe_failure
                             ? collectors_.describe_failure(a.collector, a.status)
                             : a.status.error_message()};
  }

  // Every collector's jobs and findings, merged as `stepwatchctl status` and `findings` merge them.
  http::HttpResponse ListPage() const {
    ctl::JobListPage page;
    page.refresh_seconds = refresh_seconds_;
    page.now_unix_nanos = SystemClock().NowUnixNanos();
    const CollectorClients& clients = *collectors_.clients;

    std::vector<std::string> answering;
    std::vector<v1::StatusResponse> statuses;
    for (Answer<v1::StatusResponse>& a :
         clients.Ask(collectors_.collectors, v1::StatusRequest(), kStatus)) {
      if (!a.status.ok()) {
        page.failed.push_back(Problem(a));
        continue;
      }
      answering.push_back(a.collector);
      statuses.push_back(std::move(a.response));
    }
    // Findings only of those that gave their status: a replica that no longer receives a job
    // is told by its status (WithoutStaleReplicas).
    std::vector<v1::FindingsResponse> findings;
    std::vector<const v1::StatusResponse*> by_answer;
    std::vector<v1::StatusResponse> answered_statuses;
    std::vector<Answer<v1::FindingsResponse>> finding_answers =
        clients.Ask(answering, v1::FindingsRequest(), kFindings);
    for (size_t i = 0; i < finding_answers.size(); ++i) {
      Answer<v1::FindingsResponse>& a = finding_answers[i];
      if (!a.status.ok()) {
        page.failed.push_back(Problem(a));
        continue;
      }
      page.answered.push_back(a.collector);
      findings.push_back(std::move(a.response));
      answered_statuses.push_back(std::move(statuses[i]));
    }
    if (page.answered.empty()) {
      return HtmlResponse(502, RenderErrorHtml(502, "No collector answered",
                                               "None of the collectors could be asked.",
                                               page.failed, refresh_seconds_));
    }
    by_answer.reserve(answered_statuses.size());
    for (const v1::StatusResponse& s : answered_statuses) by_answer.push_back(&s);
    if (findings.size() > 1) findings = WithoutStaleReplicas(std::move(findings), by_answer);
    page.status = MergeStatus(answered_statuses);
    page.findings = MergeFindings(findings);

    std::set<std::string> jobs_with_findings;
    for (const v1::Finding& f : page.findings.findings()) {
      jobs_with_findings.insert(f.job());
    }
    for (const std::string& job : jobs_with_findings) {
      if (page.reports.size() >= kMaxAnchoredJobs) break;
      std::vector<v1::ReportResponse> known;
      AskReport(job, &known, nullptr, nullptr);
      if (known.empty()) continue;
      std::vector<v1::JobReport> reports;
      reports.reserve(known.size());
      for (const v1::ReportResponse& r : known) reports.push_back(r.report());
      page.reports.push_back(MergeReports(reports));
    }
    return HtmlResponse(200, RenderJobListHtml(page));
  }

  // Asks `job`'s owners for its report, past those that do not answer or do not know it.
  void AskReport(const std::string& job, std::vector<v1::ReportResponse>* known,
                 std::vector<std::string>* unknown, std::vector<CollectorProblem>* failed) const {
    const std::function<std::vector<Answer<v1::ReportResponse>>(const std::vector<std::string>&)>
        ask = [&](const std::vector<std::string>& round) {
          v1::ReportRequest request;
          request.set_job(job);
          return collectors_.clients->Ask(round, request, kReport);
        };
    OwnersAnswers<v1::ReportResponse> owners = AskOwners<v1::ReportResponse>(
        RendezvousOrder(job, collectors_.collectors), collectors_.replicas, ask);
    for (Answer<v1::ReportResponse>& a : owners.known) known->push_back(std::move(a.response));
    if (unknown != nullptr) {
      for (const Answer<v1::ReportResponse>& a : owners.unknown) unknown->push_back(a.collector);
    }
    if (failed != nullptr) {
      for (const Answer<v1::ReportResponse>& a : owners.failed) failed->push_back(Problem(a));
    }
  }

  // The job's report from its owners, merged as `stepwatchctl report JOB` merges it.
  http::HttpResponse JobPage(const std::string& job) const {
    std::vector<v1::ReportResponse> known;
    std::vector<std::string> unknown;
    std::vector<CollectorProblem> failed;
    AskReport(job, &known, &unknown, &failed);
    if (known.empty()) {
      if (unknown.empty()) {
        return HtmlResponse(502, RenderErrorHtml(502, "No collector answered",
                                                 absl::StrCat("None of the owners of job \"", job,
                                                              "\" could be asked."),
                                                 failed, refresh_seconds_));
      }
      return HtmlResponse(
          404, RenderErrorHtml(404, "No such job",
                               absl::StrCat("No collector asked knows a job named \"", job, "\"."),
                               failed));
    }
    std::vector<v1::JobReport> reports;
    reports.reserve(known.size());
    for (const v1::ReportResponse& r : known) reports.push_back(r.report());
    ReportHtmlOptions html;
    html.refresh = options_.refresh;
    html.site_root = "/";
    return HtmlResponse(200,
                        WithCollectorBanner(RenderReportHtml(MergeReports(reports), html), failed));
  }

  const ServeOptions options_;
  const int refresh_seconds_;  // options_.refresh, as the pages state it
  const ServeCollectors collectors_;
  std::unique_ptr<http::WorkerPool> pool_;
  std::unique_ptr<http::HttpServer> server_;
};

LiveView::LiveView(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LiveView::~LiveView() = default;
int LiveView::port() const { return impl_->port(); }

absl::StatusOr<std::unique_ptr<LiveView>> LiveView::Start(const ServeOptions& options,
                                                          ServeCollectors collectors) {
  if (collectors.clients == nullptr || collectors.collectors.empty()) {
    return absl::InvalidArgumentError("serve needs at least one collector");
  }
  auto impl = std::make_unique<Impl>(options, std::move(collectors));
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<LiveView>(new LiveView(std::move(impl)));
}

absl::Status ServeUntilSignalled(const ServeOptions& options, ServeCollectors collectors,
                                 const sigset_t& stop_signals) {
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad --listen \"", options.listen, "\": ", listen.status().message()));
  }
  absl::StatusOr<std::unique_ptr<LiveView>> view = LiveView::Start(options, std::move(collectors));
  if (!view.ok()) return view.status();
  HostPort bound = *listen;
  bound.port = (*view)->port();
  if (bound.host.empty()) bound.host = "0.0.0.0";
  if (!IsLoopbackListen(options.listen)) {
    SW_LOG_WARNING << "listening on " << JoinHostPort(bound)
                   << ", not loopback: this view has no authentication, anyone who can reach "
                      "the address sees every job the collectors know";
  }
  SW_LOG_INFO << "serving on http://" << JoinHostPort(bound) << "/";
  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  SW_LOG_INFO << "received " << strsignal(sig) << ", stopping";
  view->reset();
  SW_LOG_INFO << "stopped";
  return absl::OkStatus();
}

}  // namespace stepwatch::ctl
