"""The collector and stepwatchctl as processes: flags, readiness, /metrics, errors, shutdown."""

import json
import os
import signal
import subprocess
import tempfile
import unittest

from harness import Collector, build_path, ctl, ctl_json, free_port, scrape, metric_value


class CollectorCliTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-collector-cli-")
        self.tmpdir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_status_of_an_empty_collector(self):
        with Collector(self.tmpdir) as c:
            status = ctl_json(c.grpc_addr, "status")
            self.assertEqual(status["jobs"], [])
            self.assertEqual(status["nodes"], [])
            text = ctl(c.grpc_addr, "status")
            self.assertEqual(text.returncode, 0, text.stderr)
            self.assertIn("No jobs reporting.", text.stdout)
            self.assertEqual(ctl_json(c.grpc_addr, "findings")["findings"], [])
            samples = c.scrape()
            self.assertEqual(metric_value(samples, "stepwatch_collector_batches_received_total"), 0)
            self.assertEqual(metric_value(samples, "stepwatch_collector_agents_connected"), 0)

    def test_explain_of_an_unknown_job_fails_clearly(self):
        with Collector(self.tmpdir) as c:
            result = ctl(c.grpc_addr, "explain", "no-such-job")
            self.assertEqual(result.returncode, 1)
            self.assertIn('no job named "no-such-job"', result.stderr)

    def test_unreachable_collector(self):
        addr = f"127.0.0.1:{free_port()}"
        result = ctl(addr, "status", timeout=20)
        self.assertEqual(result.returncode, 1)
        self.assertIn(f"cannot reach collector at {addr}", result.stderr)

    def test_collector_address_from_environment(self):
        with Collector(self.tmpdir) as c:
            env = dict(os.environ, STEPWATCH_COLLECTOR=c.grpc_addr)
            result = subprocess.run([build_path("stepwatchctl"), "status", "--json"],
                                    capture_output=True, text=True, timeout=30, env=env)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("jobs", json.loads(result.stdout))

    def test_usage_errors(self):
        for args in (["frobnicate"], ["explain"], []):
            result = subprocess.run([build_path("stepwatchctl"), "--collector=127.0.0.1:1", *args],
                                    capture_output=True, text=True, timeout=30)
            self.assertEqual(result.returncode, 2, args)
            self.assertIn("Usage:", result.stderr)

    def test_sigterm_stops_cleanly_and_writes_the_state_file(self):
        c = Collector(self.tmpdir)
        c.start()
        try:
            self.assertIn("gRPC listening on", c.log())
            rc = c.process.stop(signal.SIGTERM)
        finally:
            c.stop()
        self.assertEqual(rc, 0, c.log())
        self.assertTrue(os.path.exists(os.path.join(c.state_dir, "scaling_history")), c.log())
        self.assertIn("stopped", c.log())

    def test_bad_flags_are_rejected(self):
        for flag in ("--expire=-1", "--grpc-listen=nonsense", "--max-jobs=0"):
            result = subprocess.run([build_path("stepwatch-collector"), flag,
                                     "--metrics-listen=127.0.0.1:0"],
                                    capture_output=True, text=True, timeout=30)
            self.assertNotEqual(result.returncode, 0, flag)
            self.assertTrue(result.stderr.strip(), flag)

    def test_help_documents_the_flags(self):
        result = subprocess.run([build_path("stepwatch-collector"), "--helpfull"],
                                capture_output=True, text=True, timeout=30)
        text = result.stdout + result.stderr
        for flag in ("grpc_listen", "metrics_listen", "state_dir", "expire", "max_jobs",
                     "max_ranks_per_job", "max_nodes", "underutil_threshold"):
            self.assertIn(flag, text)


if __name__ == "__main__":
    unittest.main()
