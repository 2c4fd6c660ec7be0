// The memory budget's accounted costs: what each tracked job, rank, node and GPU is charged
// (CollectorStateOptions::max_memory_bytes). CollectorState's Charge, Refund and EraseJob, in
// memory_budget.cc, keep the running total.
#pragma once

#include <cstdint>
#include <string>

#include "analysis/engine.h"
#include "collector/published_state.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

// Accounted bytes per tracked item, derived from bench/collector/memory_cost_bench.cc (see
// MemoryCostsFor in memory_budget.cc).
struct MemoryCosts {
  int64_t job = 0;        // a job's own state
  int64_t rank_slot = 0;  // per unit of a job's world_size (the engine keeps a slot per rank)
  int64_t rank = 0;       // a rank that reported: its windows and its share of pending steps
  int64_t node = 0;       // a node (agent): its view, host reading and deduplication state
  int64_t gpu = 0;        // a GPU of a node: its last sample, twice (view and engine)
};
MemoryCosts MemoryCostsFor(const analysis::EngineOptions& engine);

// What a new job is charged: its state, the copies of its name and of the opening node's, its
// rank slots and its first rank (`rank_bytes`, see RankBytes).
int64_t NewJobBytes(const MemoryCosts& costs, const std::string& job, const std::string& node,
                    int world_size, int64_t rank_bytes);
// What each rank of `job` is charged: MemoryCosts::rank and the copies of the job's name (the
// node index) and of the node's (the rank's record).
int64_t RankBytes(const MemoryCosts& costs, const std::string& job, const std::string& node);
// What a node's strings take beyond MemoryCosts::node: its name (map key, view, node info, the
// engine's records), agent id, node info and host sample.
int64_t NodeTextBytes(const NodeSnapshot& view);
// What a GPU of `node` is charged: MemoryCosts::gpu, its kept strings and lists, and the engine's
// copy of the node name.
int64_t GpuBytes(const MemoryCosts& costs, const v1::GpuSample& sample, const std::string& node);

}  // namespace stepwatch::collector
