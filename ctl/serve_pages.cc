#include "ctl/serve_pages.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/net.h"
#include "common/utf8.h"
#include "ctl/format.h"
#include "ctl/report_html.h"

namespace stepwatch::ctl {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const Utf8Sequence s = DecodeUtf8At(text, i);
    if (s.length == 0) return false;
    i += s.length;
  }
  return true;
}

// Shared by every page: small, readable, no script and nothing fetched from elsewhere.
constexpr char kStyle[] =
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "th,td{border-bottom:1px solid #ddd;padding:.3em .7em;text-align:left;vertical-align:top}"
    "th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "ul.findings{margin:0;padding-left:1.1em}.sev-critical{color:#b00020}"
    ".sev-warning{color:#a15c00}.problems{background:#fff3f3;border:1px solid #e0a0a0;"
    "padding:.5em 1em;margin-bottom:1em}.muted{color:#777}";

std::string Head(const std::string& title, int refresh_seconds) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  if (refresh_seconds > 0) {
    absl::StrAppend(&out, "<meta http-equiv=\"refresh\" content=\"", refresh_seconds, "\">");
  }
  absl::StrAppend(&out, "<title>", EscapeHtml(title), "</title><style>", kStyle,
                  "</style></head>\n<body>\n");
  return out;
}

std::string ProblemsHtml(const std::vector<CollectorProblem>& failed) {
  if (failed.empty()) return "";
  std::string out = "<div class=\"problems\" id=\"collector-problems\"><b>Not answering:</b><ul>";
  for (const CollectorProblem& p : failed) {
    absl::StrAppend(&out, "<li class=\"collector-problem\" data-collector=\"",
                    EscapeHtml(p.collector), "\"><code>", EscapeHtml(p.collector),
                    "</code>: ", EscapeHtml(p.why), "</li>");
  }
  return out + "</ul></div>\n";
}

// "rank 1 on node-0 GPU 1", "node node-3", "stage 2", "" for a job-level finding.
std::string Subject(const v1::Finding& f) {
  std::string out;
  if (f.rank() >= 0) absl::StrAppend(&out, "rank ", f.rank());
  if (f.stage() >= 0 && f.rank() < 0) absl::StrAppend(&out, "stage ", f.stage());
  if (!f.node().empty()) absl::StrAppend(&out, out.empty() ? "node " : " on ", f.node());
  if (f.gpu() >= 0) absl::StrAppend(&out, " GPU ", f.gpu());
  if (!f.device().empty()) absl::StrAppend(&out, " ", f.device());
  return out;
}

std::string JobState(const v1::JobStatus& j) {
  if (j.world_size() > 0 && j.ranks_reporting() < j.world_size()) {
    return absl::StrCat("partial (", j.ranks_reporting(), " of ", j.world_size(),
                        " ranks reporting)");
  }
  return "running";
}

std::string Ago(int64_t now_unix_nanos, int64_t then_unix_nanos) {
  if (then_unix_nanos <= 0 || now_unix_nanos <= 0) return "-";
  const int64_t seconds = std::max<int64_t>(0, (now_unix_nanos - then_unix_nanos) / 1'000'000'000);
  return absl::StrCat(seconds, " s ago");
}

std::string FindingItem(const v1::Finding& f, const v1::JobReport* report) {
  const int index = report == nullptr ? -1 : FindingIndexInReport(f, *report);
  std::string out = absl::StrCat(
      "<li class=\"finding sev-", EscapeHtml(f.severity()), "\" data-kind=\"", EscapeHtml(f.kind()),
      "\" data-rank=\"", f.rank(), "\" data-node=\"", EscapeHtml(f.node()), "\"><a href=\"",
      EscapeHtml(FindingPath(f.job(), index)), "\"><b>", EscapeHtml(f.kind()), "</b></a>");
  const std::string subject = Subject(f);
  if (!subject.empty()) absl::StrAppend(&out, " ", EscapeHtml(subject));
  if (!f.cause().empty()) {
    absl::StrAppend(&out, " &middot; cause <span class=\"cause\">", EscapeHtml(f.cause()),
                    "</span>");
  }
  absl::StrAppend(&out, " &middot; since step ", f.since_step());
  if (!f.summary().empty()) {
    absl::StrAppend(&out, "<br><span class=\"muted summary\">", EscapeHtml(f.summary()), "</span>");
  }
  return out + "</li>";
}

}  // namespace

bool IsLoopbackListen(absl::string_view listen) {
  absl::StatusOr<HostPort> hp = ParseHostPort(listen);
  if (!hp.ok()) return false;
  const std::string host = absl::AsciiStrToLower(hp->host);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

std::string PercentEncode(absl::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 0xF];
    }
  }
  return out;
}

std::optional<std::string> PercentDecode(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    const int high = HexValue(text[i + 1]);
    const int low = HexValue(text[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  if (absl::StrContains(out, '\0') || !IsUtf8(out)) return std::nullopt;
  return out;
}

std::string JobPath(const std::string& job) { return "/jobs/" + PercentEncode(job); }

std::string FindingPath(const std::string& job, int index) {
  if (index < 0) return JobPath(job);
  return absl::StrCat(JobPath(job), "#finding-", index);
}

Route RouteRequest(absl::string_view method, absl::string_view path) {
  Route route;
  if (method != "GET" && method != "HEAD") {
    route.kind = PageKind::kMethodNotAllowed;
    return route;
  }
  if (path == "/" || path == "/index.html") {
    route.kind = PageKind::kJobList;
    return route;
  }
  constexpr absl::string_view kJobs = "/jobs/";
  if (absl::StartsWith(path, kJobs) && path.size() > kJobs.size()) {
    std::optional<std::string> job = PercentDecode(path.substr(kJobs.size()));
    if (job.has_value() && !job->empty()) {
      route.kind = PageKind::kJob;
      route.job = *std::move(job);
    }
  }
  return route;
}

int FindingIndexInReport(const v1::Finding& finding, const v1::JobReport& report) {
  auto same_subject = [&finding](const v1::Finding& r) {
    return r.kind() == finding.kind() && r.rank() == finding.rank() && r.node() == finding.node() &&
           r.gpu() == finding.gpu();
  };
  int still_active = -1;
  for (int i = 0; i < report.findings_size(); ++i) {
    const v1::Finding& r = report.findings(i);
    if (!same_subject(r)) continue;
    if (r.since_step() == finding.since_step()) return i;
    if (r.until_step() < 0 && still_active < 0) still_active = i;
  }
  return still_active;
}

std::string RenderJobListHtml(const JobListPage& page) {
  std::string out = Head("stepwatch: jobs", page.refresh_seconds);
  absl::StrAppend(&out, "<h1>stepwatch: jobs</h1>\n", ProblemsHtml(page.failed));

  std::map<std::string, std::vector<const v1::Finding*>> findings_by_job;
  for (const v1::Finding& f : page.findings.findings()) {
    findings_by_job[f.job()].push_back(&f);
  }
  std::map<std::string, const v1::JobReport*> report_by_job;
  for (const v1::JobReport& r : page.reports) report_by_job[r.job()] = &r;
  auto findings_html = [&](const std::string& job) {
    auto it = findings_by_job.find(job);
    if (it == findings_by_job.end()) return std::string("<span class=\"muted\">none</span>");
    auto report = report_by_job.find(job);
    std::string list = "<ul class=\"findings\">";
    for (const v1::Finding* f : it->second) {
      absl::StrAppend(&list,
                      FindingItem(*f, report == report_by_job.end() ? nullptr : report->second));
    }
    return list + "</ul>";
  };

  std::set<std::string> listed;
  if (page.status.jobs().empty()) {
    absl::StrAppend(&out, "<p class=\"muted\" id=\"no-jobs\">No running jobs.</p>\n");
  } else {
    absl::StrAppend(&out,
                    "<table id=\"jobs\"><thead><tr><th>Job</th><th>State</th><th>World</th>"
                    "<th>Last step</th><th>Step time</th><th>Steps/s</th><th>Efficiency</th>"
                    "<th>Last seen</th><th>Active findings</th></tr></thead><tbody>\n");
    for (const v1::JobStatus& j : page.status.jobs()) {
      listed.insert(j.job());
      absl::StrAppend(&out, "<tr class=\"job\" data-job=\"", EscapeHtml(j.job()),
                      "\"><td><a class=\"job-link\" href=\"", EscapeHtml(JobPath(j.job())), "\">",
                      EscapeHtml(j.job()), "</a></td><td class=\"state\">", EscapeHtml(JobState(j)),
                      "</td><td class=\"num world\">", j.world_size(),
                      "</td><td class=\"num last-step\">", j.last_step(), "</td><td class=\"num\">",
                      j.step_seconds() > 0 ? FormatDuration(j.step_seconds()) : "-",
                      "</td><td class=\"num\">", absl::StrFormat("%.2f", j.steps_per_second()),
                      "</td><td class=\"num efficiency\">",
                      j.efficiency_ratio() > 0 ? FormatPercent(j.efficiency_ratio()) : "-",
                      "</td><td class=\"num\">", Ago(page.now_unix_nanos, j.last_seen_unix_nanos()),
                      "</td><td>", findings_html(j.job()), "</td></tr>\n");
    }
    absl::StrAppend(&out, "</tbody></table>\n");
  }

  // Findings of jobs no collector lists any more (they stay until the collector expires them).
  std::string orphans;
  for (const auto& [job, findings] : findings_by_job) {
    if (listed.count(job) > 0) continue;
    absl::StrAppend(&orphans, "<tr class=\"job\" data-job=\"", EscapeHtml(job),
                    "\"><td><a class=\"job-link\" href=\"", EscapeHtml(JobPath(job)), "\">",
                    EscapeHtml(job), "</a></td><td>", findings_html(job), "</td></tr>\n");
  }
  if (!orphans.empty()) {
    absl::StrAppend(&out,
                    "<h2>Findings of jobs no longer reporting</h2><table id=\"other-findings\">"
                    "<thead><tr><th>Job</th><th>Active findings</th></tr></thead><tbody>\n",
                    orphans, "</tbody></table>\n");
  }

  std::string answered;
  for (const std::string& c : page.answered) {
    absl::StrAppend(&answered, answered.empty() ? "" : ", ", "<code>", EscapeHtml(c), "</code>");
  }
  absl::StrAppend(&out, "<p class=\"muted\" id=\"collectors\">Collectors answering: ",
                  answered.empty() ? "none" : answered);
  if (!page.failed.empty()) {
    absl::StrAppend(&out, "; not answering: ");
    for (size_t i = 0; i < page.failed.size(); ++i) {
      absl::StrAppend(&out, i == 0 ? "" : ", ", "<code>", EscapeHtml(page.failed[i].collector),
                      "</code>");
    }
  }
  if (page.refresh_seconds > 0) {
    absl::StrAppend(&out, ". This page reloads every ", page.refresh_seconds, " s");
  }
  absl::StrAppend(&out, ".</p>\n</body></html>\n");
  return out;
}

std::string RenderErrorHtml(int status, const std::string& title, const std::string& message,
                            const std::vector<CollectorProblem>& failed, int refresh_seconds) {
  return absl::StrCat(Head(absl::StrCat(status, " ", title), refresh_seconds), "<h1>", status, " ",
                      EscapeHtml(title), "</h1>\n<p id=\"error\">", EscapeHtml(message), "</p>\n",
                      ProblemsHtml(failed), "<p><a href=\"/\">All jobs</a></p>\n</body></html>\n");
}

std::string WithCollectorBanner(std::string page, const std::vector<CollectorProblem>& failed) {
  if (failed.empty()) return page;
  size_t at = 0;
  const size_t body = page.find("<body");
  if (body != std::string::npos) {
    const size_t end = page.find('>', body);
    if (end != std::string::npos) at = end + 1;
  }
  page.insert(at, ProblemsHtml(failed));
  return page;
}

}  // namespace stepwatch::ctl
