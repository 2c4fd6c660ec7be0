// Reads a collector's /metrics the way Prometheus would (one HTTP GET) and keeps only what the load
// generator measures with: which (job, rank) pairs have a straggler finding and which jobs the
// collector analyses (stepwatch_job_last_step).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stepwatch::loadgen {

struct MetricsView {
  // stepwatch_finding{kind="straggler"} series: (job, rank).
  std::set<std::pair<std::string, int>> stragglers;
  // stepwatch_job_last_step: job -> highest step the collector has seen.
  std::map<std::string, int64_t> last_step;
  int64_t bytes = 0;
  double seconds = 0;  // request to last byte
};

// Extracts the view from a /metrics body (Prometheus text format).
MetricsView ParseMetrics(absl::string_view body);

// GET http://HOST:PORT/metrics with a `timeout_s` bound on connect and each read.
absl::StatusOr<MetricsView> ScrapeMetrics(const std::string& host_port, double timeout_s);

}  // namespace stepwatch::loadgen
