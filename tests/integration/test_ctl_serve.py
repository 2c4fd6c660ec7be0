"""`stepwatchctl serve`, the live web view, against a real collector and agent (fake NVML GPUs): a
4-rank job whose rank 1 computes 60% longer than the others runs while the test reads the pages
over HTTP and in headless Chromium. The job list names the straggler and links it to its row on
the job's page; the pages change as the job runs; the view is read-only (405), answers unknown
paths with 404, escapes a hostile job name and still reaches its page; with a second collector
that is down, the list still shows the job and names the collector that did not answer. A
screenshot of each page is kept under <build>/test-artifacts/ctl_serve/."""

import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from harness import (BUILD_DIR, Agent, Collector, Process, build_path, ctl_json, fake_gpu,
                     fake_nvml_state, free_port, step_event, wait_until)

JOB = "serve-train/1"
WORLD = 4
SLOW_RANK = 1
# A name built to break out of HTML and of a URL path, as a hostile sender would pick it.
HOSTILE_JOB = 'evil<script>alert("x")</script>/a&b\'c'
HOSTILE_WORLD = 2
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(os.path.abspath(BUILD_DIR), "test-artifacts", "ctl_serve")


class Element:
    def __init__(self, tag, attrs, parent):
        self.tag = tag
        self.attrs = dict(attrs)
        self.parent = parent
        self.children = []
        self.text_parts = []

    def text(self):
        return "".join(self.text_parts) + "".join(c.text() for c in self.children)

    def classes(self):
        return (self.attrs.get("class") or "").split()

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def find_all(self, tag=None, cls=None, **attrs):
        return [e for e in self.walk() if (tag is None or e.tag == tag)
                and (cls is None or cls in e.classes())
                and all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())]


class DomParser(html.parser.HTMLParser):
    """The whole document as a tree of Elements (character references decoded)."""
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
            "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", [], None)
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        e = Element(tag, attrs, self.current)
        self.current.children.append(e)
        if tag not in self.VOID:
            self.current = e

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Element(tag, attrs, self.current))

    def handle_endtag(self, tag):
        e = self.current
        while e is not None and e.tag != tag:
            e = e.parent
        if e is not None and e.parent is not None:
            self.current = e.parent

    def handle_data(self, data):
        self.current.text_parts.append(data)


def parse(text):
    p = DomParser()
    p.feed(text)
    p.close()
    return p.root


def fetch(url, method="GET"):
    """(status, headers, body) of one request; error statuses are returned, not raised."""
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=20) as r:
            return r.status, r.headers, r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode("utf-8")


def job_row(doc, job):
    rows = doc.find_all("tr", cls="job", data_job=job)
    return rows[0] if len(rows) == 1 else None


def last_step(doc, job):
    row = job_row(doc, job)
    cells = row.find_all("td", cls="last-step") if row else []
    return int(cells[0].text()) if cells else None


class Ranks(threading.Thread):
    """Plays the training ranks through the agent's socket until stopped: every rank computes
    100 ms per step, the slow one 160 ms, and all share the slowest's step time."""

    def __init__(self, agent):
        super().__init__(daemon=True)
        self.agent = agent
        self.stop_event = threading.Event()

    def run(self):
        step = 0
        while not self.stop_event.is_set():
            for rank in range(WORLD):
                compute = 0.16 if rank == SLOW_RANK else 0.10
                self.agent.send(step_event(JOB, rank, WORLD, step, 0.165, data_s=0.0,
                                           compute_s=compute, comm_s=0.165 - compute, gpu=rank,
                                           local_rank=rank))
            for rank in range(HOSTILE_WORLD):
                self.agent.send(step_event(HOSTILE_JOB, rank, HOSTILE_WORLD, step, 0.1,
                                           data_s=0.0, compute_s=0.08, comm_s=0.02, gpu=rank))
            step += 1
            time.sleep(0.01)

    def stop(self):
        self.stop_event.set()
        self.join(timeout=10)


class Serve:
    """`stepwatchctl serve` on a free port (--listen=127.0.0.1:0), read from its log."""

    def __init__(self, tmp, name, collectors):
        self.process = Process(name, [build_path("stepwatchctl"), f"--collector={collectors}",
                                      "serve", "--listen=127.0.0.1:0", "--refresh=2",
                                      "--timeout=5"], os.path.join(tmp, f"{name}.log"))

    def start(self):
        self.process.start()
        match = wait_until(lambda: re.search(r"serving on (http://127\.0\.0\.1:\d+/)",
                                             self.process.log()),
                           timeout=30, message="serve to log its address")
        self.url = match.group(1)
        return self

    def stop(self):
        return self.process.stop()


def chromium(*args):
    """Runs headless Chromium with its own profile; returns the CompletedProcess."""
    profile = tempfile.mkdtemp(prefix="stepwatch-chromium-")
    try:
        return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                               f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class CtlServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-ctl-serve-")
        tmp = cls._tmp.name
        cls.started = []
        try:
            cls.collector = Collector(tmp, tick=0.2).start()
            cls.started.append(cls.collector)
            gpus = [fake_gpu(i, pids=[1000 + i]) for i in range(WORLD)]
            cls.agent = Agent(tmp, cls.collector.grpc_addr, node="node-0",
                              fake_nvml_state=fake_nvml_state(gpus)).start()
            cls.started.append(cls.agent)
            cls.ranks = Ranks(cls.agent)
            cls.ranks.start()
            cls.started.append(cls.ranks)
            cls.serve = Serve(tmp, "serve", cls.collector.grpc_addr).start()
            cls.started.append(cls.serve)
            # Nothing listens on this one.
            cls.down_addr = f"127.0.0.1:{free_port()}"
            cls.serve_with_down = Serve(tmp, "serve-down",
                                        f"{cls.collector.grpc_addr},{cls.down_addr}").start()
            cls.started.append(cls.serve_with_down)
            wait_until(cls.straggler_found, timeout=90, interval=0.5,
                       message=f"rank {SLOW_RANK} to be flagged")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for thing in reversed(cls.started):
            thing.stop()
        cls.started = []
        cls._tmp.cleanup()

    @classmethod
    def straggler_found(cls):
        findings = ctl_json(cls.collector.grpc_addr, "findings", JOB).get("findings", [])
        return any(f["kind"] == "straggler" and f["rank"] == SLOW_RANK for f in findings)

    def diagnostics(self):
        return "\n--- serve\n%s\n--- collector\n%s" % (self.serve.process.log()[-3000:],
                                                        self.collector.log()[-2000:])

    def report_index_of_straggler(self):
        report = ctl_json(self.collector.grpc_addr, "report", JOB)
        for i, f in enumerate(report["findings"]):
            if f["kind"] == "straggler" and f["rank"] == SLOW_RANK and f["until_step"] == -1:
                return i
        self.fail("no active straggler in the report: " + json.dumps(report)[:2000])

    def assert_lists_straggler(self, doc):
        row = job_row(doc, JOB)
        self.assertIsNotNone(row, "job row missing")
        links = row.find_all("a", cls="job-link")
        self.assertEqual([a.attrs["href"] for a in links],
                         ["/jobs/" + urllib.parse.quote(JOB, safe="")])
        stragglers = row.find_all("li", cls="finding", data_kind="straggler",
                                  data_rank=str(SLOW_RANK))
        self.assertEqual(len(stragglers), 1, row.text())
        self.assertIn(f"rank {SLOW_RANK}", stragglers[0].text())
        self.assertIn("node-0", stragglers[0].text())
        href = stragglers[0].find_all("a")[0].attrs["href"]
        path, _, anchor = href.partition("#")
        self.assertEqual(path, "/jobs/" + urllib.parse.quote(JOB, safe=""))
        self.assertEqual(anchor, f"finding-{self.report_index_of_straggler()}")
        # No healthy rank is flagged.
        self.assertEqual([li.attrs["data-rank"] for li in row.find_all("li", cls="finding",
                                                                       data_kind="straggler")],
                         [str(SLOW_RANK)])
        return href

    def test_job_list_over_http(self):
        status, headers, body = fetch(self.serve.url)
        self.assertEqual(status, 200, body + self.diagnostics())
        self.assertTrue(headers["Content-Type"].startswith("text/html"))
        doc = parse(body)
        href = self.assert_lists_straggler(doc)
        row = job_row(doc, JOB)
        self.assertEqual(row.find_all("td", cls="world")[0].text(), str(WORLD))
        self.assertEqual(doc.find_all("meta", http_equiv="refresh")[0].attrs["content"], "2")
        # The finding's link leads to the job's page, to the row of that finding.
        status, _, page = fetch(urllib.parse.urljoin(self.serve.url, href))
        self.assertEqual(status, 200, page)
        job_doc = parse(page)
        self.assertIn(JOB, job_doc.text())
        self.assertEqual(len(job_doc.find_all(id=href.partition("#")[2])), 1,
                         "the job page has no row " + href)
        self.assertTrue(job_doc.find_all("meta", http_equiv="refresh"), "the job page never reloads")

    def test_pages_follow_the_running_job(self):
        def step_now():
            status, _, body = fetch(self.serve.url)
            self.assertEqual(status, 200, body)
            return last_step(parse(body), JOB)

        first = wait_until(step_now, timeout=30, message="a step on the list page")
        later = wait_until(lambda: (lambda s: s if s > first else None)(step_now() or 0),
                           timeout=30, message=f"the step on the list page to pass {first}")
        self.assertGreater(later, first)

    def test_read_only_and_unknown_paths(self):
        for path in ("", "jobs/" + urllib.parse.quote(JOB, safe="")):
            for method in ("POST", "PUT", "DELETE"):
                status, headers, _ = fetch(self.serve.url + path, method=method)
                self.assertEqual(status, 405, f"{method} /{path}")
                self.assertEqual(headers["Allow"], "GET, HEAD")
        status, _, body = fetch(self.serve.url + "metrics")
        self.assertEqual(status, 404, body)
        self.assertEqual(fetch(self.serve.url + "jobs/%zz")[0], 404)
        status, _, body = fetch(self.serve.url + "jobs/no-such-job")
        self.assertEqual(status, 404, body)
        self.assertIn("no-such-job", parse(body).text())
        status, _, body = fetch(self.serve.url, method="HEAD")
        self.assertEqual((status, body), (200, ""))

    def test_hostile_job_name_is_escaped_and_reachable(self):
        status, _, body = fetch(self.serve.url)
        self.assertEqual(status, 200, body)
        self.assertNotIn("<script>", body)
        doc = parse(body)
        self.assertEqual(doc.find_all("script"), [])
        row = job_row(doc, HOSTILE_JOB)
        self.assertIsNotNone(row, "hostile job missing from the list")
        link = row.find_all("a", cls="job-link")[0]
        self.assertEqual(link.text(), HOSTILE_JOB)
        self.assertEqual(link.attrs["href"], "/jobs/" + urllib.parse.quote(HOSTILE_JOB, safe=""))
        status, _, page = fetch(urllib.parse.urljoin(self.serve.url, link.attrs["href"]))
        self.assertEqual(status, 200, page)
        self.assertNotIn("<script>", page)
        job_doc = parse(page)
        self.assertEqual(job_doc.find_all("script"), [])
        self.assertIn(HOSTILE_JOB, job_doc.text())

    def test_a_collector_that_is_down_is_named(self):
        status, _, body = fetch(self.serve_with_down.url)
        self.assertEqual(status, 200, body + self.serve_with_down.process.log()[-2000:])
        doc = parse(body)
        self.assert_lists_straggler(doc)
        problems = doc.find_all("li", cls="collector-problem", data_collector=self.down_addr)
        self.assertEqual(len(problems), 1, body)
        self.assertIn(f"cannot reach collector at {self.down_addr}", problems[0].text())
        # The job's page too says which collector did not answer.
        status, _, page = fetch(self.serve_with_down.url + "jobs/" +
                                urllib.parse.quote(JOB, safe=""))
        self.assertEqual(status, 200, page)
        self.assertEqual(len(parse(page).find_all("li", cls="collector-problem",
                                                  data_collector=self.down_addr)), 1)
        # With no collector answering, the pages are 502 and still say which and why.
        serve = Serve(self._tmp.name, "serve-none", self.down_addr).start()
        try:
            for path in ("", "jobs/" + urllib.parse.quote(JOB, safe="")):
                status, _, body = fetch(serve.url + path)
                self.assertEqual(status, 502, body)
                problems = parse(body).find_all("li", cls="collector-problem",
                                                data_collector=self.down_addr)
                self.assertEqual(len(problems), 1, body)
                self.assertIn(f"cannot reach collector at {self.down_addr}", problems[0].text())
        finally:
            serve.stop()

    def test_stops_cleanly_on_signals(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            serve = Serve(self._tmp.name, f"serve-{sig.name}", self.collector.grpc_addr).start()
            try:
                self.assertEqual(fetch(serve.url)[0], 200)
            finally:
                rc = serve.process.stop(sig=sig)
            self.assertEqual(rc, 0, serve.process.log())
            self.assertIn("stopped", serve.process.log())

    def require_chromium(self):
        # scripts/install-deps.sh installs it: a missing browser is a broken set-up, not a pass.
        self.assertTrue(os.access(CHROMIUM, os.X_OK),
                        f"{CHROMIUM} is not installed (scripts/install-deps.sh test)")

    def test_in_headless_chromium(self):
        self.require_chromium()
        result = chromium("--dump-dom", self.serve.url)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        doc = parse(result.stdout)
        href = self.assert_lists_straggler(doc)
        self.assertIsNotNone(job_row(doc, HOSTILE_JOB), result.stdout[-3000:])
        self.assertEqual(doc.find_all("script"), [])

        result = chromium("--dump-dom", urllib.parse.urljoin(self.serve.url, href))
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        job_doc = parse(result.stdout)
        self.assertIn(JOB, job_doc.text())
        self.assertEqual(len(job_doc.find_all(id=href.partition("#")[2])), 1)

        os.makedirs(ARTIFACTS, exist_ok=True)
        print(f"screenshots in {ARTIFACTS}")
        for name, url in (("jobs.png", self.serve.url),
                          ("job.png", urllib.parse.urljoin(self.serve.url, href.partition("#")[0])),
                          ("jobs-collector-down.png", self.serve_with_down.url)):
            path = os.path.join(ARTIFACTS, name)
            if os.path.exists(path):
                os.remove(path)
            result = chromium(f"--screenshot={path}", "--window-size=1400,1600", url)
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            with open(path, "rb") as f:
                png = f.read()
            self.assertTrue(png.startswith(b"\x89PNG\r\n\x1a\n"), path)
            self.assertGreater(len(png), 1000, path)


if __name__ == "__main__":
    unittest.main()
