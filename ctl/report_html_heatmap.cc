// The heatmaps of the HTML job report: busy time per rank (or node) and column, relative to the
// column's fastest ranks; per section; GPU readings per node. A cell is a stroke of a path, one
// path per colour and row, so that 1,024 ranks x 100 columns stay well under a few MB.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ctl/report_html.h"
#include "ctl/report_html_internal.h"

namespace stepwatch::ctl::html {
namespace {

// Upper bounds of the busy-ratio colour bins (busy / the column's 10th percentile); the last bin
// is everything from 2.0 up.
constexpr double kRatioBounds[] = {1.05, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0};

std::string Bool(bool b) { return b ? "true" : "false"; }

int RatioBin(double value, double reference) {
  if (value < 0 || !(reference > 0)) return -1;
  const double ratio = value / reference;
  int bin = 0;
  for (double bound : kRatioBounds) {
    if (ratio >= bound) ++bin;
  }
  return bin;
}

int ShareBin(double value) {
  if (value < 0) return -1;
  return std::clamp(static_cast<int>(value * kBins), 0, kBins - 1);
}

// Per column: the 10th percentile of the positive values of `series` (0 when none).
std::vector<double> ColumnReference(
    const std::vector<const google::protobuf::RepeatedField<float>*>& series, int columns) {
  std::vector<double> out(columns, 0);
  std::vector<float> values;
  for (int c = 0; c < columns; ++c) {
    values.clear();
    for (const auto* s : series) {
      if (c < s->size() && (*s)[c] > 0) values.push_back((*s)[c]);
    }
    if (values.empty()) continue;
    const size_t k = static_cast<size_t>(0.1 * static_cast<double>(values.size() - 1));
    std::nth_element(values.begin(), values.begin() + k, values.end());
    out[c] = values[k];
  }
  return out;
}

std::string RatioLegend() {
  std::string out =
      "<svg class=\"legend\" role=\"img\" aria-label=\"colour scale: busy time relative to the "
      "column's fastest ranks\" width=\"760\" height=\"34\" font-size=\"11\">";
  for (int b = 0; b < kBins; ++b) {
    const std::string text =
        b == 0
            ? absl::StrCat("<", Num(kRatioBounds[0]))
            : (b == kBins - 1 ? absl::StrCat(">=", Num(kRatioBounds[b - 1]))
                              : absl::StrCat(Num(kRatioBounds[b - 1]), "-", Num(kRatioBounds[b])));
    absl::StrAppend(&out, "<rect class=\"f", b, "\" x=\"", b * 72,
                    "\" y=\"2\" width=\"70\" height=\"12\"/>", "<text x=\"", b * 72 + 2,
                    "\" y=\"28\">", EscapeHtml(text), "x</text>");
  }
  absl::StrAppend(&out, "<rect class=\"fn\" x=\"", kBins * 72 + 6,
                  "\" y=\"2\" width=\"30\" height=\"12\"/><text x=\"", kBins * 72 + 40,
                  "\" y=\"12\">no data</text><rect class=\"fl\" x=\"", kBins * 72 + 6,
                  "\" y=\"18\" width=\"30\" height=\"12\"/><text x=\"", kBins * 72 + 40,
                  "\" y=\"28\">flagged</text></svg>\n");
  return out;
}

std::string Caption(const v1::ReportTimeline& t, const std::string& what) {
  const int columns = t.columns_size();
  int64_t samples = 0;
  for (const v1::TimelineColumn& c : t.columns()) samples += c.samples();
  return absl::StrCat(
      "<p class=\"caption\">", what, " ", columns, " columns over steps ",
      StepRange(t.columns(0).first_step(), t.columns(columns - 1).last_step()),
      ". Not every step is drawn: the collector samples the job at its ticks (", samples,
      " samples in these columns, now at most one every ",
      Seconds(static_cast<double>(t.sample_interval_nanos()) / 1e9),
      "), each sample holding every rank's median over its recent window, and a column is the "
      "mean of the samples taken while its steps first..last ran. Adjacent columns are merged as "
      "the job grows, so the columns always span the whole job evenly.</p>\n");
}

struct RowExtreme {
  double ratio = 0;
  int column = -1;
};

RowExtreme Worst(const google::protobuf::RepeatedField<float>& values,
                 const std::vector<double>& ref) {
  RowExtreme w;
  for (int c = 0; c < values.size() && c < static_cast<int>(ref.size()); ++c) {
    if (values[c] < 0 || !(ref[c] > 0)) continue;
    const double r = values[c] / ref[c];
    if (r > w.ratio) w = {r, c};
  }
  return w;
}

std::string RankAttrs(const v1::RankSeries& r, bool flagged) {
  return absl::StrCat("data-rank=\"", r.rank(), "\" data-node=\"", EscapeHtml(r.node()),
                      "\" data-flagged=\"", Bool(flagged), "\"");
}

bool AnyFlagged(const v1::RankSeries& r) {
  return std::any_of(r.flagged().begin(), r.flagged().end(), [](bool f) { return f; });
}

bool StagesKnown(const v1::ReportTimeline& t) {
  int first = -1;
  for (const v1::RankSeries& r : t.ranks()) {
    if (r.pp_stage() < 0) continue;
    if (first < 0) first = r.pp_stage();
    if (r.pp_stage() != first) return true;
  }
  return false;
}

HeatRow RankRow(const v1::RankSeries& r, const google::protobuf::RepeatedField<float>& values,
                const std::vector<double>& ref, bool stages, int columns) {
  HeatRow row;
  row.label =
      stages ? absl::StrCat("r", r.rank(), " s", r.pp_stage()) : absl::StrCat("r", r.rank());
  row.attrs = RankAttrs(r, AnyFlagged(r));
  if (stages) absl::StrAppend(&row.attrs, " data-stage=\"", r.pp_stage(), "\"");
  const RowExtreme w = Worst(values, ref);
  row.title = absl::StrCat("rank ", r.rank(), " on ", EscapeHtml(r.node()), " GPU ", r.gpu(),
                           stages ? absl::StrCat(", stage ", r.pp_stage()) : "",
                           w.column >= 0 ? absl::StrCat(": at most ", Num(w.ratio), "x") : "");
  row.bins.resize(columns, -1);
  row.flagged.resize(columns, false);
  for (int c = 0; c < columns; ++c) {
    if (c < values.size()) row.bins[c] = RatioBin(values[c], ref[c]);
    if (c < r.flagged_size()) row.flagged[c] = r.flagged(c);
  }
  return row;
}

// Ranks in drawing order: by node, then stage, then rank.
std::vector<const v1::RankSeries*> Ordered(const v1::ReportTimeline& t) {
  std::vector<const v1::RankSeries*> out;
  for (const v1::RankSeries& r : t.ranks()) out.push_back(&r);
  std::stable_sort(out.begin(), out.end(), [](const v1::RankSeries* a, const v1::RankSeries* b) {
    if (a->node() != b->node()) return NaturalLess(a->node(), b->node());
    if (a->pp_stage() != b->pp_stage()) return a->pp_stage() < b->pp_stage();
    return a->rank() < b->rank();
  });
  return out;
}

// The slowest rows in words: the text alternative of a heatmap.
std::string SlowestText(const std::vector<const v1::RankSeries*>& ranks,
                        const std::vector<double>& ref, const v1::ReportTimeline& t) {
  std::vector<std::pair<RowExtreme, const v1::RankSeries*>> worst;
  int flagged = 0;
  for (const v1::RankSeries* r : ranks) {
    worst.emplace_back(Worst(r->busy_seconds(), ref), r);
    if (AnyFlagged(*r)) ++flagged;
  }
  std::sort(worst.begin(), worst.end(),
            [](const auto& a, const auto& b) { return a.first.ratio > b.first.ratio; });
  std::string out = absl::StrCat("<p class=\"summary\">", flagged, " of ", ranks.size(),
                                 " ranks flagged in some column.");
  if (!worst.empty() && worst[0].first.column >= 0) {
    out += " Slowest:";
    for (size_t i = 0; i < worst.size() && i < 3 && worst[i].first.column >= 0; ++i) {
      const v1::TimelineColumn& col = t.columns(worst[i].first.column);
      absl::StrAppend(&out, i > 0 ? ";" : "", " rank ", worst[i].second->rank(), " on ",
                      EscapeHtml(worst[i].second->node()), " at ", Num(worst[i].first.ratio),
                      "x (steps ", StepRange(col.first_step(), col.last_step()), ")");
    }
    out += ".";
  }
  return out + "</p>\n";
}

// More ranks than options.max_rank_rows: one row per node, each opening to its ranks.
std::string NodeRows(const v1::ReportTimeline& t, const std::vector<const v1::RankSeries*>& ranks,
                     const std::vector<double>& ref, bool stages) {
  const int columns = t.columns_size();
  std::map<std::string, std::vector<const v1::RankSeries*>, NaturalOrder> by_node;
  for (const v1::RankSeries* r : ranks) by_node[r->node()].push_back(r);
  std::map<std::string, const v1::NodeSeries*, NaturalOrder> nodes;
  for (const v1::NodeSeries& n : t.nodes()) nodes[n.node()] = &n;
  for (const auto& [name, list] : by_node) nodes.emplace(name, nullptr);
  std::string out = absl::StrCat("<svg class=\"hm\" width=\"", kLabelWidth + kPlotWidth + 10,
                                 "\" height=\"26\" aria-hidden=\"true\">",
                                 ColumnAxis(t, kLabelWidth, CellWidth(columns), 2),
                                 "</svg>\n<div class=\"nodes\">\n");
  for (const auto& [name, series] : nodes) {
    const auto it = by_node.find(name);
    const std::vector<const v1::RankSeries*> empty;
    const std::vector<const v1::RankSeries*>& members = it == by_node.end() ? empty : it->second;
    HeatRow row;
    row.label = EscapeHtml(name);
    row.bins.resize(columns, -1);
    row.flagged.resize(columns, false);
    for (const v1::RankSeries* r : members) {
      for (int c = 0; c < columns && c < r->flagged_size(); ++c) {
        if (r->flagged(c)) row.flagged[c] = true;
      }
    }
    for (int c = 0; c < columns; ++c) {
      if (series != nullptr && c < series->busy_seconds_size()) {
        row.bins[c] = RatioBin(series->busy_seconds(c), ref[c]);
      }
    }
    const bool flagged =
        std::find(row.flagged.begin(), row.flagged.end(), true) != row.flagged.end();
    const int node_ranks = series != nullptr ? series->ranks() : static_cast<int>(members.size());
    row.attrs = absl::StrCat("data-node=\"", EscapeHtml(name), "\" data-flagged=\"", Bool(flagged),
                             "\" data-ranks=\"", node_ranks, "\"");
    row.title = absl::StrCat(EscapeHtml(name), ": mean of its ", node_ranks, " ranks");
    absl::StrAppend(
        &out, "<details class=\"node\" data-node=\"", EscapeHtml(name), "\" data-flagged=\"",
        Bool(flagged), "\"><summary>",
        HeatmapSvg({row}, t, 8, absl::StrCat("node ", name, ": busy time of its ranks' mean"),
                   false),
        "</summary>\n");
    std::vector<HeatRow> rows;
    rows.reserve(members.size());
    for (const v1::RankSeries* r : members) {
      rows.push_back(RankRow(*r, r->busy_seconds(), ref, stages, columns));
    }
    if (rows.empty()) {
      out += "<p>No rank of this node has its own row (the collector's row limit).</p>\n";
    } else {
      absl::StrAppend(&out, HeatmapSvg(rows, t, 10, absl::StrCat("ranks of node ", name), false));
    }
    out += "</details>\n";
  }
  return out + "</div>\n";
}

std::string SectionMaps(const v1::ReportTimeline& t,
                        const std::vector<const v1::RankSeries*>& ranks, bool stages) {
  const int columns = t.columns_size();
  std::string out;
  for (int s = 0; s < t.section_names_size(); ++s) {
    std::vector<google::protobuf::RepeatedField<float>> values(ranks.size());
    std::vector<const google::protobuf::RepeatedField<float>*> series;
    for (size_t i = 0; i < ranks.size(); ++i) {
      const auto& all = ranks[i]->section_seconds();
      for (int c = 0; c < columns; ++c) {
        const int k = s * columns + c;
        values[i].Add(k < all.size() ? all[k] : -1.0f);
      }
      series.push_back(&values[i]);
    }
    const std::vector<double> ref = ColumnReference(series, columns);
    std::vector<HeatRow> rows;
    for (size_t i = 0; i < ranks.size(); ++i) {
      rows.push_back(RankRow(*ranks[i], values[i], ref, stages, columns));
      absl::StrAppend(&rows.back().attrs, " data-section=\"", EscapeHtml(t.section_names(s)), "\"");
      rows.back().gap_before = i > 0 && ranks[i]->node() != ranks[i - 1]->node();
    }
    const std::string name = EscapeHtml(t.section_names(s));
    absl::StrAppend(&out, "<figure class=\"section\"><figcaption>Section <b>", name,
                    "</b></figcaption>",
                    HeatmapSvg(rows, t, ranks.size() <= 32 ? 8 : 3,
                               absl::StrCat("section ", t.section_names(s),
                                            ": time per rank and column relative to the column's "
                                            "fastest ranks"),
                               true),
                    "</figure>\n");
  }
  return out;
}

}  // namespace

std::string RenderHeatmaps(const v1::JobReport& report, const ReportHtmlOptions& options) {
  const v1::ReportTimeline& t = report.timeline();
  const int columns = t.columns_size();
  if (columns == 0 || (t.ranks_size() == 0 && t.nodes_size() == 0)) return "";
  const std::vector<const v1::RankSeries*> ranks = Ordered(t);
  std::vector<const google::protobuf::RepeatedField<float>*> series;
  series.reserve(ranks.size());
  for (const v1::RankSeries* r : ranks) series.push_back(&r->busy_seconds());
  if (series.empty()) {
    for (const v1::NodeSeries& n : t.nodes()) series.push_back(&n.busy_seconds());
  }
  const std::vector<double> ref = ColumnReference(series, columns);
  const bool stages = StagesKnown(t);
  const bool by_node =
      static_cast<int>(ranks.size()) > options.max_rank_rows || t.ranks_omitted() > 0;

  std::string out =
      "<section id=\"heatmap\"><h2>Busy time per rank and step</h2>\n"
      "<p>Each cell: a rank's busy time (compute and data, not waiting) divided by the 10th "
      "percentile of the column's ranks, so the fastest ranks read 1.0 and a straggler stands "
      "out whatever the step time; outlined cells were flagged by the collector.";
  if (by_node) {
    absl::StrAppend(&out, " ", ranks.size() + t.ranks_omitted(),
                    " ranks: one row per node (its ranks' mean), open a node for its ranks",
                    t.ranks_omitted() > 0
                        ? absl::StrCat(" (", t.ranks_omitted(),
                                       " ranks past the collector's row limit appear only in "
                                       "their node's row)")
                        : "",
                    ".");
  }
  out += "</p>\n" + RatioLegend();
  if (by_node) {
    out += NodeRows(t, ranks, ref, stages);
  } else {
    std::vector<HeatRow> rows;
    for (size_t i = 0; i < ranks.size(); ++i) {
      rows.push_back(RankRow(*ranks[i], ranks[i]->busy_seconds(), ref, stages, columns));
      const bool new_node = i == 0 || ranks[i]->node() != ranks[i - 1]->node();
      rows.back().gap_before = i > 0 && new_node;
      if (new_node)
        rows.back().label = absl::StrCat(EscapeHtml(ranks[i]->node()), " ", rows.back().label);
    }
    const int n = static_cast<int>(rows.size());
    out += HeatmapSvg(rows, t, n <= 32 ? 16 : (n <= 96 ? 10 : 5),
                      absl::StrCat("heatmap of busy time, ", n, " ranks by ", columns, " columns"),
                      true);
  }
  out += SlowestText(ranks, ref, t);
  out += Caption(t, "Step axis:");
  if (t.section_names_size() > 0 && !ranks.empty()) {
    out += "<h3>Per section</h3>\n<div class=\"sections\">" + SectionMaps(t, ranks, stages) +
           "</div>\n";
  }
  return out + "</section>\n";
}

std::string RenderGpuHeatmaps(const v1::JobReport& report) {
  const v1::ReportTimeline& t = report.timeline();
  const int columns = t.columns_size();
  std::string out;
  for (int which = 0; which < 2; ++which) {
    std::vector<HeatRow> rows;
    bool known = false;
    for (const v1::NodeSeries& n : t.nodes()) {
      const auto& values = which == 0 ? n.gpu_utilization_ratio() : n.sm_active_ratio();
      HeatRow row;
      row.label = EscapeHtml(n.node());
      row.attrs = absl::StrCat("data-node=\"", EscapeHtml(n.node()), "\"");
      double sum = 0;
      int count = 0;
      for (int c = 0; c < columns; ++c) {
        const double v = c < values.size() ? values[c] : -1;
        row.bins.push_back(ShareBin(v));
        if (v >= 0) {
          known = true;
          sum += v;
          ++count;
        }
      }
      row.title = absl::StrCat(
          EscapeHtml(n.node()),
          count > 0 ? absl::StrCat(": mean ", Num(100 * sum / count), "%") : ": unknown");
      rows.push_back(std::move(row));
    }
    if (!known) continue;
    const char* name = which == 0 ? "GPU utilization" : "SM activity";
    const int n = static_cast<int>(rows.size());
    absl::StrAppend(&out, "<h3>", name, " per node</h3>\n",
                    HeatmapSvg(rows, t, n <= 32 ? 14 : (n <= 128 ? 6 : 3),
                               absl::StrCat(name, " per node over the job, 0 to 100%"), true));
  }
  if (out.empty()) return "";
  std::string legend =
      "<svg class=\"legend\" role=\"img\" aria-label=\"colour scale: 0 to 100 percent\" "
      "width=\"620\" height=\"30\" font-size=\"11\">";
  for (int b = 0; b < kBins; ++b) {
    absl::StrAppend(&legend, "<rect class=\"f", b, "\" x=\"", b * 72,
                    "\" y=\"2\" width=\"70\" height=\"12\"/>", "<text x=\"", b * 72 + 2,
                    "\" y=\"26\">", b * 100 / kBins, "-", (b + 1) * 100 / kBins, "%</text>");
  }
  legend += "</svg>\n";
  return absl::StrCat(
      "<section id=\"gpu\"><h2>GPUs per node</h2>\n<p>The mean over each node's "
      "GPUs, per column (darker: less busy).</p>\n",
      legend, out, "</section>\n");
}

}  // namespace stepwatch::ctl::html
