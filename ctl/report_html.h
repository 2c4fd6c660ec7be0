// A job report as one self-contained HTML page: every style inline, charts as SVG generated here,
// no script or font fetched from anywhere, so the file opens offline. Used by
// `stepwatchctl report JOB --html` and by the pages of `stepwatchctl serve`.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::ctl {

struct ReportHtmlOptions {
  // Heatmap rows drawn one per rank up to this many ranks; beyond it one row per node, each
  // expandable to its ranks.
  int max_rank_rows = 256;
  // When positive the page reloads itself this often (the live view), in whole seconds.
  absl::Duration refresh = absl::ZeroDuration();
  // Prefix of links to other pages of the live view (e.g. "/"); empty in a saved file, which
  // links nowhere.
  std::string site_root;
};

// The whole page of `report` (running or finished).
std::string RenderReportHtml(const v1::JobReport& report, const ReportHtmlOptions& options = {});

// Text made safe inside HTML element content and double-quoted attribute values.
std::string EscapeHtml(const std::string& text);

}  // namespace stepwatch::ctl
