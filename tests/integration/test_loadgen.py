"""stepwatch-loadgen (bench/loadgen) against two real collectors: what it reports is what the
collectors counted, its placement is the agent's, and the straggler it injects is found."""

import json
import subprocess
import tempfile
import unittest

from harness import Collector, build_path, metric_value


def run_loadgen(collectors, replicas, duration=6):
    args = [build_path("stepwatch-loadgen"),
            "--collector=" + ",".join(c.grpc_addr for c in collectors),
            "--metrics=" + ",".join(c.metrics_addr for c in collectors),
            f"--replicas={replicas}", "--nodes=8", "--ranks-per-node=8", "--world-size=16",
            "--gpus=8", "--steps-per-second=5", f"--duration={duration}", "--measure-after=1",
            "--straggler-rank=3", "--straggler-after=1", "--poll-interval=0.5"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"loadgen failed ({result.returncode}): {result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


class LoadgenTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-loadgen-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def check(self, replicas):
        with Collector(self.tmp, name=f"a{replicas}") as a, \
                Collector(self.tmp, name=f"b{replicas}") as b:
            summary = run_loadgen([a, b], replicas)
            self.assertEqual(summary["ranks"], 64)
            self.assertEqual(summary["jobs"], 4)
            self.assertEqual(summary["steps_unplaced"], 0)
            self.assertEqual(summary["batches_failed"], 0)
            self.assertGreater(summary["steps_acked"], 0)
            # Every job on `replicas` collectors, as the agent places it.
            held = [c["jobs_held"] for c in summary["per_collector"]]
            self.assertEqual(sum(held), replicas * summary["jobs"])
            # The generator's count of acknowledged steps is what the collectors counted.
            counted = sum(metric_value(c.scrape(), "stepwatch_collector_steps_received_total")
                          for c in (a, b))
            self.assertEqual(counted, summary["steps_acked"])
            # The injected straggler (rank 3 of one job) found by its owners.
            self.assertEqual(summary["detection"]["undetected"], 0)
            self.assertGreater(summary["detection"]["straggler_jobs"], 0)
            return summary

    def test_one_replica_places_each_job_once(self):
        self.check(replicas=1)

    def test_two_replicas_hold_every_job_twice(self):
        summary = self.check(replicas=2)
        self.assertEqual([c["jobs_held"] for c in summary["per_collector"]], [4, 4])


if __name__ == "__main__":
    unittest.main()
