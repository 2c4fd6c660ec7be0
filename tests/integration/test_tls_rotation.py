"""Certificate rotation of a real TLS collector while clients keep connecting.

The collector's --tls-cert/--tls-key point at DIR/current/{cert,key}.pem, DIR/current being a
symlink to DIR/<version>/. Generation v1 is signed by CA 1, v2 by CA 2, v3 by CA 1 again, so a
client that trusts only one CA tells which pair is being served; a prober that trusts both runs
stepwatchctl in a loop the whole time and must never fail. A symlink swap applies both files at
once; a half-applied write (new certificate, old key) is refused, logged and counted while the
previous pair keeps serving, and the completed rotation is served. A collector or agent started
with a key that is not its certificate's exits at once naming the flags."""

import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

from harness import Agent, Collector, build_path, metric_value, step_event, wait_until
from test_security import Pki


def run_ctl(addr, *args):
    return subprocess.run([build_path("stepwatchctl"), f"--collector={addr}", "--timeout=10",
                           "status", *args], capture_output=True, text=True, timeout=60)


class Prober(threading.Thread):
    """stepwatchctl over a new connection, again and again, until stopped (bounded count)."""

    def __init__(self, addr, ca):
        super().__init__(daemon=True)
        self.addr, self.ca = addr, ca
        self.stop_event = threading.Event()
        self.ok = 0
        self.failures = []

    def run(self):
        for _ in range(2000):
            if self.stop_event.is_set():
                return
            result = run_ctl(self.addr, f"--tls-ca={self.ca}")
            if result.returncode == 0:
                self.ok += 1
            else:
                self.failures.append(result.stderr[-300:])
            time.sleep(0.05)

    def finish(self):
        self.stop_event.set()
        self.join(timeout=60)


class TlsRotationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("openssl is not installed")
        cls._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-rotation-")
        d = cls._tmp.name
        cls.ca1 = Pki(d, "ca1")
        cls.ca2 = Pki(d, "ca2")
        sans = "IP:127.0.0.1,DNS:localhost"
        cls.generations = {"v1": cls.ca1.issue("v1", "stepwatch-collector", sans),
                           "v2": cls.ca2.issue("v2", "stepwatch-collector", sans),
                           "v3": cls.ca1.issue("v3", "stepwatch-collector", sans)}
        cls.both_cas = os.path.join(d, "both-cas.pem")
        with open(cls.both_cas, "w") as out:
            for ca in (cls.ca1.ca, cls.ca2.ca):
                with open(ca) as f:
                    out.write(f.read())

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def setUp(self):
        self._run = tempfile.TemporaryDirectory(prefix="stepwatch-rotation-run-")
        self.tmpdir = self._run.name
        self.addCleanup(self._run.cleanup)
        self.certs = os.path.join(self.tmpdir, "certs")
        os.makedirs(self.certs)
        for version, (cert, key) in self.generations.items():
            os.makedirs(os.path.join(self.certs, version))
            shutil.copy(cert, os.path.join(self.certs, version, "cert.pem"))
            shutil.copy(key, os.path.join(self.certs, version, "key.pem"))

    def swap_to(self, version):
        """The documented rotation: one rename replaces the symlink, so both files at once."""
        tmp = os.path.join(self.certs, "current.tmp")
        os.symlink(version, tmp)
        os.replace(tmp, os.path.join(self.certs, "current"))

    def current(self, name):
        return os.path.join(self.certs, "current", name)

    def serves(self, addr, ca):
        return run_ctl(addr, f"--tls-ca={ca}").returncode == 0

    def counter(self, collector, name):
        return metric_value(collector.scrape(), name) or 0

    def test_symlink_swap_and_half_applied_rotation(self):
        self.swap_to("v1")
        collector = Collector(self.tmpdir, tls_cert=self.current("cert.pem"),
                              tls_key=self.current("key.pem"), tls_reload_interval=1)
        with collector as c:
            self.assertTrue(self.serves(c.grpc_addr, self.ca1.ca))
            prober = Prober(c.grpc_addr, self.both_cas)
            prober.start()
            try:
                with Agent(self.tmpdir, c.grpc_addr, node="node-r", tls_ca=self.both_cas) as agent:
                    job_step = [0]

                    def ingests():
                        # Steps sent now reach the collector: the agent's connection works.
                        before = self.counter(c, "stepwatch_collector_steps_received_total")
                        agent.send(step_event("rot", 0, 1, job_step[0], 0.1))
                        job_step[0] += 1
                        wait_until(lambda: self.counter(
                            c, "stepwatch_collector_steps_received_total") > before,
                            timeout=20, message="a step through the agent")

                    ingests()
                    # 1. The symlink swap: v2 (CA 2) is served, v1 no longer.
                    swapped = time.monotonic()
                    self.swap_to("v2")
                    wait_until(lambda: self.serves(c.grpc_addr, self.ca2.ca), timeout=30,
                               interval=0.3, message="v2 served after the symlink swap")
                    print(f"\nsymlink swap served after {time.monotonic() - swapped:.1f} s "
                          "(--tls-reload-interval=1)")
                    self.assertFalse(self.serves(c.grpc_addr, self.ca1.ca))
                    self.assertEqual(self.counter(c, "stepwatch_collector_tls_reloads_total"), 1)
                    self.assertEqual(
                        self.counter(c, "stepwatch_collector_tls_reload_errors_total"), 0)
                    ingests()

                    # 2. A half-applied rotation written in place: v3's certificate over v2's,
                    # v2's key left. Refused, logged, counted; v2 keeps serving.
                    with open(self.current("cert.pem") + ".tmp", "w") as out:
                        with open(os.path.join(self.certs, "v3", "cert.pem")) as f:
                            out.write(f.read())
                    os.replace(self.current("cert.pem") + ".tmp", self.current("cert.pem"))
                    wait_until(lambda: self.counter(
                        c, "stepwatch_collector_tls_reload_errors_total") == 1, timeout=30,
                        message="the half-applied rotation counted")
                    self.assertIn("is not the private key of the certificate in --tls-cert",
                                  c.log())
                    time.sleep(3)  # several reload intervals in the half-applied state
                    self.assertTrue(self.serves(c.grpc_addr, self.ca2.ca))
                    self.assertFalse(self.serves(c.grpc_addr, self.ca1.ca))
                    self.assertEqual(
                        self.counter(c, "stepwatch_collector_tls_reload_errors_total"), 1)
                    ingests()

                    # 3. The rotation completes: v3 (CA 1) is served.
                    shutil.copy(os.path.join(self.certs, "v3", "key.pem"),
                                self.current("key.pem") + ".tmp")
                    os.replace(self.current("key.pem") + ".tmp", self.current("key.pem"))
                    wait_until(lambda: self.serves(c.grpc_addr, self.ca1.ca), timeout=30,
                               interval=0.3, message="v3 served once its key is in place")
                    self.assertFalse(self.serves(c.grpc_addr, self.ca2.ca))
                    self.assertEqual(self.counter(c, "stepwatch_collector_tls_reloads_total"), 2)
                    ingests()
            finally:
                prober.finish()
            # Trusting both CAs, no new connection failed at any point.
            print(f"prober: {prober.ok} connections, {len(prober.failures)} failed")
            self.assertEqual(prober.failures, [])
            self.assertGreater(prober.ok, 10)
            self.assertTrue(c.process.alive())

    def test_agent_client_certificate_half_applied_rotation(self):
        # The agent checks its client certificate the same way (every 10 s): a half-applied
        # rotation is refused and logged, the old pair keeps shipping, the completed one is taken.
        node_dir = os.path.join(self.certs, "node")
        for version, days in (("n1", 2), ("n2", 3)):
            cert, key = self.ca1.issue(f"node-{version}", "node-t", "DNS:node-t", days=days)
            os.makedirs(os.path.join(node_dir, version))
            shutil.copy(cert, os.path.join(node_dir, version, "cert.pem"))
            shutil.copy(key, os.path.join(node_dir, version, "key.pem"))
        os.symlink("n1", os.path.join(node_dir, "current"))
        server_cert, server_key = self.generations["v1"]
        with Collector(self.tmpdir, tls_cert=server_cert, tls_key=server_key,
                       tls_client_ca=self.ca1.ca) as c:
            current = os.path.join(node_dir, "current")
            with Agent(self.tmpdir, c.grpc_addr, node="node-t", tls_ca=self.ca1.ca,
                       tls_cert=os.path.join(current, "cert.pem"),
                       tls_key=os.path.join(current, "key.pem")) as agent:
                received = lambda: self.counter(c, "stepwatch_collector_steps_received_total")
                agent.send(step_event("rot-agent", 0, 1, 0, 0.1))
                wait_until(lambda: received() == 1, timeout=20, message="the agent's first step")
                shutil.copy(os.path.join(node_dir, "n2", "cert.pem"),
                            os.path.join(current, "cert.pem.tmp"))
                os.replace(os.path.join(current, "cert.pem.tmp"), os.path.join(current, "cert.pem"))
                wait_until(lambda: "TLS certificate not reloaded" in agent.log(), timeout=30,
                           message="the agent to refuse the half-applied rotation")
                self.assertIn("is not the private key of the certificate in --tls-cert",
                              agent.log())
                agent_counter = lambda name: metric_value(agent.scrape(), name)
                wait_until(lambda: agent_counter("stepwatch_agent_tls_reload_errors_total") == 1,
                           timeout=10, message="the agent to count the refused rotation")
                self.assertEqual(agent_counter("stepwatch_agent_tls_reloads_total"), 0)
                agent.send(step_event("rot-agent", 0, 1, 1, 0.1))
                wait_until(lambda: received() == 2, timeout=20, message="a step after it")
                shutil.copy(os.path.join(node_dir, "n2", "key.pem"),
                            os.path.join(current, "key.pem.tmp"))
                os.replace(os.path.join(current, "key.pem.tmp"), os.path.join(current, "key.pem"))
                wait_until(lambda: "reloaded (checked to be a pair)" in agent.log(), timeout=30,
                           message="the agent to take the completed rotation")
                wait_until(lambda: agent_counter("stepwatch_agent_tls_reloads_total") == 1,
                           timeout=10, message="the agent to count the completed rotation")
                self.assertEqual(agent_counter("stepwatch_agent_tls_reload_errors_total"), 1)
                agent.send(step_event("rot-agent", 0, 1, 2, 0.1))
                wait_until(lambda: received() == 3, timeout=20, message="a step after that")

    def test_a_mismatched_pair_fails_at_start(self):
        cert = os.path.join(self.certs, "v1", "cert.pem")
        key = os.path.join(self.certs, "v2", "key.pem")
        c = Collector(self.tmpdir, tls_cert=cert, tls_key=key)
        proc = subprocess.run(c.command(), capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn(f"--tls-key={key} is not the private key of the certificate in "
                      f"--tls-cert={cert}", proc.stderr)
        a = Agent(self.tmpdir, "127.0.0.1:1", node="node-m", tls_ca=self.ca1.ca, tls_cert=cert,
                  tls_key=key)
        proc = subprocess.run(a.command(), capture_output=True, text=True, timeout=30)
        self.assertNotEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(f"--tls-key={key} is not the private key", proc.stderr)
        proc = subprocess.run([build_path("stepwatchctl"), "--collector=127.0.0.1:1",
                               f"--tls-ca={self.ca1.ca}", f"--tls-cert={cert}",
                               f"--tls-key={key}", "status"],
                              capture_output=True, text=True, timeout=30)
        self.assertNotEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("--tls-key=", proc.stderr)


if __name__ == "__main__":
    unittest.main()
