"""`stepwatchctl report JOB --html -o FILE` rendered in headless Chromium: real agent (fake NVML
GPUs) and collector, four ranks of which rank 1 computes 60% longer. The page Chromium builds
(--dump-dom, parsed with html.parser) marks rank 1's heatmap row flagged and no other, draws the
straggler as a span from the step the report's JSON says it started at, and shows the JSON's
efficiency and step count in its header; a screenshot is kept in the test's artifact directory."""

import html.parser
import json
import os
import subprocess
import tempfile
import unittest

from harness import (Agent, BUILD_DIR, Collector, ctl, fake_gpu, fake_nvml_state, wait_until)

PYTHON = "/usr/bin/python3"
CHROMIUM = "/usr/bin/chromium"
JOB = "report-html/1"
WORLD = 4
STEPS = 150
SLOW_RANK = 1
ARTIFACTS = os.path.join(os.path.abspath(BUILD_DIR), "test-artifacts", "report_html")

# argv: socket job world steps slow_rank. Every rank computes 100 ms per step, the slow rank 160
# ms; all share the step time of the slowest, as in synchronous training. 20 ms between steps: the
# job runs a few seconds, long enough for the collector to sample it at many ticks.
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
        time.sleep(0.02)
"""


class Dom(html.parser.HTMLParser):
    """The elements of the dumped DOM that carry the page's machine-readable attributes."""

    def __init__(self):
        super().__init__()
        self.by_id = {}
        self.rank_rows = []  # attrs of heatmap rows (data-rank, not per section)
        self.spans = []  # attrs of finding spans
        self.table_rows = []
        self.text = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.by_id[a["id"]] = a
        if tag == "g" and "data-rank" in a and "data-section" not in a:
            self.rank_rows.append(a)
        if tag == "g" and "span" in a.get("class", "").split():
            self.spans.append(a)
        if tag == "tr" and a.get("id", "").startswith("finding-"):
            self.table_rows.append(a)

    def handle_data(self, data):
        self.text.append(data)


def chromium(*args, profile):
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                           f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)


class ReportHtmlTest(unittest.TestCase):
    def setUp(self):
        # scripts/install-deps.sh installs it: a missing browser is a broken set-up, not a pass.
        self.assertTrue(os.access(CHROMIUM, os.X_OK),
                        f"{CHROMIUM} is not installed (scripts/install-deps.sh test)")
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-report-html-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name
        self.collector = Collector(self.tmp, tick=0.2)
        self.collector.start()
        self.addCleanup(self.collector.stop)
        gpus = [fake_gpu(i, utilization=90 if i != SLOW_RANK else 60) for i in range(WORLD)]
        self.agent = Agent(self.tmp, self.collector.grpc_addr, node="node-0",
                           fake_nvml_state=fake_nvml_state(gpus))
        self.agent.start()
        self.addCleanup(self.agent.stop)

    def diagnostics(self):
        return "--- agent\n%s\n--- collector\n%s" % (self.agent.log()[-3000:],
                                                      self.collector.log()[-3000:])

    def test_report_page_in_chromium(self):
        p = subprocess.run([PYTHON, "-c", RANKS, self.agent.socket_path, JOB, str(WORLD),
                            str(STEPS), str(SLOW_RANK)], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        wait_until(lambda: "job %s finished: all" % JOB in self.collector.log(), timeout=30,
                   interval=0.2, message="the job to finish")
        result = ctl(self.collector.grpc_addr, "report", JOB, "--json")
        self.assertEqual(result.returncode, 0, result.stderr + self.diagnostics())
        report = json.loads(result.stdout)
        stragglers = [f for f in report["findings"] if f["kind"] == "straggler"]
        self.assertTrue(stragglers, json.dumps(report))
        self.assertEqual({f["rank"] for f in stragglers}, {SLOW_RANK}, json.dumps(report))

        os.makedirs(ARTIFACTS, exist_ok=True)
        print(f"report_html artifacts: {ARTIFACTS}")
        page = os.path.join(ARTIFACTS, "report.html")
        result = ctl(self.collector.grpc_addr, "report", JOB, "--html", "-o", page)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "")
        with open(page, encoding="utf-8") as f:
            source = f.read()
        self.assertNotIn("http://", source)
        self.assertNotIn("https://", source)
        # --html without a job, and an output path that cannot be written.
        bad = ctl(self.collector.grpc_addr, "report", "--html")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--html needs a job", bad.stderr)
        unwritable = os.path.join(self.tmp, "no-such-dir", "r.html")
        bad = ctl(self.collector.grpc_addr, "report", JOB, "--html", f"--output={unwritable}")
        self.assertEqual(bad.returncode, 1)
        self.assertIn(unwritable, bad.stderr)

        profile = os.path.join(self.tmp, "chromium-profile")
        dumped = chromium("--dump-dom", "file://" + page, profile=profile)
        self.assertEqual(dumped.returncode, 0, dumped.stderr[-2000:])
        dom = Dom()
        dom.feed(dumped.stdout)
        self.assertEqual(dom.by_id["job"]["data-value"], JOB)

        # The header's figures are the JSON's.
        steps = report["last_step"] - report["first_step"] + 1
        self.assertEqual(int(dom.by_id["steps"]["data-value"]), steps)
        self.assertEqual(dom.by_id["world-size"]["data-value"], str(WORLD))
        self.assertIsNotNone(report["efficiency_ratio"])
        self.assertAlmostEqual(float(dom.by_id["efficiency"]["data-value"]),
                               report["efficiency_ratio"], places=5)

        # Each straggler span starts and ends at its finding's steps (one span per finding, in
        # the report's order); every finding has its table row.
        spans = [s for s in dom.spans if s["data-kind"] == "straggler"]
        self.assertEqual([(int(s["data-since-step"]), int(s["data-until-step"])) for s in spans],
                         [(f["since_step"], f["until_step"]) for f in stragglers], dom.spans)
        self.assertEqual([r["id"] for r in dom.table_rows],
                         [f"finding-{i}" for i in range(len(report["findings"]))])
        self.assertEqual([r["data-kind"] for r in dom.table_rows],
                         [f["kind"] for f in report["findings"]])

        # The heatmap: rank 1's row flagged, no other (needs the collector's timeline).
        timeline = report.get("timeline") or {}
        if not timeline.get("columns"):
            self.assertIn("no-timeline", dom.by_id)
            print("NOTE: the collector sent no timeline: heatmap assertions not run")
        else:
            rows = {int(r["data-rank"]): r for r in dom.rank_rows}
            self.assertEqual(sorted(rows), list(range(WORLD)))
            self.assertEqual([k for k, r in rows.items() if r["data-flagged"] == "true"],
                             [SLOW_RANK])
            self.assertTrue(all(r["data-node"] == "node-0" for r in rows.values()))

        shot = os.path.join(ARTIFACTS, "report.png")
        if os.path.exists(shot):
            os.unlink(shot)
        taken = chromium(f"--screenshot={shot}", "--window-size=1400,2400", "file://" + page,
                         profile=profile)
        self.assertEqual(taken.returncode, 0, taken.stderr[-2000:])
        with open(shot, "rb") as f:
            png = f.read()
        self.assertTrue(png.startswith(b"\x89PNG\r\n\x1a\n"), png[:16])
        self.assertGreater(len(png), 10_000)


if __name__ == "__main__":
    unittest.main()
