"""A job's report records its life over time (JobReport.timeline): real agent (fake NVML GPUs at a
known utilization) and collector, a 4-rank job whose rank 2 computes 40% longer than the others.
`stepwatchctl report JOB --json` shows columns covering the job's steps in order, rank 2 slower
and flagged in the columns after it was found, the node's GPU utilization as NVML gave it; the
finished report keeps the timeline, and a collector restarted while the job runs continues it."""

import json
import subprocess
import tempfile
import unittest

from harness import Agent, Collector, ctl, fake_gpu, fake_nvml_state, metric_value, wait_until

PYTHON = "/usr/bin/python3"
WORLD = 4
SLOW_RANK = 2
UTILIZATION = 70  # percent, every fake GPU

# argv: socket job world steps slow_rank pause. Every rank computes 100 ms per step, the slow rank
# 140 ms; all share the step time of the slowest. Then the process exits (the job finishes).
RANKS = r"""
import json, socket, sys, time
path, job = sys.argv[1], sys.argv[2]
world, steps, slow = (int(a) for a in sys.argv[3:6])
pause = float(sys.argv[6])
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for step in range(steps):
        for rank in range(world):
            compute = 0.14 if rank == slow else 0.10
            event = {"job": job, "rank": rank, "world_size": world, "step": step, "step_s": 0.145,
                     "data_s": 0.0, "compute_s": compute, "comm_s": 0.145 - compute, "gpu": rank}
            s.sendto(json.dumps(event).encode(), path)
        time.sleep(pause)
"""


class ReportTimelineTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-timeline-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name

    def start(self, service):
        service.start()
        self.addCleanup(service.stop)
        return service

    def start_pair(self, **collector_flags):
        self.collector = self.start(Collector(self.tmp, tick=0.2, **collector_flags))
        gpus = [fake_gpu(i, utilization=UTILIZATION) for i in range(WORLD)]
        self.agent = self.start(Agent(self.tmp, self.collector.grpc_addr, node="node-0",
                                      fake_nvml_state=fake_nvml_state(gpus),
                                      reconnect_max_backoff=0.2))

    def run_ranks(self, job, steps, pause):
        ranks = subprocess.Popen([PYTHON, "-c", RANKS, self.agent.socket_path, job, str(WORLD),
                                  str(steps), str(SLOW_RANK), str(pause)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: ranks.poll() is None and ranks.kill())
        return ranks

    def diagnostics(self):
        return "--- agent\n%s\n--- collector\n%s" % (self.agent.log()[-3000:],
                                                      self.collector.log()[-3000:])

    def report(self, job):
        result = ctl(self.collector.grpc_addr, "report", job, "--json")
        self.assertEqual(result.returncode, 0, result.stderr + self.diagnostics())
        return json.loads(result.stdout)

    def columns(self, job):
        timeline = self.report(job).get("timeline")
        return timeline["columns"] if timeline else []

    def finish(self, ranks, job):
        _, err = ranks.communicate(timeout=120)
        self.assertEqual(ranks.returncode, 0, err)
        wait_until(lambda: f"job {job} finished: all" in self.collector.log(), timeout=30,
                   interval=0.2, message="the job to finish")
        report = self.report(job)
        self.assertEqual(report["state"], "finished")
        return report

    def assert_covers_the_job(self, report):
        t = report["timeline"]
        columns = t["columns"]
        self.assertGreaterEqual(len(columns), 5, json.dumps(t)[:2000])
        self.assertLessEqual(len(columns), 100)
        self.assertEqual(columns[0]["first_step"], report["first_step"])
        self.assertEqual(columns[-1]["last_step"], report["last_step"])
        for before, after in zip(columns, columns[1:]):
            self.assertEqual(after["first_step"], before["last_step"] + 1)
            self.assertLessEqual(after["first_step"], after["last_step"])
            self.assertGreaterEqual(after["start_unix_nanos"], before["start_unix_nanos"])
        self.assertEqual(sum(c["samples"] for c in columns), t["samples"])
        self.assertGreater(t["sample_interval_nanos"], 0)
        self.assertEqual([r["rank"] for r in t["ranks"]], list(range(WORLD)))
        self.assertEqual(t["ranks_omitted"], 0)
        for r in t["ranks"]:
            self.assertEqual(r["node"], "node-0")
            self.assertEqual(r["gpu"], r["rank"])
            self.assertEqual(len(r["busy_seconds"]), len(columns))
            self.assertEqual(len(r["flagged"]), len(columns))

    def assert_straggler_over_time(self, report):
        t = report["timeline"]
        found = [f for f in report["findings"]
                 if f["kind"] == "straggler" and f["rank"] == SLOW_RANK]
        self.assertTrue(found, json.dumps(report["findings"]))
        # The columns sampled while a finding lasted (a restart closes one, and the rank is found
        # again after it).
        after = [i for i, c in enumerate(t["columns"])
                 if any(f["since_step"] < c["first_step"] and c["last_step"] <= f["until_step"]
                        for f in found)]
        self.assertTrue(after, "no column after the finding: %s" % json.dumps(
            {"findings": found, "columns": t["columns"]}))
        ranks = {r["rank"]: r for r in t["ranks"]}
        # since_step is where the slowdown began, found some steps later: in each finding's
        # columns the rank is flagged from some column on, to the last.
        for f in found:
            own = [i for i in after
                   if f["since_step"] < t["columns"][i]["first_step"]
                   and t["columns"][i]["last_step"] <= f["until_step"]]
            flags = [ranks[SLOW_RANK]["flagged"][i] for i in own]
            if flags:
                self.assertTrue(flags[-1], "not flagged at the end of %s" % json.dumps(f))
                self.assertEqual(flags, sorted(flags), "flag came and went: %s" % flags)
        for i in after:
            slow = ranks[SLOW_RANK]["busy_seconds"][i]
            others = [ranks[r]["busy_seconds"][i] for r in ranks if r != SLOW_RANK]
            self.assertGreater(slow, max(others) * 1.2, "column %d" % i)
            self.assertAlmostEqual(slow, 0.14, delta=0.02)
            for r in ranks:
                if r != SLOW_RANK:
                    self.assertFalse(ranks[r]["flagged"][i], "rank %d column %d" % (r, i))

    def assert_node_readings(self, report):
        t = report["timeline"]
        self.assertEqual([n["node"] for n in t["nodes"]], ["node-0"])
        node = t["nodes"][0]
        self.assertEqual(node["ranks"], WORLD)
        known = [u for u in node["gpu_utilization_ratio"] if u is not None]
        # The first columns may come before the agent's first GPU sample.
        self.assertGreaterEqual(len(known), len(t["columns"]) - 2, json.dumps(node))
        for u in known:
            self.assertAlmostEqual(u, UTILIZATION / 100, places=3)
        for sm in (s for s in node["sm_active_ratio"] if s is not None):
            self.assertAlmostEqual(sm, UTILIZATION / 100 * 0.9, places=3)
        for i, busy in enumerate(node["busy_seconds"]):
            ranks = [r["busy_seconds"][i] for r in t["ranks"]]
            if busy is not None and None not in ranks:
                self.assertAlmostEqual(busy, sum(ranks) / len(ranks), places=4)

    def test_timeline_of_a_running_then_finished_job(self):
        self.start_pair()
        job = "timeline-job"
        steps = 420
        ranks = self.run_ranks(job, steps, 0.03)
        wait_until(lambda: metric_value(self.collector.scrape(), "stepwatch_straggler",
                                        rank=str(SLOW_RANK)) == 1,
                   timeout=60, message="the straggler flagged")
        # A few samples more while it runs: the running report has the timeline too.
        wait_until(lambda: len(self.columns(job)) >= 5, timeout=30,
                   message="five columns while running")
        running = self.report(job)
        self.assertEqual(running["state"], "running")
        self.assertEqual(running["timeline"]["columns"][0]["first_step"], 0)
        listing = json.loads(ctl(self.collector.grpc_addr, "report", "--json").stdout)
        self.assertNotIn("timeline", listing["reports"][0])

        report = self.finish(ranks, job)
        self.assertEqual(report["last_step"], steps - 1)
        self.assert_covers_the_job(report)
        self.assert_straggler_over_time(report)
        self.assert_node_readings(report)
        print("[timeline] %d steps: %d columns, %d samples, interval %.1f s" % (
            steps, len(report["timeline"]["columns"]), report["timeline"]["samples"],
            report["timeline"]["sample_interval_nanos"] / 1e9), flush=True)

    def test_restarted_collector_continues_the_timeline(self):
        self.start_pair(running_report_save_interval=0.5)
        job = "restarted-timeline-job"
        steps = 480
        ranks = self.run_ranks(job, steps, 0.03)
        wait_until(lambda: len(self.columns(job)) >= 4, timeout=60,
                   message="four columns before the restart")
        self.collector.restart()  # SIGTERM: every running report is written, then start
        before = self.report(job)
        self.assertEqual(before["state"], "running")
        old = before["timeline"]["columns"]
        self.assertGreaterEqual(len(old), 4, json.dumps(before["timeline"])[:2000])
        wait_until(lambda: len(self.columns(job)) >= len(old) + 3, timeout=60,
                   message="three columns after the restart")
        report = self.finish(ranks, job)
        self.assertTrue(report["partial"])
        t = report["timeline"]
        # The same timeline, continued: what was recorded before the restart leads it.
        self.assertEqual(t["columns"][:len(old) - 1], old[:len(old) - 1])
        self.assertEqual(t["columns"][len(old) - 1]["first_step"],
                         old[len(old) - 1]["first_step"])
        self.assertGreater(t["samples"], before["timeline"]["samples"])
        self.assert_covers_the_job(report)
        self.assert_straggler_over_time(report)
        self.assert_node_readings(report)


if __name__ == "__main__":
    unittest.main()
