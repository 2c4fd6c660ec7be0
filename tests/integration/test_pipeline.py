"""End to end: real agents and a real collector on loopback, driven through the real socket."""

import os
import subprocess
import tempfile
import unittest

from harness import (Agent, Collector, build_path, ctl, ctl_json, fake_gpu, fake_nvml_state,
                     metric_samples, metric_value, send_step, step_event, wait_until)


def send_steps(agent, job, world_size, ranks, steps, step_s=0.1):
    """Sends one event per (rank, step); returns how many the socket took."""
    sent = 0
    for step in steps:
        for rank in ranks:
            ok = agent.send(step_event(job, rank, world_size, step, step_s, data_s=0.01,
                                       compute_s=0.06, comm_s=0.03, samples=8, local_rank=rank % 8,
                                       gpu=rank % 8))
            sent += 1 if ok else 0
    return sent


def collector_steps(collector):
    return metric_value(collector.scrape(), "stepwatch_collector_steps_received_total") or 0


class PipelineTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-it-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_events_from_two_agents_reach_collector_metrics_and_ctl(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-a") as a, \
                Agent(self.tmp, collector.grpc_addr, node="node-b") as b:
            # A 4-rank job: ranks 0-1 on node-a, 2-3 on node-b.
            sent = send_steps(a, "job-two", 4, [0, 1], range(20))
            sent += send_steps(b, "job-two", 4, [2, 3], range(20))
            self.assertEqual(sent, 80)
            wait_until(lambda: collector_steps(collector) == 80, timeout=20,
                       message="80 steps at the collector")
            samples = wait_until(
                lambda: (lambda s: s if metric_value(s, "stepwatch_job_ranks_reporting",
                                                     job="job-two") == 4 else None)(
                    collector.scrape()), timeout=20, message="4 ranks reporting")
            self.assertEqual(metric_value(samples, "stepwatch_job_world_size", job="job-two"), 4)
            self.assertEqual(metric_value(samples, "stepwatch_job_last_step", job="job-two"), 19)
            step_seconds = metric_value(samples, "stepwatch_job_step_seconds", job="job-two")
            self.assertIsNotNone(step_seconds)
            self.assertAlmostEqual(step_seconds, 0.1, places=3)
            # Both nodes tracked; their up series are only exported once a finding names them
            # (--export-node-metrics=findings), the agents' /metrics show every node.
            self.assertEqual(metric_value(samples, "stepwatch_collector_nodes"), 2)
            self.assertEqual(metric_value(samples, "stepwatch_collector_duplicate_batches_total"), 0)

            status = ctl_json(collector.grpc_addr, "status")
            jobs = {j["job"]: j for j in status["jobs"]}
            self.assertIn("job-two", jobs)
            self.assertEqual(int(jobs["job-two"]["world_size"]), 4)
            nodes = sorted(n["node"] for n in status["nodes"])
            self.assertEqual(nodes, ["node-a", "node-b"])

            text = ctl(collector.grpc_addr, "status")
            self.assertEqual(text.returncode, 0, text.stderr)
            self.assertIn("job-two", text.stdout)
            self.assertIn("node-a", text.stdout)

    def test_collector_restart_loses_no_batch_within_buffer(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-r", buffer=1000) as agent:
            first = send_steps(agent, "job-restart", 2, [0, 1], range(0, 50))
            wait_until(lambda: collector_steps(collector) == first, timeout=20,
                       message="first phase at the collector")
            # Everything acknowledged: nothing of phase one may be sent again.
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_buffer_batches") == 0,
                       timeout=20, message="agent buffer empty")

            collector.kill()
            second = send_steps(agent, "job-restart", 2, [0, 1], range(50, 150))
            self.assertEqual(second, 200)
            # The agent keeps shipping into its buffer while the collector is away.
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_events_shipped_total")
                       >= first + second, timeout=20, message="phase two batched by the agent")
            agent_metrics = agent.scrape()
            self.assertGreater(metric_value(agent_metrics, "stepwatch_agent_buffer_batches"), 0)
            self.assertEqual(metric_value(agent_metrics, "stepwatch_agent_connected"), 0)

            collector.start()  # same ports, fresh process: it knows nothing of phase one
            wait_until(lambda: collector_steps(collector) >= second, timeout=30,
                       message="phase two delivered after the restart")
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_buffer_batches") == 0,
                       timeout=20, message="agent buffer drained")
            self.assertEqual(collector_steps(collector), second, "no batch lost or applied twice")
            agent_metrics = agent.scrape()
            self.assertEqual(metric_value(agent_metrics, "stepwatch_agent_batches_dropped_total"), 0)
            # Jobs reach /metrics with the view the collector publishes at its next tick.
            wait_until(lambda: metric_value(collector.scrape(), "stepwatch_job_last_step",
                                            job="job-restart") == 149, timeout=10,
                       message="the job's last step on /metrics")

    def test_bad_datagrams_are_rejected_and_counted(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-bad") as agent:
            good = step_event("job-bad", 0, 2, 1, 0.2)
            bad = {
                "not_json": b"{not json",
                "not_object": b"[1,2,3]",
                "missing_field": b'{"job":"j","rank":0,"world_size":2,"step":1}',
                "wrong_type": b'{"job":"j","rank":"zero","world_size":2,"step":1,"step_s":0.1}',
                "out_of_range": b'{"job":"j","rank":2,"world_size":2,"step":1,"step_s":0.1}',
                "too_large": b'{"job":"' + b"x" * (70 * 1024) + b'"}',
            }
            for reason, payload in bad.items():
                self.assertTrue(send_step(agent.socket_path, payload), reason)
            self.assertTrue(agent.send(good))
            # Negative durations and NaN are out of range too.
            send_step(agent.socket_path, b'{"job":"j","rank":0,"world_size":2,"step":1,"step_s":-1}')
            send_step(agent.socket_path, b'{"job":"j","rank":0,"world_size":2,"step":1,"step_s":NaN}')

            def rejected():
                s = agent.scrape()
                return {l["reason"]: v for l, v in
                        metric_samples(s, "stepwatch_agent_events_rejected_total")}

            # 6 kinds above plus the negative and the NaN step_s: 8 rejections in all.
            counts = wait_until(lambda: (lambda r: r if sum(r.values()) >= 8 else None)(
                rejected()), timeout=10, message="rejections counted")
            self.assertEqual(sum(counts.values()), 8, counts)
            for reason in ("not_json", "not_object", "missing_field", "wrong_type", "too_large"):
                self.assertGreaterEqual(counts.get(reason, 0), 1, reason)
            self.assertEqual(counts["out_of_range"], 2)
            # NaN is not JSON at all.
            self.assertEqual(counts["not_json"], 2)
            # The valid event still made it through, and the agent is still alive.
            wait_until(lambda: collector_steps(collector) == 1, timeout=10,
                       message="the valid event at the collector")
            self.assertTrue(agent.process.alive())

    def test_fake_nvml_drives_gpu_series(self):
        gpus = [fake_gpu(i, utilization=90, pids=[4000 + i]) for i in range(4)]
        # Every GPU's readings at the collector, as a small single-collector install has them.
        with Collector(self.tmp, export_node_metrics="all") as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-g",
                      fake_nvml_state=fake_nvml_state(gpus)) as agent:
            def gpu_util(gpu):
                return metric_value(collector.scrape(), "stepwatch_gpu_utilization_ratio",
                                    node="node-g", gpu=gpu)

            wait_until(lambda: gpu_util(3) == 0.9, timeout=15, message="GPU 3 at 90%")
            local = agent.scrape()
            self.assertIsNotNone(metric_value(local, "stepwatch_agent_gpu_utilization_ratio", gpu=0))
            # Change the state on the fly: the fake re-reads it, the agent ships it.
            gpus[2] = fake_gpu(2, utilization=25, pids=[4002], sm_clock_mhz=1410,
                               throttle_reasons=0x20)
            agent.set_gpus(gpus)
            wait_until(lambda: gpu_util(2) == 0.25, timeout=15, message="GPU 2 down to 25%")
            samples = collector.scrape()
            self.assertEqual(metric_value(samples, "stepwatch_gpu_sm_clock_hertz", node="node-g",
                                          gpu=2), 1410e6)
            self.assertEqual(metric_value(samples, "stepwatch_gpu_utilization_ratio", node="node-g",
                                          gpu=1), 0.9)
            status = ctl_json(collector.grpc_addr, "status")
            node = [n for n in status["nodes"] if n["node"] == "node-g"][0]
            self.assertEqual(len(node["gpus"]), 4)
            self.assertTrue(node["nvml_available"])

    def test_agent_without_nvml_runs_and_says_so(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-nogpu") as agent:
            wait_until(lambda: metric_value(collector.scrape(), "stepwatch_collector_nodes") == 1,
                       timeout=15, message="node seen")
            self.assertEqual(metric_value(agent.scrape(), "stepwatch_agent_nvml_available"), 0)
            said = [l for l in agent.log().splitlines() if "NVML unavailable" in l]
            self.assertEqual(len(said), 1, agent.log())

    def test_ctl_reports_unreachable_collector(self):
        from harness import free_port
        result = ctl(f"127.0.0.1:{free_port()}", "status")
        self.assertEqual(result.returncode, 1)
        self.assertIn("cannot reach collector", result.stderr)

    def test_bad_flags_exit_with_usage_error(self):
        for binary, flag in (("stepwatch-agent", "--interval=-1"),
                             ("stepwatch-collector", "--grpc-listen=nonsense")):
            result = subprocess.run([build_path(binary), flag], capture_output=True, text=True,
                                    timeout=20)
            self.assertEqual(result.returncode, 2, f"{binary} {flag}: {result.stderr}")
            self.assertTrue(result.stderr.strip(), binary)


if __name__ == "__main__":
    unittest.main()
