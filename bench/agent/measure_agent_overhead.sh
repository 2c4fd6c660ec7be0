#!/usr/bin/env bash
# Measures stepwatch-agent's CPU use and resident memory at --interval=1 with 8 fake GPUs (the
# project's fake NVML), while a sender reports step events for 8 ranks.
#
#   bench/agent/measure_agent_overhead.sh [BUILD_DIR] [SECONDS] [EVENTS_PER_SECOND]
#
# BUILD_DIR defaults to ./build, SECONDS to 30, EVENTS_PER_SECOND to 16 (8 ranks, 2 steps/s).
# When BUILD_DIR has stepwatch-collector, the agent ships to a real collector; otherwise to an
# address where nothing listens (the agent then keeps its batches and retries, which costs a
# little more; STEPWATCH_COLLECTOR_BIN names another collector binary). STEPWATCH_HOST_ROOT sets
# the agent's --host-root (e.g. a fake sysfs tree of NIC ports from tests/integration/nic_sysfs.py)
# and STEPWATCH_INTERVAL its --interval (default 1). CPU% comes from utime+stime in /proc/PID/stat over the measured window (after a
# 5 s warm-up); RSS is VmRSS from /proc/PID/status at the end, and VmHWM the peak.
set -euo pipefail

BUILD_DIR=${1:-build}
SECONDS_TO_RUN=${2:-30}
RATE=${3:-16}
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
AGENT=$BUILD_DIR/agent/stepwatch-agent
COLLECTOR=${STEPWATCH_COLLECTOR_BIN:-$BUILD_DIR/collector/stepwatch-collector}
FAKE_NVML=$BUILD_DIR/tests/gpu/fake_nvml/libnvidia-ml.so.1
for f in "$AGENT" "$FAKE_NVML"; do
  [[ -e $f ]] || { echo "missing $f (build the stepwatch-agent and fake_nvml targets)" >&2; exit 1; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/stepwatch-overhead-XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Eight GPUs as the fake NVML documents them (docs/fake-nvml.md).
python3 - "$WORK/nvml.json" <<'PY'
import json, sys
gpus = [{"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i:08d}", "utilization_gpu": 90,
         "utilization_memory": 40, "memory_used_bytes": 40 << 30, "memory_total_bytes": 80 << 30,
         "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "power_mw": 600000,
         "power_limit_mw": 700000, "temperature_c": 60, "throttle_reasons": 0,
         "pcie_tx_kbps": 1000, "pcie_rx_kbps": 1000, "sm_activity": 0.8, "dram_bandwidth": 0.5,
         "tensor_activity": 0.6, "pids": [1000 + i]} for i in range(8)]
json.dump({"driver_version": "550.54.15", "gpus": gpus}, open(sys.argv[1], "w"))
PY

COLLECTOR_ADDR=127.0.0.1:$(free_port)
if [[ -x $COLLECTOR ]]; then
  "$COLLECTOR" --grpc-listen="$COLLECTOR_ADDR" --metrics-listen=127.0.0.1:$(free_port) \
    >"$WORK/collector.log" 2>&1 &
  PIDS+=($!)
  echo "collector: $COLLECTOR_ADDR"
else
  echo "collector: none (no $COLLECTOR); the agent ships to an address where nothing listens"
fi

SOCK=$WORK/agent.sock
STEPWATCH_FAKE_NVML_STATE=$WORK/nvml.json "$AGENT" --collector="$COLLECTOR_ADDR" --socket="$SOCK" \
  --node=overhead-node --interval="${STEPWATCH_INTERVAL:-1}" --nvml-library="$FAKE_NVML" \
  ${STEPWATCH_HOST_ROOT:+--host-root="$STEPWATCH_HOST_ROOT"} \
  --metrics-listen=127.0.0.1:$(free_port) >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!
PIDS+=($AGENT_PID)
for _ in $(seq 100); do [[ -S $SOCK ]] && break; sleep 0.1; done
[[ -S $SOCK ]] || { echo "agent did not start:"; cat "$WORK/agent.log"; exit 1; }

# Step events for 8 ranks at RATE events/s, until killed.
python3 - "$SOCK" "$RATE" <<'PY' &
import json, socket, sys, time
path, rate = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setblocking(False)
step = 0
while rate > 0:
    for rank in range(8):
        ev = {"job": "overhead", "rank": rank, "world_size": 8, "step": step, "step_s": 0.5,
              "data_s": 0.01, "compute_s": 0.4, "comm_s": 0.09, "samples": 32}
        try:
            s.sendto(json.dumps(ev).encode(), path)
        except OSError:
            pass
    step += 1
    time.sleep(8 / rate)
PY
PIDS+=($!)

ticks() { awk '{print $14 + $15}' "/proc/$AGENT_PID/stat"; }
HZ=$(getconf CLK_TCK)
sleep 5
T0=$(ticks); S0=$(date +%s.%N)
sleep "$SECONDS_TO_RUN"
T1=$(ticks); S1=$(date +%s.%N)
RSS_KB=$(awk '/^VmRSS/ {print $2}' "/proc/$AGENT_PID/status")
HWM_KB=$(awk '/^VmHWM/ {print $2}' "/proc/$AGENT_PID/status")
python3 - "$T0" "$T1" "$S0" "$S1" "$HZ" "$RSS_KB" "$HWM_KB" "$RATE" <<'PY'
import sys
t0, t1, s0, s1, hz, rss, hwm, rate = map(float, sys.argv[1:])
cpu = (t1 - t0) / hz / (s1 - s0) * 100
print(f"stepwatch-agent, 8 fake GPUs, {rate:g} step events/s, {s1 - s0:.0f} s:")
print(f"  CPU: {cpu:.2f}% of one core ({(t1 - t0) / hz:.2f} s CPU in {s1 - s0:.1f} s)")
print(f"  RSS: {rss / 1024:.1f} MiB (peak {hwm / 1024:.1f} MiB)")
PY
curl -s "$(grep -o 'serving metrics on [^ ]*' "$WORK/agent.log" | awk '{print "http://"$4"/metrics"}')" \
  2>/dev/null | grep -E '^stepwatch_agent_(events_received_total|batches_acknowledged_total|connected|gpus)' || true
