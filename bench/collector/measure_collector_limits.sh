#!/usr/bin/env bash
# The collector's memory and size limits, measured with real processes on loopback:
#  1. heap bytes per job, rank, node and GPU (memory_cost_bench: where the budget's costs come from);
#  2. /metrics size and render time at NODES x 8 GPUs, in-process (metrics_size_bench);
#  3. a real collector fed NODES x 8 GPUs by collector_flood: /metrics size and scrape time,
#     stepwatchctl status and findings answer sizes;
#  4. a real collector with --max-memory-mib=BUDGET flooded with FLOOD_RANKS distinct ranks, with a
#     job tracked before the flood that gets a straggler after it: peak RSS (VmHWM), refusals, and
#     whether the straggler is found;
#  5. 16 concurrent streams (one connection) each sending one batch just under the receive limit,
#     then 16 over it: peak RSS.
# Usage: bench/collector/measure_collector_limits.sh [BUILD_DIR] [NODES] [FLOOD_RANKS] [BUDGET_MIB]
set -euo pipefail
BUILD=${1:-build}
NODES=${2:-10000}
FLOOD_RANKS=${3:-300000}
BUDGET=${4:-256}
COLLECTOR="$BUILD/collector/stepwatch-collector"
CTL="$BUILD/ctl/stepwatchctl"
FLOOD="$BUILD/bench/collector/collector_flood"
TMP=$(mktemp -d)
PID=
cleanup() {
  if [[ -n "$PID" ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_collector FLAGS...: sets PID, GRPC, METRICS.
start_collector() {
  GRPC=127.0.0.1:$(free_port)
  METRICS=127.0.0.1:$(free_port)
  "$COLLECTOR" --grpc-listen="$GRPC" --metrics-listen="$METRICS" "$@" >"$TMP/collector.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do
    curl -sf "http://$METRICS/metrics" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "collector did not start"; cat "$TMP/collector.log"; exit 1
}
stop_collector() { kill "$PID"; wait "$PID" || true; PID=; }
metric() { curl -sf "http://$METRICS/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
hwm_mib() { awk '/^VmHWM:/ { printf "%.0f", $2 / 1024 }' "/proc/$PID/status"; }

echo "== 1. heap bytes per item"
"$BUILD/bench/collector/memory_cost_bench" 20000 2>/dev/null

echo "== 2. /metrics in-process at $NODES nodes x 8 GPUs"
"$BUILD/bench/collector/metrics_size_bench" "$NODES" 20 2>/dev/null

echo "== 3. real collector at $NODES nodes x 8 GPUs (8 ranks per node, jobs of 512 ranks)"
start_collector
"$FLOOD" --collector="$GRPC" --nodes="$NODES" --gpus=8 --ranks-per-node=8 --world-size=512 \
  --steps=20 --threads=4 --slow-rank=3
sleep 2
for i in 1 2 3; do
  curl -s -o "$TMP/metrics.txt" -w "scrape $i: %{size_download} bytes in %{time_total} s\n" \
    "http://$METRICS/metrics"
done
echo "series: $(grep -vc '^#' "$TMP/metrics.txt"); dropped: $(grep '^stepwatch_collector_series_dropped_total' "$TMP/metrics.txt" | tr '\n' ' ')"
for cmd in status findings; do
  start=$(date +%s.%N)
  "$CTL" --collector="$GRPC" "$cmd" --json >"$TMP/$cmd.json"
  end=$(date +%s.%N)
  echo "stepwatchctl $cmd --json: $(stat -c %s "$TMP/$cmd.json") bytes in $(echo "$end - $start" | bc) s"
done
echo "collector peak RSS: $(hwm_mib) MiB"
stop_collector

echo "== 4. flood: --max-memory-mib=$BUDGET, $FLOOD_RANKS distinct ranks"
start_collector --max-memory-mib="$BUDGET" --tick=0.2 --step-grace=0.5
PRE=(--collector="$GRPC" --nodes=1 --gpus=8 --ranks-per-node=8 --world-size=8 --job-prefix=pre
     --node-prefix=pre --threads=1)
"$FLOOD" "${PRE[@]}" --steps=10
FLOOD_NODES=$(( (FLOOD_RANKS + 999) / 1000 ))
"$FLOOD" --collector="$GRPC" --nodes="$FLOOD_NODES" --gpus=0 --ranks-per-node=1000 \
  --world-size=60000 --steps=1 --threads=4 --job-prefix=flood --node-prefix=flood
"$FLOOD" "${PRE[@]}" --steps=60 --first-step=10 --slow-rank=5
sleep 1
echo "limit hits (memory): $(metric 'stepwatch_collector_limit_hits_total{limit="memory"}')"
echo "steps rejected (limit): $(metric 'stepwatch_collector_steps_rejected_total{reason="limit"}')"
echo "accounted: $(metric stepwatch_collector_memory_accounted_bytes) of $(metric stepwatch_collector_memory_budget_bytes) bytes"
"$CTL" --collector="$GRPC" findings --json >"$TMP/flood-findings.json"
python3 - "$TMP/flood-findings.json" <<'PY'
import json, sys
found = [f for f in json.load(open(sys.argv[1])).get("findings", [])
         if f.get("job") == "pre-0" and f.get("rank") == 5]
print("pre-flood job's straggler found:", [f["kind"] for f in found] or "NO")
PY
echo "collector peak RSS (VmHWM): $(hwm_mib) MiB; bound 1.5 x $BUDGET + 64 = $(( BUDGET * 3 / 2 + 64 )) MiB"
stop_collector

echo "== 5. concurrent big batches: 16 streams of one ~7.5 MB batch each, then 16 over the limit"
start_collector --max-memory-mib=64
echo "idle peak RSS: $(hwm_mib) MiB"
"$FLOOD" --collector="$GRPC" --nodes=16 --threads=16 --ranks-per-node=90000 --world-size=60000 \
  --gpus=0 --steps=1 --job-prefix=big --node-prefix=big
echo "after 16 batches in the limit: peak RSS $(hwm_mib) MiB"
"$FLOOD" --collector="$GRPC" --nodes=16 --threads=16 --ranks-per-node=200000 --world-size=60000 \
  --gpus=0 --steps=1 --job-prefix=huge --node-prefix=huge 2>&1 | tail -1
echo "after 16 batches over the limit: peak RSS $(hwm_mib) MiB"
stop_collector
