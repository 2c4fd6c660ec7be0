"""Finished jobs keep their answers: real agent and collector, training ranks played by a
short-lived child process that sends through the agent's socket, one rank computing 60% longer than
the others. Its process exits, the job leaves `status`, and `stepwatchctl report` still tells the
straggler with the steps it started and cleared at, also after a collector restart; the Slurm
epilog saves the report with the agent's configuration (its environment file: collectors, TLS
directory, reader token), from a collector with mutual TLS and tokens too, and says why, in the
logs and a <job>.error file, when it cannot (exit 0: a failing epilog drains the node)."""

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import unittest

from harness import Agent, Collector, SOURCE_DIR, build_path, ctl, ctl_json, free_port, wait_until

PYTHON = "/usr/bin/python3"
JOB = "report-job/1"  # a '/' in the name: its report file must still be safe
WORLD = 4
STEPS = 80
SLOW_RANK = 2

# argv: socket job world steps slow_rank. Every rank computes 100 ms per step, the slow rank 160 ms;
# all share the step time of the slowest, as in synchronous training. Then the process exits.
RANKS = r"""
import json, socket, sys, time
path, job = sys.argv[1], sys.argv[2]
world, steps, slow = (int(a) for a in sys.argv[3:6])
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for step in range(steps):
        for rank in range(world):
            compute = 0.16 if rank == slow else 0.10
            event = {"job": job, "rank": rank, "world_size": world, "step": step, "step_s": 0.165,
                     "data_s": 0.0, "compute_s": compute, "comm_s": 0.165 - compute, "gpu": rank}
            s.sendto(json.dumps(event).encode(), path)
        time.sleep(0.005)
"""


def jobs(collector):
    return {j["job"] for j in ctl_json(collector.grpc_addr, "status").get("jobs", [])}


def run_epilog(tmp, env_file_lines, **env):
    """deploy/slurm/epilog.sh as slurmd runs it on the job's first node, with the agent's
    environment file holding `env_file_lines`. Returns (result, report dir, syslog lines)."""
    bin_dir = os.path.join(tmp, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    # Slurm is not installed here: a stand-in scontrol names this host as the first node, and a
    # stand-in logger records what would go to syslog.
    syslog = os.path.join(tmp, "syslog")
    for name, body in (("scontrol", "hostname -s\n"),
                       ("logger", f'printf "%s\\n" "$*" >>"{syslog}"\n')):
        with open(os.path.join(bin_dir, name), "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(os.path.join(bin_dir, name), stat.S_IRWXU)
    env_file = os.path.join(tmp, "default-stepwatch-agent")
    with open(env_file, "w") as f:
        f.write("# /etc/default/stepwatch-agent\n" + "".join(l + "\n" for l in env_file_lines))
    out_dir = os.path.join(tmp, "epilog-out")
    full_env = {"PATH": bin_dir + ":/usr/bin:/bin", "SLURM_JOB_ID": "1",
                "SLURM_JOB_NODELIST": socket.gethostname(), "STEPWATCH_JOB": JOB,
                "STEPWATCH_AGENT_ENV_FILE": env_file, "STEPWATCHCTL": build_path("stepwatchctl"),
                "STEPWATCH_REPORT_DIR": out_dir, "STEPWATCH_REPORT_WAIT": "5", **env}
    result = subprocess.run(["/bin/bash", os.path.join(SOURCE_DIR, "deploy", "slurm",
                                                        "epilog.sh")],
                            env=full_env, capture_output=True, text=True, timeout=90)
    lines = []
    if os.path.exists(syslog):
        with open(syslog) as f:
            lines = f.read().splitlines()
    return result, out_dir, lines


class ReportTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-report-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name
        self.collector = Collector(self.tmp, tick=0.2)
        self.collector.start()
        self.addCleanup(self.collector.stop)
        self.agent = Agent(self.tmp, self.collector.grpc_addr, node="node-0")
        self.agent.start()
        self.addCleanup(self.agent.stop)

    def diagnostics(self):
        return "--- agent\n%s\n--- collector\n%s" % (self.agent.log()[-3000:],
                                                      self.collector.log()[-3000:])

    def report(self, job):
        result = ctl(self.collector.grpc_addr, "report", job, "--json")
        self.assertEqual(result.returncode, 0, result.stderr + self.diagnostics())
        return json.loads(result.stdout)

    def run_ranks(self):
        p = subprocess.run([PYTHON, "-c", RANKS, self.agent.socket_path, JOB, str(WORLD),
                            str(STEPS), str(SLOW_RANK)], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)

    def assert_final_report(self, report):
        self.assertEqual(report["job"], JOB)
        self.assertEqual(report["state"], "finished")
        self.assertEqual(report["end_reason"], "exited")
        self.assertEqual(report["world_size"], WORLD)
        self.assertEqual(report["first_step"], 0)
        self.assertEqual(report["last_step"], STEPS - 1)
        self.assertIsNotNone(report["start_time"])
        self.assertIsNotNone(report["end_time"])
        self.assertIn("efficiency_ratio", report)
        stragglers = [f for f in report["findings"]
                      if f["kind"] == "straggler" and f["rank"] == SLOW_RANK]
        self.assertEqual(len(stragglers), 1, json.dumps(report, indent=1))
        f = stragglers[0]
        self.assertEqual(f["node"], "node-0")
        self.assertLess(f["since_step"], STEPS - 1)
        # Still flagged when the job ended: closed at its last step.
        self.assertEqual(f["until_step"], STEPS - 1)
        self.assertIn(f["severity"], ("warning", "critical"))
        self.assertIn("rank %d" % SLOW_RANK, f["summary"])
        self.assertIsInstance(f["cause"], str)
        # No healthy rank was ever flagged.
        self.assertEqual([f for f in report["findings"] if f["kind"] == "straggler"
                          and f["rank"] != SLOW_RANK], [])

    def test_finished_job_keeps_its_report_across_a_restart(self):
        self.run_ranks()
        wait_until(lambda: "job %s finished: all" % JOB in self.collector.log(), timeout=20,
                   interval=0.2, message="the job to finish")
        # `status` answers from the view published at each tick, so the job leaves it at the tick
        # after the exit that finished it, not at the log line.
        wait_until(lambda: JOB not in jobs(self.collector), timeout=5, interval=0.1,
                   message="the finished job to leave status")
        # The report is final once the job finished (written at the next tick).
        self.assert_final_report(self.report(JOB))
        # Asked about the live job that is gone, stepwatchctl points to its report.
        for command in ("explain", "status", "findings"):
            gone = ctl(self.collector.grpc_addr, command, JOB)
            self.assertEqual(gone.returncode, 1, command)
            self.assertEqual(gone.stderr, f'stepwatchctl: job "{JOB}" has ended: its report says '
                             f'what it had, run `stepwatchctl report {JOB}`\n', command)
        reports_dir = os.path.join(self.collector.state_dir, "reports")
        wait_until(lambda: "report-job%2F1.json" in os.listdir(reports_dir), timeout=10,
                   message="the report file")
        self.assertEqual([n for n in os.listdir(reports_dir) if n.endswith(".json")],
                         ["report-job%2F1.json"])

        self.collector.restart()
        self.assert_final_report(self.report(JOB))
        listing = ctl_json(self.collector.grpc_addr, "report")["reports"]
        self.assertEqual([r["job"] for r in listing], [JOB])
        self.assertEqual(listing[0]["state"], "finished")
        self.assertGreaterEqual(listing[0]["finding_count"], 1)
        text = ctl(self.collector.grpc_addr, "report")
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn(JOB, text.stdout)
        self.assertIn("finished", text.stdout)
        text = ctl(self.collector.grpc_addr, "report", JOB)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("straggler", text.stdout)

        unknown = ctl(self.collector.grpc_addr, "report", "no-such-job")
        self.assertNotEqual(unknown.returncode, 0)
        self.assertIn("no-such-job", unknown.stderr)

        self.run_epilog()

    def run_epilog(self):
        """deploy/slurm/epilog.sh on the job's first node saves the text and JSON reports, asking
        the collector the agent's environment file names (the same quoting systemd accepts)."""
        result, out_dir, syslog = run_epilog(
            self.tmp, [f'STEPWATCH_COLLECTOR="{self.collector.grpc_addr}"',
                       f"STEPWATCH_TLS_DIR={self.tmp}/no-tls"])
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out_dir, "report-job_1.json")) as f:
            self.assert_final_report(json.load(f))
        with open(os.path.join(out_dir, "report-job_1.txt")) as f:
            self.assertIn("straggler", f.read())
        # The HTML page: the job's name in its header, the straggler's row in the findings.
        with open(os.path.join(out_dir, "report-job_1.html")) as f:
            page = f.read()
        self.assertTrue(page.startswith("<!DOCTYPE html>"), page[:100])
        self.assertIn(f'id="job" data-value="{JOB}"', page)
        self.assertRegex(page, r'<tr id="finding-[0-9]+" data-kind="straggler"')
        self.assertTrue(page.rstrip().endswith("</html>"))
        self.assertFalse(os.path.exists(os.path.join(out_dir, "report-job_1.error")))
        self.assertTrue(any("saved the report of job " + JOB in l and ".json and .html" in l
                            for l in syslog), syslog)


@unittest.skipIf(shutil.which("openssl") is None, "openssl is not installed")
class EpilogTest(unittest.TestCase):
    """The epilog with the agent's configuration against a collector that wants mutual TLS and
    tokens, and against none at all."""

    def setUp(self):
        from test_security import AGENT_TOKEN, READER_TOKEN, Pki
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-epilog-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name
        # The systemd layout: ca.pem and HOST.pem/.key in the TLS directory (the unit's %H).
        self.tls_dir = os.path.join(self.tmp, "tls")
        os.makedirs(self.tls_dir)
        pki = Pki(self.tls_dir)
        host = socket.gethostname()
        server = pki.issue("server", "stepwatch-collector", "IP:127.0.0.1,DNS:localhost")
        node_cert, node_key = pki.issue("node", host, f"DNS:{host}")
        shutil.copy(node_cert, os.path.join(self.tls_dir, f"{host}.pem"))
        shutil.copy(node_key, os.path.join(self.tls_dir, f"{host}.key"))
        self.tokens = {}
        for role, token in (("agent", AGENT_TOKEN), ("reader", READER_TOKEN)):
            self.tokens[role] = os.path.join(self.tls_dir, f"{role}.token")
            with open(self.tokens[role], "w") as f:
                f.write(token + "\n")
        collector_tokens = os.path.join(self.tmp, "collector-tokens")
        with open(collector_tokens, "w") as f:
            f.write(f"agent {AGENT_TOKEN}\nreader {READER_TOKEN}\n")
        self.collector = Collector(self.tmp, tick=0.2, tls_cert=server[0], tls_key=server[1],
                                   tls_client_ca=pki.ca, auth_token_file=collector_tokens)
        self.ca = pki.ca
        self.node = (node_cert, node_key)

    def env_file(self, collector_addr, token="reader"):
        return [f"STEPWATCH_COLLECTOR={collector_addr}", f"STEPWATCH_TLS_DIR='{self.tls_dir}'",
                f"STEPWATCH_AGENT_ARGS=--auth-token-file={self.tokens['agent']}",
                f"STEPWATCH_REPORT_TOKEN_FILE={self.tokens[token]}"]

    def test_epilog_saves_the_report_over_mutual_tls_with_a_token(self):
        self.collector.start()
        self.addCleanup(self.collector.stop)
        host = socket.gethostname()
        agent = Agent(self.tmp, self.collector.grpc_addr, node=host, tls_ca=self.ca,
                      tls_cert=self.node[0], tls_key=self.node[1],
                      auth_token_file=self.tokens["agent"])
        agent.start()
        self.addCleanup(agent.stop)
        p = subprocess.run([PYTHON, "-c", RANKS, agent.socket_path, JOB, str(WORLD), str(STEPS),
                            str(SLOW_RANK)], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        # The list as the agent has it (every collector; a second, unreachable one included).
        dead = f"127.0.0.1:{free_port()}"
        result, out_dir, syslog = run_epilog(
            self.tmp, self.env_file(f"{self.collector.grpc_addr},{dead}"))
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out_dir, "report-job_1.json")) as f:
            report = json.load(f)
        self.assertEqual(report["job"], JOB)
        self.assertEqual(report["state"], "finished", result.stderr + agent.log()[-2000:])
        with open(os.path.join(out_dir, "report-job_1.txt")) as f:
            self.assertIn("straggler", f.read())
        self.assertTrue(any("saved the report" in l for l in syslog), syslog)

        # The agent's own token may only report: the epilog says why it saved nothing.
        result, out_dir, syslog = run_epilog(self.tmp, self.env_file(self.collector.grpc_addr,
                                                                     token="agent"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("no report saved for job " + JOB, result.stderr)
        self.assertFalse(os.path.exists(os.path.join(out_dir, "report-job_1.json")))
        with open(os.path.join(out_dir, "report-job_1.error")) as f:
            self.assertIn("reader", f.read().lower())
        self.assertTrue(any(l.startswith("-t stepwatch -p user.err") for l in syslog), syslog)

    def test_unreachable_collector_is_logged_and_marked(self):
        dead = f"127.0.0.1:{free_port()}"
        result, out_dir, syslog = run_epilog(self.tmp, self.env_file(dead),
                                             STEPWATCH_REPORT_WAIT="2")
        # Never fails the job (a failing epilog drains the node), but says why, everywhere.
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"no report saved for job {JOB} (collectors {dead})", result.stderr)
        errors = [l for l in syslog if "-p user.err" in l]
        self.assertEqual(len(errors), 1, syslog)
        self.assertIn(dead, errors[0])
        self.assertEqual(sorted(os.listdir(out_dir)), ["report-job_1.error"])
        with open(os.path.join(out_dir, "report-job_1.error")) as f:
            text = f.read()
        self.assertIn(dead, text)
        self.assertIn("no report saved", text)


if __name__ == "__main__":
    unittest.main()
