#!/usr/bin/env python3
"""Benchmark (not a test): /metrics scrape latency of a real collector with idle and slow-loris
clients open against it, and the render cost per series.

Starts stepwatch-collector and one stepwatch-agent from a build dir on loopback, feeds JOBS jobs of
RANKS ranks through the agent so that the collector has series to render, then scrapes
sequentially (a new connection per scrape, as Prometheus without keep-alive) in three phases:
no other clients; IDLE idle connections; IDLE idle plus SLOW slow-loris clients sending one header
byte per second. Connections the server closes at its header deadline are reopened, so the load
stays constant. Prints p50/p99/max per phase and the collector's own render time per series.

  bench/collector/scrape_under_idle_connections.py --build-dir=build [--scrapes=300]
"""

import argparse
import os
import select
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--scrapes", type=int, default=300, help="scrapes per phase")
    p.add_argument("--idle", type=int, default=300)
    p.add_argument("--slow", type=int, default=50)
    p.add_argument("--jobs", type=int, default=40)
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--timeout", type=float, default=15.0, help="per scrape, seconds")
    return p.parse_args()


class Clients:
    """IDLE silent connections and SLOW ones that send a header byte per second, kept open."""

    def __init__(self, port, idle, slow):
        self.port = port
        self.connect_failures = 0
        self.idle = [s for s in (self._connect() for _ in range(idle)) if s is not None]
        self.slow = [s for s in (self._connect() for _ in range(slow)) if s is not None]
        self.reopened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _connect(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        except OSError:
            self.connect_failures += 1  # a server that stops accepting
            return None
        s.setblocking(False)
        return s

    def _reopen_closed(self, group):
        readable, _, _ = select.select(group, [], [], 0) if group else ([], [], [])
        for s in readable:
            try:
                if s.recv(4096):
                    continue  # a response: keep it (not expected from silent clients)
            except OSError:
                pass
            fresh = self._connect()
            if fresh is not None:
                group[group.index(s)] = fresh
                s.close()
                self.reopened += 1

    def _run(self):
        head = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 4096
        i = 0
        while not self.stop.wait(1.0):
            for s in self.slow:
                try:
                    s.send(head[i % len(head):i % len(head) + 1])
                except OSError:
                    pass
            i += 1
            # select() takes at most 1024 descriptors per call.
            for start in range(0, len(self.idle), 500):
                chunk = self.idle[start:start + 500]
                self._reopen_closed(chunk)
                self.idle[start:start + 500] = chunk
            self._reopen_closed(self.slow)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        for s in self.idle + self.slow:
            s.close()


def scrape_latencies(url, count, timeout):
    latencies, failures = [], 0
    for _ in range(count):
        start = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                r.read()
                ok = r.status == 200
        except (OSError, urllib.error.URLError):
            ok = False
        latencies.append(time.monotonic() - start)
        failures += 0 if ok else 1
        time.sleep(0.01)
    return latencies, failures


def summary(values):
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]
    return (f"p50 {pick(0.5) * 1e3:7.2f} ms  p99 {pick(0.99) * 1e3:7.2f} ms  "
            f"max {v[-1] * 1e3:7.2f} ms")


def main():
    args = parse_args()
    os.environ["STEPWATCH_BUILD_DIR"] = os.path.abspath(args.build_dir)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "tests", "integration"))
    from harness import Agent, Collector, metric_value, parse_metrics, step_event, wait_until

    with tempfile.TemporaryDirectory(prefix="stepwatch-scrape-bench-") as tmp:
        with Collector(tmp) as collector, Agent(tmp, collector.grpc_addr) as agent:
            for step in range(20):
                for job in range(args.jobs):
                    for rank in range(args.ranks):
                        busy = 0.07 * (1.5 if rank == 3 else 1.0)
                        agent.send(step_event(f"bench-{job}", rank, args.ranks, step, 0.1,
                                              data_s=0.0, compute_s=busy, comm_s=0.1 - busy))
            wait_until(lambda: (metric_value(collector.scrape(), "stepwatch_job_step_seconds",
                                             job=f"bench-{args.jobs - 1}") or 0) > 0,
                       timeout=60, message="every job in the collector")
            body = urllib.request.urlopen(collector.metrics_url, timeout=10).read().decode()
            series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
            print(f"collector /metrics: {series} series, {len(body)} bytes")
            renders = []
            for _ in range(20):
                samples = parse_metrics(
                    urllib.request.urlopen(collector.metrics_url, timeout=10).read().decode())
                value = metric_value(samples, "stepwatch_metrics_http_render_seconds")
                if value is not None:
                    renders.append(value)
            if renders:
                renders.sort()
                median = renders[len(renders) // 2]
                print(f"render (Collect + text format): median {median * 1e3:.2f} ms, "
                      f"{median / series * 1e6:.2f} us per series")

            phases = [("no other clients", 0, 0), (f"{args.idle} idle", args.idle, 0),
                      (f"{args.idle} idle + {args.slow} slow-loris", args.idle, args.slow)]
            for name, idle, slow in phases:
                clients = Clients(collector.metrics_port, idle, slow) if idle or slow else None
                time.sleep(1.0)  # let the server accept them all
                try:
                    latencies, failures = scrape_latencies(collector.metrics_url, args.scrapes,
                                                           args.timeout)
                finally:
                    reopened = clients.reopened if clients else 0
                    refused = clients.connect_failures if clients else 0
                    if clients:
                        clients.close()
                print(f"{name:32s} {summary(latencies)}  failed {failures}/{len(latencies)}"
                      f"  (clients reopened after a server close: {reopened}, "
                      f"not accepted within 2 s: {refused})")


if __name__ == "__main__":
    main()
