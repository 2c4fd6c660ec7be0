// Text and JSON renderings of the Query service's answers, kept apart from the gRPC client so that
// they can be tested on canned responses.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ctl/whatif_summary.h"
#include "google/protobuf/message.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::ctl {

// "12.3 ms", "1.25 s", "850 us".
std::string FormatDuration(double seconds);
// "78%" (0.78), "-" for negative or non-finite input.
std::string FormatPercent(double ratio);
// A horizontal bar of `fraction` (clamped to 0..1) x `width` cells with eighth-cell resolution,
// e.g. "██████▍".
std::string Bar(double fraction, int width);

// Renders rows as left-aligned columns separated by two spaces (the last column is not padded, so
// it may hold multi-byte text such as bars).
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);
// A Kubernetes pod as "NAMESPACE/POD" ("-" where unknown), and its container ("-" when unknown).
std::string PodCell(const v1::KubernetesPod& pod);
std::string ContainerCell(const v1::KubernetesPod& pod);
// Adds POD and CONTAINER columns to `rows` (a header and one row per entry of `pods`) when any
// of `pods` names one: off Kubernetes the tables stay as they were.
void AddPodColumns(const std::vector<const v1::KubernetesPod*>& pods,
                   std::vector<std::vector<std::string>>* rows);

// The jobs table alone (stepwatchctl status JOB).
std::string FormatJobs(const v1::StatusResponse& status);
// Jobs and nodes; `now_unix_nanos` is used to show how long ago each node reported.
std::string FormatStatus(const v1::StatusResponse& status, int64_t now_unix_nanos);
std::string FormatFindings(const v1::FindingsResponse& findings);

struct ExplainFormatOptions {
  int bar_width = 24;
  // With more ranks than this, the table shows the ranks furthest above the median (flagged ones
  // always) and says how many it left out.
  int max_rank_rows = 64;
};
std::string FormatExplain(const v1::ExplainResponse& explain,
                          const ExplainFormatOptions& options = {});

// The what-ifs of `explain` taken together (ctl/whatif_summary.h).
WhatIfSummary SummarizeWhatIf(const v1::ExplainResponse& explain);

}  // namespace stepwatch::ctl
