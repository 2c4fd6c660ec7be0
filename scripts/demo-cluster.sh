#!/usr/bin/env bash
# Runs the demo cluster from an existing build directory.
# Usage: scripts/demo-cluster.sh BUILD_DIR [SCENARIO]
# Environment:
#   STEPWATCH_DEMO_SECONDS  run this long and exit (default: until Ctrl-C)
#   STEPWATCH_DEMO_SPEED    simulated seconds per real second (default 1)
#   STEPWATCH_DEMO_GRPC / STEPWATCH_DEMO_METRICS  collector addresses (default: free loopback ports)
#   STEPWATCH_DEMO_COLLECTORS  number of collectors (default 1); with more, agents send the job to
#                              2 of them (--replicas=2) and stepwatchctl asks and merges them
#   STEPWATCH_DEMO_PROMETHEUS  1: also run `prometheus` (or this path to it) with the demo's scrape
#                              config and the shipped rules, on a free loopback port
#   STEPWATCH_DEMO_ALERT_FOR   the `for:` of the demo's copy of the alert rules (default 30s): the
#                              shipped alerts wait 1 to 15 minutes before they fire, longer than
#                              a short demo runs
# Each agent serves its node's raw view (every GPU and host reading) on its own /metrics, as in a
# real deployment; $RUN_DIR/prometheus.yml scrapes the collector and every agent, with the shipped
# rules, so the Grafana dashboards are full.
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(cd "${1:?usage: demo-cluster.sh BUILD_DIR [SCENARIO]}" && pwd)"
scenario="${2:-sim/demo/demo.json}"
seconds="${STEPWATCH_DEMO_SECONDS:-0}"
speed="${STEPWATCH_DEMO_SPEED:-1}"
nodes=8

# A free loopback port, never one this script handed out before: the kernel may give a port it
# just released to the next bind, and two agents told the same port leave one node unserved.
# Called in $(...), so the ports handed out are kept in a file, not a variable.
ports_given="$(mktemp /tmp/stepwatch-demo-ports.XXXXXX)"
free_port() {
  local port
  for _ in $(seq 1 50); do
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    if ! grep -qx "$port" "$ports_given"; then
      echo "$port" >>"$ports_given"
      echo "$port"
      return 0
    fi
  done
  echo "demo-cluster.sh: no new free port in 50 tries" >&2
  return 1
}
collectors="${STEPWATCH_DEMO_COLLECTORS:-1}"
grpc_addrs=("${STEPWATCH_DEMO_GRPC:-127.0.0.1:$(free_port)}")
metrics_addrs=("${STEPWATCH_DEMO_METRICS:-127.0.0.1:$(free_port)}")
for _ in $(seq 2 "$collectors"); do
  grpc_addrs+=("127.0.0.1:$(free_port)")
  metrics_addrs+=("127.0.0.1:$(free_port)")
done
grpc="$(IFS=,; echo "${grpc_addrs[*]}")"  # what agents and stepwatchctl take: every collector
metrics="${metrics_addrs[0]}"
replicas=()
if [ "$collectors" -gt 1 ]; then replicas=(--replicas=2); fi
agent_metrics=()
for i in $(seq 0 $((nodes - 1))); do agent_metrics+=("127.0.0.1:$(free_port)"); done
prometheus_bin=""
case "${STEPWATCH_DEMO_PROMETHEUS:-0}" in
  0 | "") ;;
  1) prometheus_bin="$(command -v prometheus || true)" ;;
  *) prometheus_bin="$STEPWATCH_DEMO_PROMETHEUS" ;;
esac
if [ "${STEPWATCH_DEMO_PROMETHEUS:-0}" != "0" ] && [ ! -x "$prometheus_bin" ]; then
  echo "demo: STEPWATCH_DEMO_PROMETHEUS=${STEPWATCH_DEMO_PROMETHEUS}: no prometheus binary found" >&2
  exit 1
fi
run_dir="$(mktemp -d /tmp/stepwatch-demo.XXXXXX)"
fake_nvml="$build/tests/gpu/fake_nvml/libnvidia-ml.so.1"
for bin in collector/stepwatch-collector agent/stepwatch-agent ctl/stepwatchctl sim/stepwatch-sim; do
  [ -x "$build/$bin" ] || { echo "demo: $build/$bin is missing; run scripts/demo.sh" >&2; exit 1; }
done
[ -f "$fake_nvml" ] || { echo "demo: fake NVML library missing at $fake_nvml" >&2; exit 1; }

pids=()
cleanup() {
  trap - EXIT INT TERM
  rm -f "$ports_given"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "demo: stopped ${#pids[@]} processes; logs in $run_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for c in $(seq 0 $((collectors - 1))); do
  suffix=""
  if [ "$collectors" -gt 1 ]; then suffix="-$c"; fi
  "$build/collector/stepwatch-collector" --grpc-listen="${grpc_addrs[$c]}" \
    --metrics-listen="${metrics_addrs[$c]}" --state-dir="$run_dir/collector-state$suffix" \
    >"$run_dir/collector$suffix.log" 2>&1 &
  pids+=($!)
done

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
    --collector="$grpc" "${replicas[@]}" --socket="$run_dir/node-$i.sock" --node="node-$i" \
    --interval=1 --nvml-library="$fake_nvml" --metrics-listen="${agent_metrics[$i]}" \
    >"$run_dir/agent-node-$i.log" 2>&1 &
  pids+=($!)
done

# Prometheus scrape config for the demo: the collector (findings, jobs, ranks) and every agent (the
# raw node view), as deploy/prometheus/prometheus.yml does for a real cluster.
# The alert rules are a copy whose non-zero `for:` are shortened to $alert_for, so that alerts
# fire while the demo runs; the recording rules are the shipped ones.
rules="$(pwd)/deploy/prometheus/rules"
alert_for="${STEPWATCH_DEMO_ALERT_FOR:-30s}"
mkdir -p "$run_dir/rules"
sed -E "s/^( *for: )[1-9][0-9]*m$/\\1${alert_for}/" "$rules/stepwatch-alerts.yml" \
  >"$run_dir/rules/stepwatch-alerts.yml"
{
  echo "global: {scrape_interval: 5s, evaluation_interval: 5s}"
  echo "rule_files: [\"$rules/stepwatch-recording.yml\", \"$run_dir/rules/stepwatch-alerts.yml\"]"
  echo "scrape_configs:"
  echo "  - job_name: stepwatch-collector"
  echo "    honor_labels: true"
  echo "    static_configs:"
  echo "      - targets:"
  for m in "${metrics_addrs[@]}"; do echo "          - \"$m\""; done
  echo "  - job_name: stepwatch-agent"
  echo "    honor_labels: true"
  echo "    static_configs:"
  echo "      - targets:"
  for a in "${agent_metrics[@]}"; do echo "          - \"$a\""; done
} >"$run_dir/prometheus.yml"
prometheus_hint=""
if [ -n "$prometheus_bin" ]; then
  prometheus_addr="127.0.0.1:$(free_port)"
  "$prometheus_bin" --config.file="$run_dir/prometheus.yml" \
    --storage.tsdb.path="$run_dir/prometheus-data" --web.listen-address="$prometheus_addr" \
    >"$run_dir/prometheus.log" 2>&1 &
  pids+=($!)
  echo "demo: Prometheus http://$prometheus_addr"
  prometheus_hint="
Prometheus: http://$prometheus_addr (point Grafana at it and import deploy/grafana/dashboards)
Alerts fire after ${alert_for} here: the demo's copy of the rules ($run_dir/rules) shortens their
for: (the shipped ones wait 1 to 15 minutes, longer than a short demo runs)"
fi

ctl=("$build/ctl/stepwatchctl" --collector="$grpc")
job="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["job"])' "$scenario")"
# The live view in a browser: the job list and each job's report page, reloading themselves.
view_addr="127.0.0.1:$(free_port)"
"${ctl[@]}" serve --listen="$view_addr" >"$run_dir/serve.log" 2>&1 &
pids+=($!)
echo "demo: live view http://$view_addr/"
# Kept under the live view: where the collector listens and what to try next.
if [ "$collectors" -gt 1 ]; then
  where="collectors: gRPC $grpc (each job on 2 of them), metrics$(printf ' http://%s/metrics' "${metrics_addrs[@]}")"
else
  where="collector: gRPC $grpc, metrics http://$metrics/metrics"
fi
hint="$where; logs in $run_dir
agents: node-0 metrics http://${agent_metrics[0]}/metrics (every node: $run_dir/prometheus.yml)
live view in a browser: http://$view_addr/ (the job: http://$view_addr/jobs/$job)$prometheus_hint
Try in another terminal:
  $build/ctl/stepwatchctl --collector=$grpc explain $job   # where the step time goes, what to fix
  $build/ctl/stepwatchctl --collector=$grpc report $job    # the job's whole life, also after it ends
  $build/ctl/stepwatchctl --collector=$grpc report $job --html -o $run_dir/report.html   # the same as a page with charts (open it in a browser)
  curl -s http://$metrics/metrics | grep '^stepwatch_job_'"
echo "demo: $where, logs in $run_dir"
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
if "${ctl[@]}" report "$job" --html -o "$run_dir/report.html"; then
  echo "demo: the job's report as a page: $run_dir/report.html (${ctl[*]} report $job --html -o FILE)"
fi
