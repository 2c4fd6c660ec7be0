#!/usr/bin/env bash
# Checks stepwatch's NVML loader against a real NVIDIA driver: builds stepwatch-gpu-probe (and the
# agent), prints what the probe reads from every GPU and from the host, and, when the agent is
# built, what the agent exports on its local /metrics.
# Usage: scripts/device-check.sh [BUILD_DIR]     (default: build-device-check)
# STEPWATCH_NVML_LIBRARY overrides the library (default libnvidia-ml.so.1), e.g. to try the script
# with the fake NVML and STEPWATCH_FAKE_NVML_STATE.
set -euo pipefail

src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build-device-check}"
jobs="$(nproc 2>/dev/null || echo 2)"
nvml="${STEPWATCH_NVML_LIBRARY:-libnvidia-ml.so.1}"

cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEPWATCH_BUILD_TESTS=OFF \
  -DSTEPWATCH_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target stepwatch-gpu-probe
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,utilization.gpu,memory.used,power.draw \
    --format=csv || true
fi

echo "== stepwatch-gpu-probe (3 readings, 1 s apart) =="
probe_rc=0
"$build/gpu/stepwatch-gpu-probe" --nvml-library="$nvml" --samples=3 --interval=1 || probe_rc=$?

if cmake --build "$build" -j"$jobs" --target stepwatch-agent >/dev/null 2>&1 &&
  [ -x "$build/agent/stepwatch-agent" ]; then
  echo "== stepwatch-agent local /metrics =="
  tmp="$(mktemp -d)"
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  "$build/agent/stepwatch-agent" --collector=127.0.0.1:1 --socket="$tmp/agent.sock" \
    --metrics-listen="127.0.0.1:$port" --interval=0.5 --nvml-library="$nvml" 2>"$tmp/agent.log" &
  agent=$!
  for _ in $(seq 1 40); do
    if curl -fsS "http://127.0.0.1:$port/metrics" >"$tmp/metrics" 2>/dev/null &&
      grep -Eq 'nvml_available\{[^}]*\} 1' "$tmp/metrics"; then
      break
    fi
    sleep 0.25
  done
  grep -v '^#' "$tmp/metrics" | grep -i -E 'gpu|nvml|memory_bandwidth' || true
  kill "$agent" 2>/dev/null || true
  wait "$agent" 2>/dev/null || true
  echo "(agent log: $tmp/agent.log)"
fi
exit "$probe_rc"
