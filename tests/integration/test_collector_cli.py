"""The collector and stepwatchctl as processes: flags, readiness, /metrics, errors, shutdown."""

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import unittest

from harness import (SOURCE_DIR, Agent, Collector, build_path, ctl, ctl_json, free_port, scrape,
                     metric_value, send_step, step_event, wait_until)


def project_version():
    """VERSION of project() in the top-level CMakeLists.txt: what --version must print."""
    with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
        return re.search(r"project\(stepwatch VERSION ([0-9.]+)", f.read()).group(1)


def run(binary, *args, timeout=30):
    return subprocess.run([build_path(binary), *args], capture_output=True, text=True,
                          timeout=timeout)


class BusyPort:
    """A listening TCP socket on a loopback port, as another server would hold it."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        return self

    def __exit__(self, *exc):
        self.sock.close()
        return False


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

    def test_findings_of_an_unknown_job_fail_clearly(self):
        with Collector(self.tmpdir) as c, Agent(self.tmpdir, c.grpc_addr) as a:
            for step in range(3):
                for rank in range(2):
                    send_step(a.socket_path, step_event("healthy", rank, 2, step, 0.1))
            wait_until(lambda: any(j["job"] == "healthy"
                                   for j in ctl_json(c.grpc_addr, "status")["jobs"]),
                       message="job healthy in status")
            known = ctl(c.grpc_addr, "findings", "healthy")
            self.assertEqual(known.returncode, 0, known.stderr)
            self.assertIn("No active findings.", known.stdout)
            for args in (["findings", "no-such-job"], ["findings", "no-such-job", "--json"],
                         ["explain", "no-such-job"]):
                result = ctl(c.grpc_addr, *args)
                self.assertEqual(result.returncode, 1, args)
                # One collector asked: says so, and how to ask every collector.
                self.assertTrue(result.stderr.startswith(
                    f'stepwatchctl: no job named "no-such-job" on the collector asked '
                    f'({c.grpc_addr}); '), (args, result.stderr))
                self.assertIn("--collector=dns:///NAME:PORT", result.stderr, args)
                self.assertEqual(result.stdout, "", args)

    def test_explain_says_what_it_cannot_know(self):
        # Ranks that send only step_s cannot be split into compute and communication, nor
        # compared with each other: explain shows "-", never 100% compute or +0%.
        with Collector(self.tmpdir) as c, Agent(self.tmpdir, c.grpc_addr) as a:
            for step in range(12):
                for rank in range(4):
                    send_step(a.socket_path, step_event("totals", rank, 4, step, 0.1))
                    send_step(a.socket_path, step_event(
                        "split", rank, 4, step, 0.1, data_s=0.01, compute_s=0.06 + 0.001 * rank,
                        comm_s=0.03 - 0.001 * rank))

            def ranks(job):
                result = ctl(c.grpc_addr, "explain", job, "--json")
                if result.returncode != 0:
                    return None
                explained = json.loads(result.stdout)
                return explained if len(explained["ranks"]) == 4 else None

            totals = wait_until(lambda: ranks("totals"), message="4 ranks of job totals")
            split = wait_until(lambda: ranks("split") if all(
                r["comparable"] for r in ranks("split")["ranks"]) else None,
                message="4 comparable ranks of job split")
            # Unknown: absent, or all zero (never 100% compute).
            self.assertFalse(any(totals["time_ratio"].values()), totals)
            self.assertEqual([r["comparable"] for r in totals["ranks"]], [False] * 4, totals)
            self.assertGreater(split["time_ratio"]["compute"], 0, split)
            text = ctl(c.grpc_addr, "explain", "totals").stdout
            self.assertIn("ranks report only their step time", text)
            self.assertNotIn("100.0%", text)
            self.assertNotIn("+0%", text)

    def test_cpu_only_straggler_names_its_local_rank_not_a_gpu(self):
        # Ranks on a node without GPUs (no NVML) that send local_rank only: the finding says
        # "local rank 2", never "GPU 2", in text and JSON (whose integers are numbers).
        with Collector(self.tmpdir, tick=0.2) as c, Agent(self.tmpdir, c.grpc_addr) as a:
            for step in range(60):
                for rank in range(4):
                    compute = 0.13 if rank == 2 else 0.10
                    send_step(a.socket_path, step_event("cpu-job", rank, 4, step, 0.14,
                                                        data_s=0.0, compute_s=compute,
                                                        comm_s=0.14 - compute, local_rank=rank))

            def straggler():
                found = ctl_json(c.grpc_addr, "findings", "cpu-job")["findings"]
                return next((f for f in found if f["kind"] == "straggler"), None)

            f = wait_until(straggler, timeout=30, interval=0.3, message="cpu-job's straggler")
            self.assertEqual(f["rank"], 2)
            self.assertIsInstance(f["since_step"], int)
            self.assertIn("rank 2 on node-0 local rank 2:", f["summary"])
            self.assertNotIn("GPU 2", f["summary"])
            # The finding names no GPU anywhere: JSON, the table's GPU column, the series that
            # alerts read (whose description would say "GPU 2"), and the size the alert carries.
            self.assertEqual(f["gpu"], -1)
            text = ctl(c.grpc_addr, "findings", "cpu-job")
            self.assertEqual(text.returncode, 0, text.stderr)
            self.assertIn("local rank 2", text.stdout)
            self.assertNotIn("GPU 2", text.stdout)
            row = next(line.split() for line in text.stdout.splitlines()
                       if line.split()[:2] == ["warning", "straggler"]
                       or line.split()[:2] == ["critical", "straggler"])
            header = text.stdout.splitlines()[0].split()
            self.assertEqual(row[header.index("GPU")], "-", text.stdout)
            samples = c.scrape()
            series = [labels for (name, labels, _) in samples
                      if name == "stepwatch_finding" and labels.get("kind") == "straggler"]
            self.assertEqual(len(series), 1, series)
            self.assertEqual(series[0]["gpu"], "", series)
            size = metric_value(samples, "stepwatch_finding_size_ratio", kind="straggler",
                                job="cpu-job", rank=2)
            self.assertIsNotNone(size, samples)
            self.assertGreater(size, 1.1)

    def test_every_binary_prints_its_version(self):
        version = project_version()
        for binary in ("stepwatch-collector", "stepwatch-agent", "stepwatchctl", "stepwatch-sim",
                       "stepwatch-gpu-probe"):
            result = run(binary, "--version")
            self.assertEqual(result.returncode, 0, (binary, result.stderr))
            self.assertEqual(result.stdout, f"{binary} {version}\n", binary)

    def test_missing_state_dir_is_created_with_its_parents(self):
        state_dir = os.path.join(self.tmpdir, "new", "nested", "state")
        c = Collector(self.tmpdir, state_dir=state_dir)
        c.start()
        try:
            self.assertTrue(os.path.isdir(state_dir))
            rc = c.process.stop(signal.SIGTERM)
        finally:
            c.stop()
        self.assertEqual(rc, 0, c.log())
        self.assertTrue(os.path.exists(os.path.join(state_dir, "scaling_history")), c.log())

    def test_unusable_state_dir_stops_the_collector_at_start(self):
        blocker = os.path.join(self.tmpdir, "a-file")
        with open(blocker, "w") as f:
            f.write("not a directory\n")
        cases = [os.path.join(blocker, "state")]
        if os.geteuid() != 0:  # root writes anywhere: only a non-root run can test permissions
            read_only = os.path.join(self.tmpdir, "read-only")
            os.mkdir(read_only, 0o500)
            cases.append(read_only)
        for state_dir in cases:
            result = run("stepwatch-collector", "--grpc-listen=127.0.0.1:0",
                         "--metrics-listen=127.0.0.1:0", f"--state-dir={state_dir}")
            self.assertEqual(result.returncode, 1, result.stderr)
            lines = result.stderr.splitlines()
            self.assertEqual(len(lines), 1, result.stderr)
            self.assertTrue(lines[0].startswith(f"stepwatch-collector: --state-dir={state_dir}: "),
                            result.stderr)
            self.assertNotIn("ready", result.stderr)

    def test_a_port_in_use_is_named_in_one_line(self):
        tmp_socket = os.path.join(self.tmpdir, "agent.sock")
        for binary, flag, others in (
                ("stepwatch-collector", "--grpc-listen", ["--metrics-listen=127.0.0.1:0"]),
                ("stepwatch-collector", "--metrics-listen", ["--grpc-listen=127.0.0.1:0"]),
                ("stepwatch-agent", "--metrics-listen", [f"--socket={tmp_socket}",
                                                         "--nvml-library=/nonexistent"])):
            with BusyPort() as busy:
                result = run(binary, f"{flag}={busy.addr}", *others)
            self.assertEqual(result.returncode, 1, (binary, flag, result.stderr))
            self.assertEqual(result.stderr,
                             f"{binary}: {flag}={busy.addr}: address already in use\n",
                             (binary, flag))
            self.assertFalse(os.path.exists(tmp_socket))

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

    def test_unreadable_basic_auth_file_names_its_flag(self):
        missing = os.path.join(self.tmpdir, "no-such-dir", "htpasswd")
        result = run("stepwatch-collector", "--grpc-listen=127.0.0.1:0",
                     "--metrics-listen=127.0.0.1:0", f"--metrics-basic-auth-file={missing}")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"--metrics-basic-auth-file: cannot open {missing}", result.stderr)
        self.assertNotIn("ready", result.stderr)

    def test_bad_flags_are_rejected(self):
        for flag in ("--expire=-1", "--grpc-listen=nonsense", "--max-jobs=0",
                     "--export-node-metrics=some"):
            result = subprocess.run([build_path("stepwatch-collector"), flag,
                                     "--metrics-listen=127.0.0.1:0"],
                                    capture_output=True, text=True, timeout=30)
            self.assertNotEqual(result.returncode, 0, flag)
            self.assertTrue(result.stderr.strip(), flag)

    def test_help_documents_the_flags(self):
        result = subprocess.run([build_path("stepwatch-collector"), "--helpfull"],
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(result.returncode, 0, result.stderr)
        text = result.stdout + result.stderr
        for flag in ("grpc-listen", "metrics-listen", "state-dir", "expire", "max-jobs",
                     "max-ranks-per-job", "max-nodes", "underutil-threshold",
                     "export-node-metrics"):
            self.assertIn(f"  --{flag}=", text)

    def test_every_binary_helps_with_dashed_flags_and_no_source_path(self):
        """--help names flags as the docs spell them (--max-jobs), says underscores work too, and
        shows no path of the machine that built it (Abseil's own help does both wrong)."""
        # Flags shared by several binaries (defined once, in http/ and security/) are listed by
        # each, with that binary's own default.
        expected = {"stepwatch-collector": ["--max-jobs=INT", "--verify-node-identity  ",
                                            '--metrics-listen=TEXT  (default: "0.0.0.0:9464")',
                                            "--tls-cert=TEXT", "--auth-token-file=TEXT"],
                    "stepwatch-agent": ["--metrics-basic-auth-file=TEXT",
                                        "--metrics-max-connections=INT",
                                        '--metrics-listen=TEXT  (default: "")',
                                        "--tls-ca=TEXT", "--tls-key=TEXT"],
                    "stepwatchctl": ["--auth-token-file=TEXT", "--tls-ca=TEXT"],
                    "stepwatch-sim": [], "stepwatch-gpu-probe": []}
        for binary, flags in expected.items():
            for spelling in ("--help", "--helpshort", "--helpfull"):
                with self.subTest(binary=binary, help=spelling):
                    result = run(binary, spelling)
                    self.assertEqual(result.returncode, 0, result.stderr)
                    text = result.stdout
                    self.assertTrue(text.startswith(f"{binary}: "), text[:200])
                    self.assertIn("underscores work too", text)
                    for flag in flags:
                        self.assertIn(f"  {flag}", text)
                    names = re.findall(r"(?m)^  --([\w-]+)", text)
                    self.assertGreater(len(names), 2, text)
                    self.assertEqual([n for n in names if "_" in n], [], text)
                    self.assertNotIn("/work/", text)
                    self.assertNotIn("main.cc", text)
                    self.assertNotRegex(text, r"Flags from ")


if __name__ == "__main__":
    unittest.main()
