// The Query service's answers (stepwatchctl status, findings, explain, report), as pure functions
// of what readers see: a published state, or the report store. They never take the ingest mutex.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "collector/published_state.h"
#include "collector/report_store.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

// Jobs, then nodes while the answer stays under `max_answer_bytes` (the rest are left out, and
// logged), so that it always fits the gRPC send limit.
v1::StatusResponse StatusAnswer(const PublishedState& view, int64_t max_answer_bytes);
// Findings of `job`, or of every job when it is empty (idle GPUs included), under
// `max_answer_bytes` the same way.
v1::FindingsResponse FindingsAnswer(const PublishedState& view, absl::string_view job,
                                    int64_t max_answer_bytes);
// NotFound for a job the view does not hold.
absl::StatusOr<v1::ExplainResponse> ExplainAnswer(const PublishedState& view,
                                                  absl::string_view job);
// Every report when `job` is empty, else that job's (NotFound when there is none).
absl::Status ReportAnswer(const ReportStore& reports, absl::string_view job,
                          v1::ReportResponse* response);

}  // namespace stepwatch::collector
