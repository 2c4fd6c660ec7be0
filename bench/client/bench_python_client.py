#!/usr/bin/env python3
"""Cost to a training loop of reporting one step with the stepwatch Python package.

Measured with time.perf_counter over many events, against a real bound Unix datagram socket that a
separate process drains (as the agent would). Prints one line per case with the median over
repetitions of the mean microseconds per event (wall clock, and this thread's CPU time), plus how
many events were sent and dropped (the drainer cannot always keep up: dropped events cost the same
system call).

    /usr/bin/python3 bench/client/bench_python_client.py [--events N] [--repeat R]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import stepwatch  # noqa: E402

_DRAIN = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print("ready", flush=True)
while True:  # until terminated by the benchmark
    s.recv(65536)
"""


def bench(fn, events, repeat):
    """Median over `repeat` runs of (wall, CPU) microseconds per event.

    Wall time (perf_counter) is the figure that counts; the thread's CPU time tells how much of it
    was spent in this thread rather than waiting for a busy machine's CPUs.
    """
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn(events)
        wall.append((time.perf_counter() - start) / events * 1e6)
        cpu.append((time.thread_time() - start_cpu) / events * 1e6)
    return statistics.median(wall), statistics.median(cpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100000, help="events per repetition")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median is reported)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sw-pybench-") as tmp:
        path = os.path.join(tmp, "agent.sock")
        drain = subprocess.Popen([sys.executable, "-c", _DRAIN, path], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert drain.stdout.readline().strip() == "ready"
            rep = stepwatch.Reporter(job="bench-job", rank=3, world_size=8, local_rank=3, gpu=3,
                                     socket_path=path, env={})

            def send(n):
                for i in range(n):
                    rep.send(i, 0.123456789, 0.0012345, 0.0987654321, 0.0234567, 256)

            def scopes(n):
                for _ in range(n):
                    with rep.step(samples=256):
                        with rep.phase("data"):
                            pass
                        with rep.phase("compute"):
                            pass
                        with rep.phase("comm"):
                            pass

            results = []
            for name, fn in (("send", send), ("step_with_3_phases", scopes)):
                rep.sent = rep.dropped = 0
                us, cpu_us = bench(fn, args.events, args.repeat)
                results.append({"case": name, "us_per_event": round(us, 3),
                                "cpu_us_per_event": round(cpu_us, 3), "sent": rep.sent,
                                "dropped": rep.dropped})
            rep.close()

            absent = stepwatch.Reporter(job="bench-job", rank=0, world_size=1,
                                        socket_path=os.path.join(tmp, "absent.sock"), env={})
            absent._log.disabled = True

            def send_absent(n):
                for i in range(n):
                    absent.send(i, 0.1, 0.01, 0.05, 0.04, 256)

            us, cpu_us = bench(send_absent, args.events, args.repeat)
            results.append({"case": "send_agent_absent", "us_per_event": round(us, 3),
                            "cpu_us_per_event": round(cpu_us, 3), "sent": absent.sent,
                            "dropped": absent.dropped})
            absent._log.disabled = False
        finally:
            drain.terminate()
            drain.wait(timeout=30)
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
