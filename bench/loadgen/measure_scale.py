#!/usr/bin/env python3
"""Reruns the docs/scale.md measurements: real collectors on loopback fed by stepwatch-loadgen.

Usage: bench/loadgen/measure_scale.py [--build build-scale] [--max-ranks 100000]
           [--only NAME[,NAME]] [--out DIR] [--duration-scale 1.0]

Scenarios (each bounded by its duration plus 60 s; the whole run by --budget, default 2400 s;
all of them take about 35 minutes):
  single-8, single-1k, single-10k, single-30k    one collector, 1 step/s, 8 GPUs per node
  single-10k-export-all                          the same with --export-node-metrics=all
  single-100k                                    one collector, 0.25 steps/s (1 step/s does not
                                                 fit 2 cores with the load generator)
  triple-10k, triple-30k, triple-100k (0.25/s)   three collectors, --replicas=2
  failover-r{2,1}-{10k,30k,100k}                 three collectors, SIGKILL of the first one
  (not in the default list: single-50k, single-100k-1hz, failover-r1-10k-window8)

For each: collector CPU (from /proc) per step event and per event (steps + GPU/host samples),
RSS, /metrics size and scrape time (curl, 3 scrapes per collector), straggler detection latency
(loadgen polls /metrics), failover times. Writes DIR/NAME.json (the loadgen summary plus the curl
figures) and prints one line per scenario. Ranks are 8 per node, jobs of 1,000 ranks (the 8-rank
case: one job of 8).
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_collector(build, logdir, name, extra):
    grpc = f"127.0.0.1:{free_port()}"
    metrics = f"127.0.0.1:{free_port()}"
    log = open(os.path.join(logdir, f"{name}.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(build, "collector/stepwatch-collector"), f"--grpc-listen={grpc}",
         f"--metrics-listen={metrics}"] + extra, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 10
    while time.time() < deadline:
        if curl_once(metrics) is not None:
            return proc, grpc, metrics
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"collector {name} did not start; see {log.name}")


def curl_once(metrics):
    """One scrape with curl: (bytes, seconds) or None."""
    try:
        out = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{size_download} %{time_total}",
             "--max-time", "20", f"http://{metrics}/metrics"],
            capture_output=True, text=True, timeout=25)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    size, secs = out.stdout.split()
    return int(size), float(secs)


SCENARIOS = {
    # name: (collectors, replicas, ranks, world_size, kill, steps per second). The 100,000-rank
    # runs go at 0.25 steps/s: at 1 step/s the load generator and the collector do not both fit
    # this 2-core VM in real time (docs/scale.md); state, /metrics and detection in steps are
    # still those of 100,000 ranks.
    "single-8": (1, 1, 8, 8, False, 1),
    "single-1k": (1, 1, 1000, 1000, False, 1),
    "single-10k": (1, 1, 10000, 1000, False, 1),
    "single-30k": (1, 1, 30000, 1000, False, 1),
    "single-50k": (1, 1, 50000, 1000, False, 1),
    "single-100k": (1, 1, 100000, 1000, False, 0.25),
    "single-100k-1hz": (1, 1, 100000, 1000, False, 1),
    "triple-10k": (3, 2, 10000, 1000, False, 1),
    "triple-30k": (3, 2, 30000, 1000, False, 1),
    "triple-100k": (3, 2, 100000, 1000, False, 0.25),
    "failover-r2-10k": (3, 2, 10000, 1000, True, 1),
    "failover-r1-10k": (3, 1, 10000, 1000, True, 1),
    "failover-r2-30k": (3, 2, 30000, 1000, True, 1),
    "failover-r1-30k": (3, 1, 30000, 1000, True, 1),
    "failover-r2-100k": (3, 2, 100000, 1000, True, 0.25),
    "failover-r1-100k": (3, 1, 100000, 1000, True, 0.25),
}
# Extra collector flags per scenario: the /metrics of every node's readings, as before issue 11.
SCENARIOS["single-10k-export-all"] = (1, 1, 10000, 1000, False, 1)
# A shorter straggler window: how much of R=1's re-flagging time is the fresh owner's window.
SCENARIOS["failover-r1-10k-window8"] = (3, 1, 10000, 1000, True, 1)
COLLECTOR_FLAGS = {"single-10k-export-all": ["--export-node-metrics=all"],
                   "failover-r1-10k-window8": ["--straggler-window=8"]}
DEFAULT = ["single-8", "single-1k", "single-10k", "single-10k-export-all", "single-30k",
           "single-100k", "triple-10k", "triple-30k", "triple-100k", "failover-r2-10k",
           "failover-r1-10k", "failover-r2-30k", "failover-r1-30k", "failover-r2-100k",
           "failover-r1-100k"]


def run_scenario(args, name, logdir):
    n_coll, replicas, ranks, world, kill, sps = SCENARIOS[name]
    rpn = min(8, ranks)
    nodes = ranks // rpn
    k = args.duration_scale
    # Timeline: warm-up 10 s, CPU window 30 s (no /metrics polls in it), curl scrapes, straggler
    # from 45 s (rank 3 of every job), detection polls every 0.5 s for 25 steps, the kill, then
    # 2 s of failover and 30 steps for the new owners to flag the stragglers again.
    measure_after, measure_for = 10 * k, 30 * k
    curl_at = measure_after + measure_for + 1
    straggler_after = curl_at + 4
    kill_at = straggler_after + 25 * k / sps if kill else -1
    duration = (kill_at + 2 + 30 * k / sps) if kill else (straggler_after + 25 * k / sps)
    extra = (["--max-nodes=20000"] if nodes > 10000 else []) + COLLECTOR_FLAGS.get(name, [])
    collectors = [start_collector(args.build, logdir, f"{name}-c{i}", extra) for i in range(n_coll)]
    try:
        cmd = [os.path.join(args.build, "bench/loadgen/stepwatch-loadgen"),
               "--collector=" + ",".join(c[1] for c in collectors),
               "--metrics=" + ",".join(c[2] for c in collectors),
               "--collector-pids=" + ",".join(str(c[0].pid) for c in collectors),
               f"--replicas={replicas}", f"--nodes={nodes}", f"--ranks-per-node={rpn}",
               f"--world-size={world}", "--gpus=8", f"--steps-per-second={sps}",
               f"--duration={duration}", f"--measure-after={measure_after}",
               f"--measure-for={measure_for}", "--straggler-rank=3", "--straggler-jobs=0",
               f"--straggler-after={straggler_after}", "--poll-interval=0.5",
               f"--threads={4 if nodes >= 1000 else 1}"]
        if kill:
            # The victim: the first collector (placement decides which jobs it holds).
            cmd += [f"--kill-pid={collectors[0][0].pid}", "--kill-index=0", f"--kill-at={kill_at}"]
        err = open(os.path.join(logdir, f"{name}.loadgen.log"), "w")
        start = time.time()
        lg = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        time.sleep(max(0, curl_at - (time.time() - start)))
        scrapes = []
        for _, _, metrics in collectors:
            got = [curl_once(metrics) for _ in range(3)]
            got = [g for g in got if g]
            scrapes.append({"bytes": max((g[0] for g in got), default=-1),
                            "seconds": sorted(g[1] for g in got)[len(got) // 2] if got else -1})
        try:
            out, _ = lg.communicate(timeout=duration + 60)
        except subprocess.TimeoutExpired:
            lg.kill()
            out, _ = lg.communicate()
        summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        summary["scenario"] = name
        summary["curl"] = scrapes
        summary["loadavg_1m_at_end"] = os.getloadavg()[0]
        summary["collector_binary_mtime"] = time.strftime(
            "%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(
                os.path.join(args.build, "collector/stepwatch-collector"))))
        return summary
    finally:
        for proc, _, _ in collectors:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def line(s):
    cols = s.get("per_collector", [])
    live = [c for c in cols if c["cpu_s"] > 0]
    parts = [f"{s['scenario']}: ranks={s.get('ranks')} steps/s={s.get('steps_per_second')} lag_max={s.get('max_lag_s')}s"
             f" sent={s.get('steps_sent')} acked={s.get('steps_acked')}"
             f" loadgen_cpu={s.get('loadgen_cpu_s')}s load1={s.get('loadavg_1m_at_end'):.2f}"
             f" collector_built={s.get('collector_binary_mtime')}"]
    for c in live:
        parts.append(f"  {c['address']}: ranks_held={c['ranks_held']} cpu_share={c['cpu_share']}"
                     f" step_ev/cpu_s={c['step_events_per_cpu_s']} ev/cpu_s={c['events_per_cpu_s']}"
                     f" rss={c['rss_start_kib']}->{c['rss_kib']} KiB")
    parts.append(f"  curl: {s.get('curl')}")
    parts.append(f"  detection: {s.get('detection')}")
    if "failover" in s:
        parts.append(f"  failover: {s['failover']}")
    return "\n".join(parts)


def table(out):
    """Markdown rows from DIR/*.json: the figures docs/scale.md quotes."""
    rows = ["| scenario | ranks | steps/s | max lag s | per collector: ranks held, CPU % of a core, "
            "step events per CPU-s, all events per CPU-s, RSS MiB, KiB per rank | /metrics bytes, "
            "curl s (before findings) | /metrics bytes with findings (poll p50) | detection p50 / "
            "max: steps (s) | failover (s from SIGKILL, p50/max) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in list(SCENARIOS):
        path = os.path.join(out, f"{name}.json")
        if not os.path.exists(path):
            continue
        s = json.load(open(path))
        cols, curls = [], []
        for c, cu in zip(s["per_collector"], s["curl"]):
            if c["ranks_held"] > 0 and c["rss_kib"] > 0:
                per_rank = (c["rss_kib"] - c["rss_start_kib"]) / c["ranks_held"]
                cols.append(f"{c['ranks_held']}, {100 * c['cpu_share']:.1f}%, "
                            f"{c['step_events_per_cpu_s']:.0f}, {c['events_per_cpu_s']:.0f}, "
                            f"{c['rss_kib'] / 1024:.0f}, {per_rank:.1f}")
            curls.append(f"{cu['bytes']}, {cu['seconds']:.4f}")
        polled = "; ".join(f"{c['scrape_bytes_p50']:.0f}" for c in s["per_collector"])
        d = s["detection"]
        det = (f"{d['steps_p50']} / {d['steps_max']} ({d['seconds_p50']} / {d['seconds_max']})"
               f"{', undetected ' + str(d['undetected']) if d['undetected'] else ''}")
        fo = ""
        if "failover" in s:
            f = s["failover"]
            fo = "; ".join(f"{k}: {v['p50_s']}/{v['max_s']}" + (f" ({v['missing']} missing)" if v["missing"] else "")
                           for k, v in f.items() if isinstance(v, dict))
            fo = f"{f['moved_jobs']} jobs moved; " + fo
        rows.append(f"| {name} | {s['ranks']} | {s['steps_per_second']} | {s['max_lag_s']} | "
                    f"{'; '.join(cols)} | {'; '.join(curls)} | {polled} | {det} | {fo} |")
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build-scale")
    p.add_argument("--max-ranks", type=int, default=100000)
    p.add_argument("--only", default="")
    p.add_argument("--out", default="")
    p.add_argument("--duration-scale", type=float, default=1.0)
    p.add_argument("--table", default="", help="print the table of DIR's results and exit")
    p.add_argument("--budget", type=float, default=2400, help="seconds for the whole run")
    args = p.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    out = args.out or tempfile.mkdtemp(prefix="stepwatch-scale-")
    os.makedirs(out, exist_ok=True)
    names = [n for n in DEFAULT if SCENARIOS[n][2] <= args.max_ranks]
    if args.only:
        names = [n for n in args.only.split(",") if n in SCENARIOS]
    began = time.time()
    for name in names:
        if time.time() - began > args.budget:
            print(f"budget of {args.budget:.0f} s spent; skipping {name}")
            continue
        s = run_scenario(args, name, out)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(s, f, indent=1)
        print(line(s), flush=True)
    print(f"results in {out}")


if __name__ == "__main__":
    sys.exit(main())
