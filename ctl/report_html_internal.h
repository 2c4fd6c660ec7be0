// Pieces of the HTML job report shared by its parts (page, heatmaps, charts); not an interface
// for other code: ctl/report_html.h is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ctl/report_html.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::ctl::html {

// Width of the drawing area of every chart (pixels), and of the row labels left of a heatmap.
inline constexpr int kPlotWidth = 960;
inline constexpr int kLabelWidth = 150;

// A number for people: up to `digits` significant digits.
std::string Num(double v, int digits = 3);
// A number for machines (data-value): as `report --json` prints it (%.6g).
std::string DataNum(double v);
// "1.2 s", "350 ms", "3h 12m".
std::string Seconds(double s);
std::string Duration(double s);
// "12..80" ("-" when none).
std::string StepRange(int64_t first, int64_t last);

// The first and last step a timeline covers (its columns), else the report's.
struct StepSpan {
  int64_t first = 0;
  int64_t last = 0;
};
StepSpan TimelineSpan(const v1::JobReport& report);
// x of `step` in [0, kPlotWidth] over `span`.
double StepX(const StepSpan& span, double step);

// Labels of the step axis under a chart kPlotWidth wide whose columns are drawn `cell` pixels
// each, starting at x = `left`: a few columns' step ranges. SVG elements, at y = `y`.
std::string ColumnAxis(const v1::ReportTimeline& timeline, double left, double cell, double y);

// Colour bins of a heatmap (viridis steps, CSS classes "b0".."b7"; "bn" unknown).
inline constexpr int kBins = 8;

// One row of a heatmap.
struct HeatRow {
  std::string label;      // left of the row; empty: none
  std::string attrs;      // data-* attributes of the row's <g>
  std::string title;      // what a pointer over the row shows
  std::vector<int> bins;  // per column: 0..kBins-1, -1 unknown
  std::vector<bool> flagged;
  bool gap_before = false;  // a new node starts: a little space above
};

// An SVG coordinate: one decimal at most.
std::string Px(double v);
// Pixels per column when `columns` share kPlotWidth.
double CellWidth(int columns);
// One SVG of heatmap rows, `row_h` pixels each (labels drawn when >= 8), the column axis under
// them when `axis`; `label` is its text alternative.
std::string HeatmapSvg(const std::vector<HeatRow>& rows, const v1::ReportTimeline& timeline,
                       int row_h, const std::string& label, bool axis);
// Names in the order people count: "node-2" before "node-10".
bool NaturalLess(const std::string& a, const std::string& b);
struct NaturalOrder {
  bool operator()(const std::string& a, const std::string& b) const { return NaturalLess(a, b); }
};

// The heatmaps of busy time (rank x step, per node beyond options.max_rank_rows, per section) and
// of GPU readings per node, with their captions and legends. Empty when the timeline has none.
std::string RenderHeatmaps(const v1::JobReport& report, const ReportHtmlOptions& options);
std::string RenderGpuHeatmaps(const v1::JobReport& report);

// The step time over the job with every finding as a span, the breakdown over time, and the
// what-ifs.
std::string RenderStepTimeline(const v1::JobReport& report);
std::string RenderBreakdown(const v1::JobReport& report);
std::string RenderWhatIfs(const v1::JobReport& report);

// Okabe-Ito colour (CSS class "k0".."k7") of a breakdown component.
int ComponentColour(const std::string& component);
inline constexpr const char* kComponents[] = {"compute", "imbalance", "comm", "data", "other"};

}  // namespace stepwatch::ctl::html
