// The HTML job report: the page, its header and findings table; the heatmaps and charts are in
// report_html_heatmap.cc and report_html_charts.cc.
#include "ctl/report_html.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "ctl/report_html_internal.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace stepwatch::ctl {
namespace html {

std::string Num(double v, int digits) {
  if (!std::isfinite(v)) return "?";
  return absl::StrFormat("%.*g", digits, v);
}

std::string DataNum(double v) { return std::isfinite(v) ? absl::StrFormat("%.6g", v) : ""; }

std::string Seconds(double s) {
  if (!(s > 0)) return "0 s";
  if (s < 1) return absl::StrCat(Num(s * 1000), " ms");
  return absl::StrCat(Num(s), " s");
}

std::string Duration(double s) {
  if (!(s >= 0)) return "-";
  if (s < 120) return absl::StrCat(Num(s), " s");
  const int64_t total = static_cast<int64_t>(s);
  if (total < 7200) return absl::StrCat(total / 60, "m ", total % 60, "s");
  return absl::StrCat(total / 3600, "h ", (total % 3600) / 60, "m");
}

std::string StepRange(int64_t first, int64_t last) {
  if (last < 0) return "-";
  return absl::StrCat(first < 0 ? "?" : absl::StrCat(first), "..", last);
}

StepSpan TimelineSpan(const v1::JobReport& report) {
  const v1::ReportTimeline& t = report.timeline();
  StepSpan span;
  if (t.columns_size() > 0) {
    span = {t.columns(0).first_step(), t.columns(t.columns_size() - 1).last_step()};
  } else {
    span = {std::max<int64_t>(0, report.first_step()), std::max<int64_t>(0, report.last_step())};
  }
  // Findings outside the columns (a finding before the first sample) widen the span.
  for (const v1::Finding& f : report.findings()) {
    if (f.since_step() >= 0) span.first = std::min(span.first, f.since_step());
    span.last = std::max(span.last, f.until_step());
  }
  span.last = std::max({span.last, report.last_step(), span.first});
  return span;
}

double StepX(const StepSpan& span, double step) {
  if (span.last <= span.first) return 0;
  const double f =
      (step - static_cast<double>(span.first)) / static_cast<double>(span.last - span.first);
  return std::clamp(f, 0.0, 1.0) * kPlotWidth;
}

int ComponentColour(const std::string& component) {
  if (component == "compute") return 4;
  if (component == "imbalance") return 5;
  if (component == "comm") return 0;
  if (component == "data") return 2;
  return 7;
}

}  // namespace html

namespace {

using html::Num;

// Light and dark, colour-blind safe: viridis for magnitudes, Okabe-Ito for categories.
constexpr char kStyle[] = R"css(
:root{--bg:#fff;--fg:#1b1b1b;--muted:#5c5c5c;--line:#d0d0d0;--card:#f5f5f5;--flag:#d55e00;--warn:#fff4d6;--accent:#0072b2}
@media (prefers-color-scheme:dark){:root{--bg:#15171a;--fg:#e8e8e8;--muted:#a8a8a8;--line:#3a3d42;--card:#1f2226;--flag:#ff8a4c;--warn:#3b3220;--accent:#56b4e9}}
body{background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,sans-serif;margin:0 auto;padding:16px 24px;max-width:1240px}
h1{font-size:22px;margin:0 0 8px;word-break:break-all}h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid var(--line)}h3{font-size:15px;margin:16px 0 4px}
a{color:var(--accent)}
dl.figures{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0}dl.figures div{background:var(--card);padding:6px 12px;border-radius:6px}
dt{font-size:12px;color:var(--muted)}dd{margin:0;font-size:16px;font-weight:600}
.warn{background:var(--warn);padding:6px 10px;border-radius:6px;margin:6px 0}
.caption,.summary,.legend-text{color:var(--muted);font-size:13px;max-width:1100px}
svg text{fill:var(--fg)}svg .ylab,svg .axis text{fill:var(--muted)}
.tick,.grid{stroke:var(--line);stroke-width:1;fill:none}.line{stroke:var(--fg);stroke-width:1.5;fill:none}
.gap{fill:var(--line);opacity:.5}
.hm path{fill:none}
.b0{stroke:#440154}.b1{stroke:#46327e}.b2{stroke:#365c8d}.b3{stroke:#277f8e}.b4{stroke:#1fa187}.b5{stroke:#4ac16d}.b6{stroke:#a0da39}.b7{stroke:#fde725}.bn{stroke:var(--line)}
.f0{fill:#440154}.f1{fill:#46327e}.f2{fill:#365c8d}.f3{fill:#277f8e}.f4{fill:#1fa187}.f5{fill:#4ac16d}.f6{fill:#a0da39}.f7{fill:#fde725}.fn{fill:var(--line)}
.hm path.fl,rect.fl{fill:none;stroke:var(--flag);stroke-width:1.5}
.k0{fill:#e69f00}.k1{fill:#56b4e9}.k2{fill:#009e73}.k3{fill:#f0e442}.k4{fill:#0072b2}.k5{fill:#d55e00}.k6{fill:#cc79a7}.k7{fill:#999}
.sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.sw.k0{background:#e69f00}.sw.k1{background:#56b4e9}.sw.k2{background:#009e73}.sw.k3{background:#f0e442}.sw.k4{background:#0072b2}.sw.k5{background:#d55e00}.sw.k6{background:#cc79a7}.sw.k7{background:#999}
details.node summary{cursor:pointer;list-style:none;display:block;line-height:0}details.node svg{display:block}details.node summary::-webkit-details-marker{display:none}
details.node[open]{outline:1px solid var(--line);margin:2px 0}
.sections{display:flex;flex-wrap:wrap;gap:12px}figure.section{margin:0}
table{border-collapse:collapse;font-size:13px;width:100%}th,td{border-bottom:1px solid var(--line);padding:4px 6px;text-align:left;vertical-align:top}
th{background:var(--card)}tr:target{outline:2px solid var(--accent)}td.ev{font-size:12px;color:var(--muted);max-width:320px;word-break:break-word}
.sev-critical{color:var(--flag);font-weight:700}.sev-warning{font-weight:600}
footer{margin-top:24px;color:var(--muted);font-size:12px}
)css";

std::string Time(int64_t unix_nanos) {
  if (unix_nanos <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixNanos(unix_nanos),
                          absl::UTCTimeZone());
}

std::string Figure(const std::string& id, const std::string& name, const std::string& value,
                   const std::string& shown, const std::string& extra = "") {
  return absl::StrCat("<div><dt>", name, "</dt><dd id=\"", id, "\" data-value=\"",
                      EscapeHtml(value), "\"", extra, ">", shown, "</dd></div>\n");
}

std::string Header(const v1::JobReport& r) {
  std::string out = absl::StrCat("<header><h1 id=\"job\" data-value=\"", EscapeHtml(r.job()), "\">",
                                 EscapeHtml(r.job()), "</h1>\n<dl class=\"figures\">\n");
  std::string state = EscapeHtml(r.state());
  if (!r.end_reason().empty()) {
    absl::StrAppend(&state, " (", EscapeHtml(r.end_reason()),
                    r.end_reason() == "exited"    ? ": every rank's process exited"
                    : r.end_reason() == "expired" ? ": went silent"
                                                  : "",
                    ")");
  }
  out += Figure("state", "State", r.state(), state,
                absl::StrCat(" data-end-reason=\"", EscapeHtml(r.end_reason()), "\""));
  out += Figure("world-size", "World size", absl::StrCat(r.world_size()),
                absl::StrCat(r.world_size(), " ranks"));
  const int64_t steps =
      r.last_step() < 0 ? 0 : r.last_step() - std::max<int64_t>(0, r.first_step()) + 1;
  out += Figure("steps", "Steps", absl::StrCat(steps),
                absl::StrCat(html::StepRange(r.first_step(), r.last_step()), " (", steps, ")"),
                absl::StrCat(" data-first-step=\"", r.first_step(), "\" data-last-step=\"",
                             r.last_step(), "\""));
  const int64_t end = r.end_unix_nanos() > 0 ? r.end_unix_nanos() : r.updated_unix_nanos();
  const double duration = r.start_unix_nanos() > 0 && end >= r.start_unix_nanos()
                              ? static_cast<double>(end - r.start_unix_nanos()) / 1e9
                              : -1;
  out += Figure("duration", "Duration", duration >= 0 ? html::DataNum(duration) : "",
                absl::StrCat(html::Duration(duration), r.end_unix_nanos() > 0 ? "" : " so far"));
  out += Figure("step-time", "Step time (last)", html::DataNum(r.step_seconds()),
                r.step_seconds() > 0 ? html::Seconds(r.step_seconds()) : "unknown");
  out += Figure(
      "efficiency", "Efficiency",
      r.has_efficiency_ratio() ? html::DataNum(r.efficiency_ratio()) : "",
      r.has_efficiency_ratio() ? absl::StrCat(Num(100 * r.efficiency_ratio()), "%") : "unknown");
  out += Figure("finding-count", "Findings", absl::StrCat(r.finding_count()),
                absl::StrCat(r.finding_count(),
                             r.findings_dropped() > 0
                                 ? absl::StrCat(" (", r.findings_dropped(), " oldest dropped)")
                                 : ""));
  absl::StrAppend(&out, "</dl>\n<p class=\"summary\">Started ", Time(r.start_unix_nanos()),
                  r.end_unix_nanos() > 0 ? absl::StrCat(", ended ", Time(r.end_unix_nanos()))
                                         : absl::StrCat(", updated ", Time(r.updated_unix_nanos())),
                  ". Efficiency: ideal / actual step time, last known.</p>\n");
  if (r.unsaved()) {
    out +=
        "<p class=\"warn\" id=\"unsaved\">Not saved yet: the collector cannot write this report "
        "under its --state-dir (disk full or failing); it is kept in memory and retried, and lost "
        "if the collector stops first.</p>\n";
  }
  if (r.gaps_size() > 0) {
    absl::StrAppend(&out, "<div class=\"warn\" id=\"gaps\" data-value=\"", r.gaps_size(),
                    "\">Partial: the collector restarted while the job ran.<ul>");
    for (const v1::ReportGap& g : r.gaps()) {
      if (g.before_step() < 0) {
        absl::StrAppend(&out, "<li>after step ", g.after_step(), " (", Time(g.from_unix_nanos()),
                        "): the job has not reported since</li>");
      } else {
        absl::StrAppend(&out, "<li>steps ", g.after_step() + 1, "..", g.before_step() - 1,
                        " missing (", Time(g.from_unix_nanos()), " to ", Time(g.to_unix_nanos()),
                        ")</li>");
      }
    }
    out += "</ul></div>\n";
  }
  return out + "</header>\n";
}

int SeverityRank(const std::string& s) { return s == "critical" ? 0 : (s == "warning" ? 1 : 2); }

std::string Where(const v1::Finding& f) {
  std::vector<std::string> parts;
  if (f.rank() >= 0) parts.push_back(absl::StrCat("rank ", f.rank()));
  if (!f.node().empty()) parts.push_back(EscapeHtml(f.node()));
  if (f.gpu() >= 0) parts.push_back(absl::StrCat("GPU ", f.gpu()));
  if (f.stage() >= 0) parts.push_back(absl::StrCat("stage ", f.stage()));
  if (!f.device().empty()) parts.push_back(EscapeHtml(f.device()));
  if (f.rank() < 0 && f.ranks_size() > 0) {
    std::vector<int> ranks(f.ranks().begin(), f.ranks().begin() + std::min(f.ranks_size(), 8));
    parts.push_back(
        absl::StrCat("ranks ", absl::StrJoin(ranks, ","), f.ranks_size() > 8 ? ",..." : ""));
  }
  return parts.empty() ? "job" : absl::StrJoin(parts, " ");
}

// What the findings say, grouped by kind and cause: the first thing a reader wants.
std::string CauseSummary(const v1::JobReport& r) {
  if (r.findings_size() == 0) {
    return "<section id=\"causes\"><h2>Causes</h2><p>No finding: stepwatch saw nothing slow "
           "in this job.</p></section>\n";
  }
  struct Group {
    int severity = 2, count = 0, active = 0, first = -1;
    std::vector<std::string> where;
  };
  std::map<std::pair<std::string, std::string>, Group> groups;
  for (int i = 0; i < r.findings_size(); ++i) {
    const v1::Finding& f = r.findings(i);
    Group& g = groups[{f.kind(), f.cause()}];
    g.severity = std::min(g.severity, SeverityRank(f.severity()));
    ++g.count;
    if (f.until_step() < 0) ++g.active;
    if (g.first < 0) g.first = i;
    const std::string w = Where(f);
    if (g.where.size() < 4 && std::find(g.where.begin(), g.where.end(), w) == g.where.end()) {
      g.where.push_back(w);
    }
  }
  std::vector<std::pair<const std::pair<std::string, std::string>*, const Group*>> order;
  order.reserve(groups.size());
  for (const auto& [key, g] : groups) order.emplace_back(&key, &g);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.second->severity != b.second->severity) return a.second->severity < b.second->severity;
    return a.second->count > b.second->count;
  });
  std::string out = "<section id=\"causes\"><h2>Causes</h2><ul>\n";
  for (const auto& [key, g] : order) {
    const v1::Finding& f = r.findings(g->first);
    absl::StrAppend(
        &out, "<li data-kind=\"", EscapeHtml(key->first), "\" data-cause=\"",
        EscapeHtml(key->second), "\"><b>", EscapeHtml(key->first), "</b>",
        key->second.empty() ? "" : absl::StrCat(" (cause: ", EscapeHtml(key->second), ")"), ": ",
        absl::StrJoin(g->where, "; "), " &mdash; ", g->count,
        g->count == 1 ? " finding" : " findings",
        g->active > 0 ? absl::StrCat(", ", g->active, " active") : "", ". <a href=\"#finding-",
        g->first, "\">details</a>",
        f.action().empty() ? "" : absl::StrCat("<br>", EscapeHtml(f.action())), "</li>\n");
  }
  return out + "</ul></section>\n";
}

// The set fields of a message, "name=value, ...": the evidence a finding's summary is worded from.
std::string FieldsText(const google::protobuf::Message& m) {
  const google::protobuf::Reflection* reflection = m.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(m, &fields);
  std::vector<std::string> parts;
  using FD = google::protobuf::FieldDescriptor;
  for (const FD* f : fields) {
    std::vector<std::string> values;
    const int n = f->is_repeated() ? reflection->FieldSize(m, f) : 1;
    for (int i = 0; i < n && i < 16; ++i) {
      const bool rep = f->is_repeated();
      switch (f->cpp_type()) {
        case FD::CPPTYPE_DOUBLE:
          values.push_back(
              Num(rep ? reflection->GetRepeatedDouble(m, f, i) : reflection->GetDouble(m, f), 4));
          break;
        case FD::CPPTYPE_FLOAT:
          values.push_back(
              Num(rep ? reflection->GetRepeatedFloat(m, f, i) : reflection->GetFloat(m, f), 4));
          break;
        case FD::CPPTYPE_INT32:
          values.push_back(absl::StrCat(rep ? reflection->GetRepeatedInt32(m, f, i)
                                            : reflection->GetInt32(m, f)));
          break;
        case FD::CPPTYPE_INT64:
          values.push_back(absl::StrCat(rep ? reflection->GetRepeatedInt64(m, f, i)
                                            : reflection->GetInt64(m, f)));
          break;
        case FD::CPPTYPE_UINT32:
          values.push_back(absl::StrCat(rep ? reflection->GetRepeatedUInt32(m, f, i)
                                            : reflection->GetUInt32(m, f)));
          break;
        case FD::CPPTYPE_UINT64:
          values.push_back(absl::StrCat(rep ? reflection->GetRepeatedUInt64(m, f, i)
                                            : reflection->GetUInt64(m, f)));
          break;
        case FD::CPPTYPE_BOOL:
          values.push_back((rep ? reflection->GetRepeatedBool(m, f, i) : reflection->GetBool(m, f))
                               ? "true"
                               : "false");
          break;
        case FD::CPPTYPE_STRING:
          values.push_back(EscapeHtml(rep ? reflection->GetRepeatedString(m, f, i)
                                          : reflection->GetString(m, f)));
          break;
        case FD::CPPTYPE_MESSAGE:
          values.push_back(absl::StrCat("{",
                                        FieldsText(rep ? reflection->GetRepeatedMessage(m, f, i)
                                                       : reflection->GetMessage(m, f)),
                                        "}"));
          break;
        default:
          break;
      }
    }
    if (n > 16) values.push_back("...");
    parts.push_back(absl::StrCat(f->name(), "=", f->is_repeated() ? "[" : "",
                                 absl::StrJoin(values, ", "), f->is_repeated() ? "]" : ""));
  }
  return absl::StrJoin(parts, "; ");
}

// A finding's time under its step, when known.
std::string When(int64_t unix_nanos) {
  return unix_nanos > 0 ? absl::StrCat("<br><small>", Time(unix_nanos), "</small>") : "";
}

std::string FindingsTable(const v1::JobReport& r) {
  std::string out =
      absl::StrCat("<section id=\"findings\"><h2>Findings</h2>\n<p class=\"summary\">",
                   r.findings_size(), r.findings_size() == 1 ? " finding" : " findings",
                   ", oldest first; a finding that cleared and came back is a new row. Until: the "
                   "step it cleared at (active: still on).</p>\n");
  if (r.findings_size() == 0) return out + "</section>\n";
  out +=
      "<table><thead><tr><th>#</th><th>Kind</th><th>Severity</th><th>Where</th><th>Cause</th>"
      "<th>Since</th><th>Until</th><th>Summary</th><th>Evidence</th><th>Action</th></tr></thead>"
      "<tbody>\n";
  for (int i = 0; i < r.findings_size(); ++i) {
    const v1::Finding& f = r.findings(i);
    std::vector<std::string> causes;
    for (const std::string& c : f.causes()) causes.push_back(EscapeHtml(c));
    const std::string cause =
        causes.size() > 1 ? absl::StrJoin(causes, ", ") : EscapeHtml(f.cause());
    absl::StrAppend(
        &out, "<tr id=\"finding-", i, "\" data-kind=\"", EscapeHtml(f.kind()), "\" data-rank=\"",
        f.rank(), "\" data-since-step=\"", f.since_step(), "\" data-until-step=\"", f.until_step(),
        "\"><td>", i, "</td><td>", EscapeHtml(f.kind()), f.persistent() ? "" : " (transient)",
        "</td><td class=\"sev-", EscapeHtml(f.severity()), "\">", EscapeHtml(f.severity()),
        "</td><td>", Where(f), "</td><td>", cause, "</td><td>", f.since_step(),
        When(f.since_unix_nanos()), "</td><td>",
        f.until_step() < 0 ? std::string("active")
                           : absl::StrCat(f.until_step(), When(f.until_unix_nanos())),
        "</td><td>", EscapeHtml(f.summary()), "</td><td class=\"ev\">", FieldsText(f.evidence()),
        f.has_kubernetes_pod() ? absl::StrCat("; pod: ", FieldsText(f.kubernetes_pod())) : "",
        "</td><td>", EscapeHtml(f.action()), "</td></tr>\n");
  }
  return out + "</tbody></table></section>\n";
}

std::string NoTimeline(const v1::JobReport& r) {
  return absl::StrCat(
      "<section id=\"no-timeline\"><h2>Over time</h2><p>There is no timeline in this report: the "
      "collector recorded none for this job (a collector too old to keep one, or a job that "
      "ended before it was sampled), so there is no heatmap or chart over time. The findings ",
      r.findings_size() > 0 ? "below still say" : "would say",
      " at which steps each started and cleared.</p></section>\n");
}

}  // namespace

std::string EscapeHtml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string RenderReportHtml(const v1::JobReport& report, const ReportHtmlOptions& options) {
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta name=\"viewport\" "
      "content=\"width=device-width,initial-scale=1\">\n<meta name=\"color-scheme\" "
      "content=\"light "
      "dark\">\n",
      options.refresh >= absl::Seconds(1)
          ? absl::StrCat("<meta http-equiv=\"refresh\" content=\"",
                         absl::ToInt64Seconds(options.refresh), "\">\n")
          : "",
      "<title>stepwatch report: ", EscapeHtml(report.job()), "</title>\n<style>", kStyle,
      "</style></head>\n<body>\n");
  if (!options.site_root.empty()) {
    absl::StrAppend(&out, "<nav><a href=\"", EscapeHtml(options.site_root),
                    "\">all jobs</a></nav>\n");
  }
  out += Header(report);
  out += CauseSummary(report);
  const bool timeline = report.timeline().columns_size() > 0;
  if (timeline) {
    out += html::RenderHeatmaps(report, options);
  } else {
    out += NoTimeline(report);
  }
  out += html::RenderStepTimeline(report);
  if (timeline) out += html::RenderBreakdown(report);
  out += html::RenderWhatIfs(report);
  if (timeline) out += html::RenderGpuHeatmaps(report);
  out += FindingsTable(report);
  absl::StrAppend(&out, "<footer>stepwatch job report, ",
                  report.state() == "running" ? "as of " : "", Time(report.updated_unix_nanos()),
                  ". Self-contained: no script, font or style is fetched from anywhere.</footer>\n"
                  "</body></html>\n");
  return out;
}

}  // namespace stepwatch::ctl
