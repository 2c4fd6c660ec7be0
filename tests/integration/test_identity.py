"""Identity binding and admission bounds at the collector, through the real processes: a client
certificate that names no node is refused; one node's certificate cannot inject steps or exits for
ranks another node runs, nor end its job; a rank whose node went silent for --expire moves; with
--verify-node-identity=false the collector says what that allows; oversized strings are refused
and the collector's peak RSS stays bounded; one node cannot take every job slot; a malformed
protobuf ends its stream with INVALID_ARGUMENT and is counted. The PKI is made by openssl in the
test's temporary directory (test_security.Pki); crafted Ingest messages come from ingest_probe
(tests/collector). Loopback only; every wait is bounded."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from harness import (Agent, Collector, assert_rss_at_most, build_path, metric_value, peak_rss_mib,
                     step_event, wait_until)
from test_security import Pki, _openssl

# Sends steps of (job, rank) pairs from its own process, then exits: its agent reports the exits.
ATTACKER = textwrap.dedent("""
    import json, socket, sys
    path, job, world, first, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), \\
        int(sys.argv[4]), int(sys.argv[5])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for step in range(first, first + steps):
        for rank in range(world):
            busy = 0.5 if rank == 2 else 0.07  # a false straggler, if it were believed
            s.sendto(json.dumps({"job": job, "rank": rank, "world_size": world, "step": step,
                                 "step_s": 0.55, "data_s": 0.0, "compute_s": busy,
                                 "comm_s": 0.55 - busy}).encode(), path)
""")


def send_steps(agent, job, world_size, steps, ranks=None, step_s=0.1):
    for step in steps:
        for rank in (range(world_size) if ranks is None else ranks):
            busy = step_s * 0.7
            agent.send(step_event(job, rank, world_size, step, step_s, data_s=0.0,
                                  compute_s=busy, comm_s=step_s - busy))


class IdentityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("openssl is not installed")
        cls._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-identity-")
        d = cls._tmp.name
        cls.pki = Pki(d)
        cls.server = cls.pki.issue("server", "stepwatch-collector", "IP:127.0.0.1,DNS:localhost")
        cls.certs = {n: cls.pki.issue(n, n, f"DNS:{n}") for n in ("node-a", "node-b", "node-c")}
        cls.nameless = cls._issue_nameless(d)

    @classmethod
    def _issue_nameless(cls, d):
        """Signed by the CA, with neither a DNS name nor a common name (an IP name only)."""
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", "nameless.key", "-out", "nameless.csr", "-subj", "/O=stepwatch test",
                 cwd=d)
        with open(os.path.join(d, "nameless.ext"), "w") as f:
            f.write("subjectAltName=IP:10.0.0.7\n")
        _openssl("x509", "-req", "-in", "nameless.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "nameless.pem", "-days", "2", "-extfile",
                 "nameless.ext", cwd=d)
        return os.path.join(d, "nameless.pem"), os.path.join(d, "nameless.key")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def setUp(self):
        self._run = tempfile.TemporaryDirectory(prefix="stepwatch-identity-run-")
        self.tmpdir = self._run.name

    def tearDown(self):
        self._run.cleanup()

    def mtls_collector(self, **flags):
        return Collector(self.tmpdir, tls_cert=self.server[0], tls_key=self.server[1],
                         tls_client_ca=self.pki.ca, **flags)

    def agent(self, collector, node, cert=None):
        cert = cert or self.certs[node]
        return Agent(self.tmpdir, collector.grpc_addr, node=node, tls_ca=self.pki.ca,
                     tls_cert=cert[0], tls_key=cert[1])

    @staticmethod
    def value(collector, name, **labels):
        return metric_value(collector.scrape(), name, **labels) or 0

    def flood_jobs(self, collector, honest, flooder, invented, refused):
        """`flooder` opens `invented` jobs of one step each until `refused` of them are refused as
        beyond its share; then `honest` opens a new job, which must be admitted. Returns the
        collector's samples after that."""
        for j in range(invented):
            send_steps(flooder, f"invented-{j}", 1, [0])
        wait_until(lambda: self.value(collector, "stepwatch_collector_node_refusals_total",
                                      node=flooder.node, reason="jobs_per_node") >= refused,
                   timeout=60, message=f"{flooder.node}'s jobs past its share to be refused")
        send_steps(honest, "real", 2, range(3))
        wait_until(lambda: self.value(collector, "stepwatch_job_last_step", job="real") == 2,
                   timeout=20, message=f"{honest.node}'s new job to be admitted")
        return collector.scrape()

    def probe(self, collector, mode, **flags):
        args = [build_path("ingest_probe"), f"--collector={collector.grpc_addr}", f"--mode={mode}"]
        args += [f"--{k}={v}" for k, v in flags.items()]
        result = subprocess.run(args, capture_output=True, text=True, timeout=240)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout

    def test_a_certificate_naming_no_node_is_refused_and_counted(self):
        with self.mtls_collector() as c:
            with self.agent(c, "node-a", cert=self.nameless) as agent:
                send_steps(agent, "job-nameless", 1, range(5))
                wait_until(lambda: self.value(c, "stepwatch_collector_requests_refused_total",
                                              reason="no_identity") >= 1,
                           timeout=20, message="the nameless certificate to be refused")
                self.assertEqual(self.value(c, "stepwatch_collector_steps_received_total"), 0)
                self.assertIn("names no node", c.log())
            # A certificate that names its node still reports.
            with self.agent(c, "node-a") as agent:
                send_steps(agent, "job-named", 1, range(5))
                wait_until(lambda: self.value(c, "stepwatch_collector_steps_received_total") == 5,
                           timeout=20, message="steps from the named certificate")

    def test_another_node_cannot_inject_steps_or_end_a_running_job(self):
        with self.mtls_collector() as c, self.agent(c, "node-a") as a, \
                self.agent(c, "node-b") as b:
            send_steps(a, "train", 4, range(0, 30))
            wait_until(lambda: self.value(c, "stepwatch_job_last_step", job="train") == 29,
                       timeout=20, message="node-a's job")
            # node-b's process sends 30 steps of every rank of the job (rank 2 slow), then exits:
            # its agent reports the exits of all four ranks.
            attacker = subprocess.run([sys.executable, "-c", ATTACKER, b.socket_path, "train",
                                       "4", "30", "30"], capture_output=True, text=True,
                                      timeout=30)
            self.assertEqual(attacker.returncode, 0, attacker.stderr)
            refusals = "stepwatch_collector_node_refusals_total"
            wait_until(lambda: self.value(c, refusals, node="node-b",
                                          reason="rank_foreign") == 120,
                       timeout=20, message="node-b's steps to be refused")
            wait_until(lambda: self.value(c, refusals, node="node-b",
                                          reason="rank_exit_foreign") >= 4,
                       timeout=20, message="node-b's exits to be refused")
            self.assertEqual(self.value(c, "stepwatch_collector_steps_rejected_total",
                                        reason="foreign"), 120)
            # node-a's job goes on, unaffected: not finished, not flagged, every rank node-a's.
            send_steps(a, "train", 4, range(30, 60))
            wait_until(lambda: self.value(c, "stepwatch_job_last_step", job="train") == 59,
                       timeout=20, message="node-a's job to go on")
            samples = c.scrape()
            self.assertEqual(metric_value(samples, "stepwatch_collector_jobs_finished_total"), 0)
            self.assertEqual(metric_value(samples, "stepwatch_job_ranks_reporting", job="train"), 4)
            self.assertIn(metric_value(samples, "stepwatch_straggler", job="train", rank="2"),
                          (None, 0))
            flagged = [v for (n, l, v) in samples
                       if n == "stepwatch_findings" and l.get("job") == "train" and v > 0]
            self.assertEqual(flagged, [])
            nodes = {l["rank"]: l["node"] for (n, l, v) in samples
                     if n == "stepwatch_rank_busy_vs_median_ratio" and l.get("job") == "train"}
            self.assertEqual(nodes, {str(r): "node-a" for r in range(4)})
            self.assertEqual(metric_value(samples, refusals, node="node-a", reason="rank_foreign"),
                             None)
            self.assertIn("holds that rank", c.log())

    def test_a_rank_moves_once_its_node_was_silent_for_expire(self):
        with self.mtls_collector(expire=4) as c, self.agent(c, "node-a") as a, \
                self.agent(c, "node-c") as cc:
            send_steps(a, "moving", 4, range(0, 5), ranks=[0, 1])
            send_steps(cc, "moving", 4, range(0, 5), ranks=[2, 3])
            wait_until(lambda: self.value(c, "stepwatch_job_ranks_reporting", job="moving") == 4,
                       timeout=20, message="the job on two nodes")
            # While node-a reports ranks 0 and 1, node-c cannot report them.
            send_steps(cc, "moving", 4, [5], ranks=[0, 1, 2, 3])
            send_steps(a, "moving", 4, [5], ranks=[0, 1])
            wait_until(lambda: self.value(c, "stepwatch_collector_node_refusals_total",
                                          node="node-c", reason="rank_foreign") == 2,
                       timeout=20, message="node-c's steps of node-a's ranks to be refused")
            # node-a goes silent (killed); node-c keeps its ranks going past --expire.
            a.kill()
            step = 6
            for _ in range(40):
                send_steps(cc, "moving", 4, [step], ranks=[2, 3])
                step += 1
                if self.value(c, "stepwatch_collector_expired_total", kind="node") >= 1:
                    break
                time.sleep(0.25)
            self.assertGreaterEqual(self.value(c, "stepwatch_collector_expired_total", kind="node"),
                                    1)
            # The ranks moved: node-c reports all four.
            send_steps(cc, "moving", 4, range(step, step + 3))
            last = step + 2
            wait_until(lambda: self.value(c, "stepwatch_job_last_step", job="moving") == last,
                       timeout=20, message="the moved ranks' steps")

            def nodes():
                return {l["rank"]: l["node"] for (n, l, v) in c.scrape()
                        if n == "stepwatch_rank_busy_vs_median_ratio" and l.get("job") == "moving"}
            wait_until(lambda: nodes() == {str(r): "node-c" for r in range(4)}, timeout=20,
                       message="every rank on node-c")
            self.assertEqual(self.value(c, "stepwatch_collector_node_refusals_total",
                                        node="node-c", reason="rank_foreign"), 2)
            self.assertEqual(self.value(c, "stepwatch_job_ranks_reporting", job="moving"), 4)

    def test_verify_off_warns_what_it_allows(self):
        with self.mtls_collector(verify_node_identity="false") as c:
            log = c.log()
            self.assertIn("--verify-node-identity=false", log)
            self.assertIn("any holder of a valid client certificate may report for any node", log)
            self.assertNotIn("a batch's node must match its certificate", log)
            # What it allows: node-a's certificate reports as node-b.
            with self.agent(c, "node-b", cert=self.certs["node-a"]) as agent:
                send_steps(agent, "job-off", 1, range(3))
                wait_until(lambda: self.value(c, "stepwatch_collector_steps_received_total") == 3,
                           timeout=20, message="steps claimed for node-b")
        with self.mtls_collector(name="collector-verifying") as c:
            self.assertIn("a batch's node must match its certificate", c.log())
            self.assertNotIn("--verify-node-identity=false", c.log())

    def test_oversized_strings_are_refused_and_peak_rss_stays_bounded(self):
        # 80 batches of 4 MiB boot ids and host names (16 MiB messages admitted), then 80 of
        # 4 MiB host names and 2 MiB GPU names and uuids: before the bounds, the first flood alone
        # took a collector from 16 to 525 MiB while it accounted 41 KiB.
        with Collector(self.tmpdir, max_receive_message_mib=16) as c:
            pid = c.process.proc.pid
            before = peak_rss_mib(pid)
            out = self.probe(c, "big-ids", count=80, bytes=4 << 20)
            self.assertIn("status=INVALID_ARGUMENT streams=80 acks=0", out)
            out = self.probe(c, "big-descriptions", count=80, bytes=4 << 20)
            self.assertIn("status=OK streams=80 acks=80", out)
            peak = peak_rss_mib(pid)
            print(f"\ncollector VmHWM {before:.0f} MiB at start, {peak:.0f} MiB after "
                  "80 x 4 MiB boot ids and host names and 80 x 4 MiB descriptions", flush=True)
            samples = c.scrape()
            refused = "stepwatch_collector_fields_refused_total"
            self.assertEqual(metric_value(samples, refused, field="boot_id", reason="too_long"), 80)
            self.assertEqual(metric_value(samples, refused, field="hostname", reason="too_long"),
                             80)
            self.assertEqual(metric_value(samples, refused, field="gpu_uuid", reason="too_long"),
                             80)
            self.assertEqual(metric_value(samples, "stepwatch_collector_malformed_batches_total",
                                          reason="bad_field"), 80)
            # What is kept is small and accounted: four probe nodes, no GPU.
            accounted = metric_value(samples, "stepwatch_collector_memory_accounted_bytes")
            self.assertLess(accounted, 64 << 10)
            assert_rss_at_most(self, peak, 160, f"peak RSS {peak:.0f} MiB")
            self.assertNotIn("b" * 1000, c.log())

    def test_one_node_cannot_take_every_job_slot(self):
        with self.mtls_collector(max_jobs=20, max_jobs_per_node=5) as c, \
                self.agent(c, "node-a") as a, self.agent(c, "node-b") as b:
            samples = self.flood_jobs(c, a, b, invented=25, refused=20)
            self.assertEqual(metric_value(samples, "stepwatch_collector_jobs"), 6)
            self.assertEqual(metric_value(samples, "stepwatch_collector_limit_hits_total",
                                          limit="jobs_per_node"), 20)
            self.assertEqual(metric_value(samples, "stepwatch_collector_limit_hits_total",
                                          limit="jobs"), 0)
            self.assertIsNone(metric_value(samples, "stepwatch_collector_node_refusals_total",
                                           node="node-a", reason="jobs_per_node"))
            self.assertIn("--max-jobs-per-node", c.log())

    def test_a_thousand_invented_job_ids_leave_room_for_others_at_default_bounds(self):
        # The attack as reported: one node invents 1,000 job ids (one step each) against a
        # collector with its default bounds. It gets its share (--max-jobs-per-node=64), the rest
        # are refused and counted against it, another node's new job is admitted, and the
        # collector's peak RSS stays far under its default memory budget.
        with self.mtls_collector() as c, \
                self.agent(c, "node-a") as a, self.agent(c, "node-b") as b:
            started = time.monotonic()
            samples = self.flood_jobs(c, a, b, invented=1000, refused=1000 - 64)
            flood_s = time.monotonic() - started
            self.assertEqual(metric_value(samples, "stepwatch_collector_jobs"), 65)
            self.assertEqual(metric_value(samples, "stepwatch_collector_node_refusals_total",
                                          node="node-b", reason="jobs_per_node"), 1000 - 64)
            peak_mib = peak_rss_mib(c.process.proc.pid)
            print(f"\n1,000 invented job ids from one node in {flood_s:.1f} s: 64 admitted, "
                  f"936 refused; another node's job admitted; collector VmHWM {peak_mib:.0f} MiB")
            assert_rss_at_most(self, peak_mib, 128, f"collector VmHWM {peak_mib:.0f} MiB")

    def test_a_malformed_protobuf_gets_an_error_status_and_is_counted(self):
        with Collector(self.tmpdir) as c:
            out = self.probe(c, "garbage", count=3)
            self.assertIn("status=INVALID_ARGUMENT streams=3", out)
            self.assertEqual(self.value(c, "stepwatch_collector_malformed_batches_total",
                                        reason="unparsable"), 3)
            self.assertEqual(self.value(c, "stepwatch_collector_ingest_errors_total"), 3)
            self.assertIn("not a stepwatch.v1.ReportBatch", c.log())


if __name__ == "__main__":
    unittest.main()
