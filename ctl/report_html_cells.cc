// Drawing of heatmap rows shared by the report's heatmaps: each row one <path> per colour whose
// runs of equal colour are strokes, flagged stretches outlined, and the step axis of the columns.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ctl/report_html.h"
#include "ctl/report_html_internal.h"

namespace stepwatch::ctl::html {

std::string Px(double v) {
  std::string s = absl::StrFormat("%.1f", v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s == "-0" ? "0" : s;
}

double CellWidth(int columns) { return static_cast<double>(kPlotWidth) / std::max(1, columns); }

std::string HeatmapSvg(const std::vector<HeatRow>& rows, const v1::ReportTimeline& timeline,
                       int row_h, const std::string& label, bool axis) {
  const int columns = timeline.columns_size();
  const double cell = CellWidth(columns);
  const int gap = row_h >= 8 ? 4 : 2;
  int height = 0;
  for (const HeatRow& r : rows) height += row_h + (r.gap_before ? gap : 0);
  const int axis_h = axis ? 30 : 0;
  std::string out =
      absl::StrCat("<svg class=\"hm\" role=\"img\" aria-label=\"", EscapeHtml(label), "\" width=\"",
                   kLabelWidth + kPlotWidth + 10, "\" height=\"", height + axis_h,
                   "\" stroke-width=\"", row_h > 4 ? row_h - 1 : row_h, "\" font-size=\"",
                   std::min(11, row_h), "\"><title>", EscapeHtml(label), "</title>\n");
  int y = 0;
  std::string path;
  for (const HeatRow& r : rows) {
    if (r.gap_before) y += gap;
    absl::StrAppend(&out, "<g ", r.attrs, " transform=\"translate(0,", y, ")\">");
    if (!r.title.empty()) absl::StrAppend(&out, "<title>", r.title, "</title>");
    if (!r.label.empty() && row_h >= 8) {
      absl::StrAppend(&out, "<text x=\"", kLabelWidth - 4, "\" y=\"", row_h - 2,
                      "\" text-anchor=\"end\">", r.label, "</text>");
    }
    const double mid = (row_h > 4 ? row_h - 1 : row_h) / 2.0;
    // One path per colour: runs of equal bins as horizontal strokes.
    for (int bin = -1; bin < kBins; ++bin) {
      path.clear();
      for (int c = 0; c < columns;) {
        const int b = c < static_cast<int>(r.bins.size()) ? r.bins[c] : -1;
        int end = c + 1;
        while (end < columns && (end < static_cast<int>(r.bins.size()) ? r.bins[end] : -1) == b) {
          ++end;
        }
        if (b == bin) {
          absl::StrAppend(&path, "M", Px(kLabelWidth + c * cell), " ", Px(mid), "h",
                          Px((end - c) * cell));
        }
        c = end;
      }
      if (!path.empty()) {
        absl::StrAppend(&out, "<path class=\"",
                        bin < 0 ? std::string("bn") : absl::StrCat("b", bin), "\" d=\"", path,
                        "\"/>");
      }
    }
    // Flagged stretches outlined.
    path.clear();
    for (int c = 0; c < columns;) {
      const bool f = c < static_cast<int>(r.flagged.size()) && r.flagged[c];
      int end = c + 1;
      while (end < columns && (end < static_cast<int>(r.flagged.size()) && r.flagged[end]) == f) {
        ++end;
      }
      if (f) {
        absl::StrAppend(&path, "M", Px(kLabelWidth + c * cell + 0.5), " 0.5h",
                        Px((end - c) * cell - 1), "v", row_h > 4 ? row_h - 2 : row_h - 1, "H",
                        Px(kLabelWidth + c * cell + 0.5), "z");
      }
      c = end;
    }
    if (!path.empty()) absl::StrAppend(&out, "<path class=\"fl\" d=\"", path, "\"/>");
    out += "</g>\n";
    y += row_h;
  }
  if (axis) out += ColumnAxis(timeline, kLabelWidth, cell, y + 4);
  out += "</svg>\n";
  return out;
}

bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i_end = i, j_end = j;
      while (i_end < a.size() && std::isdigit(static_cast<unsigned char>(a[i_end]))) ++i_end;
      while (j_end < b.size() && std::isdigit(static_cast<unsigned char>(b[j_end]))) ++j_end;
      // Without leading zeros, the longer run of digits is the larger number.
      size_t a0 = i, b0 = j;
      while (a0 + 1 < i_end && a[a0] == '0') ++a0;
      while (b0 + 1 < j_end && b[b0] == '0') ++b0;
      if (i_end - a0 != j_end - b0) return i_end - a0 < j_end - b0;
      const int c = a.compare(a0, i_end - a0, b, b0, j_end - b0);
      if (c != 0) return c < 0;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

std::string ColumnAxis(const v1::ReportTimeline& t, double left, double cell, double y) {
  const int columns = t.columns_size();
  if (columns == 0) return "";
  const int ticks = std::min(columns, 6);
  std::string out =
      absl::StrCat("<g class=\"axis\" font-size=\"10\"><title>steps of the columns", "</title>");
  int last = -1;
  for (int k = 0; k < ticks; ++k) {
    const int c = ticks == 1 ? 0 : k * (columns - 1) / (ticks - 1);
    if (c == last) continue;
    last = c;
    const v1::TimelineColumn& col = t.columns(c);
    const double x = left + (c + 0.5) * cell;
    const char* anchor = k == 0 ? "start" : (k == ticks - 1 ? "end" : "middle");
    absl::StrAppend(&out, "<path class=\"tick\" d=\"M", Px(x), " ", Px(y), "v5\"/><text x=\"",
                    Px(k == 0 ? left + c * cell : (k == ticks - 1 ? left + (c + 1) * cell : x)),
                    "\" y=\"", Px(y + 16), "\" text-anchor=\"", anchor, "\">",
                    col.first_step() == col.last_step()
                        ? absl::StrCat(col.first_step())
                        : StepRange(col.first_step(), col.last_step()),
                    "</text>");
  }
  return out + "</g>\n";
}

}  // namespace stepwatch::ctl::html
