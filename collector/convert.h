// Conversion between the stepwatch.v1 wire messages and the analysis library's plain structs. The
// analysis library knows nothing of protobuf; this is the only place that knows both.
#pragma once

#include <string>

#include "analysis/engine.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

// `node` is the node of the agent that received the event; `default_received_unix_nanos` is used
// when the agent did not stamp the event.
analysis::StepEvent ToStepSample(const v1::StepEvent& event, const std::string& node,
                                 int64_t default_received_unix_nanos);
// The same, overwriting every field of `*out` (reusing its string capacity).
void FillStepSample(const v1::StepEvent& event, const std::string& node,
                    int64_t default_received_unix_nanos, analysis::StepEvent* out);
analysis::GpuSample ToGpuReading(const v1::GpuSample& sample, const std::string& node);
analysis::HostSample ToHostReading(const v1::HostSample& sample, const std::string& node);
// When a rank's process exited: the agent's stamp, or `default_unix_nanos` when it sent none.
int64_t ExitedUnixNanos(const v1::RankExit& exit, int64_t default_unix_nanos);

// The job's what-ifs (fix -> speed-up) and what each is (fix -> "estimate", "lower_bound" or
// "upper_bound"); "pipeline" only for a job whose stages it would balance.
void WhatIfToProto(const analysis::WhatIf& whatif,
                   google::protobuf::Map<std::string, double>* speedup,
                   google::protobuf::Map<std::string, std::string>* kind);

void ToProto(const analysis::Finding& finding, v1::Finding* out);
void ToProto(const analysis::JobSnapshot& job, int finding_count, v1::JobStatus* out);
void ToProto(const analysis::RankSnapshot& rank, v1::RankRow* out);

}  // namespace stepwatch::collector
