#!/usr/bin/env bash
# Checks stepwatch's NVML binding against a real NVIDIA driver, in one short run:
#   1. builds stepwatch-gpu-probe and stepwatch-agent;
#   2. starts a few processes holding a CUDA context (through libcuda with ctypes; no toolkit
#      needed) so that the process lists are not empty;
#   3. prints the driver and NVML versions, then for every GPU each reading stepwatch takes next to
#      what `nvidia-smi --query-gpu` reports for the same field, and the process list next to
#      `nvidia-smi --query-compute-apps`;
#   4. prints the health readings (PCIe link generation and width, PCIe replays, ECC counts, row
#      remapping, NVLink state and error counters, Xid events) next to nvidia-smi's where it has
#      a field for them, and `nvidia-smi nvlink -s` / `-e` for the per-link ones;
#   5. prints what the agent exports on its own /metrics (readings and metric availability).
# A line marked MISMATCH is a disagreement worth a look (readings taken a moment apart may differ
# a little; memory.used differs by the driver's reserved memory on drivers whose nvidia-smi uses
# nvmlMemory_v2). The exit status is the probe's (0: NVML loaded and every GPU read).
#
# Usage: scripts/device-check.sh [BUILD_DIR]     (default: build-device-check)
# Environment: STEPWATCH_NVML_LIBRARY (default libnvidia-ml.so.1; the fake NVML works too, with
# STEPWATCH_FAKE_NVML_STATE), STEPWATCH_CHECK_CONTEXTS (CUDA contexts started on GPU 0, default 3;
# 0 starts none), STEPWATCH_CHECK_PREBUILT=1 (use the binaries in BUILD_DIR, build nothing).
set -euo pipefail

src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build-device-check}"
jobs="$(nproc 2>/dev/null || echo 2)"
nvml="${STEPWATCH_NVML_LIBRARY:-libnvidia-ml.so.1}"
contexts="${STEPWATCH_CHECK_CONTEXTS:-3}"
tmp="$(mktemp -d)"
helpers=()
agent=""
cleanup() {
  for pid in "${helpers[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ -n "$agent" ]; then kill "$agent" 2>/dev/null || true; fi
  wait 2>/dev/null || true
}
trap cleanup EXIT

if [ "${STEPWATCH_CHECK_PREBUILT:-0}" = 1 ]; then
  echo "== using the binaries already in $build"
else
  echo "== build ($build)"
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEPWATCH_BUILD_TESTS=OFF \
    -DSTEPWATCH_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$build" -j"$jobs" --target stepwatch-gpu-probe stepwatch-agent \
    >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }
fi

have_smi=0
command -v nvidia-smi >/dev/null && have_smi=1

# Processes with a CUDA context on GPU 0, so that both process lists have something to compare.
if [ "$contexts" -gt 0 ] && [ "$nvml" = "libnvidia-ml.so.1" ]; then
  cat >"$tmp/hold_context.py" <<'EOF'
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
ctx = ctypes.c_void_p()
dev = ctypes.c_int()
if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0:
    sys.exit("cuInit/cuDeviceGet failed")
if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0 or cuda.cuCtxSetCurrent(ctx) != 0:
    sys.exit("cuDevicePrimaryCtxRetain failed")
# A small allocation makes sure the context is really created on the GPU.
ptr = ctypes.c_uint64()
cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20))
print("ready", flush=True)
time.sleep(120)
EOF
  for _ in $(seq 1 "$contexts"); do
    python3 "$tmp/hold_context.py" >>"$tmp/contexts.log" 2>&1 &
    helpers+=("$!")
  done
  for _ in $(seq 1 100); do
    [ "$(grep -c ready "$tmp/contexts.log" 2>/dev/null || true)" -ge "$contexts" ] && break
    grep -q failed "$tmp/contexts.log" 2>/dev/null && break
    sleep 0.1
  done
  echo "== CUDA contexts started on GPU 0: $(grep -c ready "$tmp/contexts.log" || true) of $contexts"
  grep -v ready "$tmp/contexts.log" || true
fi

echo "== stepwatch-gpu-probe (3 readings, 1 s apart)"
probe_rc=0
"$build/gpu/stepwatch-gpu-probe" --nvml-library="$nvml" --samples=3 --interval=1 \
  >"$tmp/probe.txt" 2>"$tmp/probe.err" || probe_rc=$?
cat "$tmp/probe.err"

# nvidia-smi answers, one query per field so that a field this nvidia-smi lacks spoils nothing.
if [ "$have_smi" = 1 ]; then
  nvidia-smi >"$tmp/smi.txt" 2>&1 || true
  count="$(grep -c '^# sample 2 gpu ' "$tmp/probe.txt" || true)"
  for ((i = 0; i < count; i++)); do
    for field in uuid name driver_version utilization.gpu utilization.memory memory.used \
      memory.total clocks.sm clocks.max.sm power.draw enforced.power.limit temperature.gpu \
      clocks_event_reasons.active clocks_throttle_reasons.active \
      pcie.link.gen.current pcie.link.gen.max pcie.link.width.current pcie.link.width.max \
      ecc.errors.corrected.volatile.total ecc.errors.uncorrected.volatile.total \
      ecc.errors.corrected.aggregate.total ecc.errors.uncorrected.aggregate.total \
      remapped_rows.correctable remapped_rows.uncorrectable remapped_rows.pending \
      remapped_rows.failure; do
      value="$(nvidia-smi -i "$i" --query-gpu="$field" --format=csv,noheader,nounits 2>/dev/null |
        head -1 || true)"
      printf '%s\t%s\t%s\n' "$i" "$field" "${value:-n/a}"
    done
  done >"$tmp/smi-fields.tsv"
  nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits \
    >"$tmp/smi-apps.csv" 2>/dev/null || true
  nvidia-smi --version >"$tmp/smi-version.txt" 2>/dev/null || nvidia-smi -h | head -1 >"$tmp/smi-version.txt" || true
fi

python3 - "$tmp" "$have_smi" <<'EOF'
import collections, os, re, sys

tmp, have_smi = sys.argv[1], sys.argv[2] == "1"
text = open(os.path.join(tmp, "probe.txt")).read()

node = {}
gpus = collections.OrderedDict()  # index -> fields of the last sample
section = None
blocks = []  # nested message names inside the current GPU sample, outermost first
for line in text.splitlines():
    stripped = line.strip()
    if section is not None and "health" in section and blocks[:1] == ["health"]:
        health = section["health"]
        m = re.match(r"(\w+) \{$", stripped)
        if m:
            blocks.append(m.group(1))
            if m.group(1) in ("nvlinks", "xids"):
                health.setdefault(m.group(1), []).append({})
            continue
        if stripped == "}":
            blocks.pop()
            continue
        m = re.match(r'(\w+): "?(.*?)"?$', stripped)
        if m:
            target = health
            if len(blocks) > 1:
                inner = health.get(blocks[1])
                target = inner[-1] if isinstance(inner, list) else health.setdefault(blocks[1], {})
            target[m.group(1)] = m.group(2)
        continue
    if section is not None and stripped == "health {":
        section["health"] = {}
        blocks = ["health"]
        continue
    if line.startswith("# node"):
        section = node
        continue
    m = re.match(r"# nvml_version (.*)", line)
    if m:
        node["nvml_version"] = m.group(1).strip()
        section = None
        continue
    m = re.match(r"# sample (\d+) gpu (\d+)", line)
    if m:
        section = gpus.setdefault(int(m.group(2)), {"pids": [], "unavailable": {}})
        section["pids"] = []
        section["unavailable"] = {}
        section.pop("health", None)
        blocks = []
        continue
    if line.startswith("#"):
        section = None
        continue
    if section is None:
        continue
    m = re.match(r'\s*key: "(.*)"', line)
    if m:
        section["_key"] = m.group(1)
        continue
    m = re.match(r'\s*value: "(.*)"', line)
    if m and "_key" in section:
        section["unavailable"][section.pop("_key")] = m.group(1)
        continue
    m = re.match(r'(\w+): "?(.*?)"?$', line.strip())
    if m:
        k, v = m.groups()
        if k == "pids":
            section["pids"].append(int(v))
        else:
            section[k] = v

print("== driver %s, NVML %s, %s GPUs, nvml_available %s %s" % (
    node.get("driver_version", "?"), node.get("nvml_version", "?"), node.get("gpu_count", "0"),
    node.get("nvml_available", "false"), node.get("nvml_error", "")))
if have_smi:
    print("   nvidia-smi:", open(os.path.join(tmp, "smi-version.txt")).read().strip().replace("\n", "; "))

smi = collections.defaultdict(dict)
if have_smi:
    for line in open(os.path.join(tmp, "smi-fields.tsv")):
        i, field, value = line.rstrip("\n").split("\t", 2)
        smi[int(i)][field] = value.strip()

def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None

MiB = 1024 * 1024
# (what stepwatch reads, how to show it in nvidia-smi's unit, nvidia-smi field(s), tolerance)
ROWS = [
    ("uuid", lambda g: g.get("uuid"), ["uuid"], None),
    ("name", lambda g: g.get("name"), ["name"], None),
    ("utilization %", lambda g: num(g["utilization_gpu_ratio"]) * 100
     if "utilization_gpu_ratio" in g else None, ["utilization.gpu"], 15),
    ("memory utilization %", lambda g: num(g["utilization_memory_ratio"]) * 100
     if "utilization_memory_ratio" in g else None, ["utilization.memory"], 15),
    ("memory used MiB", lambda g: num(g["memory_used_bytes"]) / MiB if "memory_used_bytes" in g else None,
     ["memory.used"], None),
    ("memory total MiB", lambda g: num(g["memory_total_bytes"]) / MiB if "memory_total_bytes" in g else None,
     ["memory.total"], 1),
    ("SM clock MHz", lambda g: num(g.get("sm_clock_mhz")), ["clocks.sm"], 200),
    ("SM clock max MHz", lambda g: num(g.get("sm_clock_max_mhz")), ["clocks.max.sm"], 1),
    ("power W", lambda g: num(g.get("power_watts")), ["power.draw"], 30),
    ("power limit W", lambda g: num(g.get("power_limit_watts")), ["enforced.power.limit"], 1),
    ("temperature C", lambda g: num(g.get("temperature_celsius")), ["temperature.gpu"], 3),
    ("throttle reasons", lambda g: hex(int(g["throttle_reasons"])) if "throttle_reasons" in g else None,
     ["clocks_event_reasons.active", "clocks_throttle_reasons.active"], None),
]

def health(g, *path):
    """A health reading of the last sample (GpuHealth, nested by `path`), or None."""
    v = g.get("health", {})
    for key in path:
        if not isinstance(v, dict):
            return None
        if key not in v:
            # Text format leaves out the zeros of a submessage that is there (ecc, remapped_rows).
            return 0.0 if len(path) > 1 and v is not g.get("health") else None
        v = v[key]
    return num(v)

# Health readings with an nvidia-smi field; PCIe replays have none (nvidia-smi -q shows them).
HEALTH_ROWS = [
    ("PCIe gen current", ("pcie_link_generation_current",), "pcie.link.gen.current"),
    ("PCIe gen max", ("pcie_link_generation_max",), "pcie.link.gen.max"),
    ("PCIe width current", ("pcie_link_width_current",), "pcie.link.width.current"),
    ("PCIe width max", ("pcie_link_width_max",), "pcie.link.width.max"),
    ("PCIe replays", ("pcie_replays_total",), None),
    ("ECC corrected vol.", ("ecc", "corrected_volatile"), "ecc.errors.corrected.volatile.total"),
    ("ECC uncorr. vol.", ("ecc", "uncorrected_volatile"), "ecc.errors.uncorrected.volatile.total"),
    ("ECC corrected agg.", ("ecc", "corrected_aggregate"), "ecc.errors.corrected.aggregate.total"),
    ("ECC uncorr. agg.", ("ecc", "uncorrected_aggregate"),
     "ecc.errors.uncorrected.aggregate.total"),
    ("remapped corrected", ("remapped_rows", "corrected"), "remapped_rows.correctable"),
    ("remapped uncorr.", ("remapped_rows", "uncorrected"), "remapped_rows.uncorrectable"),
]

def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return "%.2f" % v
    return str(v)

mismatches = 0
for index, g in gpus.items():
    print("\n== GPU %d" % index)
    print("   %-22s %-40s %-40s %s" % ("reading", "stepwatch", "nvidia-smi", ""))
    for label, ours_fn, fields, tol in ROWS:
        ours = ours_fn(g)
        theirs = None
        for f in fields:
            v = smi[index].get(f)
            if v not in (None, "n/a", "", "[N/A]", "[Not Supported]"):
                theirs = v
                break
        verdict = ""
        if have_smi and ours is not None and theirs is not None:
            if isinstance(ours, float) and num(theirs) is not None:
                if tol is not None and abs(ours - num(theirs)) > tol:
                    verdict = "MISMATCH"
            elif label == "throttle reasons":
                if int(theirs, 16) != int(ours, 16):
                    verdict = "differs (reasons change quickly)"
            elif str(ours).strip() != str(theirs).strip():
                verdict = "MISMATCH"
        elif have_smi and (ours is None) != (theirs is None):
            verdict = "MISMATCH (one side missing)"
        mismatches += verdict.startswith("MISMATCH")
        print("   %-22s %-40s %-40s %s" % (label, fmt(ours), fmt(theirs), verdict))
    for label, key, scale in [("PCIe TX MB/s", "pcie_tx_bytes_per_second", 1e6),
                              ("PCIe RX MB/s", "pcie_rx_bytes_per_second", 1e6),
                              ("NVLink TX GB/s (sum)", "nvlink_tx_bytes_per_second", 1e9),
                              ("NVLink RX GB/s (sum)", "nvlink_rx_bytes_per_second", 1e9),
                              ("GPM SM activity", "sm_activity_ratio", 0.01),
                              ("GPM DRAM bandwidth", "dram_bandwidth_ratio", 0.01),
                              ("GPM tensor activity", "tensor_activity_ratio", 0.01)]:
        v = num(g.get(key))
        print("   %-22s %-40s %-40s" % (label, fmt(v / scale if v is not None else None),
                                         "(see nvidia-smi dmon / nvlink below)"))
    for label, path, field in HEALTH_ROWS:
        ours = health(g, *path)
        theirs = smi[index].get(field) if field else None
        if theirs in ("", "n/a", "[N/A]", "[Not Supported]", "N/A"):
            theirs = None
        verdict = ""
        # Counters may move between the two readings; generations and widths must agree.
        if have_smi and ours is not None and num(theirs) is not None and label.startswith("PCIe "):
            verdict = "" if ours == num(theirs) else "MISMATCH (an idle GPU may change its link)"
        mismatches += verdict.startswith("MISMATCH")
        print("   %-22s %-40s %-40s %s" % (label, fmt(ours), fmt(theirs if field else "(nvidia-smi -q)"),
                                           verdict))
    h = g.get("health", {})
    remap = h.get("remapped_rows", {})
    print("   %-22s pending %s, failure %s   nvidia-smi: pending %s, failure %s" % (
        "row remapping", remap.get("pending", "false" if remap else "-"),
        remap.get("failure", "false" if remap else "-"),
        smi[index].get("remapped_rows.pending", "-"), smi[index].get("remapped_rows.failure", "-")))
    links = h.get("nvlinks", [])
    down = [l.get("link", "0") for l in links if l.get("up") != "true"]
    errors = collections.Counter()
    for l in links:
        for k in ("replay_errors_total", "recovery_errors_total", "crc_flit_errors_total",
                  "crc_data_errors_total"):
            errors[k[:-len("_errors_total")]] += int(l.get(k, 0))
    print("   %-22s %d links, down: %s; errors (sum over links): %s" % (
        "NVLink", len(links), ",".join(down) or "none",
        ", ".join("%s %d" % kv for kv in sorted(errors.items())) or "-"))
    xids = h.get("xids", [])
    print("   %-22s %s (dropped %s)" % ("Xid events", ", ".join(
        "%s x%s" % (x.get("xid", "?"), x.get("count", "?")) for x in xids) or "none seen",
        h.get("xid_events_dropped", "0")))
    print("   unavailable: %s" % (", ".join("%s=%s" % kv for kv in sorted(g["unavailable"].items()))
                                  or "none"))
    if have_smi:
        uuid = g.get("uuid", "")
        theirs = sorted(int(parts[1]) for parts in
                        (l.split(",") for l in open(os.path.join(tmp, "smi-apps.csv")) if l.strip())
                        if parts[0].strip() == uuid)
        ours = sorted(g["pids"])
        verdict = "match" if ours == theirs else "MISMATCH"
        mismatches += verdict == "MISMATCH"
        print("   processes: stepwatch %s" % ours)
        print("              nvidia-smi %s  %s" % (theirs, verdict))
    else:
        print("   processes: stepwatch %s" % sorted(g["pids"]))
print("\n== %d mismatches" % mismatches)
EOF

if [ "$have_smi" = 1 ]; then
  # Cross-checks for readings --query-gpu has no field for (the GPM flag needs a recent driver).
  echo; echo "== nvidia-smi nvlink -gt d (per-link KiB counters; stepwatch reads their sum)"
  timeout 20 nvidia-smi nvlink -gt d 2>&1 | head -60 || true
  echo; echo "== nvidia-smi dmon -s t (PCIe MB/s) and GPM SM/DRAM/tensor %"
  timeout 20 nvidia-smi dmon -c 2 -s t 2>&1 || true
  timeout 20 nvidia-smi dmon -c 2 --gpm-metrics 2,10,5 2>&1 || true
  echo; echo "== nvidia-smi nvlink -s (link state) and -e (error counters; stepwatch: NVLink above)"
  timeout 20 nvidia-smi nvlink -s 2>&1 | head -80 || true
  timeout 20 nvidia-smi nvlink -e 2>&1 | head -120 || true
  echo; echo "== nvidia-smi -q -d PCIE (Replays Since Reset) and the driver's Xid lines"
  timeout 20 nvidia-smi -q -d PCIE 2>&1 | grep -i -E '^GPU|replay' || true
  (dmesg 2>/dev/null || true) | grep -i 'NVRM: Xid' | tail -10 || true
fi

echo; echo "== stepwatch-agent local /metrics (GPU series)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$build/agent/stepwatch-agent" --collector=127.0.0.1:1 --socket="$tmp/agent.sock" \
  --metrics-listen="127.0.0.1:$port" --interval=0.5 --nvml-library="$nvml" 2>"$tmp/agent.log" &
agent=$!
for _ in $(seq 1 40); do
  if curl -fsS "http://127.0.0.1:$port/metrics" >"$tmp/metrics" 2>/dev/null &&
    grep -q 'stepwatch_agent_gpu_sm_activity_ratio\|stepwatch_agent_gpu_nvlink' "$tmp/metrics"; then
    break
  fi
  sleep 0.25
done
sleep 1
curl -fsS "http://127.0.0.1:$port/metrics" >"$tmp/metrics" 2>/dev/null || true
grep -v '^#' "$tmp/metrics" | grep -E 'stepwatch_agent_(gpu|nvml)' || true
echo; echo "== agent log (NVML lines)"
grep -i nvml "$tmp/agent.log" || true
echo "(files kept in $tmp)"
trap - EXIT
cleanup
exit "$probe_rc"
