#!/usr/bin/env python3
"""Per-rank, per-step split of PyTorch profiler (Kineto) traces, as a compact CSV.

Usage: kineto_steps.py NAME=TRACE.json[.gz] [NAME=TRACE...] > steps.csv

Each argument names one trace and the label its rows get in the `trace` column; traces of the
ranks of one job share a label (their `distributedInfo.rank` tells them apart). Standard library
only.

Per rank and step (a `ProfilerStep#N` user annotation on the CPU), the step's window is
[start of ProfilerStep#N, start of ProfilerStep#N+1) (the last step: its own duration). Every GPU
activity (kernels, memcpy, memset) is clipped to the window, so that kernels a step launched but
that ran in the next step's window count where they ran and the parts add up to the window:

  step_s         the window (seconds)
  compute_s      union of non-communication GPU activity
  comm_s         union of communication kernels (names containing nccl or rccl), hidden or not
  exposed_comm_s communication when no compute ran: comm_s minus its overlap with compute
  data_s         GPU idle (neither compute nor communication) while the CPU waited for input:
                 a DataLoader `enumerate(...)` op or an annotation named data_load, load_batch or
                 wait_for_batch
  other_s        the rest of the window: GPU idle for any other reason (host-bound gaps)

step_s = compute_s + exposed_comm_s + data_s + other_s, up to rounding.
"""

import gzip
import json
import re
import sys

COMM = re.compile(r"nccl|rccl", re.IGNORECASE)
DATA = re.compile(r"^enumerate\(DataLoader\)|data_load|load_batch|wait_for_batch")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def union(intervals):
    """Sorted, disjoint union of (start, end) pairs."""
    out = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def clip(intervals, lo, hi):
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def length(intervals):
    return sum(b - a for a, b in intervals)


def intersect(x, y):
    """Intersection of two disjoint sorted unions."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a = max(x[i][0], y[j][0])
        b = min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def complement(x, lo, hi):
    out, t = [], lo
    for a, b in x:
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < hi:
        out.append((t, hi))
    return out


def steps_of(trace):
    events = trace.get("traceEvents", [])
    info = trace.get("distributedInfo", {})
    rank = int(info.get("rank", 0))
    world = int(info.get("world_size", 1))
    steps = sorted(
        (e for e in events
         if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")),
        key=lambda e: e["ts"])
    comp, comm, data = [], [], []
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X" or "dur" not in e:
            continue
        iv = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if cat in GPU_CATS:
            (comm if cat == "kernel" and COMM.search(e.get("name", "")) else comp).append(iv)
        elif cat in ("cpu_op", "user_annotation") and DATA.search(e.get("name", "")):
            data.append(iv)
    comp, comm, data = union(comp), union(comm), union(data)
    rows = []
    for i, s in enumerate(steps):
        lo = float(s["ts"])
        hi = float(steps[i + 1]["ts"]) if i + 1 < len(steps) else lo + float(s["dur"])
        c = union(clip(comp, lo, hi))
        m = union(clip(comm, lo, hi))
        exposed = length(m) - length(intersect(m, c))
        idle = complement(union(c + m), lo, hi)
        d = length(intersect(idle, union(clip(data, lo, hi))))
        window = hi - lo
        rows.append({
            "rank": rank,
            "world_size": world,
            "step": int(s["name"].split("#", 1)[1]),
            "step_s": window,
            "data_s": d,
            "compute_s": length(c),
            "comm_s": length(m),
            "exposed_comm_s": exposed,
            "other_s": max(0.0, window - length(c) - exposed - d),
        })
    return rows


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    cols = ["trace", "rank", "world_size", "step", "step_s", "data_s", "compute_s", "comm_s",
            "exposed_comm_s", "other_s"]
    print(",".join(cols))
    for arg in argv[1:]:
        name, _, path = arg.partition("=")
        for r in steps_of(load(path)):
            vals = [name] + [str(r["rank"]), str(r["world_size"]), str(r["step"])]
            # Microseconds in the trace: six decimals of a second keep them all.
            vals += ["%.6f" % (r[k] / 1e6) for k in cols[4:]]
            print(",".join(vals))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
