// Merging the answers of several collectors into one, as if one collector had seen every job:
// jobs are sharded and replicated over collectors (common/collectors.h), so the same job, node or
// finding can come from two replicas, and a job that moved during a failover from two owners.
// Pure functions on the Query service's messages, so that they can be tested on canned answers.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::ctl {

// How many of a job's owners to ask: --replicas, at least 1, at most the number of collectors
// (as the agent places it).
int EffectiveReplicas(int replicas_flag, size_t collector_count);

// Whether replica `a` of a job has newer data than replica `b`. Decided by last_step (the job's own
// step counter, comparable across collectors whatever their clocks), then ranks_reporting (the
// fuller view, e.g. of the replica whose window did not restart), then last_seen_unix_nanos.
bool NewerJobStatus(const v1::JobStatus& a, const v1::JobStatus& b);

// What makes two findings the same one, whichever replica reports it.
using FindingIdentity =
    std::tuple<std::string, std::string, int32_t, std::string, int32_t, int32_t, std::string>;
// (kind, job, rank, node, gpu, stage, cause).
FindingIdentity IdentityOf(const v1::Finding& f);

// The union of jobs (by name; of two replicas the one NewerJobStatus picks) and of nodes (by name;
// the latest last_seen_unix_nanos), each sorted by name. One answer is returned as it is.
v1::StatusResponse MergeStatus(const std::vector<v1::StatusResponse>& answers);

// The findings deduplicated by IdentityOf (of two, the one active since the earlier step: the
// replica that has watched the job longer), ordered by job, kind, rank as one collector orders
// them. One answer is returned as it is.
v1::FindingsResponse MergeFindings(const std::vector<v1::FindingsResponse>& answers);

// A replica whose newest data of a job is older than the freshest replica's by more than this no
// longer receives the job (it moved to other collectors during a failover, or back after one); it
// keeps its last findings until --expire. The shipped alert rules judge replicas the same way.
inline constexpr int64_t kStaleReplicaNanos = 15'000'000'000;

// `answers[i]` without the findings of the jobs that `statuses[i]` (the same collector's Status)
// shows stale: last_seen_unix_nanos more than kStaleReplicaNanos before the freshest replica's in
// `statuses`. A null status, or a job its status does not list, keeps the findings.
std::vector<v1::FindingsResponse> WithoutStaleReplicas(
    std::vector<v1::FindingsResponse> answers,
    const std::vector<const v1::StatusResponse*>& statuses);

// One job explained by several owners: the answer with the newest job data (NewerJobStatus)
// gives the figures and the rank table; the findings are those of every answer whose job data is
// not stale (kStaleReplicaNanos), deduplicated, and the job's finding_count is their number. One
// answer is returned as it is.
v1::ExplainResponse MergeExplain(const std::vector<v1::ExplainResponse>& answers);

// One job's report from several owners: the most recently updated one gives the figures; its
// life spans the earliest start and first step of all; the findings are those of every report,
// two being the same when their identity matches and their step spans overlap (the earlier kept),
// oldest first. One report is returned as it is.
v1::JobReport MergeReports(const std::vector<v1::JobReport>& reports);

// Report listings of every collector: one row per job (the most recently updated), newest first,
// ties by job name, as one collector lists them. One answer is returned as it is.
v1::ReportResponse MergeReportLists(const std::vector<v1::ReportResponse>& answers);

}  // namespace stepwatch::ctl
