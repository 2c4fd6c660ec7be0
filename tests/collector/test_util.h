// Shared helpers of the collector tests: batch builders, a tiny HTTP client for /metrics, promtool.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector::testing {

// One batch from `node` holding one step of every rank in [0, world_size): each rank busy for
// `busy_seconds` (compute), except `slow_rank` (if >= 0) busy for `slow_busy_s`; everyone's step
// time is the slowest busy time plus 5 ms, as in synchronous training.
v1::ReportBatch StepBatch(const std::string& node, uint64_t seq, const std::string& job,
                          int world_size, int64_t step, double busy_seconds, int slow_rank = -1,
                          double slow_busy_s = 0);

// An empty batch from agent "agent-<node>", boot "boot-1".
v1::ReportBatch EmptyBatch(const std::string& node, uint64_t seq);

// GET http://127.0.0.1:port/path; the body on a 200 answer.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

// Runs `promtool check metrics` on `exposition`; the empty string when it is clean, otherwise its
// complaints. Unavailable when promtool was not found at build time.
absl::StatusOr<std::string> PromtoolCheck(const std::string& exposition);

}  // namespace stepwatch::collector::testing
