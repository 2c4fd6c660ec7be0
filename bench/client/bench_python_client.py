#!/usr/bin/env python3
"""Cost to a training loop of reporting one step with the stepwatch Python package.

Measured with time.perf_counter over many events, against a real bound Unix datagram socket that a
separate process drains (as the agent would). Prints one line per case with the median over
repetitions of the mean microseconds per event (wall clock, and this thread's CPU time), plus how
many events were sent and dropped (the drainer cannot always keep up: a dropped event still costs
the send() system call, which fails with EAGAIN).

By default the benchmark and the drainer are pinned to two different CPUs (when there are two):
otherwise the scheduler may put them on the same CPU, and the wall clock then also counts the
drainer's own work, which on a 2-CPU machine roughly doubles the figure from run to run. --no-pin
leaves placement to the scheduler.

--transport=seqpacket drains the agent's seqpacket socket (`<socket>.seq`, a connection per
reporter) instead of the datagram socket.

    /usr/bin/python3 bench/client/bench_python_client.py [--events N] [--repeat R] [--no-pin]
        [--transport datagram|seqpacket]
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
import os, selectors, socket, sys
if sys.argv[2] != "-":
    os.sched_setaffinity(0, {int(sys.argv[2])})
if sys.argv[3] == "datagram":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sys.argv[1])
    print("ready", flush=True)
    while True:  # until terminated by the benchmark
        s.recv(65536)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(sys.argv[1] + ".seq")
listener.listen(16)
sel = selectors.DefaultSelector()
sel.register(listener, selectors.EVENT_READ)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        if key.fileobj is listener:
            sel.register(listener.accept()[0], selectors.EVENT_READ)
        elif not key.fileobj.recv(65536):
            sel.unregister(key.fileobj)
            key.fileobj.close()
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
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin the benchmark and the drainer to different CPUs")
    parser.add_argument("--transport", choices=("datagram", "seqpacket"), default="datagram",
                        help="which of the agent's sockets the drainer stands in for")
    args = parser.parse_args()

    cpus = sorted(os.sched_getaffinity(0))
    drain_cpu = "-"
    if not args.no_pin and len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[0]})
        drain_cpu = str(cpus[1])

    with tempfile.TemporaryDirectory(prefix="sw-pybench-") as tmp:
        path = os.path.join(tmp, "agent.sock")
        drain = subprocess.Popen([sys.executable, "-c", _DRAIN, path, drain_cpu, args.transport],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert drain.stdout.readline().strip() == "ready"
            identity = dict(job="bench-job", rank=3, world_size=8, local_rank=3, gpu=3,
                            socket_path=path, env={})
            rep = stepwatch.Reporter(**identity)
            rep._log.disabled = True  # the one "agent busy" warning would interleave the output

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

            module_rep = stepwatch.configure(**identity)

            def module_scopes(n):
                for _ in range(n):
                    with stepwatch.step(samples=256):
                        with stepwatch.phase("data"):
                            pass
                        with stepwatch.phase("compute"):
                            pass
                        with stepwatch.phase("comm"):
                            pass

            results = []
            for name, fn, reporter in (("send", send, rep),
                                       ("step_with_3_phases", scopes, rep),
                                       ("module_step_with_3_phases", module_scopes, module_rep)):
                reporter.sent = reporter.dropped = 0
                us, cpu_us = bench(fn, args.events, args.repeat)
                results.append({"case": name, "us_per_event": round(us, 3),
                                "cpu_us_per_event": round(cpu_us, 3), "sent": reporter.sent,
                                "dropped": reporter.dropped, "transport": reporter.transport})
            rep.close()
            module_rep.close()

            absent = stepwatch.Reporter(job="bench-job", rank=0, world_size=1,
                                        socket_path=os.path.join(tmp, "absent.sock"), env={})

            def send_absent(n):
                for i in range(n):
                    absent.send(i, 0.1, 0.01, 0.05, 0.04, 256)

            us, cpu_us = bench(send_absent, args.events, args.repeat)
            results.append({"case": "send_agent_absent", "us_per_event": round(us, 3),
                            "cpu_us_per_event": round(cpu_us, 3), "sent": absent.sent,
                            "dropped": absent.dropped})
            rep._log.disabled = False
        finally:
            drain.terminate()
            drain.wait(timeout=30)
    placement = ("benchmark on CPU %d, drainer on CPU %s" % (cpus[0], drain_cpu)
                 if drain_cpu != "-" else "placement left to the scheduler")
    print(json.dumps({"python": sys.version.split()[0], "cpus": len(cpus),
                      "placement": placement, "load_average": os.getloadavg()[0]}))
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
