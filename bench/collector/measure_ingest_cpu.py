#!/usr/bin/env python3
"""Collector CPU per million step events beside a do-nothing gRPC server, in one run.

Each server in turn (the anchor, null-ingest-server, then every collector configuration) takes
the same load: --agents stepwatch-loadgen processes of one node each (8 ranks, 8 GPUs, one
batch per step), started a fraction of a step apart so that their batches arrive spread out, as
independent agents' do. The server's CPU (utime + stime from /proc) over the whole run is
divided by the step events acknowledged. Repetitions are interleaved (every configuration once,
then again), and the table gives medians.

  bench/collector/measure_ingest_cpu.py --build build \
      --config "before=/path/to/old/stepwatch-collector --state-dir={state}" \
      --config "after=build/collector/stepwatch-collector --state-dir={state}"

A --config is NAME=COMMAND (NAME without "="); {state} is a fresh directory per run. Without
--config: the collector of --build with --state-dir at --journal-commit-interval 0, 0.002 and
the default, and without --state-dir.
"""
import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_port(port, proc, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def run_once(command, args):
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="stepwatch-ingest-cpu-", dir=args.state_root) as state:
        argv = shlex.split(command.format(state=state))
        if os.path.basename(argv[0]) == "null-ingest-server":
            argv += [f"--listen=127.0.0.1:{port}"]
        else:
            argv += [f"--grpc-listen=127.0.0.1:{port}", "--metrics-listen="]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        gens = []
        try:
            wait_for_port(port, server)
            time.sleep(0.5)
            cpu0 = cpu_seconds(server.pid)
            loadgen = os.path.join(args.build, "bench/loadgen/stepwatch-loadgen")
            period = 1.0 / args.steps_per_second
            for a in range(args.agents):
                gens.append(subprocess.Popen(
                    [loadgen, f"--collector=127.0.0.1:{port}", "--replicas=1", "--nodes=1",
                     "--threads=1", f"--ranks_per_node={args.ranks_per_node}",
                     f"--world_size={args.ranks_per_node}", "--gpus=8",
                     f"--steps_per_second={args.steps_per_second}",
                     f"--duration={args.duration}", "--measure_after=0",
                     f"--node_prefix=agent{a}-node", f"--job_prefix=agent{a}-job"],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
                time.sleep(period / args.agents)
            steps = 0
            lag = 0.0
            for g in gens:
                out, _ = g.communicate(timeout=args.duration + 60)
                summary = json.loads(out.strip().splitlines()[-1])
                steps += summary["steps_acked"]
                lag = max(lag, summary["final_lag_s"])
            cpu = cpu_seconds(server.pid) - cpu0
        finally:
            for g in gens:
                if g.poll() is None:
                    g.kill()
                    g.wait()
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return {"cpu_s": cpu, "steps": steps, "cpu_s_per_million": cpu / steps * 1e6 if steps else -1,
            "final_lag_s": lag}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--config", action="append", default=[], help="NAME=COMMAND")
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--steps-per-second", type=float, default=50,
                   help="batches per second of each agent (one step of its ranks each)")
    p.add_argument("--ranks-per-node", type=int, default=16, help="step events per batch")
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--state-root", default=None, help="where the state dirs go (default TMPDIR)")
    args = p.parse_args()

    collector = os.path.join(args.build, "collector/stepwatch-collector")
    configs = [("null-ingest-server", os.path.join(args.build, "bench/collector/null-ingest-server"))]
    if args.config:
        configs += [tuple(c.split("=", 1)) for c in args.config]
    else:
        configs += [
            ("state-dir, per-batch sync", f"{collector} --state-dir={{state}} "
             "--journal-commit-interval=0"),
            ("state-dir, group commit 2 ms", f"{collector} --state-dir={{state}} "
             "--journal-commit-interval=0.002"),
            ("state-dir, default interval", f"{collector} --state-dir={{state}}"),
            ("no state-dir", collector),
        ]
    results = {name: [] for name, _ in configs}
    for rep in range(args.repetitions):
        for name, command in configs:
            r = run_once(command, args)
            results[name].append(r)
            print(f"rep {rep + 1} {name}: {r['cpu_s']:.2f} CPU-s, {r['steps']} step events, "
                  f"{r['cpu_s_per_million']:.2f} CPU-s per million, final lag {r['final_lag_s']:.3f} s",
                  file=sys.stderr, flush=True)
    anchor = statistics.median(r["cpu_s_per_million"] for r in results[configs[0][0]])
    print(f"| server ({args.agents} agents x {args.steps_per_second:g} batches/s x "
          f"{args.ranks_per_node} step events) "
          "| CPU-s per million step events (median; runs) | vs do-nothing server |")
    print("|---|---|---|")
    for name, _ in configs:
        runs = [r["cpu_s_per_million"] for r in results[name]]
        med = statistics.median(runs)
        print(f"| {name} | {med:.2f} ({', '.join(f'{x:.2f}' for x in runs)}) | {med / anchor:.2f}x |")


if __name__ == "__main__":
    main()
