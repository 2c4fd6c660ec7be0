"""Straggler detection as statistics, end to end: noisy steps with named sections from two real
agents to a real collector, verdicts read with stepwatchctl. The scenarios are the ones a
fixed-window margin missed: a moderate straggler under 17% noise, two of four ranks slow, a
slowdown that starts mid-run, and a healthy noisy job that must raise nothing."""

import random
import tempfile
import unittest

from harness import Agent, Collector, ctl_json, step_event, wait_until

SECTIONS = ("forward", "backward", "optimizer")


def send_steps(agents, placement, world, steps, rng, extra, section_s=0.010, noise=0.3):
    """Synchronous steps: three sections of section_s +- noise each on every rank, plus
    extra(rank, step, section) seconds; the step ends at the slowest rank's collective."""
    for step in steps:
        secs = []
        for rank in range(world):
            secs.append([max(0.0, section_s * (1 + noise * rng.gauss(0, 1)))
                         + extra(rank, step, k) for k in range(3)])
        busy = [sum(s) for s in secs]
        step_s = max(busy) + 0.002
        for rank in range(world):
            agents[placement[rank]].send(step_event(
                "detect", rank, world, step, step_s, data_s=0.0, compute_s=busy[rank],
                comm_s=step_s - busy[rank], gpu=rank // len(agents),
                sections=dict(zip(SECTIONS, secs[rank]))))


def flagged(collector):
    """Ranks named by straggler findings and slow-node findings, and the findings."""
    found = ctl_json(collector.grpc_addr, "findings").get("findings", [])
    ranks = set()
    for f in found:
        if f["kind"] == "straggler":
            ranks.add(int(f["rank"]))
        elif f["kind"] == "slow_node":
            ranks.update(int(r) for r in f.get("ranks", []))
    return ranks, found


class DetectionTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-detect-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def run_job(self, world, steps, extra, expect, seed=1, chunk=40):
        """Sends `steps` steps in chunks through two agents (rank r on agent r % 2) and returns
        the collector's flagged ranks once every step was analysed with all its ranks."""
        placement = [rank % 2 for rank in range(world)]
        rng = random.Random(seed)
        # A short tick: `status` answers from the view published at each tick.
        with Collector(self.tmp, tick=0.2) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-a") as a, \
                Agent(self.tmp, collector.grpc_addr, node="node-b") as b:

            def job():
                jobs = ctl_json(collector.grpc_addr, "status").get("jobs", [])
                return next((j for j in jobs if j["job"] == "detect"), None)

            def analysed_through(step):
                j = job()
                return j is not None and int(j.get("last_complete_step", -1)) >= step

            # A chunk at a time, each analysed before the next is sent: steps sent far faster
            # than real training would otherwise let one agent run more steps ahead of the other
            # than the collector keeps pending, and those steps would be analysed without the
            # other node's ranks.
            for first in range(0, steps, chunk):
                end = min(first + chunk, steps)
                send_steps([a, b], placement, world, range(first, end), rng, extra)
                wait_until(lambda: analysed_through(end - 1), timeout=60,
                           message=f"steps {first}..{end - 1} analysed")
            # Every step was analysed with every rank: the verdicts below are on the whole run.
            self.assertEqual(int(job().get("incomplete_steps", 0)), 0, job())
            self.assertEqual(int(job().get("late_samples", 0)), 0, job())
            if expect:
                wait_until(lambda: expect <= flagged(collector)[0], timeout=30,
                           message=f"ranks {sorted(expect)} flagged: {flagged(collector)[1]}")
            self.explain = ctl_json(collector.grpc_addr, "explain", "detect")
            return flagged(collector)

    def test_moderate_straggler_under_realistic_noise_is_flagged(self):
        # One section of rank 1 at 15 ms instead of 10 ms (the step +16.7%), 17% noise per step.
        ranks, found = self.run_job(
            4, 150, lambda rank, step, k: 0.005 if rank == 1 and k == 1 else 0.0, expect={1})
        self.assertEqual(ranks, {1}, found)
        # Each what-if says what the step events can support: overlap is always an upper bound,
        # the stragglers' gain of a data-parallel job an estimate.
        kinds = self.explain.get("whatif_kind", {})
        self.assertEqual(kinds.get("overlap"), "upper_bound", self.explain)
        self.assertEqual(kinds.get("stragglers"), "estimate", self.explain)
        self.assertGreater(self.explain["whatif_speedup_ratio"]["stragglers"], 1.05, self.explain)

    def test_two_of_four_slow_are_both_flagged(self):
        # Ranks 1 and 2 (one on each node) 20% slower: the reference is the fast pair, not a
        # median between the pairs.
        ranks, found = self.run_job(
            4, 200, lambda rank, step, k: 0.002 if rank in (1, 2) else 0.0, expect={1, 2})
        self.assertEqual(ranks, {1, 2}, found)

    def test_a_slowdown_that_starts_mid_run_names_its_onset(self):
        ranks, found = self.run_job(
            8, 400, lambda rank, step, k: 0.002 if rank == 5 and step >= 200 else 0.0,
            expect={5})
        self.assertEqual(ranks, {5}, found)
        straggler = [f for f in found if f["kind"] == "straggler"][0]
        self.assertLess(abs(int(straggler["since_step"]) - 200), 25, straggler)

    def test_a_healthy_noisy_job_raises_nothing(self):
        ranks, found = self.run_job(8, 800, lambda rank, step, k: 0.0, expect=set())
        self.assertEqual(ranks, set(), found)
        self.assertEqual([f for f in found if f.get("job") == "detect"], [], found)


if __name__ == "__main__":
    unittest.main()
