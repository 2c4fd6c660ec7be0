// Text and JSON renderings of job reports (stepwatchctl report), kept apart from the gRPC client
// so that they can be tested on canned reports.
#pragma once

#include <string>

#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::ctl {

// One job's report: state, steps, times, last known efficiency, breakdown and what-ifs, and every
// finding with the steps it started and cleared at.
std::string FormatReport(const v1::JobReport& report);
// The recent reports, one row each: job, state, world size, steps, end time, findings.
std::string FormatReportList(const v1::ReportResponse& response);

// JSON for programs: numbers as numbers, null for what is unknown (efficiency_ratio, breakdown
// and whatif of a job that never reported its split; end times while running), times also as
// RFC 3339 UTC strings. A report is an object; a listing is {"reports": [...]} without findings.
std::string ReportToJson(const v1::JobReport& report);
std::string ReportListToJson(const v1::ReportResponse& response);

}  // namespace stepwatch::ctl
