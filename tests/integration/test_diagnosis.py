"""The diagnosis engine end to end: real agents and collector, findings read from /metrics and
stepwatchctl. Thresholds are shortened with the collector's flags so that each case is quick."""

import tempfile
import time
import unittest

from harness import (Agent, Collector, ctl_json, fake_gpu, fake_nvml_state, metric_samples,
                     metric_value, step_event, wait_until)


def send_job_steps(agent, job, world_size, steps, step_s, samples=32, slow_rank=None):
    for step in steps:
        for rank in range(world_size):
            busy = step_s * 0.7 * (1.3 if rank == slow_rank else 1.0)
            agent.send(step_event(job, rank, world_size, step, step_s, data_s=0.0,
                                  compute_s=busy, comm_s=max(step_s - busy, 0.0),
                                  samples=samples, local_rank=rank % 8, gpu=rank % 8))


def findings(collector, kind):
    return [f for f in ctl_json(collector.grpc_addr, "findings").get("findings", [])
            if f["kind"] == kind]


class DiagnosisTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-diag-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_scaling_efficiency_survives_a_collector_restart(self):
        # 8 GPUs at 8x, then 16 GPUs at only 10x: per-GPU throughput 10/16 = 0.625 of the best.
        collector = Collector(self.tmp)
        with collector, Agent(self.tmp, collector.grpc_addr, node="node-s") as agent:
            send_job_steps(agent, "resnet", 8, range(0, 60), step_s=0.1)
            wait_until(lambda: metric_value(collector.scrape(), "stepwatch_job_last_step",
                                            job="resnet") == 59, timeout=20,
                       message="the 8-GPU run at the collector")
            # A clean restart writes the scaling history to --state-dir; the new process reads it.
            collector.restart()
            send_job_steps(agent, "resnet", 16, range(60, 120), step_s=0.16)
            ratio = wait_until(
                lambda: metric_value(collector.scrape(), "stepwatch_job_scaling_efficiency_ratio",
                                     job="resnet"), timeout=30, message="scaling efficiency")
            self.assertAlmostEqual(ratio, 0.625, places=2)
            found = wait_until(lambda: findings(collector, "scaling_efficiency"), timeout=20,
                               message="a scaling_efficiency finding")
            self.assertEqual(found[0]["job"], "resnet")

    def test_underutilized_gpu_is_flagged_with_its_job_and_cleared(self):
        gpus = [fake_gpu(i, utilization=95, pids=[7000 + i]) for i in range(4)]
        gpus[1] = fake_gpu(1, utilization=20, pids=[7001], sm_activity=0.15)
        with Collector(self.tmp, underutil_window=2) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-u",
                      fake_nvml_state=fake_nvml_state(gpus)) as agent:
            def flagged():
                return metric_value(collector.scrape(), "stepwatch_gpu_underutilized",
                                    job="util-job", node="node-u", gpu=1)

            step = 0
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and flagged() != 1:
                send_job_steps(agent, "util-job", 4, range(step, step + 5), step_s=0.05)
                step += 5
                time.sleep(0.25)
            self.assertEqual(flagged(), 1, collector.log()[-2000:])
            samples = collector.scrape()
            for other in (0, 2, 3):
                self.assertNotEqual(metric_value(samples, "stepwatch_gpu_underutilized",
                                                 node="node-u", gpu=other), 1)
            finding = findings(collector, "underutilized_gpu")[0]
            self.assertEqual((finding["node"], finding["gpu"]), ("node-u", 1))
            # The GPU recovers: the finding clears.
            gpus[1] = fake_gpu(1, utilization=95, pids=[7001])
            agent.set_gpus(gpus)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and flagged() == 1:
                send_job_steps(agent, "util-job", 4, range(step, step + 5), step_s=0.05)
                step += 5
                time.sleep(0.25)
            self.assertNotEqual(flagged(), 1)

    def test_stall_names_the_silent_rank(self):
        with Collector(self.tmp, stall_floor=1, stall_multiple=2) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-h") as agent:
            send_job_steps(agent, "hang-job", 4, range(0, 30), step_s=0.05)
            # Rank 3 goes silent; the others report the next step and wait for it.
            for rank in range(3):
                agent.send(step_event("hang-job", rank, 4, 30, 0.05, compute_s=0.03, comm_s=0.02))
            found = wait_until(lambda: findings(collector, "stall"), timeout=30,
                               message="a stall finding")
            self.assertEqual(found[0]["job"], "hang-job")
            self.assertRegex(found[0]["summary"], r"silent ranks[^:]*: 3;")
            self.assertRegex(found[0]["summary"], r"waiting ranks: 0,1,2")
            self.assertEqual(found[0]["severity"], "critical")
            # Progress resumes: the stall clears.
            send_job_steps(agent, "hang-job", 4, range(30, 40), step_s=0.05)
            wait_until(lambda: not findings(collector, "stall"), timeout=20,
                       message="the stall to clear")

    def test_straggler_is_named_on_metrics_and_in_explain(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-x") as agent:
            send_job_steps(agent, "strag", 8, range(0, 80), step_s=0.2, slow_rank=5)
            wait_until(lambda: metric_value(collector.scrape(), "stepwatch_straggler", job="strag",
                                            rank=5) == 1, timeout=20, message="rank 5 flagged")
            flagged = [l["rank"] for l, v in metric_samples(collector.scrape(), "stepwatch_straggler")
                       if v == 1 and l.get("job") == "strag"]
            self.assertEqual(flagged, ["5"])
            explain = ctl_json(collector.grpc_addr, "explain", "strag")
            ranks = {r.get("rank", 0): r for r in explain["ranks"]}
            self.assertTrue(ranks[5]["straggler"])
            self.assertFalse(any(r.get("straggler") for k, r in ranks.items() if k != 5))
            self.assertGreater(explain["whatif_speedup_ratio"]["stragglers"], 1.1)


if __name__ == "__main__":
    unittest.main()
