#!/usr/bin/env python3
"""Soak benchmark: hours of stepwatch operation compressed into a bounded run with rising load.

Starts a real stepwatch-collector and --agents real stepwatch-agents (loopback, free ports, a
temporary directory; each agent with its own --socket and --spool-dir), then plays simulated
training jobs through them with the Python client (bench/soak/soak_sender.py, one process per
job, one stepwatch.Reporter per rank). The run is a sequence of phases: --phases load levels,
each doubling the event rate of the one before (world size and steps/s doubled in turn), and the
whole ramp played --rounds times, so that every load level is seen again later in the run. In
every phase --slots jobs run at once; each lives --job-seconds (the first of each slot less, so
that ends are staggered) and is replaced by a job with a new name, so the collector keeps
creating, finishing and reporting jobs all the time. Odd-numbered jobs have a straggler, so
findings come and go as well.

Every second it samples RSS (VmRSS) and CPU time (utime+stime, /proc/PID/stat) of the collector
and each agent, the latency of a collector /metrics scrape and of `stepwatchctl status`, and the
event counters (clients' sent, agents' received and shipped, the collector's received). It
reports, per phase and overall:

- the least-squares slope of RSS (KiB/min) over each phase's steady part (after --warmup of the
  phase), and across rounds at equal load (the steady parts of every phase at that level): at
  constant load a leak shows as a positive slope; a standard error comes with each slope;
- CPU milliseconds per 1,000 events (the collector, and all agents together), CPU % of a core;
- p50/p99 of the /metrics scrape and of stepwatchctl status (which includes starting the process),
  and the slope of the scrape latency;
- events sent by clients vs received and shipped by agents vs counted by the collector (loss).

It stops everything by itself after --duration seconds (plus a drain of at most --drain seconds);
--duration is capped at 3600 and a watchdog ends the run if it overstays.

    bench/soak/soak.py --build-dir=build [--duration=300] [--json=PATH]

The binaries come from --build-dir (stepwatch-collector, stepwatch-agent, stepwatchctl; the fake
NVML library tests/gpu/fake_nvml/libnvidia-ml.so.1 when built, for --gpus fake GPUs per agent).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import soak_report  # noqa: E402
import soak_stats  # noqa: E402

MAX_DURATION_S = 3600
# Extra time the watchdog allows past --duration + --drain for start-up and shutdown.
WATCHDOG_SLACK_S = 180
# A job shorter than this is not started at the end of a phase.
MIN_JOB_S = 2.0


class _Watchdog(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--duration", type=float, default=300, help="seconds of load (max 3600)")
    p.add_argument("--phases", type=int, default=4, help="load levels, each doubling the rate")
    p.add_argument("--rounds", type=int, default=3, help="times the ramp of load levels is played")
    p.add_argument("--settle-rounds", type=int, default=1,
                   help="first rounds left out of the leak verdicts and the across-round fits "
                   "(allocator caches, the first --max-reports reports); ignored when no later "
                   "round remains")
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8, help="fake GPUs per agent (0: none)")
    p.add_argument("--slots", type=int, default=4, help="jobs running at once")
    p.add_argument("--world-size", type=int, default=8, help="ranks per job at the first level")
    p.add_argument("--steps-per-s", type=float, default=4, help="steps/s at the first level")
    p.add_argument("--job-seconds", type=float, default=10, help="lifetime of a job")
    p.add_argument("--interval", type=float, default=1.0, help="the agents' --interval")
    p.add_argument("--name-pool", type=int, default=0,
                   help="reuse this many job names in turn (0: every job has a new name); "
                   "tells growth per distinct job name from growth per job")
    p.add_argument("--no-spool", action="store_true",
                   help="agents keep unacknowledged batches in memory only (no --spool-dir)")
    p.add_argument("--max-reports", type=int, default=16,
                   help="the collector's --max-reports: small, so that the bound is reached early "
                   "and finished reports do not read as growth")
    p.add_argument("--warmup", type=float, default=0.4,
                   help="fraction of each phase left out of its steady part")
    p.add_argument("--leak-kib-per-min", type=float, default=64,
                   help="an RSS slope above this (and above 3 standard errors) is flagged")
    p.add_argument("--drain", type=float, default=20, help="most seconds to wait for delivery")
    p.add_argument("--json", help="write the summary and every sample here")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    args = p.parse_args(argv)
    if not 0 < args.duration <= MAX_DURATION_S:
        p.error(f"--duration must be in (0, {MAX_DURATION_S}]")
    if args.phases < 1 or args.rounds < 1 or args.agents < 1 or args.slots < 1:
        p.error("--phases, --rounds, --agents and --slots must be >= 1")
    if args.settle_rounds < 0:
        p.error("--settle-rounds must be >= 0")
    if not 0 <= args.warmup < 1:
        p.error("--warmup must be in [0, 1)")
    return args


def level_load(args, level):
    """(world size, steps/s) of a load level: the product doubles at each level."""
    world = args.world_size * 2 ** ((level + 1) // 2)
    return world, args.steps_per_s * 2 ** (level // 2)


def metric_sum(samples, name):
    return sum(v for (n, _l, v) in samples if n == name)


class Soak:
    def __init__(self, args, harness, tmp):
        self.args = args
        self.h = harness
        self.tmp = tmp
        self.collector = None
        self.agents = []
        self.ctl = harness.build_path("stepwatchctl")
        self.slots = [None] * args.slots  # per slot: (Popen, job record) or None
        self.jobs = []  # every job started: name, phase, result
        self.started_in_phase = {}  # slot -> phase of its latest job
        self.samples = []
        n = args.phases * args.rounds
        self.phase_s = args.duration / n
        self.phases = []
        for i in range(n):
            level = i % args.phases
            world, rate = level_load(args, level)
            self.phases.append({"index": i, "round": i // args.phases, "level": level,
                                "world_size": world, "steps_per_s": rate,
                                "start": i * self.phase_s, "end": (i + 1) * self.phase_s})

    # ------------------------------------------------------------------ processes

    def start_services(self):
        a = self.args
        # Kept before start(), so that stop_all() also stops a process that never became ready.
        self.collector = self.h.Collector(self.tmp, max_reports=a.max_reports)
        self.collector.start()
        nvml_state = None
        if a.gpus > 0:
            try:
                self.h.fake_nvml_path()
                nvml_state = self.h.fake_nvml_state([self.h.fake_gpu(i) for i in range(a.gpus)])
            except FileNotFoundError:
                print("soak: no fake NVML library in the build dir; agents run without GPUs",
                      file=sys.stderr)
                a.gpus = 0
        for i in range(a.agents):
            spool = None if a.no_spool else os.path.join(self.tmp, f"spool-{i}")
            self.agents.append(self.h.Agent(self.tmp, self.collector.grpc_addr, node=f"node-{i}",
                                             fake_nvml_state=nvml_state, interval=a.interval,
                                             spool_dir=spool))
            self.agents[-1].start()

    def start_job(self, slot, phase, now, first):
        a = self.args
        seq = len(self.jobs)
        if a.name_pool > 0:
            name = f"soak-pool-{seq % a.name_pool}"
        else:
            name = f"soak-r{phase['round']}-l{phase['level']}-{seq:04d}"
        lifetime = a.job_seconds * ((slot + 1) / a.slots if first else 1.0)
        lifetime = min(lifetime, self.t0 + phase["end"] - now)
        result = os.path.join(self.tmp, f"{name}.json")
        cmd = [sys.executable, os.path.join(HERE, "soak_sender.py"), f"--job={name}",
               f"--world-size={phase['world_size']}", f"--steps-per-s={phase['steps_per_s']}",
               f"--seconds={lifetime:.3f}", f"--gpus-per-node={max(a.gpus, 1)}",
               "--sockets=" + ",".join(ag.socket_path for ag in self.agents),
               f"--result={result}", f"--seed={seq}"]
        if seq % 2:
            cmd.append("--straggler")
        log = open(os.path.join(self.tmp, f"{name}.log"), "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        log.close()
        job = {"name": name, "phase": phase["index"], "result_path": result, "result": None}
        self.jobs.append(job)
        self.slots[slot] = (proc, job)

    def reap(self, slot):
        """Collects a finished job; True when the slot is free."""
        entry = self.slots[slot]
        if entry is None:
            return True
        proc, job = entry
        if proc.poll() is None:
            return False
        try:
            with open(job["result_path"]) as f:
                job["result"] = json.load(f)
        except (OSError, ValueError):
            job["result"] = {"sent": 0, "dropped": 0, "error": f"exit status {proc.returncode}"}
        self.slots[slot] = None
        return True

    def manage_jobs(self, now):
        t = now - self.t0
        phase = next((p for p in self.phases if p["start"] <= t < p["end"]), None)
        for slot in range(self.args.slots):
            if not self.reap(slot) or phase is None:
                continue
            if self.t0 + phase["end"] - now < MIN_JOB_S:
                continue
            first = self.started_in_phase.get(slot) != phase["index"]
            self.started_in_phase[slot] = phase["index"]
            self.start_job(slot, phase, now, first)
        return phase

    def stop_senders(self, timeout):
        """Waits for the running jobs to end; SIGTERM (they still write their counts) after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        terminated = False
        while not all([self.reap(s) for s in range(self.args.slots)]):
            if time.monotonic() > deadline and not terminated:
                for entry in self.slots:
                    if entry is not None:
                        entry[0].terminate()
                terminated = True
                deadline = time.monotonic() + 10
            elif time.monotonic() > deadline:
                return  # stop_all() kills what is left
            time.sleep(0.2)

    def state_dir_figures(self):
        """What the collector keeps on disk: job names in its scaling history (one line each
        after a header), saved reports, the dedupe journal. Per-job entries that outlive their
        jobs show here as well as in RSS."""
        d = self.collector.state_dir
        out = {}
        try:
            with open(os.path.join(d, "scaling_history")) as f:
                out["scaling_history_job_names"] = len({line.split("\t")[0]
                                                        for line in f.readlines()[1:]})
        except OSError:
            pass
        try:
            out["reports"] = len(os.listdir(os.path.join(d, "reports")))
        except OSError:
            pass
        try:
            out["dedupe_journal_bytes"] = os.path.getsize(os.path.join(d, "dedupe.journal"))
        except OSError:
            pass
        # A job whose last steps arrive after its ranks' exits is started afresh and finishes
        # again: its name shows in more than one "job NAME finished" line of the collector's log.
        counts = {}
        for m in re.finditer(r"job (\S+) finished", self.collector.log()):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        out["jobs_finished_more_than_once"] = sorted(j for j, n in counts.items() if n > 1)
        return out

    def stop_all(self):
        for entry in self.slots:
            if entry is not None and entry[0].poll() is None:
                entry[0].kill()
                entry[0].wait(timeout=10)
        for agent in self.agents:
            agent.stop()
        if self.collector is not None:
            self.collector.stop()

    # ------------------------------------------------------------------ sampling

    def sample(self, now, phase):
        s = {"t": now - self.t0, "phase": phase["index"] if phase else None}
        c = self.collector
        rss = soak_stats.read_rss_kib(c.process.proc.pid) or (None, None)
        s["collector"] = {"rss_kib": rss[0], "hwm_kib": rss[1],
                          "cpu_s": soak_stats.read_cpu_seconds(c.process.proc.pid)}
        start = time.perf_counter()
        try:
            text = self.h.http_get(c.metrics_url, timeout=5)
            s["scrape_ms"] = (time.perf_counter() - start) * 1e3
            m = self.h.parse_metrics(text)
            s["scrape_bytes"] = len(text)
            s["series"] = len(m)
            for key, name in (("steps_received", "stepwatch_collector_steps_received_total"),
                              ("steps_rejected", "stepwatch_collector_steps_rejected_total"),
                              ("jobs", "stepwatch_collector_jobs"),
                              ("jobs_finished", "stepwatch_collector_jobs_finished_total"),
                              ("memory_accounted", "stepwatch_collector_memory_accounted_bytes"),
                              ("duplicates", "stepwatch_collector_duplicate_batches_total"),
                              ("limit_hits", "stepwatch_collector_limit_hits_total")):
                s[key] = metric_sum(m, name)
        except Exception as e:  # a failed scrape is recorded, not fatal
            s["scrape_error"] = repr(e)
        start = time.perf_counter()
        try:
            r = subprocess.run([self.ctl, f"--collector={c.grpc_addr}", "status"],
                               capture_output=True, timeout=10)
            if r.returncode == 0:
                s["ctl_ms"] = (time.perf_counter() - start) * 1e3
            else:
                s["ctl_error"] = r.stderr.decode(errors="replace")[-200:]
        except subprocess.TimeoutExpired:
            s["ctl_error"] = "timeout"
        s["agents"] = []
        for agent in self.agents:
            pid = agent.process.proc.pid
            rss = soak_stats.read_rss_kib(pid) or (None, None)
            a = {"rss_kib": rss[0], "hwm_kib": rss[1], "cpu_s": soak_stats.read_cpu_seconds(pid)}
            try:
                m = self.h.parse_metrics(self.h.http_get(agent.metrics_url, timeout=5))
                a["received"] = metric_sum(m, "stepwatch_agent_events_received_total")
                a["rejected"] = metric_sum(m, "stepwatch_agent_events_rejected_total")
                a["shipped"] = metric_sum(m, "stepwatch_agent_events_shipped_total")
                a["dropped"] = metric_sum(m, "stepwatch_agent_events_dropped_total")
                a["batches_dropped"] = metric_sum(m, "stepwatch_agent_batches_dropped_total")
            except Exception as e:
                a["scrape_error"] = repr(e)
            s["agents"].append(a)
        s["sys_busy"], s["sys_total"] = soak_stats.read_system_cpu()
        s["load1"] = soak_stats.read_loadavg()
        self.samples.append(s)
        return s

    # ------------------------------------------------------------------ the run

    def run(self):
        a = self.args
        self.start_services()
        self.t0 = time.monotonic()
        tick = 0
        end = self.t0 + a.duration
        while True:
            now = time.monotonic()
            if now >= end:
                break
            phase = self.manage_jobs(now)
            self.sample(now, phase)
            tick += 1
            time.sleep(max(0.0, self.t0 + tick - time.monotonic()))
        # Drain: every job ends, then wait until the collector has counted what agents shipped.
        self.stop_senders(timeout=15)
        drain_end = time.monotonic() + a.drain
        while time.monotonic() < drain_end:
            time.sleep(1.0)
            s = self.sample(time.monotonic(), None)
            shipped = sum(x.get("shipped", 0) for x in s["agents"])
            received = sum(x.get("received", 0) for x in s["agents"])
            if s.get("steps_received") == shipped == received and s.get("jobs") == 0:
                break


def load_harness(build_dir):
    os.environ["STEPWATCH_BUILD_DIR"] = os.path.abspath(build_dir)
    sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
    import harness
    return harness


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    harness = load_harness(args.build_dir)

    def on_alarm(_sig, _frame):
        raise _Watchdog(f"the run overstayed {args.duration + args.drain + WATCHDOG_SLACK_S:.0f} s")

    def on_term(_sig, _frame):
        raise KeyboardInterrupt()

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.alarm(int(args.duration + args.drain + WATCHDOG_SLACK_S))
    tmp = tempfile.mkdtemp(prefix="stepwatch-soak-")
    soak = Soak(args, harness, tmp)
    machine_before = soak_report.machine_info()
    try:
        soak.run()
    except BaseException:
        print(f"soak: the run failed; logs kept in {tmp}", file=sys.stderr)
        raise
    finally:
        signal.alarm(0)
        soak.stop_all()
    summary = soak_report.analyze(args, soak.phases, soak.samples, soak.jobs)
    # Read after the collector stopped: it saves its state on the way out.
    summary["state_dir"] = soak.state_dir_figures()
    summary["machine"] = machine_before
    summary["machine"]["load1_end"] = soak_stats.read_loadavg()
    summary["binaries"] = {"build_dir": os.path.abspath(args.build_dir)}
    soak_report.print_summary(summary, sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(summary, samples=soak.samples,
                           jobs=[{k: v for k, v in j.items() if k != "result_path"}
                                 for j in soak.jobs]), f, indent=1)
        print(f"JSON written to {args.json}")
    if args.keep:
        print(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
