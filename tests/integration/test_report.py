"""Finished jobs keep their answers: real agent and collector, training ranks played by a
short-lived child process that sends through the agent's socket, one rank computing 60% longer than
the others. Its process exits, the job leaves `status`, and `stepwatchctl report` still tells the
straggler with the steps it started and cleared at, also after a collector restart; the Slurm
epilog saves the report."""

import json
import os
import socket
import stat
import subprocess
import tempfile
import unittest

from harness import Agent, Collector, SOURCE_DIR, build_path, ctl, ctl_json, wait_until

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
        self.assertNotIn(JOB, jobs(self.collector))
        # The report is final once the job finished (written at the next tick).
        self.assert_final_report(self.report(JOB))
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
        """deploy/slurm/epilog.sh on the job's first node saves the text and JSON reports."""
        bin_dir = os.path.join(self.tmp, "bin")
        os.makedirs(bin_dir)
        # Slurm is not installed here: a stand-in scontrol names this host as the first node.
        scontrol = os.path.join(bin_dir, "scontrol")
        with open(scontrol, "w") as f:
            f.write("#!/bin/sh\nhostname -s\n")
        os.chmod(scontrol, stat.S_IRWXU)
        out_dir = os.path.join(self.tmp, "epilog-out")
        env = {"PATH": bin_dir + ":/usr/bin:/bin", "SLURM_JOB_ID": "1",
               "SLURM_JOB_NODELIST": socket.gethostname(), "STEPWATCH_JOB": JOB,
               "STEPWATCH_COLLECTOR": self.collector.grpc_addr,
               "STEPWATCHCTL": build_path("stepwatchctl"), "STEPWATCH_REPORT_DIR": out_dir,
               "STEPWATCH_REPORT_WAIT": "5"}
        result = subprocess.run(["/bin/bash", os.path.join(SOURCE_DIR, "deploy", "slurm",
                                                            "epilog.sh")],
                                env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out_dir, "report-job_1.json")) as f:
            self.assert_final_report(json.load(f))
        with open(os.path.join(out_dir, "report-job_1.txt")) as f:
            self.assertIn("straggler", f.read())


if __name__ == "__main__":
    unittest.main()
