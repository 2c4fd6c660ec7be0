#!/usr/bin/env python3
"""Cost to a training loop of reporting one step with the stepwatch Python package.

Measured with time.perf_counter over many events, against a real bound Unix datagram socket that a
separate process drains (as the agent would). Prints one line per case with the median over
repetitions of the mean microseconds per event (wall clock, and this thread's CPU time), plus how
many events were sent and dropped (the drainer cannot always keep up: a dropped event still costs
the send() system call, which fails with EAGAIN). Each step case is followed by its anchor: a bare
socket.send() of the same event's bytes on a socket of its own, and the ratio of the two.

By default the benchmark and the drainer are pinned to two different CPUs (when there are two):
otherwise the scheduler may put them on the same CPU, and the wall clock then also counts the
drainer's own work, which on a 2-CPU machine roughly doubles the figure from run to run. --no-pin
leaves placement to the scheduler.

--transport=seqpacket drains the agent's seqpacket socket (`<socket>.seq`, a connection per
reporter) instead of the datagram socket.

    /usr/bin/python3 bench/client/bench_python_client.py [--events N] [--repeat R] [--no-pin]
        [--transport datagram|seqpacket] [--pause S] [--stop-drainer]
"""

import argparse
import json
import os
import signal
import socket
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


def bench(fn, events, repeat, pause=0.0, stopped=None):
    """Median over `repeat` runs of (wall, CPU) microseconds per event.

    Wall time (perf_counter) is the figure that counts; the thread's CPU time tells how much of it
    was spent in this thread rather than waiting for a busy machine's CPUs. `pause` seconds
    between runs (not timed) let the drainer empty the socket; with `stopped` (the drainer's
    pid) the drainer is stopped while a run is timed, so that neither the client nor its anchor
    pays for waking it (a slower sender finds it asleep more often).
    """
    wall, cpu = [], []
    for _ in range(repeat):
        if pause:
            time.sleep(pause)
        if stopped:
            os.kill(stopped, signal.SIGSTOP)
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn(events)
        wall.append((time.perf_counter() - start) / events * 1e6)
        cpu.append((time.thread_time() - start_cpu) / events * 1e6)
        if stopped:
            os.kill(stopped, signal.SIGCONT)
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
    parser.add_argument("--stop-drainer", action="store_true",
                        help="stop the drainer while each run is timed (use with --pause, "
                             "--transport=seqpacket and --events the send buffer holds)")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds between repetitions, so that the drainer of a busy machine "
                             "empties the socket (with --transport=seqpacket and --events under "
                             "what the send buffer holds, no event is then dropped)")
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
            stopped = drain.pid if args.stop_drainer else None
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

            def captured_event(reporter, fn):
                """The bytes `fn` sends for one event (the reporter's socket stood in for)."""

                class Capture:
                    def send(self, data):
                        self.data = data

                real, capture = reporter._sock, Capture()
                reporter._sock = capture
                try:
                    fn(1)
                finally:
                    reporter._sock = real
                return capture.data

            bare = None
            if args.transport == "datagram":
                bare = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                bare.connect(path)
            else:  # configured as the reporter's connection is
                bare = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                bare.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                stepwatch.reporter.SEND_BUFFER_BYTES)
                bare.connect(path + ".seq")
            bare.setblocking(False)
            bare_dropped = [0]

            def bare_sender(event):
                def run(n):
                    send = bare.send
                    for _ in range(n):
                        try:
                            send(event)
                        except BlockingIOError:  # the drainer fell behind, as for the reporter
                            bare_dropped[0] += 1
                return run

            def module_scopes(n):
                for _ in range(n):
                    with stepwatch.step(samples=256):
                        with stepwatch.phase("data"):
                            pass
                        with stepwatch.phase("compute"):
                            pass
                        with stepwatch.phase("comm"):
                            pass

            def module_one_phase(n):
                for _ in range(n):
                    with stepwatch.step(samples=256):
                        with stepwatch.phase("compute"):
                            pass

            def module_two_phases(n):
                for _ in range(n):
                    with stepwatch.step(samples=256):
                        with stepwatch.phase("data"):
                            pass
                        with stepwatch.phase("compute"):
                            pass

            def module_sections(n):
                for _ in range(n):
                    with stepwatch.step(samples=256):
                        with stepwatch.phase("data"):
                            pass
                        with stepwatch.phase("forward"):
                            pass
                        with stepwatch.phase("backward"):
                            pass

            results = []
            for name, fn, reporter in (("send", send, rep),
                                       ("step_with_3_phases", scopes, rep),
                                       ("module_step_with_3_phases", module_scopes, module_rep),
                                       ("module_step_with_1_phase", module_one_phase, module_rep),
                                       ("module_step_with_2_phases", module_two_phases,
                                        module_rep),
                                       ("module_step_with_2_sections", module_sections,
                                        module_rep)):
                reporter.sent = reporter.dropped = 0
                us, cpu_us = bench(fn, args.events, args.repeat, args.pause, stopped)
                result = {"case": name, "us_per_event": round(us, 3),
                          "cpu_us_per_event": round(cpu_us, 3), "sent": reporter.sent,
                          "dropped": reporter.dropped, "transport": reporter.transport}
                # The anchor: a bare socket.send() of the same bytes on a socket of its own,
                # measured right after (the machine's state is the same for both).
                event = captured_event(reporter, fn)
                bare_dropped[0] = 0
                bare_us, bare_cpu_us = bench(bare_sender(event), args.events, args.repeat,
                                             args.pause, stopped)
                result.update({"bare_send_us": round(bare_us, 3),
                               "bare_send_cpu_us": round(bare_cpu_us, 3),
                               "bare_dropped": bare_dropped[0],
                               "ratio": round(us / bare_us, 2),
                               "cpu_ratio": round(cpu_us / bare_cpu_us, 2)})
                results.append(result)
            rep.close()
            module_rep.close()
            bare.close()

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
