"""Transport security through the real processes: a collector with TLS, client certificates and
bearer tokens; agents and stepwatchctl with and without the right credentials. The PKI is made by
openssl in the test's temporary directory. Loopback only; every wait is bounded."""

import base64
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt

from harness import (Agent, Collector, build_path, free_port, metric_value, step_event,
                     wait_until)

AGENT_TOKEN = "agent-token-for-tests-0123456789"
READER_TOKEN = "reader-token-for-tests-0123456789"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class Pki:
    """A test CA, a server certificate for 127.0.0.1 and client certificates."""

    def __init__(self, directory, ca_name="ca"):
        self.dir = directory
        self.ca_name = ca_name
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{ca_name}.key", "-out", f"{ca_name}.pem", "-days", "2",
                 "-subj", f"/CN=stepwatch test {ca_name}", cwd=directory)

    @property
    def ca(self):
        return os.path.join(self.dir, f"{self.ca_name}.pem")

    def issue(self, name, common_name, sans, days=2):
        """Returns (cert, key) paths of a certificate signed by this CA."""
        prefix = f"{self.ca_name}-{name}"
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{prefix}.key", "-out", f"{prefix}.csr", "-subj", f"/CN={common_name}",
                 cwd=self.dir)
        with open(os.path.join(self.dir, f"{prefix}.ext"), "w") as f:
            f.write(f"subjectAltName={sans}\n")
        _openssl("x509", "-req", "-in", f"{prefix}.csr", "-CA", f"{self.ca_name}.pem", "-CAkey",
                 f"{self.ca_name}.key", "-CAcreateserial", "-out", f"{prefix}.pem", "-days",
                 str(days), "-extfile", f"{prefix}.ext", cwd=self.dir)
        return os.path.join(self.dir, f"{prefix}.pem"), os.path.join(self.dir, f"{prefix}.key")


class PasswordMetricsCollector(Collector):
    """A collector whose /metrics needs a password: ready once both ports accept."""

    def _ready(self):
        for port in (self.grpc_port, self.metrics_port):
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
        return True


def write_password_file(path, user, password, header=""):
    """A /metrics password file (USER:BCRYPT_HASH, bcrypt's default cost) with one user."""
    with open(path, "w") as f:
        f.write(header + user + ":" + crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
                + "\n")


class PasswordMetricsAgent(Agent):
    """An agent whose /metrics needs a password: ready once its socket and port exist."""

    def _ready(self):
        if not os.path.exists(self.socket_path):
            return False
        with socket.create_connection(("127.0.0.1", self.metrics_port), timeout=1):
            return True


def fetch_metrics(port, cafile=None, user=None, password=None, scheme="https"):
    """(status, body) of GET /metrics; status 0 when the connection or handshake failed."""
    request = urllib.request.Request(f"{scheme}://127.0.0.1:{port}/metrics")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    context = ssl.create_default_context(cafile=cafile) if scheme == "https" else None
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, ssl.SSLError, ConnectionError, OSError):
        return 0, ""


def run_ctl(addr, *args, timeout=30):
    return subprocess.run([build_path("stepwatchctl"), f"--collector={addr}", "--timeout=5", *args],
                          capture_output=True, text=True, timeout=timeout)


class SecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("openssl is not installed")
        cls._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-security-")
        d = cls._tmp.name
        cls.pki = Pki(d)
        cls.other = Pki(d, "other-ca")
        cls.server = cls.pki.issue("server", "stepwatch-collector", "IP:127.0.0.1,DNS:localhost")
        cls.node_a = cls.pki.issue("node-a", "node-a", "DNS:node-a")
        cls.reader = cls.pki.issue("reader", "reader", "DNS:reader")
        cls.foreign = cls.other.issue("node-a", "node-a", "DNS:node-a")
        cls.expired = cls.pki.issue("expired", "node-a", "DNS:node-a", days=-1)
        cls.tokens = os.path.join(d, "tokens")
        with open(cls.tokens, "w") as f:
            f.write(f"# collector tokens\nagent {AGENT_TOKEN}\nreader {READER_TOKEN}\n")
        for name, token in (("agent.token", AGENT_TOKEN), ("reader.token", READER_TOKEN)):
            with open(os.path.join(d, name), "w") as f:
                f.write(token + "\n")
        cls.agent_token = os.path.join(d, "agent.token")
        cls.reader_token = os.path.join(d, "reader.token")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def setUp(self):
        self._run = tempfile.TemporaryDirectory(prefix="stepwatch-security-run-")
        self.tmpdir = self._run.name

    def tearDown(self):
        self._run.cleanup()

    def assert_password_required(self, port, user, password, expected_text):
        """Plain-HTTP /metrics on `port` answers 200 (with `expected_text`) to `user:password`
        only: 401 without credentials, with a wrong password or for an unknown user."""
        status, body = fetch_metrics(port, None, user, password, "http")
        self.assertEqual(status, 200)
        self.assertIn(expected_text, body)
        self.assertEqual(fetch_metrics(port, scheme="http")[0], 401)
        self.assertEqual(fetch_metrics(port, None, user, "wrong", "http")[0], 401)
        self.assertEqual(fetch_metrics(port, None, "mallory", password, "http")[0], 401)

    def mtls_collector(self, **flags):
        return Collector(self.tmpdir, tls_cert=self.server[0], tls_key=self.server[1],
                         tls_client_ca=self.pki.ca, **flags)

    def client_tls(self, cert_key=None, ca=None):
        args = [f"--tls-ca={ca or self.pki.ca}"]
        if cert_key:
            args += [f"--tls-cert={cert_key[0]}", f"--tls-key={cert_key[1]}"]
        return args

    def send_steps(self, agent, job, steps=5):
        for step in range(steps):
            agent.send(step_event(job, 0, 1, step, 0.1, compute_s=0.09, comm_s=0.01))

    def steps_received(self, collector):
        return metric_value(collector.scrape(), "stepwatch_collector_steps_received_total")

    def refused(self, collector, reason):
        return metric_value(collector.scrape(), "stepwatch_collector_requests_refused_total",
                            reason=reason)

    def test_plaintext_collector_warns_loudly(self):
        with Collector(self.tmpdir) as c:
            self.assertIn("PLAINTEXT", c.log())

    def test_mutual_tls_refuses_clients_without_a_valid_certificate(self):
        with self.mtls_collector() as c:
            ok = run_ctl(c.grpc_addr, "status", *self.client_tls(self.reader))
            self.assertEqual(ok.returncode, 0, ok.stderr)
            refused = {
                "plaintext": [],
                "no client certificate": self.client_tls(),
                "certificate of another CA": self.client_tls(self.foreign),
                "expired certificate": self.client_tls(self.expired),
                "server not trusted": self.client_tls(self.reader, ca=self.other.ca),
            }
            for what, args in refused.items():
                result = run_ctl(c.grpc_addr, "status", *args)
                self.assertEqual(result.returncode, 1, f"{what}: {result.stdout}")
            self.assertIn("cannot reach collector", run_ctl(c.grpc_addr, "status").stderr)

            # A plaintext agent and one with a certificate of another CA deliver nothing; the
            # agent with its node's certificate does.
            for name, extra in (("plain", {}), ("foreign", {"tls_ca": self.pki.ca,
                                                            "tls_cert": self.foreign[0],
                                                            "tls_key": self.foreign[1]})):
                with Agent(self.tmpdir, c.grpc_addr, node="node-a", **extra) as agent:
                    self.send_steps(agent, f"job-{name}")
                    # The agent tried and was turned away (its collector link logs each failed attempt).
                    wait_until(lambda: "unavailable" in agent.log(), timeout=20,
                               message=f"the {name} agent's connection to be refused")
                    self.assertEqual(self.steps_received(c), 0, name)
            with Agent(self.tmpdir, c.grpc_addr, node="node-a", tls_ca=self.pki.ca,
                       tls_cert=self.node_a[0], tls_key=self.node_a[1]) as agent:
                self.send_steps(agent, "job-good")
                wait_until(lambda: self.steps_received(c) == 5, timeout=20,
                           message="steps from the agent with a valid certificate")

    def test_a_certificate_for_one_node_cannot_report_another(self):
        with self.mtls_collector() as c:
            with Agent(self.tmpdir, c.grpc_addr, node="node-b", tls_ca=self.pki.ca,
                       tls_cert=self.node_a[0], tls_key=self.node_a[1]) as agent:
                self.send_steps(agent, "forged")
                wait_until(lambda: self.refused(c, "node_mismatch") >= 1, timeout=20,
                           message="the batch claiming node-b to be refused")
                self.assertEqual(self.steps_received(c), 0)
                status = run_ctl(c.grpc_addr, "status", "--json", *self.client_tls(self.reader))
                self.assertEqual(status.returncode, 0, status.stderr)
                self.assertNotIn("node-b", status.stdout)
                self.assertIn("node-a", c.log())

    def test_tokens_have_roles(self):
        # TLS without client certificates, tokens decide who may report and who may query.
        with Collector(self.tmpdir, tls_cert=self.server[0], tls_key=self.server[1],
                       auth_token_file=self.tokens) as c:
            tls = self.client_tls()
            self.assertEqual(run_ctl(c.grpc_addr, "status", *tls,
                                     f"--auth-token-file={self.reader_token}").returncode, 0)
            no_token = run_ctl(c.grpc_addr, "status", *tls)
            self.assertEqual(no_token.returncode, 1)
            self.assertIn("refused", no_token.stderr)
            agent_token = run_ctl(c.grpc_addr, "status", *tls,
                                  f"--auth-token-file={self.agent_token}")
            self.assertEqual(agent_token.returncode, 1)
            self.assertIn("reader role", agent_token.stderr)
            self.assertGreaterEqual(self.refused(c, "unauthenticated"), 1)
            self.assertGreaterEqual(self.refused(c, "permission_denied"), 1)

            with Agent(self.tmpdir, c.grpc_addr, node="node-r", tls_ca=self.pki.ca,
                       auth_token_file=self.reader_token) as agent:
                self.send_steps(agent, "reader-reports")
                wait_until(lambda: self.refused(c, "permission_denied") >= 2, timeout=20,
                           message="a reader token's stream to be refused")
                self.assertEqual(self.steps_received(c), 0)
            with Agent(self.tmpdir, c.grpc_addr, node="node-g", tls_ca=self.pki.ca,
                       auth_token_file=self.agent_token) as agent:
                self.send_steps(agent, "agent-reports")
                wait_until(lambda: self.steps_received(c) == 5, timeout=20,
                           message="steps from the agent token")

    def test_rotated_certificate_and_tokens_apply_without_restart(self):
        tokens = os.path.join(self.tmpdir, "tokens")
        shutil.copy(self.tokens, tokens)
        cert = os.path.join(self.tmpdir, "server.pem")
        key = os.path.join(self.tmpdir, "server.key")
        shutil.copy(self.server[0], cert)
        shutil.copy(self.server[1], key)
        with Collector(self.tmpdir, tls_cert=cert, tls_key=key, auth_token_file=tokens,
                       tls_reload_interval=1) as c:
            reader = f"--auth-token-file={self.reader_token}"
            self.assertEqual(run_ctl(c.grpc_addr, "status", *self.client_tls(), reader).returncode,
                             0)
            # Tokens: the old reader token is replaced by a new one.
            new_token = os.path.join(self.tmpdir, "new-reader.token")
            with open(new_token, "w") as f:
                f.write("reader-token-rotated-0123456789\n")
            with open(tokens + ".tmp", "w") as f:
                f.write(f"agent {AGENT_TOKEN}\nreader reader-token-rotated-0123456789\n")
            os.replace(tokens + ".tmp", tokens)
            self.assertEqual(run_ctl(c.grpc_addr, "status", *self.client_tls(),
                                     f"--auth-token-file={new_token}").returncode, 0)
            self.assertEqual(run_ctl(c.grpc_addr, "status", *self.client_tls(), reader).returncode,
                             1)
            # Certificate: the server's certificate is replaced by one of another CA; clients that
            # trust only the new CA get through once the collector has reloaded it.
            new_cert, new_key = self.other.issue("server", "stepwatch-collector",
                                                 "IP:127.0.0.1,DNS:localhost")
            shutil.copy(new_key, key + ".tmp")
            shutil.copy(new_cert, cert + ".tmp")
            os.replace(key + ".tmp", key)
            os.replace(cert + ".tmp", cert)
            args = ["status", f"--tls-ca={self.other.ca}", f"--auth-token-file={new_token}"]
            wait_until(lambda: run_ctl(c.grpc_addr, *args).returncode == 0, timeout=30,
                       interval=0.5, message="the rotated server certificate to be served")
            self.assertEqual(run_ctl(c.grpc_addr, "status", *self.client_tls(),
                                     f"--auth-token-file={new_token}").returncode, 1)
            self.assertTrue(c.process.alive())

    @unittest.skipIf(shutil.which("socat") is None, "socat is not installed")
    def test_metrics_basic_auth_behind_a_tls_sidecar(self):
        # The collector asks for a password; TLS is terminated by a sidecar in front of a /metrics
        # bound to loopback (the Kubernetes convention; socat stands in for the proxy here).
        users = os.path.join(self.tmpdir, "metrics-users")
        write_password_file(users, "prometheus", "scrape-secret", "# scrapers\n")
        c = PasswordMetricsCollector(self.tmpdir, metrics_basic_auth_file=users)
        with c:
            plain = c.metrics_port
            self.assert_password_required(plain, "prometheus", "scrape-secret",
                                          "stepwatch_collector_batches_received_total")
            pem = os.path.join(self.tmpdir, "sidecar.pem")
            with open(pem, "w") as out:
                for path in (self.server[1], self.server[0]):
                    with open(path) as f:
                        out.write(f.read())
            tls_port = free_port()
            sidecar = subprocess.Popen(
                ["socat", f"OPENSSL-LISTEN:{tls_port},bind=127.0.0.1,reuseaddr,fork,cert={pem},"
                 "verify=0", f"TCP:127.0.0.1:{plain}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_until(lambda: fetch_metrics(tls_port, self.pki.ca, "prometheus",
                                                 "scrape-secret")[0] == 200,
                           timeout=20, message="metrics through the TLS sidecar")
                self.assertEqual(fetch_metrics(tls_port, self.pki.ca)[0], 401)
                self.assertEqual(
                    fetch_metrics(tls_port, self.other.ca, "prometheus", "scrape-secret")[0], 0)
            finally:
                sidecar.terminate()
                sidecar.wait(timeout=10)
            # A rotated password file applies without a restart.
            write_password_file(users + ".tmp", "prometheus", "rotated-secret")
            os.replace(users + ".tmp", users)
            self.assertEqual(
                fetch_metrics(plain, None, "prometheus", "rotated-secret", "http")[0], 200)
            self.assertEqual(
                fetch_metrics(plain, None, "prometheus", "scrape-secret", "http")[0], 401)

    def test_agent_metrics_need_the_scrapers_password(self):
        # The agent's /metrics as shipped (systemd unit, DaemonSet): a password file; the answer
        # is 401 without it, with a wrong password or an unknown user, 200 with it.
        users = os.path.join(self.tmpdir, "agent-metrics-users")
        write_password_file(users, "prometheus", "agent-secret")
        with Collector(self.tmpdir) as c:
            agent = PasswordMetricsAgent(self.tmpdir, c.grpc_addr, node="locked",
                                         metrics_basic_auth_file=users)
            with agent:
                self.assert_password_required(agent.metrics_port, "prometheus", "agent-secret",
                                              "stepwatch_agent_")

    def test_bad_security_flags_fail_at_start(self):
        for flags, expected in (({"tls_cert": "/nonexistent.pem", "tls_key": self.server[1]},
                                 "--tls-cert=/nonexistent.pem"),
                                ({"tls_cert": self.server[0]}, "--tls-cert and --tls-key"),
                                ({"auth_token_file": "/nonexistent-tokens"}, "--auth-token-file"),
                                ({"metrics_basic_auth_file": self.tokens}, "USER:BCRYPT_HASH")):
            c = Collector(self.tmpdir, **flags)
            proc = subprocess.run(c.command(), capture_output=True, text=True, timeout=30)
            self.assertNotEqual(proc.returncode, 0, flags)
            self.assertIn(expected, proc.stderr, flags)


if __name__ == "__main__":
    unittest.main()
