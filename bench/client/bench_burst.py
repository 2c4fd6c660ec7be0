#!/usr/bin/env python3
"""Burst benchmark: RANKS training processes on one node end their steps at the same instant, on a
machine whose CPUs are busy, ROUNDS times; once against an agent with its seqpacket socket and once
against the same agent with datagrams only (--seqpacket-socket=none, as an older agent). Prints,
per transport, the sends the clients saw refused (their own drop count) and the events the agent
received.

    bench/client/bench_burst.py --agent build/agent/stepwatch-agent [--ranks 64] [--rounds 50]

The agent runs with its collector address pointing at a closed loopback port: what is measured is
the hop from the training process to the agent. CPU burners (one busy process per CPU, by default)
run for the whole measurement. Not a test: it asserts nothing.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "..", "python")

# One rank: at each round's instant sends one step event, then prints its reporter's counters.
RANK = """
import json, sys, time
import stepwatch
path, rank, ranks, start, rounds, interval = sys.argv[1:7]
rep = stepwatch.Reporter("bench", int(rank), int(ranks), socket_path=path, env={})
start, interval = float(start), float(interval)
for step in range(int(rounds)):
    delay = start + interval * step - time.time()
    if delay > 0:
        time.sleep(delay)
    rep.send(step, interval, data_s=0.001, compute_s=interval * 0.8, comm_s=0.001, samples=8)
print(json.dumps({"sent": rep.sent, "dropped": rep.dropped, "transport": rep.transport}))
"""

BURNER = "while True:\n    pass\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url, name):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^%s(\{[^}]*\})?\s+(\S+)" % re.escape(name), line)
        if m:
            total += float(m.group(2))
    return total


def run(args, seqpacket):
    tmp = tempfile.mkdtemp(prefix="sw-bench-burst-")
    sock = os.path.join(tmp, "agent.sock")
    metrics = "127.0.0.1:%d" % free_port()
    agent_cmd = [
        args.agent,
        "--collector=127.0.0.1:%d" % free_port(),
        "--socket=" + sock,
        "--metrics-listen=" + metrics,
        "--nvml-library=" + os.path.join(tmp, "no-nvml.so"),
        "--seqpacket-socket=" + ("" if seqpacket else "none"),
    ]
    log = open(os.path.join(tmp, "agent.log"), "wb")
    agent = subprocess.Popen(agent_cmd, stdout=log, stderr=subprocess.STDOUT)
    url = "http://%s/metrics" % metrics
    deadline = time.monotonic() + 20
    while True:
        try:
            scrape(url, "stepwatch_agent_events_received_total")
            break
        except OSError:
            if time.monotonic() > deadline or agent.poll() is not None:
                agent.kill()
                sys.exit("the agent did not start; see " + log.name)
            time.sleep(0.1)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(PYTHON_DIR))
    start = time.time() + args.startup
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, sock, str(r), str(args.ranks), repr(start),
             str(args.rounds), str(args.interval)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        for r in range(args.ranks)
    ]
    results = [json.loads(p.communicate(timeout=600)[0]) for p in ranks]
    late = time.time() - (start + args.interval * args.rounds)
    time.sleep(1.0)  # the agent drains what is queued
    received = scrape(url, "stepwatch_agent_events_received_total")
    reported = scrape(url, "stepwatch_agent_client_dropped_events_total")
    agent.send_signal(signal.SIGTERM)
    agent.wait(timeout=20)
    log.close()
    return {
        "transport": sorted({r["transport"] or "none" for r in results}),
        "events": args.ranks * args.rounds,
        "sent": sum(r["sent"] for r in results),
        "refused": sum(r["dropped"] for r in results),
        "received": int(received),
        "drops_reported_to_agent": int(reported),
        "seconds_behind_schedule": round(max(late, 0.0), 2),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default=os.path.join(HERE, "..", "..", "build", "agent",
                                                        "stepwatch-agent"))
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between rounds")
    parser.add_argument("--burners", type=int, default=os.cpu_count(),
                        help="busy processes kept running (default: one per CPU)")
    parser.add_argument("--startup", type=float, default=10.0,
                        help="seconds the ranks get to start before the first round")
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(args.burners)]
    try:
        out = {}
        for name, seqpacket in (("datagram", False), ("seqpacket", True)):
            out[name] = run(args, seqpacket)
            print(name, json.dumps(out[name]), flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    print("qlen", open("/proc/sys/net/unix/max_dgram_qlen").read().strip(),
          "cpus", os.cpu_count(), "burners", args.burners, "ranks", args.ranks,
          "rounds", args.rounds)


if __name__ == "__main__":
    main()
