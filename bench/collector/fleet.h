// A synthetic fleet for the collector's size and memory benchmarks: report batches as agents on
// `nodes` nodes of `gpus` GPUs would send them, with `ranks_per_node` ranks each, grouped into jobs
// of `world_size` ranks.
#pragma once

#include <cstdint>
#include <string>

#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector::bench {

struct FleetSpec {
  int nodes = 10000;
  int gpus = 8;
  int ranks_per_node = 8;
  int world_size = 512;
  std::string job_prefix = "job";
  std::string node_prefix = "node";
  // The agents' boot id: a new one starts a new batch sequence (a restarted agent).
  std::string boot_id = "boot-1";
  // Every rank of this global index is busy this much longer (a straggler); -1: none.
  int slow_rank = -1;
  double slow_extra_s = 0.05;
};

std::string NodeName(const FleetSpec& spec, int node);

// The readings NVML and GPM give for GPU `gpu` of node number `node` on a busy Hopper GPU
// (utilization, memory, clocks, power, temperature, SM/DRAM/tensor activity, one process); the
// load generator (bench/loadgen) sends these, FleetBatch adds PCIe, NVLink and throttle reasons.
void FillBusyGpuSample(int node, int gpu, int64_t now_unix_nanos, v1::GpuSample* s);
// A host sample: CPU utilization and count, memory total and available.
void FillBusyHostSample(int64_t now_unix_nanos, v1::HostSample* h);

// The batch number `seq` (1, 2, ...) of `node`: one step (`step`) of each of its ranks, a sample
// of each GPU with the fields NVML and GPM give on a Hopper GPU, and a host sample.
v1::ReportBatch FleetBatch(const FleetSpec& spec, int node, int64_t step, uint64_t seq,
                           int64_t now_unix_nanos);

}  // namespace stepwatch::collector::bench
