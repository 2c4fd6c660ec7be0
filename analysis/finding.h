// Helpers for building findings: the finding type itself is public (engine.h); these are the
// pieces every detector shares when it fills one in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/engine.h"

namespace stepwatch::analysis {

// Sets the single cause of a finding (no cause listed when it is unknown).
void SetCause(Finding* f, Cause c);

// A finding about a whole job (not one rank, node or GPU).
Finding JobFinding(FindingKind kind, const std::string& job, int64_t since_step,
                   int64_t since_unix_nanos);

// Sorted, at most `max` ranks (EngineOptions::max_finding_ranks).
std::vector<int> BoundedRanks(std::vector<int> ranks, int max);

// "31%" and "120 ms" / "1.50 s", as the summaries write them.
std::string Percent(double ratio);
std::string Seconds(double s);

}  // namespace stepwatch::analysis
