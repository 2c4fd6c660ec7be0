"""Offline checks of deploy/ and docker/: rules coverage, dashboards, Kubernetes manifests, systemd
units, Slurm scripts and Dockerfiles. Needs python3-yaml, promtool and kubectl (no cluster)."""

import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

SOURCE_DIR = os.path.abspath(os.environ.get(
    "STEPWATCH_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")))
DEPLOY = os.path.join(SOURCE_DIR, "deploy")
RULES_DIR = os.path.join(DEPLOY, "prometheus", "rules")
ALERTS_FILE = os.path.join(RULES_DIR, "stepwatch-alerts.yml")
RULE_TESTS = sorted(glob.glob(os.path.join(DEPLOY, "prometheus", "tests", "*.yml")))
DASHBOARD_DIR = os.path.join(DEPLOY, "grafana", "dashboards")
K8S = os.path.join(DEPLOY, "kubernetes")

def load_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


def load_yaml_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def alert_rules():
    rules = []
    for group in load_yaml(ALERTS_FILE)["groups"]:
        rules.extend(r for r in group["rules"] if "alert" in r)
    return rules


def dashboards():
    out = {}
    for path in sorted(glob.glob(os.path.join(DASHBOARD_DIR, "*.json"))):
        with open(path) as f:
            out[os.path.basename(path)] = json.load(f)
    return out


def panel_exprs(dashboard):
    """(panel title, expr) for every query of every panel."""
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            yield panel["title"], t["expr"]


def substitute(expr, job=".*", node=".*"):
    """Grafana variables -> values Prometheus understands."""
    return (expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
            .replace("$job", job).replace("$node", node))


def metric_names(expr):
    """stepwatch_* series names used in a PromQL expression (recording rules excluded)."""
    return set(re.findall(r"(?<![:\w])(stepwatch_[a-z0-9_]+)", expr))


def exported_metric_sources():
    text = []
    for pattern in ("collector/*.cc", "agent/*.cc", "security/*.cc", "http/*.cc", "metrics/*.cc",
                    "common/*.cc"):
        for path in glob.glob(os.path.join(SOURCE_DIR, pattern)):
            with open(path) as f:
                text.append(f.read())
    return "\n".join(text)


def engine_vocabulary():
    """(finding kind names, cause names) as analysis/engine.h documents them; empty when absent."""
    path = os.path.join(SOURCE_DIR, "analysis", "engine.h")
    if not os.path.exists(path):
        return [], []
    with open(path) as f:
        text = f.read()
    m = re.search(r"((?://.*\n)+)const char\* FindingKindName", text)
    kinds = re.findall(r'"(\w+)"', m.group(1)) if m else []
    m = re.search(r"enum class Cause \{(.*?)\};", text, re.S)
    causes = re.findall(r'k\w+,\s*// "(\w+)"', m.group(1)) if m else []
    return kinds, causes


def is_exported(name, sources):
    if f'"{name}"' in sources:
        return True
    # The agent builds some names as "stepwatch_agent_" + suffix.
    for prefix in ("stepwatch_agent_gpu_", "stepwatch_agent_host_", "stepwatch_agent_"):
        if name.startswith(prefix) and f'"{name[len(prefix):]}"' in sources:
            return True
    # GPU and host metrics: metrics/node_metric_table.cc names them without the exporter's prefix.
    for prefix in ("stepwatch_gpu_", "stepwatch_host_", "stepwatch_nic_"):
        if name.startswith(prefix) and f'"{name[len("stepwatch_"):]}"' in sources:
            return True
    return False


# Series of one collector about itself (or of one agent): per instance, summed over instances.
PER_INSTANCE_PREFIXES = ("stepwatch_collector_", "stepwatch_metrics_", "stepwatch_engine_",
                         "stepwatch_agent_")
# Readings of GPUs and hosts: every GPU on the agents, only GPUs in findings on the collectors.
NODE_READING = re.compile(r"(?<![:\w])stepwatch_((?:gpu|host)_[a-z0-9_]+)")


def replica_problems(expr):
    """Ways `expr` depends on how many collector replicas export a series: a sum, count or average
    straight over a series that every replica of a job exports alike (reduce it with `max by`
    first), or a GPU/host reading taken from the collectors alone (they export only the GPUs in
    findings; read stepwatch_agent_* too)."""
    problems = []
    for m in re.finditer(r"\b(sum|count|avg|min|stddev|quantile|topk|bottomk)\s*"
                         r"(?:by\s*\([^)]*\)\s*)?\((?:\s*[\d.]+\s*,)?\s*(stepwatch_[a-z0-9_]+)",
                         expr):
        if not m.group(2).startswith(PER_INSTANCE_PREFIXES):
            problems.append(f"{m.group(1)} over {m.group(2)} counts every replica")
    for m in re.finditer(r"_over_time\((?:\s*[\d.]+\s*,)?\s*(stepwatch_[a-z0-9_]+)\[", expr):
        if not m.group(1).startswith(PER_INSTANCE_PREFIXES):
            problems.append(f"{m.group(0)}: one result per replica (reduce before over_time)")
    for m in NODE_READING.finditer(expr):
        if m.group(1) != "gpu_underutilized" and f"stepwatch_agent_{m.group(1)}" not in expr:
            problems.append(f"{m.group(0)} without stepwatch_agent_{m.group(1)}")
    return problems


def recording_rules():
    doc = load_yaml(os.path.join(RULES_DIR, "stepwatch-recording.yml"))
    return [r for g in doc["groups"] for r in g["rules"]]


REPLICA_A, REPLICA_B = "collector-a:9464", "collector-b:9464"


def single_replica(expr):
    """`expr` with every stepwatch selector restricted to what one collector replica exports."""
    def restrict(m):
        inner = m.group(2) or ""
        sep = "," if inner.strip() else ""
        return f'{m.group(1)}{{{inner}{sep}instance!="{REPLICA_B}"}}'
    return re.sub(r"(?<![:\w])(stepwatch_[a-z0-9_]+)(?:\{([^}]*)\})?", restrict, expr)


def replica_input_series(names):
    """promtool input series for `names`: each series a collector exports for a job, from two
    replicas (identical but for instance); per-collector health from one collector; the agents'
    series from one agent. Values make most conditions hold (findings 1, a node down, counters
    rising, a job's last step unchanged while its GPU has a process)."""
    series = []
    for name in sorted(names):
        if name.startswith("stepwatch_agent_"):
            labels, instances = {"node": "n1", "gpu": "0", "job": "llm", "reason": "not_json"}, [
                "n1:9465"]
        elif name.startswith(PER_INSTANCE_PREFIXES):
            labels = {"reason": "evicted", "limit": "jobs", "family": "finding"}
            instances = [REPLICA_A]
        else:
            labels = {"job": "llm", "node": "n1", "gpu": "0", "rank": "3", "kind": "straggler",
                      "severity": "warning", "cause": "unknown", "component": "compute",
                      "fix": "stragglers"}
            instances = [REPLICA_A, REPLICA_B]
        if name.endswith("_total"):
            values = "0+10x30"
        elif name == "stepwatch_job_last_seen_timestamp_seconds":
            values = "0+60x30"
        elif name in ("stepwatch_node_up", "stepwatch_job_last_step"):
            values = "0x30"
        elif name == "stepwatch_agent_connected":
            values = "1x30"
        else:
            values = "1+0.01x30"
        for instance in instances:
            lab = ",".join(f'{k}="{v}"' for k, v in {**labels, "instance": instance}.items())
            series.append({"series": f"{name}{{{lab}}}", "values": values})
    return series


def replica_equivalence_tests(exprs, require_data):
    """promtool promql_expr_tests asserting that each expression gives the same samples from two
    replicas as from one (and, where `require_data`, some samples)."""
    tests = []
    for expr, needs_data in zip(exprs, require_data):
        one, two = single_replica(expr), expr
        for a, b in ((one, two), (two, one)):
            tests.append({"expr": f"(count(({a}) == ({b})) or vector(0)) - "
                                  f"(count({a}) or vector(0))",
                          "eval_time": "20m", "exp_samples": [{"labels": "{}", "value": 0}]})
        if needs_data:
            tests.append({"expr": f"count({one}) > bool 0", "eval_time": "20m",
                          "exp_samples": [{"labels": "{}", "value": 1}]})
    return tests


def run_replica_equivalence(testcase, exprs, require_data):
    promtool = shutil.which("promtool")
    if not promtool:
        testcase.skipTest("promtool not installed")
    names = set()
    for expr in exprs:
        names |= metric_names(expr)
    doc = {"rule_files": [os.path.join(RULES_DIR, "stepwatch-recording.yml")],
           "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": replica_input_series(names),
                      "promql_expr_test": replica_equivalence_tests(exprs, require_data)}]}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "replicas.yml")
        with open(path, "w") as f:
            yaml.safe_dump(doc, f)
        result = subprocess.run([promtool, "test", "rules", path], capture_output=True,
                                text=True, timeout=120)
    return result


class PrometheusRulesTest(unittest.TestCase):

    def test_rules_give_single_replica_results(self):
        """Every alert and recording expression, evaluated by promtool over two identical replicas,
        gives exactly the samples it gives over one."""
        exprs = [r["expr"] for r in alert_rules()] + [r["expr"] for r in recording_rules()]
        needs = [False] * len(alert_rules()) + [True] * len(recording_rules())
        result = run_replica_equivalence(self, exprs, needs)
        self.assertEqual(result.returncode, 0, result.stdout[-6000:] + result.stderr[-2000:])

    def test_replica_equivalence_catches_double_counting(self):
        result = run_replica_equivalence(
            self, ["sum by (job, kind) (stepwatch_findings)"], [True])
        self.assertNotEqual(result.returncode, 0, result.stdout)

    def test_replica_checks_catch_double_counting(self):
        """The static replica check flags what the rules used to do before replicas."""
        self.assertTrue(replica_problems("sum by (job, kind) (stepwatch_findings)"))
        self.assertTrue(replica_problems("sum(stepwatch_findings) or vector(0)"))
        self.assertTrue(replica_problems(
            "quantile_over_time(0.5, stepwatch_job_step_seconds[1h] offset 10m)"))
        self.assertTrue(replica_problems("avg by (node) (stepwatch_gpu_utilization_ratio)"))
        self.assertTrue(replica_problems("sum by (node) (stepwatch_gpu_processes) > 0"))
        self.assertTrue(replica_problems("sum by (job) (stepwatch_gpu_underutilized)"))
        self.assertEqual(replica_problems(
            "sum by (job, kind) (max by (job, kind, severity) (stepwatch_findings))"), [])
        self.assertEqual(replica_problems(
            "sum by (instance, reason) (increase(stepwatch_collector_steps_rejected_total[10m]))"),
            [])

    def test_rules_do_not_depend_on_the_number_of_replicas(self):
        rules = [(r.get("alert") or r["record"], r["expr"]) for r in alert_rules()]
        rules += [(r["record"], r["expr"]) for r in recording_rules()]
        for name, expr in rules:
            with self.subTest(rule=name):
                self.assertEqual(replica_problems(expr), [], expr)
                # A bare comparison of a replicated series alerts once per replica.
                replicated = [m for m in metric_names(expr)
                              if not m.startswith(PER_INSTANCE_PREFIXES)]
                if replicated and not name.startswith(("job", "node", "cluster")):
                    self.assertRegex(expr, r"\b(max|group|count|sum) by \(", expr)
                    self.assertNotRegex(expr, r"\bby \([^)]*\binstance\b", expr)

    def test_job_findings_count_only_from_replicas_that_receive_the_job(self):
        """A collector a job moved away from keeps its last verdicts until --expire: each alert on
        a job's findings keeps only replicas whose last step of the job is recent."""
        for rule in alert_rules():
            m = re.search(r'stepwatch_finding\{kind="(\w+)"\}', rule["expr"])
            # Findings about a GPU or a node, not a job's.
            if not m or m.group(1) in ("idle_gpu", "gpu_health", "nic_health"):
                continue
            with self.subTest(alert=rule["alert"]):
                self.assertRegex(
                    rule["expr"],
                    r'stepwatch_finding\{kind="\w+"\}\s*and on \(instance, job\) \(\s*'
                    r"stepwatch_job_last_seen_timestamp_seconds\s*>= on \(job\) group_left \(\)\s*"
                    r"\(max by \(job\) \(stepwatch_job_last_seen_timestamp_seconds\) - \d+\)\)")

    def test_rule_tests_cover_replicas(self):
        """Some rule test feeds two or more replicas of one finding, a restart and a move."""
        path = os.path.join(DEPLOY, "prometheus", "tests", "replicas.yml")
        doc = load_yaml(path)
        instances = set()
        for case in doc["tests"]:
            for s in case["input_series"]:
                if s["series"].startswith("stepwatch_finding{"):
                    instances.add(re.search(r'instance="([^"]+)"', s["series"]).group(1))
        self.assertGreaterEqual(len(instances), 3)
        self.assertIn("ALERTS_FOR_STATE", json.dumps(doc))

    def test_every_alert_has_firing_and_quiet_unit_tests(self):
        firing, quiet = set(), set()
        for path in RULE_TESTS:
            doc = load_yaml(path)
            self.assertIn("../rules/stepwatch-alerts.yml", doc["rule_files"], path)
            for case in doc["tests"]:
                for t in case.get("alert_rule_test", []):
                    (firing if t.get("exp_alerts") else quiet).add(t["alertname"])
        names = {r["alert"] for r in alert_rules()}
        self.assertGreaterEqual(len(names), 8)
        self.assertEqual(names - firing, set(), "alerts without a test where they fire")
        self.assertEqual(names - quiet, set(), "alerts without a test where they stay quiet")
        self.assertEqual(firing - names, set(), "tests for alerts that do not exist")

    def test_alerts_say_what_where_and_what_to_look_at(self):
        for rule in alert_rules():
            with self.subTest(alert=rule["alert"]):
                # A fixed severity, or the finding's own (kept by the alert's `max by`).
                severity = rule.get("labels", {}).get("severity")
                if severity is None:
                    m = re.search(r"max by \(([\w, ]+)\)", rule["expr"])
                    self.assertTrue(m and "severity" in [x.strip() for x in m.group(1).split(",")],
                                    "no severity: neither a label nor the finding's")
                else:
                    self.assertIn(severity, ("info", "warning", "critical"))
                for key in ("summary", "description", "action"):
                    self.assertTrue(rule["annotations"].get(key), key)
                # Alerts on a job's findings point at stepwatchctl explain for their job (an alert
                # about stepwatch's own delivery of a job's events points at the agent instead).
                if ("$labels.job" in rule["annotations"]["summary"]
                        and "stepwatch_agent_" not in rule["expr"]):
                    self.assertIn("stepwatchctl explain {{ $labels.job }}",
                                  rule["annotations"]["action"])

    def test_one_alert_per_finding_kind_says_where_and_why(self):
        """Every kind of the collector's findings has an alert built on stepwatch_finding that
        keeps the labels saying where (per kind) and why (cause), deduplicated with max by."""
        kinds, _ = engine_vocabulary()
        if not kinds:
            self.skipTest("analysis sources not present")
        where = {"straggler": {"job", "rank", "node", "gpu"}, "slow_node": {"job", "node"},
                 "pipeline_imbalance": {"job", "stage"},
                 "underutilized_gpu": {"job", "node", "gpu"}, "idle_gpu": {"node", "gpu"},
                 "scaling_efficiency": {"job"}, "regression": {"job"}, "stall": {"job"},
                 "gpu_health": {"node", "gpu"}, "nic_health": {"node", "device"}}
        self.assertEqual(set(kinds), set(where), "a finding kind without a known alert shape")
        for kind in kinds:
            with self.subTest(kind=kind):
                rules = [r for r in alert_rules()
                         if f'stepwatch_finding{{kind="{kind}"}}' in r["expr"]]
                self.assertEqual(len(rules), 1, f"alerts on {kind} findings")
                m = re.search(r'max by \(([\w, ]+)\) \(\s*stepwatch_finding\{kind="' + kind,
                              rules[0]["expr"])
                self.assertIsNotNone(m, rules[0]["expr"])
                labels = {x.strip() for x in m.group(1).split(",")}
                self.assertLessEqual(where[kind] | {"cause"}, labels)
                self.assertNotIn("instance", labels)
                self.assertIn("$labels.cause", rules[0]["annotations"]["summary"] +
                              rules[0]["annotations"]["description"])

    def test_alerts_document_the_cause_vocabulary(self):
        _, causes = engine_vocabulary()
        if not causes:
            self.skipTest("analysis sources not present")
        with open(ALERTS_FILE) as f:
            text = f.read()
        self.assertGreaterEqual(len(causes), 14)
        for cause in causes:
            self.assertRegex(text, rf"\b{cause}\b", "cause missing from the alerts' comment")

    def test_alert_metrics_are_exported(self):
        sources = exported_metric_sources()
        if '"stepwatch_job_step_seconds"' not in sources:
            self.skipTest("collector sources not present")
        for rule in alert_rules():
            for name in metric_names(rule["expr"]):
                with self.subTest(alert=rule["alert"], metric=name):
                    self.assertTrue(is_exported(name, sources), f"{name} is exported by nobody")


class GrafanaTest(unittest.TestCase):

    def test_committed_dashboards_match_generator(self):
        gen = load_module("generate_dashboards",
                          os.path.join(DEPLOY, "grafana", "generate_dashboards.py"))
        for name, builder in gen.DASHBOARDS.items():
            with self.subTest(dashboard=name):
                with open(os.path.join(DASHBOARD_DIR, name)) as f:
                    self.assertEqual(f.read(), gen.render(builder),
                                     "run deploy/grafana/generate_dashboards.py")

    def test_dashboards_have_required_panels_and_variables(self):
        boards = dashboards()
        self.assertEqual(set(boards), {"stepwatch-overview.json", "stepwatch-job.json",
                                       "stepwatch-node.json"})
        required = {
            "stepwatch-overview.json": (set(), {"Jobs", "Efficiency by job", "Active findings",
                                                "GPU utilization by node"}),
            "stepwatch-job.json": ({"job"}, {"Step time", "Efficiency and scaling efficiency",
                                             "Time breakdown", "What-if speed-ups",
                                             "Busy time per rank", "Stragglers"}),
            "stepwatch-node.json": ({"node"}, {"GPU utilization", "SM activity",
                                               "DRAM bandwidth", "SM clock", "Throttle reasons",
                                               "Host CPU utilization",
                                               "Host memory bandwidth"}),
        }
        for name, (variables, titles) in required.items():
            with self.subTest(dashboard=name):
                board = boards[name]
                names = {v["name"] for v in board["templating"]["list"]}
                self.assertEqual(names, {"datasource"} | variables)
                panel_titles = {p["title"] for p in board["panels"]}
                self.assertLessEqual(titles, panel_titles)
                types = {p["title"]: p["type"] for p in board["panels"]}
                if name == "stepwatch-job.json":
                    self.assertEqual(types["Busy time per rank"], "heatmap")
                    breakdown = next(p for p in board["panels"] if p["title"] == "Time breakdown")
                    self.assertEqual(
                        breakdown["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"],
                        "normal")
                for var in variables:
                    # Every query of a per-job/per-node dashboard honours its variable.
                    for title, expr in panel_exprs(board):
                        self.assertIn(f'=~"${var}"', expr, title)

    def test_dashboard_layout_is_valid(self):
        for name, board in dashboards().items():
            with self.subTest(dashboard=name):
                ids = [p["id"] for p in board["panels"]]
                self.assertEqual(len(ids), len(set(ids)), "duplicate panel ids")
                cells = set()
                for p in board["panels"]:
                    g = p["gridPos"]
                    self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
                    for x in range(g["x"], g["x"] + g["w"]):
                        for y in range(g["y"], g["y"] + g["h"]):
                            self.assertNotIn((x, y), cells, f"{p['title']} overlaps")
                            cells.add((x, y))
                    if p["type"] != "row":
                        self.assertEqual(p["datasource"]["uid"], "${datasource}")
                        self.assertTrue(p["targets"], p["title"])

    def test_panels_give_single_replica_results(self):
        """Every panel query, evaluated by promtool over two identical collector replicas, gives
        exactly the samples it gives over one, and has data."""
        exprs = [substitute(e).replace("[1m]", "[5m]")
                 for board in dashboards().values() for _, e in panel_exprs(board)]
        result = run_replica_equivalence(self, exprs, [True] * len(exprs))
        self.assertEqual(result.returncode, 0, result.stdout[-6000:] + result.stderr[-2000:])

    def test_panel_queries_parse(self):
        """Every panel query (variables substituted) must be valid PromQL: promtool parses them."""
        promtool = shutil.which("promtool")
        if not promtool:
            self.skipTest("promtool not installed")
        rules = []
        for name, board in dashboards().items():
            for title, expr in panel_exprs(board):
                rules.append({"record": f"panel:check{len(rules)}", "expr": substitute(expr)})
            for var in board["templating"]["list"]:
                if var["type"] == "query":
                    m = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]["query"])
                    self.assertIsNotNone(m, var["query"])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "panels.yml")
            with open(path, "w") as f:
                yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}, f)
            result = subprocess.run([promtool, "check", "rules", path], capture_output=True,
                                    text=True, timeout=60)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertGreater(len(rules), 30)

    def test_panels_do_not_depend_on_the_number_of_replicas(self):
        for name, board in dashboards().items():
            for title, expr in panel_exprs(board):
                with self.subTest(dashboard=name, panel=title):
                    self.assertEqual(replica_problems(expr), [], expr)

    def test_panel_metrics_are_exported(self):
        sources = exported_metric_sources()
        if '"stepwatch_job_step_seconds"' not in sources:
            self.skipTest("collector sources not present")
        for name, board in dashboards().items():
            for title, expr in panel_exprs(board):
                for metric in metric_names(expr):
                    with self.subTest(dashboard=name, panel=title, metric=metric):
                        self.assertTrue(is_exported(metric, sources), f"{metric} not exported")

    def test_provisioning(self):
        ds = load_yaml(os.path.join(DEPLOY, "grafana", "provisioning", "datasources",
                                    "stepwatch.yml"))
        self.assertEqual(ds["apiVersion"], 1)
        self.assertEqual(ds["datasources"][0]["type"], "prometheus")
        prov = load_yaml(os.path.join(DEPLOY, "grafana", "provisioning", "dashboards",
                                      "stepwatch.yml"))
        self.assertEqual(prov["providers"][0]["type"], "file")
        self.assertTrue(prov["providers"][0]["options"]["path"].startswith("/"))


def container_flags(container):
    return dict(a[2:].split("=", 1) for a in container["args"] if "=" in a)


def collector_topology_problems(objects):
    """What is missing or inconsistent in the replicated collectors and the agents that find them:
    a StatefulSet of at least 2 behind a headless Service (only ready pods in DNS) that its
    serviceName names, a PodDisruptionBudget of one, anti-affinity across nodes, readiness and
    liveness probes, and agents whose --collector=dns:///NAME:PORT is that Service's name and
    gRPC port, with --replicas at least 2 and below the collectors' count. `objects` maps
    (kind, name) to the parsed manifests."""
    problems = []
    sets = [d for (kind, _), d in objects.items() if kind == "StatefulSet"
            and d["metadata"]["name"] == "stepwatch-collector"]
    if not sets:
        return ["no StatefulSet stepwatch-collector"]
    sts = sets[0]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    ns = sts["metadata"]["namespace"]
    replicas = spec.get("replicas", 1)
    if replicas < 2:
        problems.append(f"StatefulSet replicas {replicas}: no replica to fail over to")
    if not spec["selector"]["matchLabels"].items() <= labels.items():
        problems.append("StatefulSet selector does not match its pods")
    svc = objects.get(("Service", spec.get("serviceName")))
    if svc is None:
        problems.append(f"no Service {spec.get('serviceName')} (the StatefulSet's serviceName)")
    else:
        if svc["spec"].get("clusterIP") != "None":
            problems.append("the collectors' Service is not headless (clusterIP: None)")
        if svc["spec"].get("publishNotReadyAddresses", False):
            problems.append("the headless Service publishes collectors that are not ready")
        if not svc["spec"]["selector"].items() <= labels.items():
            problems.append("the headless Service does not select the collector pods")
        if svc["metadata"]["namespace"] != ns:
            problems.append("the headless Service is in another namespace")
    pdbs = [d for (kind, _), d in objects.items() if kind == "PodDisruptionBudget"
            and d["spec"]["selector"]["matchLabels"].items() <= labels.items()]
    if len(pdbs) != 1:
        problems.append(f"{len(pdbs)} PodDisruptionBudgets select the collectors, want 1")
    elif pdbs[0]["spec"].get("maxUnavailable") != 1:
        problems.append("the PodDisruptionBudget does not keep all but one collector")
    anti = pod.get("affinity", {}).get("podAntiAffinity", {})
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    if not any(term.get("topologyKey") == "kubernetes.io/hostname" and
               term["labelSelector"]["matchLabels"].items() <= labels.items() for term in terms):
        problems.append("no required pod anti-affinity of the collectors across nodes")
    (c,) = pod["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        if probe not in c:
            problems.append(f"collector without {probe}")
    grpc_port = int(container_flags(c).get("grpc-listen", ":0").rsplit(":", 1)[1])
    agents = [d for (kind, _), d in objects.items() if kind == "DaemonSet"]
    if not agents:
        problems.append("no agent DaemonSet")
    for ds in agents:
        flags = container_flags(ds["spec"]["template"]["spec"]["containers"][0])
        target = flags.get("collector", "")
        m = re.fullmatch(r"dns:///([\w.-]+):(\d+)", target)
        if not m:
            problems.append(f"agent --collector={target} is not dns:///NAME:PORT")
            continue
        name, port = m.group(1), int(m.group(2))
        if svc is not None:
            want = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
            if name not in (want, want[:-len(".cluster.local")]):
                problems.append(f"agent resolves {name}, the headless Service is {want}")
            ports = [p for p in svc["spec"]["ports"] if p["port"] == port]
            if not ports:
                problems.append(f"agent port {port} is no port of the headless Service")
            elif ports[0]["targetPort"] not in [p["name"] for p in c["ports"]
                                                 if p["containerPort"] == grpc_port]:
                problems.append(f"agent port {port} does not reach the collectors' gRPC port")
        r = int(flags.get("replicas", "0"))
        if not 2 <= r < replicas:
            problems.append(f"agent --replicas={r}: want 2 or more, fewer than the {replicas} "
                            "collectors (so one can fail)")
        if "metrics-listen" not in flags:
            problems.append("agent without --metrics-listen: no raw node view for Prometheus")
    return problems


def kubectl_env():
    # No kubeconfig: proves the checks need no API server.
    env = dict(os.environ)
    env["KUBECONFIG"] = os.devnull
    return env


@unittest.skipUnless(shutil.which("kubectl"), "kubectl not installed")
class KubernetesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.objects = {}
        for path in glob.glob(os.path.join(K8S, "*.yaml")):
            if os.path.basename(path) == "kustomization.yaml":
                continue
            for doc in load_yaml_all(path):
                cls.objects[(doc["kind"], doc["metadata"]["name"])] = doc

    def kubectl(self, *args, stdin=None):
        return subprocess.run(["kubectl", *args], capture_output=True, text=True, input=stdin,
                              env=kubectl_env(), timeout=60)

    def test_kustomize_builds_offline(self):
        built = self.kubectl("kustomize", K8S)
        self.assertEqual(built.returncode, 0, built.stderr)
        docs = list(yaml.safe_load_all(built.stdout))
        kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
        # What the kustomization generates: the agents' certificate script (name + content hash).
        generated = {k for k in kinds if k[0] == "ConfigMap"}
        self.assertEqual(len(generated), 1, generated)
        self.assertRegex(next(iter(generated))[1], r"^stepwatch-agent-certificate-\w+$")
        self.assertEqual(kinds - generated, set(self.objects))
        (script,) = [d for d in docs if d["kind"] == "ConfigMap"]
        with open(os.path.join(K8S, "agent-certificate.sh")) as f:
            self.assertEqual(script["data"]["agent-certificate.sh"], f.read())
        # The DaemonSet mounts the generated name.
        (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
        volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(volumes["certificate-script"]["configMap"]["name"],
                         script["metadata"]["name"])
        # Every object is a well-formed Kubernetes object (client side, no server).
        names = self.kubectl("label", "--local", "--dry-run=client", "-o", "name", "-f", "-",
                             "stepwatch.check=1", stdin=built.stdout)
        self.assertEqual(names.returncode, 0, names.stderr)
        self.assertEqual(len(names.stdout.split()), len(self.objects) + len(generated))

    def test_workloads_decode_as_typed_objects(self):
        files = [os.path.join(K8S, "agent.yaml"), os.path.join(K8S, "collector.yaml"),
                 os.path.join(K8S, "examples", "training-job.yaml")]
        args = ["set", "env", "--local", "--dry-run=client", "-o", "name"]
        for f in files:
            args += ["-f", f]
        result = self.kubectl(*args, "STEPWATCH_CHECK=1")
        # `set env` errors on objects without a pod template, so only count the workloads.
        workloads = [l for l in result.stdout.split() if "/" in l]
        self.assertIn("daemonset.apps/stepwatch-agent", workloads, result.stderr)
        self.assertIn("statefulset.apps/stepwatch-collector", workloads, result.stderr)
        self.assertIn("job.batch/resnet-ddp", workloads, result.stderr)
        self.assertNotIn("unable to decode", result.stderr)

    def test_typed_decoding_rejects_a_broken_manifest(self):
        """The offline check is meaningful: a wrongly typed field fails it."""
        with open(os.path.join(K8S, "agent.yaml")) as f:
            broken = f.read().replace("containerPort: 9465", 'containerPort: "metrics"', 1)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as tmp:
            tmp.write(broken)
            tmp.flush()
            result = self.kubectl("set", "env", "--local", "--dry-run=client", "-o", "name",
                                  "-f", tmp.name, "X=1")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("containerPort", result.stderr)

    def test_collectors_are_replicated_and_found_by_the_agents(self):
        self.assertEqual(collector_topology_problems(self.objects), [])
        self.assertEqual(self.objects[("StatefulSet", "stepwatch-collector")]["spec"]["replicas"],
                         3)

    def test_topology_check_catches_what_is_missing(self):
        """Each broken variant of the manifests fails the topology check."""
        import copy

        def broken(edit):
            objects = copy.deepcopy(self.objects)
            edit(objects)
            return collector_topology_problems(objects)

        sts = ("StatefulSet", "stepwatch-collector")
        svc = ("Service", "stepwatch-collector")
        agent = ("DaemonSet", "stepwatch-agent")

        def set_agent_flag(objects, flag, value):
            c = objects[agent]["spec"]["template"]["spec"]["containers"][0]
            c["args"] = [a for a in c["args"] if not a.startswith(f"--{flag}=")]
            if value is not None:
                c["args"].append(f"--{flag}={value}")

        variants = {
            "no StatefulSet": lambda o: o.pop(sts),
            "one replica": lambda o: o[sts]["spec"].update(replicas=1),
            "Service not headless": lambda o: o[svc]["spec"].pop("clusterIP"),
            "not-ready pods in DNS": lambda o: o[svc]["spec"].update(
                publishNotReadyAddresses=True),
            "serviceName elsewhere": lambda o: o[sts]["spec"].update(serviceName="other"),
            "no PodDisruptionBudget": lambda o: o.pop(("PodDisruptionBudget",
                                                       "stepwatch-collector")),
            "no anti-affinity": lambda o: o[sts]["spec"]["template"]["spec"].pop("affinity"),
            "no readiness probe": lambda o: o[sts]["spec"]["template"]["spec"]["containers"][0]
            .pop("readinessProbe"),
            "agent on a plain address": lambda o: set_agent_flag(
                o, "collector", "stepwatch-collector.stepwatch.svc:7070"),
            "agent resolves another name": lambda o: set_agent_flag(
                o, "collector", "dns:///collectors.stepwatch.svc.cluster.local:7070"),
            "agent on the metrics port": lambda o: set_agent_flag(
                o, "collector", "dns:///stepwatch-collector.stepwatch.svc.cluster.local:9464"),
            "agent with one replica": lambda o: set_agent_flag(o, "replicas", "1"),
            "agent without --replicas": lambda o: set_agent_flag(o, "replicas", None),
            "agent without /metrics": lambda o: set_agent_flag(o, "metrics-listen", None),
        }
        for name, edit in variants.items():
            with self.subTest(variant=name):
                self.assertNotEqual(broken(edit), [])

    def pod_spec(self, kind, name):
        return self.objects[(kind, name)]["spec"]["template"]["spec"]

    def flags(self, container):
        return dict(a[2:].split("=", 1) for a in container["args"])

    def check_selector(self, kind, name):
        obj = self.objects[(kind, name)]
        selector = obj["spec"]["selector"]["matchLabels"]
        labels = obj["spec"]["template"]["metadata"]["labels"]
        self.assertLessEqual(selector.items(), labels.items())
        return labels

    def check_resources(self, container):
        for key in ("cpu", "memory"):
            self.assertIn(key, container["resources"]["limits"])
            self.assertIn(key, container["resources"]["requests"])

    def check_service_targets(self, service_name, pod_labels, container):
        svc = self.objects[("Service", service_name)]
        self.assertLessEqual(svc["spec"]["selector"].items(), pod_labels.items())
        port_names = {p["name"] for p in container["ports"]}
        for p in svc["spec"]["ports"]:
            self.assertIn(p["targetPort"], port_names)
        return svc

    def container(self, spec, name):
        (c,) = [c for c in spec["containers"] if c["name"] == name]
        return c

    def test_agent_daemonset(self):
        labels = self.check_selector("DaemonSet", "stepwatch-agent")
        spec = self.pod_spec("DaemonSet", "stepwatch-agent")
        self.assertEqual(spec["runtimeClassName"], "nvidia")
        c = self.container(spec, "agent")
        self.assertIs(spec["containers"][0], c)
        flags = self.flags(c)
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["NVIDIA_VISIBLE_DEVICES"]["value"], "all")
        self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        self.assertEqual(flags["node"], "$(NODE_NAME)")
        # The socket lives in the hostPath directory that training pods share.
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        sock_dir = os.path.dirname(flags["socket"])
        self.assertIn(sock_dir, mounts)
        self.assertEqual(volumes[mounts[sock_dir]]["hostPath"]["path"], "/run/stepwatch")
        # The kubelet's PodResources socket, read-only, for Kubernetes attribution.
        kubelet_dir = os.path.dirname(flags["kubelet-socket"])
        self.assertIn(kubelet_dir, mounts)
        self.assertEqual(volumes[mounts[kubelet_dir]]["hostPath"]["path"],
                         "/var/lib/kubelet/pod-resources")
        self.assertTrue(next(m for m in c["volumeMounts"] if m["mountPath"] == kubelet_dir)
                        .get("readOnly"))
        self.check_resources(c)
        metrics_port = int(flags["metrics-listen"].rsplit(":", 1)[1])
        self.assertIn(metrics_port, [p["containerPort"] for p in c["ports"]])
        self.check_service_targets("stepwatch-agent", labels, c)
        # The agent finds the collectors through their headless Service
        # (test_collectors_are_replicated_and_found_by_the_agents checks the name and port).
        self.assertTrue(flags["collector"].startswith("dns:///stepwatch-collector."))
        # A training pod mounts the same directory and points STEPWATCH_SOCKET at the socket.
        job = load_yaml(os.path.join(K8S, "examples", "training-job.yaml"))
        tspec = job["spec"]["template"]["spec"]
        tenv = {e["name"]: e.get("value") for e in tspec["containers"][0]["env"]}
        self.assertEqual(tenv["STEPWATCH_SOCKET"], flags["socket"])
        self.assertEqual(tspec["volumes"][0]["hostPath"]["path"], "/run/stepwatch")

    def test_collector_statefulset(self):
        labels = self.check_selector("StatefulSet", "stepwatch-collector")
        spec = self.pod_spec("StatefulSet", "stepwatch-collector")
        (c,) = spec["containers"]
        flags = self.flags(c)
        self.check_resources(c)
        self.assertTrue(spec["securityContext"]["runAsNonRoot"])
        ports = {p["containerPort"] for p in c["ports"]}
        for flag in ("grpc-listen", "metrics-listen"):
            self.assertIn(int(flags[flag].rsplit(":", 1)[1]), ports)
        # Each collector's state on its own volume, from the StatefulSet's claim template.
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        templates = {t["metadata"]["name"]: t for t in
                     self.objects[("StatefulSet", "stepwatch-collector")]["spec"]
                     ["volumeClaimTemplates"]}
        self.assertIn(mounts[flags["state-dir"]], templates)
        self.assertEqual(templates[mounts[flags["state-dir"]]]["spec"]["accessModes"],
                         ["ReadWriteOnce"])
        self.check_service_targets("stepwatch-collector", labels, c)

    def tls_secret_file(self, spec, container, path):
        """The Certificate whose Secret, mounted in `container`, holds the file at `path`."""
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        directory, name = os.path.split(path)
        self.assertIn(name, ("tls.crt", "tls.key", "ca.crt"), path)
        self.assertIn(directory, mounts, path)
        secret = volumes[mounts[directory]]["secret"]["secretName"]
        certs = [d for (kind, _), d in self.objects.items()
                 if kind == "Certificate" and d["spec"]["secretName"] == secret]
        self.assertEqual(len(certs), 1, f"no Certificate writes Secret {secret}")
        return certs[0]

    def test_grpc_is_mutual_tls_from_cert_manager(self):
        spec = self.pod_spec("StatefulSet", "stepwatch-collector")
        (collector,) = spec["containers"]
        cflags = self.flags(collector)
        server = self.tls_secret_file(spec, collector, cflags["tls-cert"])
        self.assertIs(self.tls_secret_file(spec, collector, cflags["tls-key"]), server)
        self.assertIs(self.tls_secret_file(spec, collector, cflags["tls-client-ca"]), server)
        self.assertIn("server auth", server["spec"]["usages"])
        # The kubelet's gRPC probe cannot speak TLS.
        for probe in ("livenessProbe", "readinessProbe"):
            self.assertNotIn("grpc", collector.get(probe, {}), probe)

        aspec = self.pod_spec("DaemonSet", "stepwatch-agent")
        agent = self.container(aspec, "agent")
        aflags = self.flags(agent)
        # (The agent's own certificate: test_each_agent_gets_a_certificate_for_its_node.)
        # The agent verifies that the collectors' certificate names the Service it resolves (it
        # dials each pod's address, checking the certificate against the name); the pods' own
        # names are covered too.
        host = aflags["collector"].rsplit(":", 1)[0][len("dns:///"):]
        self.assertIn(host, server["spec"]["dnsNames"])
        self.assertIn(f"*.{host}", server["spec"]["dnsNames"])
        # Each agent's certificate names its node: the collector checks it (the default).
        self.assertNotIn("verify-node-identity", cflags)

        # Every Certificate chains to the CA Issuer, which the self-signed Issuer bootstraps.
        ca_issuer = self.objects[("Issuer", server["spec"]["issuerRef"]["name"])]
        ca_cert = [d for (kind, _), d in self.objects.items() if kind == "Certificate" and
                   d["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]]
        self.assertEqual(len(ca_cert), 1)
        self.assertTrue(ca_cert[0]["spec"]["isCA"])
        root = self.objects[("Issuer", ca_cert[0]["spec"]["issuerRef"]["name"])]
        self.assertIn("selfSigned", root["spec"])
        for (kind, name), doc in self.objects.items():
            if kind == "Certificate" and doc is not ca_cert[0]:
                self.assertEqual(doc["spec"]["issuerRef"]["name"],
                                 ca_issuer["metadata"]["name"], name)
        reader = self.objects[("Certificate", "stepwatch-reader")]
        self.assertIn("client auth", reader["spec"]["usages"])

    def test_each_agent_gets_a_certificate_for_its_node(self):
        """No Secret shared by every agent: the init container asks cert-manager for a certificate
        whose name is spec.nodeName, the same source as the agent's --node, from the CA Issuer the
        collectors trust; the sidecar renews it; the service account may ask for nothing else."""
        spec = self.pod_spec("DaemonSet", "stepwatch-agent")
        agent = self.container(spec, "agent")
        flags = self.flags(agent)
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
        tls_dirs = {os.path.dirname(flags[f]) for f in ("tls-cert", "tls-key", "tls-ca")}
        self.assertEqual(len(tls_dirs), 1)
        tls_volume = mounts[tls_dirs.pop()]
        self.assertNotIn("secret", volumes[tls_volume], "a Secret is the same on every node")
        self.assertIn("emptyDir", volumes[tls_volume])
        self.assertFalse(any("secret" in v and "agent" in v["secret"]["secretName"]
                             and "tls" in v["secret"]["secretName"] for v in volumes.values()))

        def node_name_source(container):
            env = {e["name"]: e for e in container.get("env", [])}
            return env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]

        self.assertEqual(flags["node"], "$(NODE_NAME)")
        self.assertEqual(node_name_source(agent), "spec.nodeName")
        writers = spec["initContainers"] + [c for c in spec["containers"] if c is not agent]
        self.assertEqual([c["name"] for c in writers], ["certificate", "certificate-renewer"])
        script_name = "agent-certificate.sh"
        for c in writers:
            with self.subTest(container=c["name"]):
                self.assertEqual(c["image"], agent["image"])
                self.assertEqual(node_name_source(c), "spec.nodeName")
                cmounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
                self.assertEqual(cmounts[tls_volume], os.path.dirname(flags["tls-cert"]))
                env = {e["name"]: e.get("value") for e in c["env"]}
                self.assertEqual(env["STEPWATCH_TLS_DIR"], os.path.dirname(flags["tls-cert"]))
                self.assertEqual(c["command"][1],
                                 f"{cmounts['certificate-script']}/{script_name}")
                self.assertTrue(volumes["certificate-script"]["configMap"]["name"]
                                .startswith("stepwatch-agent-certificate"))
                self.check_resources(c)
                self.assertEqual(c["securityContext"]["capabilities"]["drop"], ["ALL"])
        self.assertEqual(spec["containers"][1]["command"][-1], "--renew")
        kustomization = load_yaml(os.path.join(K8S, "kustomization.yaml"))
        (gen,) = kustomization["configMapGenerator"]
        self.assertEqual((gen["name"], gen["files"]), ("stepwatch-agent-certificate",
                                                       [script_name]))
        # The script's certificate: CN and first DNS name are NODE_NAME (what --node gets), the
        # key usage is client auth, the Issuer is the CA the collectors trust.
        with open(os.path.join(K8S, script_name)) as f:
            script = f.read()
        self.assertIn('node="${NODE_NAME:?', script)
        self.assertIn('-subj "/CN=${node}" -addext "subjectAltName=DNS:${node}"', script)
        self.assertIn('"client auth"', script)
        issuer = re.search(r'issuer="\$\{STEPWATCH_ISSUER:-([\w-]+)\}"', script).group(1)
        ca_issuer = self.objects[("Issuer", issuer)]
        cspec = self.pod_spec("StatefulSet", "stepwatch-collector")
        server = self.tls_secret_file(cspec, cspec["containers"][0],
                                      self.flags(cspec["containers"][0])["tls-client-ca"])
        self.assertEqual(server["spec"]["issuerRef"]["name"], ca_issuer["metadata"]["name"])
        # The service account may create, read and delete CertificateRequests, nothing else.
        self.assertEqual(spec["serviceAccountName"], "stepwatch-agent")
        binding = self.objects[("RoleBinding", "stepwatch-agent-certificates")]
        self.assertIn({"kind": "ServiceAccount", "name": "stepwatch-agent",
                       "namespace": "stepwatch"}, binding["subjects"])
        role = self.objects[("Role", binding["roleRef"]["name"])]
        self.assertEqual(role["rules"], [{"apiGroups": ["cert-manager.io"],
                                          "resources": ["certificaterequests"],
                                          "verbs": ["create", "get", "delete"]}])
        # The only client certificate from a Secret is stepwatchctl's.
        clients = [n for (k, n), d in self.objects.items()
                   if k == "Certificate" and "client auth" in d["spec"].get("usages", [])]
        self.assertEqual(clients, ["stepwatch-reader"])

    def test_metrics_need_the_scrapers_password(self):
        """Collector and agent /metrics ask for the password of one Secret, which both
        ServiceMonitors send; the agent (hostNetwork) listens on the node's address only."""
        mounts_for = {}
        for kind, name, container in (("StatefulSet", "stepwatch-collector", "collector"),
                                      ("DaemonSet", "stepwatch-agent", "agent")):
            with self.subTest(workload=name):
                spec = self.pod_spec(kind, name)
                c = self.container(spec, container)
                flags = self.flags(c)
                path = flags["metrics-basic-auth-file"]
                mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
                volume = {v["name"]: v for v in spec["volumes"]}[mounts[os.path.dirname(path)]]
                self.assertEqual(volume["secret"]["secretName"], "stepwatch-metrics-auth")
                self.assertIn({"key": "htpasswd", "path": os.path.basename(path)},
                              volume["secret"]["items"])
                mounts_for[name] = path
                # The kubelet has no password: probes must not fetch /metrics.
                for probe in ("readinessProbe", "livenessProbe"):
                    self.assertNotIn("httpGet", c.get(probe, {}), probe)
                sm = self.objects[("ServiceMonitor", name)]
                for ep in sm["spec"]["endpoints"]:
                    auth = ep["basicAuth"]
                    self.assertEqual(auth["username"]["name"], "stepwatch-metrics-auth")
                    self.assertEqual(auth["password"]["name"], "stepwatch-metrics-auth")
        agent = self.container(self.pod_spec("DaemonSet", "stepwatch-agent"), "agent")
        self.assertEqual(self.flags(agent)["metrics-listen"], "$(NODE_IP):9465")
        env = {e["name"]: e for e in agent["env"]}
        self.assertEqual(env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.hostIP")

    def test_images_name_a_registry_that_kustomize_overrides(self):
        """The images are not published: manifests name a registry placeholder (example.com) and
        kustomization.yaml's images: section is where the operator names the real one."""
        images = set()
        for (kind, _), doc in self.objects.items():
            if kind in ("DaemonSet", "StatefulSet"):
                spec = doc["spec"]["template"]["spec"]
                for c in spec.get("initContainers", []) + spec["containers"]:
                    images.add(c["image"])
        self.assertEqual(images, {"registry.example.com/stepwatch/agent:0.1.0",
                                  "registry.example.com/stepwatch/collector:0.1.0"})
        kustomization = load_yaml(os.path.join(K8S, "kustomization.yaml"))
        names = {i["name"]: i for i in kustomization["images"]}
        self.assertEqual(set(names), {i.rsplit(":", 1)[0] for i in images})
        for entry in names.values():
            self.assertTrue(entry["newName"].startswith("registry.example.com/"), entry)
        # The override works: kustomize rewrites every image to the registry named there.
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({"resources": [os.path.relpath(K8S, tmp)],
                                "images": [{"name": n, "newName": "registry.test/sw/" +
                                            n.rsplit("/", 1)[1], "newTag": "9.9"}
                                           for n in names]}, f)
            built = self.kubectl("kustomize", "--load-restrictor=LoadRestrictionsNone", tmp)
        self.assertEqual(built.returncode, 0, built.stderr)
        found = set(re.findall(r"image: (\S+)", built.stdout))
        self.assertEqual(found, {"registry.test/sw/agent:9.9", "registry.test/sw/collector:9.9"})
        with open(os.path.join(SOURCE_DIR, "docs", "deploy.md")) as f:
            self.assertTrue("kustomize edit set image" in f.read(), "docs/deploy.md: the override")

    def test_agent_socket_is_for_the_training_group_only(self):
        spec = self.pod_spec("DaemonSet", "stepwatch-agent")
        flags = self.flags(spec["containers"][0])
        self.assertEqual(flags["socket-mode"], "0660")
        gid = int(flags["socket-group"])  # a number: the image's /etc/group knows no such name
        # Membership lets the agent (no CAP_CHOWN) give the socket that group.
        self.assertIn(gid, spec["securityContext"]["supplementalGroups"])
        job = load_yaml(os.path.join(K8S, "examples", "training-job.yaml"))
        self.assertIn(gid, job["spec"]["template"]["spec"]["securityContext"]
                      ["supplementalGroups"])

    def test_service_monitors_match_services_and_alert_jobs(self):
        alert_exprs = " ".join(r["expr"] for r in alert_rules())
        for name in ("stepwatch-collector", "stepwatch-agent"):
            with self.subTest(service_monitor=name):
                sm = self.objects[("ServiceMonitor", name)]
                svc = self.objects[("Service", name)]
                self.assertLessEqual(sm["spec"]["selector"]["matchLabels"].items(),
                                     svc["metadata"]["labels"].items())
                self.assertIn(svc["metadata"]["namespace"],
                              sm["spec"]["namespaceSelector"]["matchNames"])
                svc_ports = {p["name"] for p in svc["spec"]["ports"]}
                for ep in sm["spec"]["endpoints"]:
                    self.assertIn(ep["port"], svc_ports)
                    # The training-job label `job` must survive the scrape.
                    self.assertTrue(ep["honorLabels"])
                # The operator names the scrape job after the Service; alerts use that name.
                self.assertIn(f'job="{name}"', alert_exprs)

    def test_prometheusrule_matches_rule_files(self):
        gen = load_module("generate_prometheusrule",
                          os.path.join(K8S, "generate_prometheusrule.py"))
        rule = self.objects[("PrometheusRule", "stepwatch")]
        self.assertEqual(rule["spec"]["groups"], gen.rule_groups(RULES_DIR))
        with open(os.path.join(K8S, "prometheusrule.yaml")) as f:
            self.assertEqual(f.read(), gen.render(RULES_DIR),
                             "run deploy/kubernetes/generate_prometheusrule.py")


@unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
class SystemdTest(unittest.TestCase):

    def test_units_verify(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("stepwatch-agent.service", "stepwatch-collector.service"):
                with open(os.path.join(DEPLOY, "systemd", name)) as f:
                    text = f.read()
                self.assertRegex(text, r"ExecStart=/usr/local/bin/stepwatch-")
                for key in ("NoNewPrivileges=yes", "ProtectSystem=strict", "DynamicUser=yes",
                            "CapabilityBoundingSet=\n", "Restart=on-failure"):
                    self.assertIn(key, text, name)
                # verify wants an executable binary: stand one in for the real one.
                text = re.sub(r"/usr/local/bin/stepwatch-\w+", "/bin/true", text)
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(text)
            result = subprocess.run(["systemd-analyze", "verify",
                                     *glob.glob(os.path.join(tmp, "*.service"))],
                                    capture_output=True, text=True, timeout=60)
            output = result.stdout + result.stderr
            self.assertEqual(result.returncode, 0, output)
            self.assertNotRegex(output, r"Unknown (key|section)|ignoring|Failed to parse", output)

    def test_units_use_mutual_tls_and_a_group_socket(self):
        def unit(name):
            with open(os.path.join(DEPLOY, "systemd", name)) as f:
                text = f.read()
            start = re.search(r"(?m)^ExecStart=(.*)$", text).group(1)
            flags = dict(re.findall(r"--([\w-]+)=(\S+)", start))
            env = dict(re.findall(r"(?m)^Environment=(\w+)=(.*)$", text))
            groups = re.search(r"(?m)^SupplementaryGroups=(.*)$", text).group(1).split()
            expand = lambda v: v.replace("${STEPWATCH_TLS_DIR}", env["STEPWATCH_TLS_DIR"])
            return {k: expand(v) for k, v in flags.items()}, groups

        tls = "/etc/stepwatch/tls/"
        collector, groups = unit("stepwatch-collector.service")
        self.assertEqual(collector["tls-cert"], tls + "collector.pem")
        self.assertEqual(collector["tls-key"], tls + "collector.key")
        self.assertEqual(collector["tls-client-ca"], tls + "ca.pem")
        self.assertNotIn("verify-node-identity", collector)  # per-node certificates
        self.assertIn("stepwatch-tls", groups)
        agent, groups = unit("stepwatch-agent.service")
        self.assertEqual(agent["tls-ca"], collector["tls-client-ca"])
        # The node's own certificate, named like --node: the collector checks that they match.
        self.assertEqual(agent["node"], "%H")
        self.assertEqual(agent["tls-cert"], tls + "%H.pem")
        self.assertEqual(agent["tls-key"], tls + "%H.key")
        self.assertEqual(agent["socket-mode"], "0660")
        self.assertIn(agent["socket-group"], groups)
        self.assertIn("stepwatch-tls", groups)
        # /metrics of both asks for the scrapers' password, kept with the keys.
        for flags in (agent, collector):
            self.assertEqual(flags["metrics-basic-auth-file"], tls + "metrics.htpasswd")
        self.assertEqual(agent["metrics-listen"], "${STEPWATCH_METRICS_LISTEN}")
        prometheus = load_yaml(os.path.join(DEPLOY, "prometheus", "prometheus.yml"))
        for scrape in prometheus["scrape_configs"]:
            self.assertEqual(scrape["basic_auth"]["username"], "prometheus", scrape["job_name"])
            self.assertIn("password_file", scrape["basic_auth"])


class ShippedDeploymentsTest(unittest.TestCase):

    def test_node_identity_is_verified_in_every_shipped_deployment(self):
        """No manifest, unit, Slurm script, image or script turns the collector's check that an
        agent reports only the node its certificate names off."""
        paths = [p for pattern in ("deploy/**/*", "docker/*", "scripts/*")
                 for p in glob.glob(os.path.join(SOURCE_DIR, pattern), recursive=True)
                 if os.path.isfile(p)]
        self.assertGreater(len(paths), 20)
        off = re.compile(r"verify[-_]node[-_]identity(=|\s+)(false|0|no)\b", re.I)
        for path in paths:
            with open(path, errors="replace") as f:
                text = f.read()
            self.assertIsNone(off.search(text), os.path.relpath(path, SOURCE_DIR))
        self.assertIsNotNone(off.search("--verify-node-identity=false"))


class SecurityDocsTest(unittest.TestCase):
    """docs/security.md names real flags, metrics and refusal reasons."""
    # Flags of other programs that the page shows (sidecars, groupadd).
    OTHER_TOOLS = {"secure-listen-address", "upstream", "tls-cert-file", "tls-private-key-file",
                   "listen", "target", "system", "pid", "fork"}

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(SOURCE_DIR, "docs", "security.md")) as f:
            cls.text = f.read()

    def test_flags_exist(self):
        defined = set()
        # The binaries' own flags and the ones they share (defined once in http/ and security/).
        for main in ("collector/main.cc", "agent/main.cc", "ctl/main.cc",
                     "http/metrics_endpoint_flags.cc", "security/tls_flags.cc",
                     "security/tls_client_flags.cc"):
            path = os.path.join(SOURCE_DIR, main)
            if not os.path.exists(path):
                self.skipTest("sources not present")
            with open(path) as f:
                defined |= set(re.findall(r"ABSL_FLAG\([\w:]+, (\w+),", f.read()))
        used = set(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]+)", self.text)) - self.OTHER_TOOLS
        self.assertGreaterEqual(len(used), 15)
        for flag in sorted(used):
            self.assertIn(flag.replace("-", "_"), defined, f"--{flag} is no stepwatch flag")

    def test_counters_and_reasons_exist(self):
        sources = exported_metric_sources()
        if '"stepwatch_job_step_seconds"' not in sources:
            self.skipTest("collector sources not present")
        names = set(re.findall(r"\b(stepwatch_[a-z0-9_]+)", self.text))
        self.assertGreaterEqual(len(names), 5)
        for name in names:
            self.assertTrue(is_exported(name, sources), f"{name} is exported by nobody")
        with open(os.path.join(SOURCE_DIR, "agent", "step_event_parser.cc")) as f:
            sources += f.read()
        for reason in re.findall(r'reason="(\w+)"', self.text):
            self.assertTrue(f'"{reason}"' in sources, f"no counter reason {reason}")
        for reason in ("node_mismatch", "rank_exit_foreign", "not_owner", "out_of_range"):
            self.assertIn(f"`{reason}`", self.text)


class SlurmTest(unittest.TestCase):
    SLURM = os.path.join(DEPLOY, "slurm")

    def run_script(self, name, env):
        return subprocess.run(["/bin/bash", os.path.join(self.SLURM, name)], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=30)

    def exports(self, env):
        result = self.run_script("task-prolog.sh", env)
        self.assertEqual(result.returncode, 0, result.stderr)
        out = {}
        for line in result.stdout.splitlines():
            m = re.fullmatch(r"export (\w+)=(\S+)", line)
            self.assertIsNotNone(m, line)
            out[m.group(1)] = m.group(2)
        return out

    def test_task_prolog_sets_job_for_every_task(self):
        env = self.exports({"SLURM_JOB_ID": "4711", "SLURM_JOB_NAME": "resnet ddp"})
        self.assertEqual(env["STEPWATCH_JOB"], "resnet_ddp-4711")
        self.assertEqual(env["STEPWATCH_SOCKET"], "/run/stepwatch/agent.sock")
        array = self.exports({"SLURM_JOB_ID": "9", "SLURM_JOB_NAME": "sweep",
                              "SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "3"})
        self.assertEqual(array["STEPWATCH_JOB"], "sweep-8_3")
        # A job id chosen by the user is kept (runs compared across world sizes).
        own = self.exports({"SLURM_JOB_ID": "1", "STEPWATCH_JOB": "llama-7b"})
        self.assertEqual(own["STEPWATCH_JOB"], "llama-7b")

    def test_epilog_never_fails_the_job(self):
        result = self.run_script("epilog.sh", {"SLURM_JOB_ID": "1",
                                               "STEPWATCH_REPORT_DIR": "/nonexistent/x"})
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_epilog_reads_the_agents_configuration(self):
        """The epilog's defaults are the agent unit's, and it reads the unit's EnvironmentFile."""
        with open(os.path.join(DEPLOY, "systemd", "stepwatch-agent.service")) as f:
            unit = f.read()
        with open(os.path.join(self.SLURM, "epilog.sh")) as f:
            epilog = f.read()
        env_file = re.search(r"(?m)^EnvironmentFile=-?(\S+)$", unit).group(1)
        self.assertIn(f'env_file="${{STEPWATCH_AGENT_ENV_FILE:-{env_file}}}"', epilog)
        defaults = dict(re.findall(r"(?m)^Environment=(\w+)=(.*)$", unit))
        self.assertIn(f'collector="{defaults["STEPWATCH_COLLECTOR"]}"', epilog)
        self.assertIn(f'tls_dir="{defaults["STEPWATCH_TLS_DIR"]}"', epilog)
        # The node's certificate by the name the unit gives it (%H: the host name).
        self.assertIn("%H.pem", unit)
        self.assertIn('node_cert="${tls_dir}/$(hostname)"', epilog)

    def test_scripts_pass_shellcheck(self):
        scripts = glob.glob(os.path.join(self.SLURM, "*.sh"))
        self.assertEqual(len(scripts), 3)
        for s in scripts:
            self.assertEqual(subprocess.run(["bash", "-n", s]).returncode, 0, s)
            self.assertTrue(os.access(s, os.X_OK), f"{s} is not executable")
        if not shutil.which("shellcheck"):
            self.skipTest("shellcheck not installed")
        result = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout)


class DockerTest(unittest.TestCase):

    def test_dockerfiles(self):
        for name, binary in (("agent", "agent/stepwatch-agent"),
                             ("collector", "collector/stepwatch-collector")):
            with self.subTest(image=name):
                with open(os.path.join(SOURCE_DIR, "docker", f"Dockerfile.{name}")) as f:
                    text = f.read()
                stages = re.findall(r"^FROM (\S+)", text, re.M)
                self.assertEqual(len(stages), 2, "multi-stage")
                self.assertTrue(all(s.startswith("debian:12") for s in stages), stages)
                self.assertIn("scripts/install-deps.sh build", text)
                self.assertIn("scripts/build.sh /build", text)
                self.assertIn(f"COPY --from=build /build/{binary}", text)
                self.assertRegex(text, r"(?m)^USER 65532")
                for script in ("install-deps.sh", "build.sh"):
                    self.assertTrue(os.path.exists(os.path.join(SOURCE_DIR, "scripts", script)))
                # The runtime packages are real Debian 12 package names.
                m = re.search(r"install -y --no-install-recommends(.*?)&& rm", text, re.S)
                packages = [p for p in m.group(1).split() if p != "\\"]
                # Only prometheus-cpp's core is linked: its pull library (civetweb) is not.
                self.assertIn("libprometheus-cpp-core1.0", packages)
                self.assertNotIn("libprometheus-cpp-pull1.0", packages)
                self.assertIn("libgrpc++1.51", packages)
                if shutil.which("apt-cache"):
                    result = subprocess.run(["apt-cache", "show", "--no-all-versions", *packages],
                                            capture_output=True, text=True, timeout=60)
                    known = set(re.findall(r"(?m)^Package: (\S+)", result.stdout))
                    self.assertEqual(set(packages) - known, set())


if __name__ == "__main__":
    unittest.main()
