// The charts of the HTML job report drawn over steps: step time with the findings as spans, the
// time breakdown per column, and the what-if speed-ups.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "ctl/report_html.h"
#include "ctl/report_html_internal.h"
#include "ctl/whatif_summary.h"

namespace stepwatch::ctl::html {
namespace {

constexpr int kLeft = kLabelWidth;  // aligned with the heatmaps' cells
constexpr int kWidth = kLeft + kPlotWidth + 20;

// A share as a whole percentage, "<1%" for a trace.
std::string Percent(double share) {
  if (share > 0 && share < 0.005) return "<1%";
  return absl::StrFormat("%.0f%%", 100 * share);
}

double ColumnMid(const v1::TimelineColumn& c) {
  return (static_cast<double>(c.first_step()) + static_cast<double>(c.last_step())) / 2;
}

// Step labels under a chart over `span`, at y.
std::string StepAxis(const StepSpan& span, double y) {
  std::string out = "<g class=\"axis\" font-size=\"10\">";
  const int ticks = span.last > span.first ? 6 : 1;
  for (int k = 0; k < ticks; ++k) {
    const double step = ticks == 1
                            ? span.first
                            : std::round(span.first + (span.last - span.first) * k / (ticks - 1.0));
    const double x = kLeft + StepX(span, step);
    absl::StrAppend(&out, "<path class=\"tick\" d=\"M", Px(x), " ", Px(y), "v5\"/><text x=\"",
                    Px(x), "\" y=\"", Px(y + 16), "\" text-anchor=\"",
                    k == 0 ? "start" : (k == ticks - 1 ? "end" : "middle"), "\">",
                    static_cast<int64_t>(step), "</text>");
  }
  absl::StrAppend(&out, "<text x=\"", kLeft + kPlotWidth / 2, "\" y=\"", Px(y + 30),
                  "\" text-anchor=\"middle\">step</text></g>\n");
  return out;
}

std::string FindingSubject(const v1::Finding& f) {
  std::string out;
  if (f.rank() >= 0) absl::StrAppend(&out, " rank ", f.rank());
  if (!f.node().empty()) absl::StrAppend(&out, " ", f.node());
  if (f.gpu() >= 0 && f.rank() < 0) absl::StrAppend(&out, " GPU ", f.gpu());
  if (f.stage() >= 0) absl::StrAppend(&out, " stage ", f.stage());
  if (!f.device().empty()) absl::StrAppend(&out, " ", f.device());
  return out;
}

int KindColour(const std::string& kind) {
  if (kind == "straggler") return 5;
  if (kind == "slow_node") return 0;
  if (kind == "pipeline_imbalance") return 6;
  if (kind == "regression" || kind == "stall") return 7;
  if (kind == "gpu_health" || kind == "nic_health") return 3;
  if (kind == "underutilized_gpu" || kind == "idle_gpu") return 1;
  return 2;
}

}  // namespace

double MaxStepSeconds(const v1::ReportTimeline& t) {
  double max_s = 0;
  for (const v1::TimelineColumn& c : t.columns()) max_s = std::max(max_s, c.step_seconds());
  return max_s;
}

// The median step time per column as a line, with its grid and labels.
std::string StepTimeLine(const v1::ReportTimeline& t, const StepSpan& span, int plot_h,
                         int top_margin, double max_s) {
  std::string out;
  if (max_s > 0) {
    const double top = max_s * 1.15;
    auto y = [&](double s) { return plot_h - s / top * (plot_h - top_margin); };
    for (int k = 0; k <= 3; ++k) {
      const double s = top * k / 3;
      absl::StrAppend(&out, "<path class=\"grid\" d=\"M", kLeft, " ", Px(y(s)), "h", kPlotWidth,
                      "\"/><text class=\"ylab\" x=\"", kLeft - 4, "\" y=\"", Px(y(s) + 4),
                      "\" text-anchor=\"end\" font-size=\"10\">", EscapeHtml(Seconds(s)),
                      "</text>");
    }
    std::string points;
    for (const v1::TimelineColumn& c : t.columns()) {
      if (!(c.step_seconds() > 0)) continue;
      absl::StrAppend(&points, points.empty() ? "" : " ", Px(kLeft + StepX(span, ColumnMid(c))),
                      ",", Px(y(c.step_seconds())));
    }
    absl::StrAppend(&out, "<polyline class=\"line\" points=\"", points, "\"/>\n");
  } else {
    absl::StrAppend(&out, "<text x=\"", kLeft, "\" y=\"", plot_h / 2,
                    "\">no step time known</text>\n");
  }
  return out;
}

// Every finding as a span of steps, one lane each, linked to its row in the table.
std::string FindingSpans(const v1::JobReport& report, const StepSpan& span, int lanes_top,
                         int lane_h) {
  std::string out;
  for (int i = 0; i < report.findings_size(); ++i) {
    const v1::Finding& f = report.findings(i);
    const int64_t until = f.until_step() < 0 ? span.last : f.until_step();
    const double x0 = kLeft + StepX(span, f.since_step());
    const double x1 = kLeft + StepX(span, until);
    const double y = lanes_top + i * lane_h;
    const std::string label = EscapeHtml(absl::StrCat(
        f.kind(), FindingSubject(f), f.cause().empty() ? "" : absl::StrCat(" · ", f.cause()),
        f.until_step() < 0 ? " (active)" : ""));
    const bool right = x0 > kLeft + kPlotWidth * 0.6;
    absl::StrAppend(&out, "<a href=\"#finding-", i, "\"><g class=\"span\" data-finding=\"", i,
                    "\" data-kind=\"", EscapeHtml(f.kind()), "\" data-since-step=\"",
                    f.since_step(), "\" data-until-step=\"", f.until_step(), "\"><title>", label,
                    ": steps ", StepRange(f.since_step(), until), "</title><rect class=\"k",
                    KindColour(f.kind()), "\" x=\"", Px(x0), "\" y=\"", Px(y), "\" width=\"",
                    Px(std::max(3.0, x1 - x0)), "\" height=\"", lane_h - 4,
                    "\" rx=\"2\"/><text x=\"", Px(right ? x0 - 4 : x0 + 4), "\" y=\"",
                    Px(y + lane_h - 7), "\" font-size=\"11\"", right ? " text-anchor=\"end\"" : "",
                    ">", label, "</text></g></a>\n");
  }
  return out;
}

std::string RenderStepTimeline(const v1::JobReport& report) {
  const v1::ReportTimeline& t = report.timeline();
  const StepSpan span = TimelineSpan(report);
  const bool line = t.columns_size() > 0;
  if (!line && report.findings_size() == 0) return "";
  const int top_margin = line ? 12 : 0;
  const int plot_h = line ? 160 + top_margin : 0;
  const int lane_h = 18;
  const int lanes_top = plot_h + (line ? 36 : 6);
  const int height = lanes_top + report.findings_size() * lane_h + 44;
  std::string out = absl::StrCat(
      "<section id=\"timeline\"><h2>Step time and findings</h2>\n<svg class=\"chart\" "
      "role=\"img\" aria-labelledby=\"timeline-title timeline-desc\" width=\"",
      kWidth, "\" height=\"", height, "\"><title id=\"timeline-title\">",
      line ? "Median step time over the job, with each finding as a span of steps"
           : "Each finding as a span of steps",
      "</title><desc id=\"timeline-desc\">", report.findings_size(), " findings over steps ",
      StepRange(span.first, span.last), "</desc>\n");
  // Stretches the report lacks (collector restarts): shaded.
  for (const v1::ReportGap& g : report.gaps()) {
    const double x0 = kLeft + StepX(span, g.after_step());
    const double x1 = kLeft + StepX(span, g.before_step() < 0 ? span.last : g.before_step());
    absl::StrAppend(&out, "<rect class=\"gap\" x=\"", Px(x0), "\" y=\"0\" width=\"",
                    Px(std::max(2.0, x1 - x0)), "\" height=\"", height - 40,
                    "\"><title>missing steps: collector restart</title></rect>\n");
  }
  const double max_s = MaxStepSeconds(t);
  if (line) out += StepTimeLine(t, span, plot_h, top_margin, max_s);
  out += FindingSpans(report, span, lanes_top, lane_h);
  out += StepAxis(span, height - 40);
  out += "</svg>\n<p class=\"summary\">";
  if (line && max_s > 0) {
    double min_s = max_s;
    for (const v1::TimelineColumn& c : t.columns()) {
      if (c.step_seconds() > 0) min_s = std::min(min_s, c.step_seconds());
    }
    absl::StrAppend(&out, "Median step time between ", EscapeHtml(Seconds(min_s)), " and ",
                    EscapeHtml(Seconds(max_s)), " over steps ", StepRange(span.first, span.last),
                    ". ");
  }
  absl::StrAppend(&out, report.findings_size(),
                  report.findings_size() == 1 ? " finding" : " findings",
                  ", each a bar from the step it started at to the step it cleared at "
                  "(to the last step while active); select one for its row in the table.</p>\n"
                  "</section>\n");
  return out;
}

std::string RenderBreakdown(const v1::JobReport& report) {
  const v1::ReportTimeline& t = report.timeline();
  const int columns = t.columns_size();
  bool known = false;
  for (const v1::TimelineColumn& c : t.columns()) known = known || !c.time_ratio().empty();
  if (!known) return "";
  const int plot_h = 140;
  const double cell = static_cast<double>(kPlotWidth) / columns;
  std::string paths[std::size(kComponents)];
  double totals[std::size(kComponents)] = {};
  int known_columns = 0;
  for (int c = 0; c < columns; ++c) {
    const auto& ratio = t.columns(c).time_ratio();
    if (ratio.empty()) continue;
    ++known_columns;
    // Summed in key order: a protobuf map's order varies, and the page must not.
    std::map<std::string, double> sorted(ratio.begin(), ratio.end());
    double sum = 0;
    for (const auto& [name, share] : sorted) sum += std::max(0.0, share);
    if (!(sum > 0)) continue;
    double y = plot_h;
    for (size_t k = 0; k < std::size(kComponents); ++k) {
      const auto it = ratio.find(kComponents[k]);
      if (it == ratio.end() || !(it->second > 0)) continue;
      totals[k] += it->second / sum;
      const double h = it->second / sum * plot_h;
      absl::StrAppend(&paths[k], "M", Px(kLeft + c * cell), " ", Px(y - h), "h", Px(cell), "v",
                      Px(h), "h", Px(-cell), "z");
      y -= h;
    }
  }
  std::string out = absl::StrCat(
      "<section id=\"breakdown\"><h2>Where the step time went</h2>\n<svg class=\"chart\" "
      "role=\"img\" aria-labelledby=\"breakdown-title\" width=\"",
      kWidth, "\" height=\"", plot_h + 38,
      "\"><title id=\"breakdown-title\">Shares of the step "
      "per column: compute, imbalance, communication, data, other</title>\n"
      "<g transform=\"translate(0,8)\">");
  for (size_t k = 0; k < std::size(kComponents); ++k) {
    if (paths[k].empty()) continue;
    absl::StrAppend(&out, "<path class=\"k", ComponentColour(kComponents[k]),
                    "\" data-component=\"", kComponents[k], "\" d=\"", paths[k], "\"/>\n");
  }
  for (int k = 0; k <= 4; ++k) {
    const double y = plot_h - plot_h * k / 4.0;
    absl::StrAppend(&out, "<text class=\"ylab\" x=\"", kLeft - 4, "\" y=\"", Px(y + 4),
                    "\" text-anchor=\"end\" font-size=\"10\">", k * 25, "%</text>");
  }
  out += ColumnAxis(t, kLeft, cell, plot_h + 4);
  out += "</g></svg>\n<p class=\"legend-text\">";
  for (size_t k = 0; k < std::size(kComponents); ++k) {
    absl::StrAppend(&out, "<span class=\"sw k", ComponentColour(kComponents[k]), "\"></span>",
                    kComponents[k],
                    known_columns > 0 ? absl::StrCat(" ", Percent(totals[k] / known_columns)) : "",
                    k + 1 < std::size(kComponents) ? " &nbsp; " : "");
  }
  absl::StrAppend(&out, " (mean share over the ", known_columns,
                  " columns that know it)</p>\n</section>\n");
  return out;
}

std::string RenderWhatIfs(const v1::JobReport& report) {
  if (report.whatif_speedup_ratio().empty()) return "";
  std::vector<std::pair<std::string, double>> fixes;
  for (const char* fix : {"stragglers", "overlap", "data", "pipeline"}) {
    const auto it = report.whatif_speedup_ratio().find(fix);
    if (it != report.whatif_speedup_ratio().end()) fixes.emplace_back(fix, it->second);
  }
  const std::map<std::string, double> all(report.whatif_speedup_ratio().begin(),
                                          report.whatif_speedup_ratio().end());
  for (const auto& entry : all) {
    const std::string& fix = entry.first;
    if (std::none_of(fixes.begin(), fixes.end(), [&](const auto& f) { return f.first == fix; })) {
      fixes.emplace_back(fix, entry.second);
    }
  }
  double max_ratio = 1;
  size_t best = 0;
  for (size_t i = 0; i < fixes.size(); ++i) {
    max_ratio = std::max(max_ratio, fixes[i].second);
    if (fixes[i].second > fixes[best].second) best = i;
  }
  // The same combination as explain and the text report say.
  const WhatIfSummary summary = SummarizeWhatIf(report.whatif_speedup_ratio(), report.time_ratio());
  const int bar_h = 22;
  const double scale = max_ratio > 1 ? 600 / (max_ratio - 1) : 0;
  std::string out = absl::StrCat(
      "<section id=\"whatif\"><h2>What fixing each would gain</h2>\n<svg class=\"chart\" "
      "role=\"img\" aria-label=\"estimated speed-up if each cause were fixed\" width=\"",
      kWidth, "\" height=\"", fixes.size() * bar_h + 10, "\" font-size=\"12\">\n");
  for (size_t i = 0; i < fixes.size(); ++i) {
    const auto kind_it = report.whatif_kind().find(fixes[i].first);
    const std::string kind = kind_it == report.whatif_kind().end() ? "estimate" : kind_it->second;
    const double y = i * bar_h + 4;
    absl::StrAppend(&out, "<g data-fix=\"", EscapeHtml(fixes[i].first), "\" data-value=\"",
                    DataNum(fixes[i].second), "\" data-whatif-kind=\"", EscapeHtml(kind),
                    "\"><text x=\"", kLeft + 60, "\" y=\"", Px(y + 14), "\" text-anchor=\"end\">",
                    EscapeHtml(fixes[i].first), "</text><rect class=\"k", i == best ? 4 : 1,
                    "\" x=\"", kLeft + 66, "\" y=\"", Px(y), "\" width=\"",
                    Px(std::max(2.0, (fixes[i].second - 1) * scale)), "\" height=\"", bar_h - 6,
                    "\"/><text x=\"", Px(kLeft + 72 + std::max(2.0, (fixes[i].second - 1) * scale)),
                    "\" y=\"", Px(y + 14), "\">", Num(fixes[i].second), "x (",
                    EscapeHtml(absl::StrReplaceAll(kind, {{"_", " "}})), ")</text></g>\n");
  }
  out += "</svg>\n";
  absl::StrAppend(&out, "<p class=\"summary\" id=\"whatif-best\" data-fix=\"",
                  EscapeHtml(fixes[best].first), "\" data-value=\"", DataNum(fixes[best].second),
                  "\">Best single fix: <b>", EscapeHtml(fixes[best].first), "</b>, ",
                  Num(fixes[best].second),
                  "x faster steps.</p>\n<p class=\"summary\" "
                  "id=\"whatif-combined\" data-value=\"",
                  DataNum(summary.combined_speedup),
                  "\">All fixed together: ", summary.combined_is_upper_bound ? "up to " : "",
                  Num(summary.combined_speedup), "x faster",
                  summary.combined_clamped ? " (limited by the compute share)" : "",
                  ". Each fix removes its share of the step; the shares add up.</p>\n</section>\n");
  return out;
}

}  // namespace stepwatch::ctl::html
