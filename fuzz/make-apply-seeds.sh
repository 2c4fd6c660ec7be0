#!/usr/bin/env bash
# Writes the binary ReportBatch seeds of fuzz_collector_apply from the text protos below (protoc
# --encode), so that the seeds can be read and changed as text.
# Usage: fuzz/make-apply-seeds.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=fuzz/corpus/fuzz_collector_apply
mkdir -p "$out"

encode() {
  protoc --proto_path=proto --encode=stepwatch.v1.ReportBatch stepwatch/v1/stepwatch.proto >"$out/$1"
}

# Two ranks of one job, one slow; identity and node info as an agent sends them.
encode steps.bin <<'PB'
agent_id: "agent-n0" boot_id: "boot-1" seq: 1 base_seq: 1 created_unix_nanos: 1700000000000000000
node { node: "n0" hostname: "n0" agent_version: "0.1.0" nvml_available: true gpu_count: 2 }
steps { job: "bert" rank: 0 world_size: 2 step: 10 step_s: 0.5 data_s: 0.01 compute_s: 0.3
        comm_s: 0.19 samples: 32 local_rank: 0 gpu: 0 pid: 100 received_unix_nanos: 1700000000000000000 }
steps { job: "bert" rank: 1 world_size: 2 step: 10 step_s: 0.5 data_s: 0.01 compute_s: 0.45
        comm_s: 0.04 samples: 32 local_rank: 1 gpu: 1 pid: 101 received_unix_nanos: 1700000000000000000 }
PB

# GPU and host samples only.
encode samples.bin <<'PB'
agent_id: "agent-n1" boot_id: "boot-2" seq: 7 base_seq: 5
node { node: "n1" nvml_available: true gpu_count: 2 driver_version: "550.54" }
gpus { index: 0 uuid: "GPU-0" name: "H100" sampled_unix_nanos: 1700000000000000000
       utilization_gpu_ratio: 0.9 memory_used_bytes: 1000 memory_total_bytes: 8000
       sm_clock_mhz: 1400 sm_clock_max_mhz: 1980 power_watts: 300 power_limit_watts: 700
       temperature_celsius: 70 throttle_reasons: 32 sm_activity_ratio: 0.8 pids: 100 pids: 101 }
gpus { index: 1 uuid: "GPU-1" sampled_unix_nanos: 1700000000000000000
       unavailable_metrics { key: "power_watts" value: "not supported" } }
host { sampled_unix_nanos: 1700000000000000000 cpu_utilization_ratio: 0.5 cpu_count: 16
       memory_total_bytes: 64000000000 memory_available_bytes: 32000000000
       network_receive_bytes_total: 100 network_transmit_bytes_total: 200
       memory_bandwidth_bytes_per_second: 1e9 memory_bandwidth_source: "resctrl" }
PB

# A one-rank job whose rank exits in the same batch (the job finishes).
encode exit.bin <<'PB'
agent_id: "agent-n0" boot_id: "boot-1" seq: 3 base_seq: 1
node { node: "n0" }
steps { job: "short" rank: 0 world_size: 1 step: 0 step_s: 1 pid: 200 received_unix_nanos: 1700000000000000000 }
rank_exits { job: "short" rank: 0 pid: 200 exited_unix_nanos: 1700000000000000000 }
PB

# Edge values: a far-off clock, a rank beyond world_size, a pipeline stage, a huge step.
encode edges.bin <<'PB'
agent_id: "a" boot_id: "b" seq: 18446744073709551615 base_seq: 18446744073709551615
created_unix_nanos: -1
node { node: "" }
steps { job: "x" rank: 3 world_size: 2 step: 9223372036854775807 step_s: 1e-300 received_unix_nanos: 9223372036854775807 }
steps { job: "x" rank: 0 world_size: 4 step: 0 step_s: 86400 pp_stage: 3 tp_rank: 1 dp_rank: 0 received_unix_nanos: -9223372036854775808 }
rank_exits { job: "nobody" rank: -1 pid: 0 exited_unix_nanos: 0 }
PB
