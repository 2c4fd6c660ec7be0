"""Jobs sharded and replicated over three real collectors by real agents.

Three collectors and five agents (--collector=A,B,C --replicas=2) on loopback; six 8-rank jobs,
each spread over two agents, half of them with one slow rank. Checked from outside:
- each job is analysed by exactly its two rendezvous owners (computed here independently of the
  C++ code), no collector holds every job, and a node without a job reports to its own owners;
- every step is counted exactly once by each collector that holds its job (no double counting);
- the union of the straggler flags over the collectors is exactly the injected slow ranks;
- after SIGKILL of one collector every job is still watched by two live collectors and every slow
  rank is flagged again by both; the time that takes is printed;
- when it comes back its jobs return to it and the collector that held them meanwhile forgets
  them (the agents release them), so every job is again on exactly its two owners.
"""

import json
import threading
import time
import tempfile
import unittest

from harness import (Agent, Collector, ctl_json, metric_samples, metric_value, step_event,
                     wait_until)

MASK = (1 << 64) - 1
REPLICAS = 2
RANKS_PER_AGENT = 4
WORLD = 8
STEPS_PER_SECOND = 5
STEP_S = 0.2


def _fnv1a(h, text):
    for byte in text.encode():
        h ^= byte
        h = (h * 1099511628211) & MASK
    return h


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def rendezvous_owners(key, members, replicas=REPLICAS):
    """The documented placement (docs/scale.md), written again here: FNV-1a of the key, xor 0xff,
    FNV-1a of the member, splitmix64's finalizer; highest scores own the key."""
    def score(member):
        return _mix(_fnv1a(_fnv1a(1469598103934665603, key) ^ 0xFF, member))
    return sorted(members, key=lambda m: (-score(m), m))[:replicas]


def jobs_on_collector(collector):
    samples = collector.scrape()
    return {labels["job"] for labels, value in
            metric_samples(samples, "stepwatch_job_ranks_reporting") if value > 0}


def stragglers_on(collector):
    return {(labels["job"], int(labels["rank"])) for labels, value in
            metric_samples(collector.scrape(), "stepwatch_straggler") if value == 1}


class Load:
    """Steps of every job at a steady rate on a thread; counts what each job sent."""

    def __init__(self, jobs, agents, slow):
        self.jobs = jobs  # job -> (agent index of ranks 0-3, agent index of ranks 4-7)
        self.agents = agents
        self.slow = slow  # job -> slow rank
        self.sent = {job: 0 for job in jobs}
        self.step = 0
        self._stop = threading.Event()
        self._thread = None

    def send_step(self):
        for job, (first, second) in self.jobs.items():
            for rank in range(WORLD):
                agent = self.agents[first if rank < RANKS_PER_AGENT else second]
                busy = STEP_S * 0.7 * (1.3 if self.slow.get(job) == rank else 1.0)
                if agent.send(step_event(job, rank, WORLD, self.step, STEP_S, data_s=0.0,
                                         compute_s=busy, comm_s=STEP_S - busy, samples=32,
                                         local_rank=rank % RANKS_PER_AGENT,
                                         gpu=rank % RANKS_PER_AGENT)):
                    self.sent[job] += 1
        self.step += 1

    def start(self, max_seconds=120):
        def loop():
            start = time.monotonic()
            n = 0
            while not self._stop.is_set() and time.monotonic() - start < max_seconds:
                self.send_step()
                n += 1
                self._stop.wait(max(0.0, start + n / STEPS_PER_SECOND - time.monotonic()))

        self._stop.clear()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)


class MultiCollectorTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-multi-")
        self.tmp = self._tmp.name
        self.services = []

    def tearDown(self):
        for service in reversed(self.services):
            service.stop()
        self._tmp.cleanup()

    def start(self, service):
        self.services.append(service)
        return service.start()

    def test_jobs_are_sharded_replicated_counted_once_and_survive_a_collector_kill(self):
        collectors = [self.start(Collector(self.tmp, name=f"collector-{i}")) for i in range(3)]
        addresses = [c.grpc_addr for c in collectors]
        # Job names chosen so that no collector holds every job.
        jobs, names = {}, iter(f"train-{n}" for n in range(1000))
        while len(jobs) < 6:
            job = next(names)
            jobs[job] = rendezvous_owners(job, addresses)
            held = [sum(a in owners for owners in jobs.values()) for a in addresses]
            if len(jobs) == 6 and max(held) == 6:
                jobs.pop(job)
        idle_node = "node-idle"
        agents = [self.start(Agent(self.tmp, ",".join(addresses), node=f"node-{i}",
                                   replicas=REPLICAS, failover_after=1))
                  for i in range(4)]
        self.start(Agent(self.tmp, ",".join(addresses), node=idle_node, replicas=REPLICAS,
                         failover_after=1))
        placement = {job: (i % 4, (i + 1) % 4) for i, job in enumerate(jobs)}
        slow = {job: (3 * i + 1) % WORLD for i, job in enumerate(jobs) if i % 2 == 0}
        injected = {(job, rank) for job, rank in slow.items()}
        load = Load(placement, agents, slow).start()
        try:
            # Each job on exactly its two owners.
            def placed():
                for c in collectors:
                    expected = {job for job, owners in jobs.items() if c.grpc_addr in owners}
                    if jobs_on_collector(c) != expected:
                        return False
                return True
            wait_until(placed, timeout=60, message="every job on exactly its owners")
            for c in collectors:
                self.assertLess(len(jobs_on_collector(c)), len(jobs), c.grpc_addr)

            # The union of the flags is exactly the slow ranks, and each owner flags its jobs'.
            def flagged_by_owners(live):
                for c in live:
                    expected = {(job, rank) for job, rank in injected
                                if c.grpc_addr in owners_now(job, live)}
                    if stragglers_on(c) != expected:
                        return False
                return True

            def owners_now(job, live):
                return rendezvous_owners(job, [c.grpc_addr for c in live])

            wait_until(lambda: flagged_by_owners(collectors), timeout=60,
                       message="every slow rank flagged by both owners, nothing else")
            union = set().union(*(stragglers_on(c) for c in collectors))
            self.assertEqual(union, injected)

            # A node without a job reports to its own owners only.
            idle_owners = rendezvous_owners(f"node/{idle_node}", addresses)
            def idle_node_placed():
                for c in collectors:
                    nodes = {n["node"] for n in ctl_json(c.grpc_addr, "status").get("nodes", [])}
                    if (idle_node in nodes) != (c.grpc_addr in idle_owners):
                        return False
                return True
            wait_until(idle_node_placed, timeout=30, message="the idle node on its two owners")
        finally:
            load.stop()

        # Counted once per holder: each collector's steps are exactly those of the jobs it holds.
        def counted_once():
            for c in collectors:
                expected = sum(load.sent[job] for job, owners in jobs.items()
                               if c.grpc_addr in owners)
                got = metric_value(c.scrape(), "stepwatch_collector_steps_received_total") or 0
                if got != expected:
                    return False
            return True
        wait_until(counted_once, timeout=60, message="each step counted once by each holder")
        total = sum(metric_value(c.scrape(), "stepwatch_collector_steps_received_total")
                    for c in collectors)
        self.assertEqual(total, REPLICAS * sum(load.sent.values()))

        # SIGKILL the collector holding the most slow ranks' jobs; the survivors take over.
        victim = max(collectors, key=lambda c: sum(c.grpc_addr in jobs[j] for j in slow))
        survivors = [c for c in collectors if c is not victim]
        load.start()
        try:
            victim.kill()
            killed = time.monotonic()
            wait_until(lambda: all(jobs_on_collector(c) == set(jobs) for c in survivors),
                       timeout=60, message="every job on both survivors")
            watched = time.monotonic() - killed
            wait_until(lambda: flagged_by_owners(survivors), timeout=60,
                       message="every slow rank flagged again by both survivors")
            flagged = time.monotonic() - killed
            union = set().union(*(stragglers_on(c) for c in survivors))
            self.assertEqual(union, injected)
            print(json.dumps({"failover_all_jobs_watched_s": round(watched, 2),
                              "failover_all_stragglers_flagged_by_both_survivors_s":
                                  round(flagged, 2)}))

            # The killed collector comes back on its address (a restarted pod): its jobs return
            # to it, and the survivor that held them meanwhile forgets them (the agents release
            # them) instead of keeping them, and a false stall, until --expire.
            victim.start()
            returned = time.monotonic()
            wait_until(placed, timeout=60, message="every job back on exactly its owners")
            back = time.monotonic() - returned
            wait_until(lambda: flagged_by_owners(collectors), timeout=60,
                       message="every slow rank flagged by both owners again")
            print(json.dumps({"return_all_jobs_back_on_their_owners_s": round(back, 2)}))
        finally:
            load.stop()
        moved_away = sum(metric_value(c.scrape(), "stepwatch_collector_jobs_moved_away_total") or 0
                         for c in collectors)
        self.assertGreater(moved_away, 0)
        for c in collectors:
            held = jobs_on_collector(c)
            expected = {job for job, owners in jobs.items() if c.grpc_addr in owners}
            self.assertEqual(held, expected, c.grpc_addr)


if __name__ == "__main__":
    unittest.main()
