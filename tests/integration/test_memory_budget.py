"""The collector's memory budget under a flood: a real collector with --max-memory-mib=64, a real
agent carrying a job from before the flood, and a flood of distinct ranks sent straight over gRPC
by collector_flood (bench/collector). New ranks beyond the budget are refused and counted, the
collector's peak RSS stays within 1.5 x budget + 64 MiB, and the job tracked before the flood is
still analysed: its straggler, which appears only after the flood, is found."""

import subprocess
import tempfile
import time
import unittest

from harness import (Agent, Collector, assert_rss_at_most, build_path, metric_value, peak_rss_mib,
                     step_event, wait_until)

BUDGET_MIB = 64
# About 10 KiB is charged per rank: 20,000 distinct ranks are far beyond 64 MiB.
FLOOD = {"nodes": 20, "ranks-per-node": 1000, "world-size": 10000, "gpus": 0, "steps": 1,
         "threads": 2, "job-prefix": "flood", "node-prefix": "flood"}
WORLD = 8
SLOW_RANK = 5


class MemoryBudgetTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-budget-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name
        self.collector = Collector(self.tmp, max_memory_mib=BUDGET_MIB, tick=0.2, step_grace=0.5)
        self.collector.start()
        self.addCleanup(self.collector.stop)
        self.agent = Agent(self.tmp, self.collector.grpc_addr, node="node-0")
        self.agent.start()
        self.addCleanup(self.agent.stop)

    def send_steps(self, first, last, slow):
        for step in range(first, last):
            for rank in range(WORLD):
                busy = 0.16 if slow and rank == SLOW_RANK else 0.10
                self.agent.send(step_event("pre", rank, WORLD, step, 0.2, data_s=0.0,
                                           compute_s=busy, comm_s=0.2 - busy))
            time.sleep(0.01)

    def value(self, samples, name, **labels):
        try:
            return metric_value(samples, name, **labels)
        except (AssertionError, KeyError, IndexError):
            return None

    def test_flood_is_refused_and_the_tracked_job_still_analysed(self):
        started = time.monotonic()
        # Before the flood: the job is tracked, every rank equally fast.
        self.send_steps(0, 10, slow=False)
        wait_until(lambda: self.value(self.collector.scrape(), "stepwatch_job_last_step",
                                      job="pre") == 9, timeout=10, message="pre-flood job tracked")
        samples = self.collector.scrape()
        self.assertEqual(self.value(samples, "stepwatch_collector_memory_budget_bytes"),
                         BUDGET_MIB << 20)
        self.assertIsNone(self.value(samples, "stepwatch_straggler", job="pre",
                                     rank=str(SLOW_RANK), node="node-0"))

        flood = subprocess.run(
            [build_path("collector_flood"), f"--collector={self.collector.grpc_addr}"]
            + [f"--{k}={v}" for k, v in FLOOD.items()],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(flood.returncode, 0, flood.stderr)
        self.assertIn(f"batches_acked={FLOOD['nodes']}", flood.stdout, flood.stderr)

        samples = self.collector.scrape()
        refused = self.value(samples, "stepwatch_collector_limit_hits_total", limit="memory")
        self.assertGreater(refused, 0)
        # Refused ranks drop their steps (refused nodes too are counted in limit_hits).
        self.assertGreater(
            self.value(samples, "stepwatch_collector_steps_rejected_total", reason="limit"),
            refused // 2)
        accounted = self.value(samples, "stepwatch_collector_memory_accounted_bytes")
        self.assertLessEqual(accounted, BUDGET_MIB << 20)
        # The budget was the limit: most of it is in use.
        self.assertGreater(accounted, (BUDGET_MIB << 20) // 2)

        # After the flood the tracked job goes on, and its new straggler is found.
        self.send_steps(10, 50, slow=True)
        wait_until(lambda: self.value(self.collector.scrape(), "stepwatch_straggler", job="pre",
                                      rank=str(SLOW_RANK), node="node-0") == 1,
                   timeout=15, message="the straggler of the pre-flood job")
        # Every step of it still arrives (the agent ships every 0.2 s).
        wait_until(lambda: self.value(self.collector.scrape(), "stepwatch_job_last_step",
                                      job="pre") == 49, timeout=10,
                   message="the last step of the pre-flood job")

        rss = peak_rss_mib(self.collector.process.proc.pid)
        print(f"\nflood of {FLOOD['nodes']} nodes at a {BUDGET_MIB} MiB budget: {refused:.0f} "
              f"refused by the budget, {accounted / 2**20:.1f} MiB accounted; peak RSS "
              f"{rss:.0f} MiB")
        assert_rss_at_most(self, rss, 1.5 * BUDGET_MIB + 64,
                           f"peak RSS {rss:.0f} MiB over 1.5 x {BUDGET_MIB} MiB + 64 MiB")
        self.assertLess(time.monotonic() - started, 30)


# Large valid batches on many concurrent streams: 200 nodes of 16,000 ranks and 64 GPUs, 4
# batches each (about 1 MiB a batch), 16 client threads.
BIG_FLOOD = {"nodes": 200, "ranks-per-node": 16000, "world-size": 100000, "gpus": 64,
             "steps": 4, "threads": 16, "job-prefix": "big", "node-prefix": "big"}


class MemoryBudgetLargeRequestsTest(unittest.TestCase):
    """--max-memory-mib with many large, valid batches in flight at once: the tracked state stays
    within the budget and the process's peak RSS within 1.5 x budget + 64 MiB."""

    def test_large_batches_on_many_streams(self):
        with tempfile.TemporaryDirectory(prefix="stepwatch-budget-big-") as tmp:
            with Collector(tmp, max_memory_mib=BUDGET_MIB) as c:
                flood = subprocess.run(
                    [build_path("collector_flood"), f"--collector={c.grpc_addr}"]
                    + [f"--{k}={v}" for k, v in BIG_FLOOD.items()],
                    capture_output=True, text=True, timeout=120)
                self.assertEqual(flood.returncode, 0, flood.stderr)
                batches = BIG_FLOOD["nodes"] * BIG_FLOOD["steps"]
                self.assertIn(f"batches_acked={batches}", flood.stdout, flood.stderr)
                samples = c.scrape()
                self.assertLessEqual(
                    metric_value(samples, "stepwatch_collector_memory_accounted_bytes"),
                    BUDGET_MIB << 20)
                self.assertGreater(
                    metric_value(samples, "stepwatch_collector_limit_hits_total", limit="memory"),
                    0)
                rss = peak_rss_mib(c.process.proc.pid)
                print(f"\n{batches} batches of {BIG_FLOOD['ranks-per-node']} steps on "
                      f"{BIG_FLOOD['threads']} threads: {flood.stdout.strip()}; peak RSS "
                      f"{rss:.0f} MiB")
                assert_rss_at_most(self, rss, 1.5 * BUDGET_MIB + 64,
                                   f"peak RSS {rss:.0f} MiB over 1.5 x {BUDGET_MIB} MiB + 64 MiB")


if __name__ == "__main__":
    unittest.main()
