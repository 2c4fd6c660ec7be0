#!/usr/bin/env bash
# Runs the demo cluster from an existing build directory.
# Usage: scripts/demo-cluster.sh BUILD_DIR [SCENARIO]
# Environment:
#   STEPWATCH_DEMO_SECONDS  run this long and exit (default: until Ctrl-C)
#   STEPWATCH_DEMO_SPEED    simulated seconds per real second (default 1)
#   STEPWATCH_DEMO_GRPC / STEPWATCH_DEMO_METRICS  collector addresses (default: free loopback ports)
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(cd "${1:?usage: demo-cluster.sh BUILD_DIR [SCENARIO]}" && pwd)"
scenario="${2:-sim/demo/demo.json}"
seconds="${STEPWATCH_DEMO_SECONDS:-0}"
speed="${STEPWATCH_DEMO_SPEED:-1}"
nodes=8

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc="${STEPWATCH_DEMO_GRPC:-127.0.0.1:$(free_port)}"
metrics="${STEPWATCH_DEMO_METRICS:-127.0.0.1:$(free_port)}"
run_dir="$(mktemp -d /tmp/stepwatch-demo.XXXXXX)"
fake_nvml="$build/tests/gpu/fake_nvml/libnvidia-ml.so.1"
for bin in collector/stepwatch-collector agent/stepwatch-agent ctl/stepwatchctl sim/stepwatch-sim; do
  [ -x "$build/$bin" ] || { echo "demo: $build/$bin is missing; run scripts/demo.sh" >&2; exit 1; }
done
[ -f "$fake_nvml" ] || { echo "demo: fake NVML library missing at $fake_nvml" >&2; exit 1; }

pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "demo: stopped ${#pids[@]} processes; logs in $run_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$build/collector/stepwatch-collector" --grpc-listen="$grpc" --metrics-listen="$metrics" \
  --state-dir="$run_dir/collector-state" >"$run_dir/collector.log" 2>&1 &
pids+=($!)

# The simulated job writes each node's fake GPU state; agents start once it exists, as a real
# agent would start next to GPUs that are already there.
"$build/sim/stepwatch-sim" --scenario="$scenario" --socket-dir="$run_dir" \
  --nvml-state-dir="$run_dir" --speed="$speed" >"$run_dir/sim.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  [ -f "$run_dir/node-$((nodes - 1))-nvml.json" ] && break
  sleep 0.1
done

for i in $(seq 0 $((nodes - 1))); do
  STEPWATCH_FAKE_NVML_STATE="$run_dir/node-$i-nvml.json" "$build/agent/stepwatch-agent" \
    --collector="$grpc" --socket="$run_dir/node-$i.sock" --node="node-$i" --interval=1 \
    --nvml-library="$fake_nvml" >"$run_dir/agent-node-$i.log" 2>&1 &
  pids+=($!)
done

ctl=("$build/ctl/stepwatchctl" --collector="$grpc")
job="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["job"])' "$scenario")"
# Kept under the live view: where the collector listens and what to try next.
hint="collector: gRPC $grpc, metrics http://$metrics/metrics; logs in $run_dir
Try in another terminal:
  $build/ctl/stepwatchctl --collector=$grpc explain $job   # where the step time goes, what to fix
  $build/ctl/stepwatchctl --collector=$grpc report $job    # the job's whole life, also after it ends
  curl -s http://$metrics/metrics | grep '^stepwatch_job_'"
echo "demo: collector gRPC $grpc, Prometheus metrics at http://$metrics/metrics, logs in $run_dir"
start=$(date +%s)
while true; do
  now=$(date +%s)
  if [ "$seconds" != "0" ] && [ $((now - start)) -ge "$seconds" ]; then break; fi
  # The collector may still be starting: its error message is the screen until it answers.
  screen="$("${ctl[@]}" status 2>&1; echo; "${ctl[@]}" findings 2>&1)" || true
  if [ -t 1 ]; then clear; fi
  echo "stepwatch demo ($((now - start)) s) - metrics: http://$metrics/metrics - Ctrl-C to stop"
  echo "$screen"
  echo
  echo "$hint"
  sleep 2
done
echo "=== final ==="
"${ctl[@]}" status || true
"${ctl[@]}" findings || true
"${ctl[@]}" explain "$job" || true
