// Findings for humans: the summary and the action line, rendered from a finding's kind, cause,
// location and evidence. The one place that words findings; detectors only fill in fields.
#pragma once

#include <string>

#include "analysis/engine.h"

namespace stepwatch::analysis {

// One line, e.g. "rank 13 on node-2 GPU 5: compute +31% vs median; slower GPU: SM clock 1410 of
// 1980 MHz, thermal throttling".
std::string RenderSummary(const Finding& f);

// What the operator should do, one line, e.g. "drain node-2 or inspect node-2 GPU 5: cooling
// (fans, airflow)".
std::string RenderAction(const Finding& f);

// Sets f->summary and f->action (the engine calls it once per finding it produces).
void RenderFinding(Finding* f);

}  // namespace stepwatch::analysis
