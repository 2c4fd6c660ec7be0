#include "bench/collector/fleet.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stepwatch::collector::bench {

void FillBusyGpuSample(int node, int gpu, int64_t now_unix_nanos, v1::GpuSample* s) {
  s->set_index(gpu);
  s->set_uuid(absl::StrFormat("GPU-%08x-0000-0000-0000-%012d", node, gpu));
  s->set_name("NVIDIA H100 80GB HBM3");
  s->set_sampled_unix_nanos(now_unix_nanos);
  s->set_utilization_gpu_ratio(0.93);
  s->set_utilization_memory_ratio(0.41);
  s->set_memory_used_bytes(uint64_t{71} << 30);
  s->set_memory_total_bytes(uint64_t{80} << 30);
  s->set_sm_clock_mhz(1980);
  s->set_sm_clock_max_mhz(1980);
  s->set_power_watts(612.5);
  s->set_power_limit_watts(700);
  s->set_temperature_celsius(64);
  s->set_sm_activity_ratio(0.71);
  s->set_dram_bandwidth_ratio(0.52);
  s->set_tensor_activity_ratio(0.44);
  s->add_pids(10000 + gpu);
}

void FillBusyHostSample(int64_t now_unix_nanos, v1::HostSample* h) {
  h->set_sampled_unix_nanos(now_unix_nanos);
  h->set_cpu_utilization_ratio(0.31);
  h->set_cpu_count(192);
  h->set_memory_total_bytes(uint64_t{2} << 40);
  h->set_memory_available_bytes(uint64_t{1} << 40);
}

std::string NodeName(const FleetSpec& spec, int node) {
  return absl::StrFormat("%s-%05d", spec.node_prefix, node);
}

v1::ReportBatch FleetBatch(const FleetSpec& spec, int node, int64_t step, uint64_t seq,
                           int64_t now_unix_nanos) {
  v1::ReportBatch b;
  const std::string name = NodeName(spec, node);
  b.set_agent_id(absl::StrCat("agent-", name));
  b.set_boot_id(spec.boot_id);
  b.set_seq(seq);
  b.set_base_seq(seq);
  b.set_created_unix_nanos(now_unix_nanos);
  b.mutable_node()->set_node(name);
  b.mutable_node()->set_nvml_available(spec.gpus > 0);
  b.mutable_node()->set_gpu_count(spec.gpus);
  for (int i = 0; i < spec.ranks_per_node; ++i) {
    const int global = node * spec.ranks_per_node + i;
    v1::StepEvent* e = b.add_steps();
    e->set_job(absl::StrCat(spec.job_prefix, "-", global / spec.world_size));
    e->set_rank(global % spec.world_size);
    e->set_world_size(spec.world_size);
    e->set_step(step);
    const double busy =
        0.1 + 0.0005 * (global % 5) + (global == spec.slow_rank ? spec.slow_extra_s : 0);
    e->set_step_seconds(0.2);
    e->set_data_seconds(0.005);
    e->set_compute_seconds(busy - 0.005);
    e->set_comm_seconds(0.2 - busy);
    e->set_samples(64);
    e->set_local_rank(i);
    if (spec.gpus > 0) e->set_gpu(i % spec.gpus);
    e->set_pid(10000 + i);
    e->set_received_unix_nanos(now_unix_nanos);
  }
  for (int g = 0; g < spec.gpus; ++g) {
    v1::GpuSample* s = b.add_gpus();
    FillBusyGpuSample(node, g, now_unix_nanos, s);
    s->set_throttle_reasons(0);
    s->set_pcie_tx_bytes_per_second(1.5e9);
    s->set_pcie_rx_bytes_per_second(2.5e9);
    s->set_nvlink_tx_bytes_per_second(1.2e11);
    s->set_nvlink_rx_bytes_per_second(1.2e11);
  }
  v1::HostSample* h = b.mutable_host();
  FillBusyHostSample(now_unix_nanos, h);
  h->set_network_receive_bytes_total(uint64_t{123456789012});
  h->set_network_transmit_bytes_total(uint64_t{98765432109});
  return b;
}

}  // namespace stepwatch::collector::bench
