"""The quick-start demo: a collector, 8 agents with fake GPUs and a simulated 8x8 job in which two
nodes finish their compute late. Runs the real demo script for a bounded time. Each agent serves its
node's raw view on its own /metrics and the demo's Prometheus config scrapes them all; where
/usr/bin/prometheus is installed the demo runs it, and the test checks that Prometheus holds the
readings of all 64 GPUs (the node dashboards' data) although the collector exports only those of
GPUs in findings. Run again with 3 collectors (the job on 2 of them): stepwatchctl merges them
and the shipped rules count each finding once."""

import json
import os
import re
import shutil
import subprocess
import threading
import time
import unittest
import urllib.parse

from harness import BUILD_DIR, SOURCE_DIR, http_get, metric_samples, scrape, wait_until

PROMETHEUS = "/usr/bin/prometheus"
NODES = 8
GPUS_PER_NODE = 8


class DemoRun:
    """The demo script in the background, its stdout collected line by line."""

    def __init__(self, env):
        self.process = subprocess.Popen(
            [os.path.join(SOURCE_DIR, "scripts", "demo-cluster.sh"), BUILD_DIR],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lock = threading.Lock()
        self.out = {"stdout": [], "stderr": []}
        self.readers = [threading.Thread(target=self._read, args=(name,), name=f"demo-{name}")
                        for name in self.out]
        for r in self.readers:
            r.start()

    def _read(self, name):
        for line in getattr(self.process, name):
            with self.lock:
                self.out[name].append(line)

    def text(self, name="stdout"):
        with self.lock:
            return "".join(self.out[name])

    def search(self, pattern):
        return re.search(pattern, self.text())

    def finish(self, timeout):
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            self.process.wait(timeout=30)
        for r in self.readers:
            r.join(timeout=10)
        return self.process.returncode, self.text(), self.text("stderr")


class DemoTest(unittest.TestCase):
    def run_demo(self, collectors):
        """Runs the demo with `collectors` collectors; checks the agents and Prometheus while it
        runs and the findings at its end; returns its output and what Prometheus answered."""
        with_prometheus = os.path.exists(PROMETHEUS)
        env = dict(os.environ, STEPWATCH_DEMO_SECONDS="60", STEPWATCH_DEMO_SPEED="2",
                   STEPWATCH_DEMO_ALERT_FOR="10s",
                   STEPWATCH_DEMO_COLLECTORS=str(collectors),
                   STEPWATCH_DEMO_PROMETHEUS=PROMETHEUS if with_prometheus else "0")
        demo = DemoRun(env)
        try:
            prometheus = self.check_agents_and_prometheus(demo, with_prometheus, collectors)
        finally:
            rc, out, err = demo.finish(timeout=240)
        self.assertEqual(rc, 0, out[-3000:] + err[-3000:])
        final = out[out.index("=== final ==="):]
        self.assertIn("llm-pretrain", final)
        # The two slow nodes are named; the healthy ones are not flagged.
        findings = final[final.index("=== final ==="):]
        self.assertIn("node-2", findings)
        self.assertIn("node-5", findings)
        for healthy in ("node-0", "node-1", "node-3", "node-4", "node-6", "node-7"):
            flagged = [l for l in findings.splitlines()
                       if healthy in l and ("slow_node" in l or "straggler" in l)]
            self.assertEqual(flagged, [], healthy)
        self.assertIn("demo: stopped", out)
        return out, prometheus

    def test_demo_flags_the_two_slow_nodes(self):
        out, _ = self.run_demo(collectors=1)

        # Under the live view: the collector's addresses and the next commands to try.
        live = out[:out.index("=== final ===")]
        screens = live.split("stepwatch demo (")
        self.assertGreater(len(screens), 2, live[-3000:])
        last = screens[-1]
        grpc = re.search(r"collector: gRPC (127\.0\.0\.1:\d+), metrics (http://\S+/metrics)", last)
        self.assertIsNotNone(grpc, last)
        ctl = os.path.join(os.path.abspath(BUILD_DIR), "ctl", "stepwatchctl")
        self.assertIn(f"{ctl} --collector={grpc.group(1)} explain llm-pretrain", last)
        self.assertIn(f"{ctl} --collector={grpc.group(1)} report llm-pretrain", last)
        self.assertIn(f"curl -s {grpc.group(2)}", last)

    def test_three_collectors_one_alert_per_finding(self):
        """The job on 2 of 3 collectors: stepwatchctl merges their findings, Prometheus scrapes
        all 3, and the shipped rules count each slow node once although 2 collectors report it."""
        out, prometheus = self.run_demo(collectors=3)
        live = out[:out.index("=== final ===")]
        self.assertIn("collectors: gRPC ", live)
        self.assertIn("(each job on 2 of them)", live)
        if prometheus is None:
            self.skipTest("prometheus is not installed")
        self.assertEqual(prometheus["collectors up"], 3)
        self.assertEqual(prometheus["collectors with the job"], 2)
        self.assertEqual(prometheus["slow-node findings"], 4)  # 2 nodes, each from 2 collectors
        self.assertEqual(prometheus["slow-node alerts"], {"node-2", "node-5"})
        self.assertEqual(prometheus["recorded slow-node findings"], 2)

    def check_agents_and_prometheus(self, demo, with_prometheus, collectors):
        """While the demo runs: every agent serves its node's GPUs, the demo's Prometheus config
        scrapes the collectors and every agent, and (with Prometheus) holds every GPU's reading.
        Returns what Prometheus answered about replicas, or None without Prometheus."""
        hint = wait_until(lambda: demo.search(
            r"agents: node-0 metrics (http://127\.0\.0\.1:\d+/metrics) \(every node: (\S+)\)"),
            timeout=60, interval=0.5, message="the agents' metrics address in the live view")
        config_path = hint.group(2)
        # The live view (stepwatchctl serve) lists the demo's job and serves its page.
        view = demo.search(r"live view in a browser: (http://127\.0\.0\.1:\d+)/ \(the job: (\S+)\)")
        self.assertIsNotNone(view, "the live view's address in the hints")
        wait_until(lambda: "llm-pretrain" in http_get(view.group(1) + "/", timeout=10), timeout=60,
                   interval=0.5, message="the demo's job on the live view")
        wait_until(lambda: 'id="heatmap"' in http_get(view.group(2), timeout=10), timeout=60,
                   interval=0.5, message="the job's heatmap on its live page")
        with open(config_path) as f:
            config = f.read()
        collector_part, agent_part = config.split("job_name: stepwatch-agent")
        self.assertIn("job_name: stepwatch-collector", collector_part)
        agent_targets = re.findall(r'- "(127\.0\.0\.1:\d+)"', agent_part)
        self.assertEqual(len(agent_targets), NODES, config)
        self.assertEqual(len(re.findall(r'- "(127\.0\.0\.1:\d+)"', collector_part)), collectors)
        self.assertIn(hint.group(1), [f"http://{t}/metrics" for t in agent_targets])
        # The shipped alerts wait minutes (`for:`), longer than the demo runs: the demo loads a
        # copy whose waits are STEPWATCH_DEMO_ALERT_FOR, and says so.
        alert_rules = re.search(r'"([^"]+/rules/stepwatch-alerts\.yml)"', config).group(1)
        self.assertNotIn(os.path.join(SOURCE_DIR, "deploy"), alert_rules)
        with open(alert_rules) as f:
            waits = set(re.findall(r"(?m)^ +for: (\S+)$", f.read()))
        self.assertEqual(waits, {"0m", "10s"})
        promtool = shutil.which("promtool")
        if promtool:
            check = subprocess.run([promtool, "check", "config", config_path],
                                   capture_output=True, text=True, timeout=60)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

        def agent_gpus(target):
            samples = scrape(f"http://{target}/metrics")
            return {(l["node"], l["gpu"]) for l, _ in
                    metric_samples(samples, "stepwatch_agent_gpu_utilization_ratio")}

        for i, target in enumerate(agent_targets):
            gpus = wait_until(lambda: len(agent_gpus(target)) == GPUS_PER_NODE
                              and agent_gpus(target), timeout=60, interval=0.5,
                              message=f"the GPUs of agent {i} on its /metrics")
            self.assertEqual({node for node, _ in gpus}, {f"node-{i}"})

        if not with_prometheus:
            return None
        url = demo.search(r"demo: Prometheus (http://127\.0\.0\.1:\d+)").group(1)
        wait_until(lambda: demo.search(r"Alerts fire after 10s here: the demo's copy of the rules"),
                   timeout=30, interval=0.5, message="the note on the demo's alert rules")

        def query(expr):
            body = json.loads(http_get(f"{url}/api/v1/query?" +
                                       urllib.parse.urlencode({"query": expr}), timeout=5))
            self.assertEqual(body["status"], "success", expr)
            return body["data"]["result"]

        def value(expr):
            result = query(expr)
            return float(result[0]["value"][1]) if result else None

        wait_until(lambda: value('count(up{job="stepwatch-agent"} == 1)') == NODES
                   and value('count(up{job="stepwatch-collector"} == 1)') == collectors,
                   timeout=60, interval=1, message="Prometheus scraping the collector and agents")
        # Every GPU of every node from the agents (whatever the collector exports), and the node
        # dashboards' GPU utilization query over them.
        agent_gpus = "count(max by (node, gpu) (stepwatch_agent_gpu_utilization_ratio))"
        wait_until(lambda: value(agent_gpus) == NODES * GPUS_PER_NODE, timeout=60, interval=1,
                   message="every GPU's utilization from the agents in Prometheus")
        self.assertEqual(value("count(max by (node, gpu) (stepwatch_agent_gpu_utilization_ratio)"
                               " or max by (node, gpu) (stepwatch_gpu_utilization_ratio))"),
                         NODES * GPUS_PER_NODE)
        # The shipped rules load and evaluate over the demo's series.
        wait_until(lambda: value("count(node:stepwatch_gpu_utilization_ratio:avg)") == NODES,
                   timeout=60, interval=1, message="the recording rules over every node")
        # Both slow nodes flagged (by every collector holding the job), then what the rules make
        # of it: one pending or firing alert per node, findings counted once.
        slow = 'stepwatch_finding{job="llm-pretrain",kind="slow_node"}'
        wait_until(lambda: value(f"count(max by (node) ({slow}))") == 2, timeout=90, interval=1,
                   message="both slow nodes flagged in Prometheus")
        # Firing, not only pending, within the demo (its copy of the rules waits 10 s).
        def firing():
            nodes = {a["metric"]["node"] for a in query(
                'ALERTS{alertname="StepwatchSlowNode",alertstate="firing"}')}
            return nodes if len(nodes) >= 2 else None

        alerts = wait_until(firing, timeout=40, interval=1,
                            message="StepwatchSlowNode firing for both slow nodes")
        recorded = wait_until(lambda: value(
            'job_kind:stepwatch_findings:sum{job="llm-pretrain",kind="slow_node"}'),
            timeout=60, interval=1, message="the recorded findings of the job")
        return {"collectors up": value('count(up{job="stepwatch-collector"} == 1)'),
                "collectors with the job":
                    value('count(stepwatch_job_step_seconds{job="llm-pretrain"})'),
                "slow-node findings": value(f"count({slow})"),
                "slow-node alerts": alerts,
                "recorded slow-node findings": recorded}


if __name__ == "__main__":
    unittest.main()
