"""The stepwatch-agent binary: flags, readiness, ingest over the real socket, its /metrics with
the fake NVML, and clean shutdown. Runs without a collector (its collector link keeps retrying)."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import unittest

import harness
from harness import Agent, metric_value, wait_until


def agent_binary():
    return harness.build_path("stepwatch-agent")


def run_agent(*args, timeout=30):
    return subprocess.run([agent_binary(), *args], capture_output=True, text=True,
                          timeout=timeout)


def unused_collector():
    # Nothing listens on a port we just released; the agent retries in the background.
    return f"127.0.0.1:{harness.free_port()}"


class FlagTest(unittest.TestCase):
    def test_bad_flags_exit_2_with_a_clear_message(self):
        cases = [
            (["--no-such-flag=1"], "unknown flag"),
            (["--interval=abc"], "interval"),
            (["--interval=0"], "interval"),
            (["--interval=-1"], "interval"),
            (["--buffer=0"], "buffer"),
            (["--collector=no-port"], "collector"),
            (["--collector=host:0"], "collector"),
            (["--metrics-listen=bad"], "metrics-listen"),
            (["--socket="], "socket"),
            (["stray-argument"], "unexpected argument"),
        ]
        for args, needle in cases:
            with self.subTest(args=args):
                result = run_agent(*args)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(needle, result.stderr)

    def test_unreadable_basic_auth_file_names_its_flag(self):
        with tempfile.TemporaryDirectory(prefix="stepwatch-agent-auth-") as tmp:
            missing = os.path.join(tmp, "no-such-dir", "htpasswd")
            result = run_agent(f"--socket={os.path.join(tmp, 'agent.sock')}",
                               "--metrics-listen=127.0.0.1:0", "--nvml-library=/nonexistent.so",
                               f"--collector={unused_collector()}",
                               f"--metrics-basic-auth-file={missing}")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"--metrics-basic-auth-file: cannot open {missing}", result.stderr)

    def test_help_explains_every_flag(self):
        result = run_agent("--help")
        text = result.stdout + result.stderr
        for flag in ["collector", "socket", "node", "interval", "buffer", "nvml-library",
                     "metrics-listen", "host-root", "reconnect-max-backoff", "shutdown-timeout"]:
            self.assertRegex(text, rf"\n  --{flag}=[A-Z]+  \(default: ")


class AgentProcessTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="stepwatch-agent-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_events_and_rejections_are_counted_by_reason(self):
        with Agent(self.tmp, unused_collector(), node="n-1") as agent:
            for step in range(20):
                self.assertTrue(agent.send(harness.step_event("job-a", 0, 2, step, 0.1)))
            agent.send(b"not json")
            agent.send(b"[1]")
            agent.send(harness.step_event("job-a", 2, 2, 0, 0.1))  # rank >= world_size
            agent.send({"job": "job-a", "rank": 0, "world_size": 2, "step": 1})  # no step_s
            agent.send(harness.step_event("job-a", 0, 2, 0, "slow"))  # wrong type
            agent.send(b"{" + b" " * 70000 + b"}")  # over 64 KiB

            def counted():
                s = agent.scrape()
                return (metric_value(s, "stepwatch_agent_events_received_total", node="n-1") == 20
                        and metric_value(s, "stepwatch_agent_datagrams_received_total") == 26 and s)

            samples = wait_until(counted, timeout=20, message="events counted")
            for reason in ["not_json", "not_object", "out_of_range", "missing_field",
                           "wrong_type", "too_large"]:
                self.assertEqual(metric_value(samples, "stepwatch_agent_events_rejected_total",
                                              node="n-1", reason=reason), 1, reason)
            self.assertEqual(metric_value(samples, "stepwatch_agent_connected", node="n-1"), 0)
            # Without a collector the batches wait in the buffer.
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_buffer_batches") > 0,
                       timeout=20, message="batches held in the buffer")
            self.assertEqual(metric_value(samples, "stepwatch_agent_nvml_available"), 0)
            self.assertTrue(agent.process.alive())
            self.assertIn("rejected step event", agent.log())

    def test_fake_nvml_drives_gpu_series_and_scrape_passes_promtool(self):
        gpus = [harness.fake_gpu(0, utilization=90, pids=[4242]), harness.fake_gpu(1, 20)]
        with Agent(self.tmp, unused_collector(), node="gpu-node",
                   fake_nvml_state=harness.fake_nvml_state(gpus)) as agent:
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_gpu_utilization_ratio",
                                            node="gpu-node", gpu=1) == 0.2,
                       timeout=20, message="GPU 1 at 20%")
            agent.set_gpus([harness.fake_gpu(0, utilization=90), harness.fake_gpu(1, 75)])
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_gpu_utilization_ratio",
                                            node="gpu-node", gpu=1) == 0.75,
                       timeout=20, message="GPU 1 at 75% after the state changed")
            samples = agent.scrape()
            self.assertEqual(metric_value(samples, "stepwatch_agent_nvml_available"), 1)
            self.assertEqual(metric_value(samples, "stepwatch_agent_gpus", node="gpu-node"), 2)
            self.assertEqual(metric_value(samples, "stepwatch_agent_gpu_sm_clock_hertz", gpu=0),
                             1980e6)
            self.assertIsNotNone(metric_value(samples, "stepwatch_agent_host_cpus"))
            self.assertIn("NVML loaded", agent.log())
            promtool = shutil.which("promtool")
            if promtool:
                body = harness.http_get(agent.metrics_url)
                result = subprocess.run([promtool, "check", "metrics"], input=body,
                                        capture_output=True, text=True, timeout=30)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
                self.assertEqual(result.stdout + result.stderr, "")

    def test_sigterm_stops_cleanly_and_removes_the_socket(self):
        agent = Agent(self.tmp, unused_collector(), node="n-2").start()
        self.assertIn("stepwatch-agent ready", agent.log())
        self.assertEqual(os.stat(agent.socket_path).st_mode & 0o777, 0o660)
        self.assertEqual(agent.process.stop(signal.SIGTERM, timeout=15), 0)
        self.assertFalse(os.path.exists(agent.socket_path))

    def test_restart_after_kill_replaces_the_stale_socket(self):
        agent = Agent(self.tmp, unused_collector(), node="n-3").start()
        agent.kill()
        self.assertTrue(os.path.exists(agent.socket_path))  # left behind by SIGKILL
        agent.start()
        try:
            self.assertTrue(agent.send(harness.step_event("j", 0, 1, 0, 0.1)))
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_events_received_total")
                       == 1, timeout=20, message="event after restart")
        finally:
            agent.stop()

    def test_second_agent_on_the_same_socket_fails_clearly(self):
        with Agent(self.tmp, unused_collector(), node="n-4") as agent:
            result = run_agent(f"--socket={agent.socket_path}", f"--collector={unused_collector()}",
                               "--nvml-library=/nonexistent.so")
            self.assertEqual(result.returncode, 1)
            self.assertIn("in use", result.stderr)
            self.assertTrue(agent.send(harness.step_event("j", 0, 1, 0, 0.1)))


if __name__ == "__main__":
    unittest.main()
