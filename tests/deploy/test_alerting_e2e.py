"""End to end through the real servers: a simulated job sends step events through two real agents
to a real collector; a real Prometheus (the shipped scrape config and rules, with `for:` and rule
intervals shortened) scrapes it; a real Alertmanager (the shipped routing) delivers to a webhook
receiver inside this test. Rank 2 of the job develops a straggler (busy time 30% over its peers):
the alert fires, is delivered, then the rank recovers and the resolved notification arrives. The
Grafana dashboards' queries are run against the same Prometheus: each must return data. Garbage
sent to one agent's socket raises the agent's rejection alert for that node.

Loopback only; every wait is bounded. Needs /usr/bin/prometheus, /usr/bin/prometheus-alertmanager
and python3-yaml (scripts/install-deps.sh)."""

import contextlib
import http.server
import json
import os
import random
import tempfile
import threading
import time
import unittest
import urllib.parse

import yaml

import harness
import test_deploy_static as static
from nic_sysfs import FakeNicSysfs

PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
DEPLOY = static.DEPLOY

JOB = "e2e-train"
STRAGGLER_RANK = 2
NODES = ("e2e-node-a", "e2e-node-b")  # ranks 0,1 on node a; ranks 2,3 on node b
SHORT_FOR = "3s"


class WebhookReceiver:
    """An Alertmanager webhook endpoint: records every notification it is sent."""

    def __init__(self):
        self.notifications = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = {"unparsable": body.decode("utf-8", "replace")}
                payload["_path"] = self.path
                with receiver.lock:
                    receiver.notifications.append(payload)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        # Port 0: the kernel picks a free loopback port, no race with other tests.
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.1}, name="webhook")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
        return False

    def alerts(self, status, alertname, **labels):
        """Delivered alerts with this status ("firing" / "resolved"), name and labels."""
        with self.lock:
            notifications = list(self.notifications)
        found = []
        for n in notifications:
            for alert in n.get("alerts", []):
                lab = alert.get("labels", {})
                if (alert.get("status") == status and lab.get("alertname") == alertname
                        and all(lab.get(k) == str(v) for k, v in labels.items())):
                    found.append(alert)
        return found


class FakeHostRoot:
    """A --host-root for an agent: the real /proc, and a resctrl memory-traffic counter that this
    test advances (the container has no resctrl), so memory bandwidth flows end to end."""

    def __init__(self, path):
        self.path = path
        os.makedirs(os.path.join(path, "sys", "fs", "resctrl", "mon_data", "mon_L3_00"))
        os.symlink("/proc", os.path.join(path, "proc"))
        self.counter = os.path.join(path, "sys", "fs", "resctrl", "mon_data", "mon_L3_00",
                                    "mbm_total_bytes")
        self.bytes = 10**12
        self.advance(0)

    def advance(self, nbytes):
        self.bytes += nbytes
        tmp = self.counter + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{self.bytes}\n")
        os.replace(tmp, self.counter)


class SimulatedJob:
    """A synchronous data-parallel job: every step each rank is busy (data + compute), then waits
    in the all-reduce for the slowest rank, so all ranks report the same step time. It starts at
    world size 2 (a baseline for scaling efficiency), then runs at world size 4."""

    STEPS_AT_2 = 64
    STEPS_PER_SECOND = 40

    def __init__(self, agents, host_roots):
        self.agents = agents  # one per node
        self.host_roots = host_roots
        self.straggler = threading.Event()
        self.straggler.set()
        self.stop = threading.Event()
        self.step = 0
        self.errors = []
        self.rng = random.Random(7)
        self.thread = threading.Thread(target=self.run, name="simulated-job")

    def placement(self, world_size, rank):
        """(agent, local GPU) of a rank: half the ranks on each node."""
        per_node = world_size // len(self.agents)
        return self.agents[rank // per_node], rank % per_node

    def events(self, step):
        world = 2 if step < self.STEPS_AT_2 else 4
        busy = []
        for rank in range(world):
            b = 0.060 + self.rng.uniform(-0.0005, 0.0005)
            if world == 4 and rank == STRAGGLER_RANK and self.straggler.is_set():
                b *= 1.3
            busy.append(b)
        # More ranks, more communication: per-GPU throughput drops at world size 4.
        step_s = max(busy) + (0.030 if world == 4 else 0.010)
        for rank in range(world):
            agent, gpu = self.placement(world, rank)
            yield agent, harness.step_event(
                JOB, rank, world, step, step_s, data_s=0.008, compute_s=busy[rank] - 0.008,
                comm_s=step_s - busy[rank], samples=32, local_rank=gpu, gpu=gpu)

    def run(self):
        next_mbm = time.monotonic()
        while not self.stop.wait(1.0 / self.STEPS_PER_SECOND):
            for agent, event in self.events(self.step):
                if not agent.send(event):
                    self.errors.append(f"step {self.step} rank {event['rank']} not sent")
            self.step += 1
            if time.monotonic() >= next_mbm:
                for root in self.host_roots:
                    root.advance(4 * 2**30)  # ~20 GiB/s at 5 updates per second
                next_mbm = time.monotonic() + 0.2

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)
        return False


class Server(harness._Service):
    """Prometheus or Alertmanager on a free loopback port, ready when /-/ready answers."""

    ready_timeout = 60.0

    def __init__(self, name, args, tmpdir, port):
        self.name = name
        self.args = args
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(tmpdir, f"{name}.log")
        self.env = None
        self.process = None

    def command(self):
        return self.args

    def _ready(self):
        harness.http_get(self.url + "/-/ready", timeout=1)
        return True


def shortened_rules(tmpdir):
    """The shipped rule files with every `for:` and group interval shortened."""
    paths = []
    for name in ("stepwatch-recording.yml", "stepwatch-alerts.yml"):
        doc = static.load_yaml(os.path.join(static.RULES_DIR, name))
        for group in doc["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = SHORT_FOR
        path = os.path.join(tmpdir, name)
        with open(path, "w") as f:
            yaml.safe_dump(doc, f)
        paths.append(path)
    return paths


def prometheus_config(tmpdir, collector, agents, alertmanager_port):
    """The shipped prometheus.yml pointed at the test's servers, with 1 s intervals."""
    cfg = static.load_yaml(os.path.join(DEPLOY, "prometheus", "prometheus.yml"))
    cfg["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s",
                     "evaluation_interval": "1s"}
    cfg["rule_files"] = shortened_rules(tmpdir)
    cfg["alerting"]["alertmanagers"][0]["static_configs"] = [
        {"targets": [f"127.0.0.1:{alertmanager_port}"]}]
    targets = {"stepwatch-collector": [collector.metrics_addr],
               "stepwatch-agent": [a.metrics_addr for a in agents]}
    for scrape in cfg["scrape_configs"]:
        scrape["static_configs"] = [{"targets": targets[scrape["job_name"]]}]
        # The test's servers ask for no /metrics password.
        scrape.pop("basic_auth", None)
    path = os.path.join(tmpdir, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def alertmanager_config(tmpdir, receiver):
    """The shipped alertmanager.yml delivering to the test's receiver, with 1 s grouping."""
    cfg = static.load_yaml(os.path.join(DEPLOY, "alertmanager", "alertmanager.yml"))
    cfg["route"].update({"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"})
    for r in cfg["receivers"]:
        for hook in r["webhook_configs"]:
            hook["url"] = f"{receiver.base_url}/{r['name']}"
    path = os.path.join(tmpdir, "alertmanager.yml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


@unittest.skipUnless(os.path.exists(PROMETHEUS) and os.path.exists(ALERTMANAGER),
                     "prometheus and prometheus-alertmanager are not installed")
class AlertingEndToEndTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.stack = contextlib.ExitStack()
        try:
            cls._start()
        except BaseException:
            cls.stack.close()
            raise

    @classmethod
    def _start(cls):
        tmp = cls.stack.enter_context(tempfile.TemporaryDirectory(prefix="stepwatch-e2e-"))
        cls.tmp = tmp
        cls.receiver = cls.stack.enter_context(WebhookReceiver())
        am_port = harness.free_port()
        cls.alertmanager = cls.stack.enter_context(Server("alertmanager", [
            ALERTMANAGER, f"--config.file={alertmanager_config(tmp, cls.receiver)}",
            f"--storage.path={os.path.join(tmp, 'alertmanager-data')}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            tmp, am_port))
        cls.collector = cls.stack.enter_context(harness.Collector(tmp, tick=0.2, step_grace=1))
        cls.host_roots = [FakeHostRoot(os.path.join(tmp, f"{n}-root")) for n in NODES]
        cls.agents = []
        cls.gpus = []
        for node, root in zip(NODES, cls.host_roots):
            # Healthy hardware with every health reading (PCIe, ECC, NVLink, row remapping), an
            # application's Xid 13 on GPU 1 (no hardware fault: no alert), two network ports.
            health = dict(pcie_link_gen=5, pcie_link_gen_max=5, pcie_link_width=16,
                          pcie_link_width_max=16, pcie_replays=0, ecc_corrected_volatile=0,
                          ecc_uncorrected_volatile=0, ecc_corrected_aggregate=0,
                          ecc_uncorrected_aggregate=0, remapped_rows_corrected=0,
                          remapped_rows_uncorrected=0, remapped_rows_pending=0,
                          remapped_rows_failure=0, nvlink_up=[1] * 4,
                          nvlink_replay_errors=[0] * 4, nvlink_recovery_errors=[0] * 4,
                          nvlink_crc_flit_errors=[0] * 4, nvlink_crc_data_errors=[0] * 4)
            gpus = [harness.fake_gpu(0, utilization=92, xids=[], **health),
                    harness.fake_gpu(1, utilization=88, xids=[], **health)]
            FakeNicSysfs(root.path, devices=2)
            cls.agents.append(cls.stack.enter_context(harness.Agent(
                tmp, cls.collector.grpc_addr, node=node,
                fake_nvml_state=harness.fake_nvml_state(gpus), host_root=root.path)))
            cls.gpus.append(gpus)
        prom_port = harness.free_port()
        cls.prometheus = cls.stack.enter_context(Server("prometheus", [
            PROMETHEUS,
            f"--config.file={prometheus_config(tmp, cls.collector, cls.agents, am_port)}",
            f"--storage.tsdb.path={os.path.join(tmp, 'prometheus-data')}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--rules.alert.resend-delay=1s"],
            tmp, prom_port))
        cls.job = cls.stack.enter_context(SimulatedJob(cls.agents, cls.host_roots))

    @classmethod
    def tearDownClass(cls):
        cls.stack.close()

    def logs(self):
        parts = []
        for service in [self.collector, *self.agents, self.prometheus, self.alertmanager]:
            parts.append(f"--- {service.name} ---\n{service.log()[-3000:]}")
        return "\n".join(parts)

    def query(self, expr):
        """Instant query; returns the result vector (raises on a PromQL error)."""
        url = (self.prometheus.url + "/api/v1/query?" +
               urllib.parse.urlencode({"query": expr}))
        body = json.loads(harness.http_get(url, timeout=5))
        if body["status"] != "success":
            raise AssertionError(f"{expr}: {body}")
        return body["data"]["result"]

    def prometheus_alerts(self, alertname, state=None):
        body = json.loads(harness.http_get(self.prometheus.url + "/api/v1/alerts", timeout=5))
        return [a for a in body["data"]["alerts"] if a["labels"]["alertname"] == alertname
                and (state is None or a["state"] == state)]

    def wait(self, predicate, timeout, message):
        try:
            return harness.wait_until(predicate, timeout=timeout, interval=0.5, message=message)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None

    def wait_for_straggler_series(self):
        self.job.straggler.set()
        self.wait(lambda: self.query(f'stepwatch_straggler{{job="{JOB}"}}'), 90,
                  "the collector's straggler series in Prometheus")

    def test_grafana_panels_return_data(self):
        self.wait_for_straggler_series()
        # An application's Xid on one GPU (the driver reports events once the agent registered for
        # them, long before now): the Xid panel's series, and no hardware alert.
        gpus = [dict(g) for g in self.gpus[0]]
        gpus[1]["xids"] = [13]
        self.agents[0].set_gpus(gpus)
        queries = []
        for name, board in static.dashboards().items():
            for title, expr in static.panel_exprs(board):
                queries.append((name, title, static.substitute(
                    expr, job=JOB, node="|".join(NODES))))
        self.assertGreater(len(queries), 40)

        # Some series need a few scrapes (rates) or the world-size-4 history (scaling).
        missing = [(n, t, e) for (n, t, e) in queries if not self.query(e)]
        deadline = time.monotonic() + 90
        while missing and time.monotonic() < deadline:
            time.sleep(1)
            missing = [(n, t, e) for (n, t, e) in missing if not self.query(e)]
        for n, t, e in missing:
            with self.subTest(dashboard=n, panel=t):
                self.fail(f"no data for {e}")
        # The per-rank panels single out the slow rank.
        ratios = {r["metric"]["rank"]: float(r["value"][1]) for r in self.query(
            f'stepwatch_rank_busy_vs_median_ratio{{job="{JOB}"}}')}
        self.assertEqual(max(ratios, key=ratios.get), str(STRAGGLER_RANK), ratios)
        self.assertGreater(ratios[str(STRAGGLER_RANK)], 1.2)
        # The template variables list the job and the nodes.
        for name, board in static.dashboards().items():
            for var in board["templating"]["list"]:
                if var["type"] != "query":
                    continue
                metric, label = var["query"]["query"][len("label_values("):-1].split(", ")
                values = {s["metric"].get(label) for s in self.query(metric)}
                want = {JOB} if label == "job" else set(NODES)
                self.assertLessEqual(want, values, f"{name} variable {var['name']}")

    def test_malformed_step_events_raise_the_agent_alert(self):
        """A training process sending garbage: the agent counts it, the alert names the node."""
        agent = self.agents[0]
        for _ in range(5):
            self.assertTrue(agent.send(b"{not json"))
        alerts = self.wait(lambda: [a for a in self.prometheus_alerts(
            "StepwatchAgentRejectingEvents", "firing")
            if a["labels"].get("node") == NODES[0] and a["labels"].get("reason") == "not_json"],
            60, "StepwatchAgentRejectingEvents firing for the garbage")
        self.assertIn(f"The agent on node {NODES[0]}", alerts[0]["annotations"]["description"])
        self.assertEqual(
            [a for a in self.prometheus_alerts("StepwatchAgentRejectingEvents")
             if a["labels"].get("node") != NODES[0]], [], "only the agent that got garbage")
        self.wait(lambda: self.receiver.alerts("firing", "StepwatchAgentRejectingEvents",
                                               node=NODES[0], reason="not_json"),
                  60, "the agent alert at the webhook")

    def test_straggler_alert_fires_reaches_webhook_and_resolves(self):
        self.wait_for_straggler_series()
        where = {"job": JOB, "rank": str(STRAGGLER_RANK), "node": NODES[1]}

        firing = self.wait(lambda: [a for a in self.prometheus_alerts("StepwatchStraggler",
                                                                      "firing")
                                    if all(a["labels"].get(k) == v for k, v in where.items())],
                           120, "StepwatchStraggler firing in Prometheus")
        # Only the slow rank is flagged.
        ranks = {a["labels"]["rank"] for a in self.prometheus_alerts("StepwatchStraggler")}
        self.assertEqual(ranks, {str(STRAGGLER_RANK)})
        self.assertEqual(firing[0]["labels"]["severity"], "warning")

        delivered = self.wait(lambda: self.receiver.alerts("firing", "StepwatchStraggler",
                                                           **where),
                              60, "the firing notification at the webhook")
        annotations = delivered[0]["annotations"]
        self.assertIn(f"Rank {STRAGGLER_RANK} of training job {JOB} on node {NODES[1]}",
                      annotations["description"])
        self.assertRegex(annotations["description"], r"speed the job up about \d+\.\d\dx")
        # The size of the problem, as the collector measures it.
        self.assertRegex(annotations["description"], r"\(busy \+\d+% vs their median\)")
        self.assertIn(f"stepwatchctl explain {JOB}", annotations["action"])
        with self.receiver.lock:
            paths = {n["_path"] for n in self.receiver.notifications}
        self.assertIn("/stepwatch-webhook", paths)  # a warning: the webhook, not the pager

        # The rank recovers: the collector clears it, the alert resolves and says so.
        self.job.straggler.clear()
        self.wait(lambda: not self.prometheus_alerts("StepwatchStraggler"), 120,
                  "StepwatchStraggler to resolve in Prometheus")
        resolved = self.wait(lambda: self.receiver.alerts("resolved", "StepwatchStraggler",
                                                          **where),
                             60, "the resolved notification at the webhook")
        self.assertEqual(resolved[0]["labels"]["rank"], str(STRAGGLER_RANK))
        self.assertEqual(self.job.errors, [])


if __name__ == "__main__":
    unittest.main()
