"""What stepwatchctl and the agent say when a TLS connection to a real collector fails: gRPC itself
says little more than "Socket closed", so each case must name its likely cause or list the causes
and the flags to check (security/tls_errors.cc). The agent logs the cause once, not once per
retry."""

import os
import shutil
import subprocess
import tempfile
import unittest

from harness import Agent, Collector, build_path, wait_until
from test_security import Pki


def run_ctl(addr, *args):
    return subprocess.run([build_path("stepwatchctl"), f"--collector={addr}", "--timeout=5",
                           "status", *args], capture_output=True, text=True, timeout=60)


class TlsErrorMessagesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("openssl is not installed")
        cls._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-tls-errors-")
        d = cls._tmp.name
        cls.pki = Pki(d)
        cls.other = Pki(d, "other-ca")
        cls.server = cls.pki.issue("server", "stepwatch-collector", "IP:127.0.0.1,DNS:localhost")
        cls.misnamed = cls.pki.issue("misnamed", "stepwatch-collector", "DNS:elsewhere.example")
        cls.reader = cls.pki.issue("reader", "reader", "DNS:reader")
        cls.foreign = cls.other.issue("reader", "reader", "DNS:reader")
        cls.expired = cls.pki.issue("expired", "reader", "DNS:reader", days=-1)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def setUp(self):
        self._run = tempfile.TemporaryDirectory(prefix="stepwatch-tls-errors-run-")
        self.addCleanup(self._run.cleanup)
        self.tmpdir = self._run.name

    def client(self, cert_key=None, ca=None):
        args = [f"--tls-ca={ca or self.pki.ca}"]
        if cert_key:
            args += [f"--tls-cert={cert_key[0]}", f"--tls-key={cert_key[1]}"]
        return args

    def assert_explained(self, result, *words):
        self.assertEqual(result.returncode, 1, result.stderr)
        line = [l for l in result.stderr.splitlines() if l.startswith("stepwatchctl:")]
        self.assertTrue(line, result.stderr)
        self.assertIn("likely cause:", line[-1])
        for word in words:
            self.assertIn(word, line[-1])
        return line[-1]

    def test_each_failure_names_its_cause(self):
        with Collector(self.tmpdir, tls_cert=self.server[0], tls_key=self.server[1],
                       tls_client_ca=self.pki.ca) as c:
            self.assertEqual(run_ctl(c.grpc_addr, *self.client(self.reader)).returncode, 0)
            seen = {
                "no client certificate": self.assert_explained(
                    run_ctl(c.grpc_addr, *self.client()), "no client certificate", "--tls-cert"),
                "client certificate of an unknown CA": self.assert_explained(
                    run_ctl(c.grpc_addr, *self.client(self.foreign)), "unknown CA",
                    "--tls-client-ca"),
                "expired client certificate": self.assert_explained(
                    run_ctl(c.grpc_addr, *self.client(self.expired)), "expired"),
                "server of an unknown CA": self.assert_explained(
                    run_ctl(c.grpc_addr, *self.client(self.reader, ca=self.other.ca)),
                    "unknown CA", "--tls-ca"),
                "plaintext client": self.assert_explained(run_ctl(c.grpc_addr), "--tls-ca"),
            }
        with Collector(self.tmpdir, name="misnamed", tls_cert=self.misnamed[0],
                       tls_key=self.misnamed[1]) as c:
            seen["server name mismatch"] = self.assert_explained(
                run_ctl(c.grpc_addr, *self.client()), "name mismatch", "--collector")
        with Collector(self.tmpdir, name="plain") as c:
            seen["collector without TLS"] = self.assert_explained(
                run_ctl(c.grpc_addr, *self.client()), "does not speak TLS")
        for case, line in seen.items():
            print(f"\n{case}: {line}")

    def agent_cause(self, agent, *words):
        line = wait_until(
            lambda: [l for l in agent.log().splitlines() if "likely cause:" in l],
            timeout=30, message="the agent to log the likely cause")[-1]
        for word in words:
            self.assertIn(word, line)
        return line

    def test_agent_log_names_the_cause_once(self):
        with Collector(self.tmpdir, tls_cert=self.server[0], tls_key=self.server[1],
                       tls_client_ca=self.pki.ca) as c:
            with Agent(self.tmpdir, c.grpc_addr, node="no-cert", tls_ca=self.pki.ca,
                       reconnect_max_backoff=0.2) as agent:
                line = self.agent_cause(agent, "no client certificate", "--tls-cert")
                # Several retries later the cause is still logged once.
                wait_until(lambda: agent.log().count("unavailable (") >= 3, timeout=30,
                           message="the agent to retry")
                self.assertEqual(agent.log().count("likely cause:"), 1, agent.log())
                print(f"\nagent without a client certificate: {line}")
            with Agent(self.tmpdir, c.grpc_addr, node="unknown-ca", tls_ca=self.other.ca,
                       tls_cert=self.reader[0], tls_key=self.reader[1]) as agent:
                line = self.agent_cause(agent, "unknown CA", "--tls-ca")
                print(f"\nagent trusting another CA: {line}")


if __name__ == "__main__":
    unittest.main()
