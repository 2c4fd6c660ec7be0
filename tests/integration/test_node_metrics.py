"""GPU and host readings of a real agent (fake NVML) on the agent's and collector's /metrics.

Both exporters read one table (metrics/node_metric_table.cc): the agent names a metric
stepwatch_agent_<name>, the collector stepwatch_<name>, with the same TYPE, HELP and labels. The
agent shows every reading of its node; the collector, by default (--export-node-metrics=findings),
only those of the nodes and GPUs its findings name, and all of them with
--export-node-metrics=all.
"""

import tempfile
import unittest

from harness import (Agent, Collector, fake_gpu, fake_nvml_state, http_get, metric_value,
                     parse_metrics, wait_until)

# Agent-only by design: 14 series per GPU (the table's Scope::kAgentOnly), and the agent's own
# health counters, which share the gpu_/host_ prefix but are not readings.
AGENT_ONLY = {"gpu_metric_available", "gpu_sample_errors_total", "host_sample_errors_total"}
# Findings, not readings.
COLLECTOR_ONLY = {"gpu_underutilized"}


def families(text, prefix):
    """{name after prefix: (type, help, label names, {sorted labels: value})} of gpu_/host_."""
    out = {}
    types, helps = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line[len("# TYPE "):].split(" ", 1)
            types[name] = kind
        elif line.startswith("# HELP "):
            name, help_text = line[len("# HELP "):].split(" ", 1)
            helps[name] = help_text
    for name, labels, value in parse_metrics(text):
        if not name.startswith(prefix):
            continue
        short = name[len(prefix):]
        if not short.startswith(("gpu_", "host_")):
            continue
        kind, help_text, names, series = out.setdefault(
            short, (types.get(name), helps.get(name), frozenset(labels), {}))
        if frozenset(labels) != names:
            raise AssertionError(f"{name}: label names differ between series")
        series[tuple(sorted(labels.items()))] = value
    return out


class NodeMetricsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-it-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_agent_and_collector_show_the_same_gpu_and_host_families(self):
        gpus = [fake_gpu(0, utilization=80, pids=[4000]),
                fake_gpu(1, utilization=30, pids=[], sm_clock_mhz=1410, throttle_reasons=0x20)]
        with Collector(self.tmp, export_node_metrics="all") as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-m",
                      fake_nvml_state=fake_nvml_state(gpus)) as agent:
            def shipped():
                s = collector.scrape()
                return (metric_value(s, "stepwatch_gpu_utilization_ratio", node="node-m", gpu=1)
                        is not None and metric_value(s, "stepwatch_host_cpus", node="node-m")
                        is not None)

            wait_until(shipped, timeout=20, message="GPU and host series at the collector")
            agent_families = families(http_get(agent.metrics_url), "stepwatch_agent_")
            collector_families = families(http_get(collector.metrics_url), "stepwatch_")

        self.assertIn("gpu_metric_available", agent_families)
        agent_names = set(agent_families) - AGENT_ONLY
        collector_names = set(collector_families) - COLLECTOR_ONLY
        # The fake NVML gives every reading, so both show at least these.
        for name in ("gpu_utilization_ratio", "gpu_sm_activity_ratio", "gpu_info",
                     "gpu_sm_clock_hertz", "gpu_processes", "host_cpus",
                     "host_network_receive_bytes_total"):
            self.assertIn(name, agent_names)
        self.assertEqual(agent_names, collector_names)
        for name in sorted(agent_names):
            with self.subTest(family=name):
                kind, help_text, labels, series = agent_families[name]
                c_kind, c_help, c_labels, c_series = collector_families[name]
                self.assertEqual(kind, c_kind)
                self.assertEqual(help_text, c_help)
                self.assertEqual(labels, c_labels)
                self.assertIn("node", labels)
                self.assertEqual("gpu" in labels, name.startswith("gpu_"))
                self.assertEqual(set(series), set(c_series))
        # GPU readings of the fake are constant, so the values agree too (units converted alike).
        for name in ("gpu_utilization_ratio", "gpu_sm_clock_hertz", "gpu_memory_used_bytes",
                     "gpu_power_watts", "gpu_throttle_reasons", "gpu_info", "gpu_processes"):
            with self.subTest(values=name):
                self.assertEqual(agent_families[name][3], collector_families[name][3])
        # A GPU in no Kubernetes pod: the pod labels are there, empty (docs/deploy.md).
        key = (("container", ""), ("gpu", "1"), ("namespace", ""), ("node", "node-m"), ("pod", ""))
        self.assertEqual(collector_families["gpu_sm_clock_hertz"][3][key], 1410e6)

    def test_collector_exports_only_the_readings_of_gpus_in_findings(self):
        # node-q: two busy GPUs with processes, never in a finding. node-i: GPU 0 busy, GPU 1
        # idle (30%, no process, no job), an idle_gpu finding after --underutil-window.
        busy = [fake_gpu(0, utilization=90, pids=[4000]), fake_gpu(1, utilization=95, pids=[4001])]
        idle = [fake_gpu(0, utilization=90, pids=[4100]), fake_gpu(1, utilization=30, pids=[])]
        with Collector(self.tmp, underutil_window=1) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-q",
                      fake_nvml_state=fake_nvml_state(busy)) as quiet_agent, \
                Agent(self.tmp, collector.grpc_addr, node="node-i",
                      fake_nvml_state=fake_nvml_state(idle)):
            def idle_found():
                s = collector.scrape()
                return (metric_value(s, "stepwatch_finding", kind="idle_gpu", node="node-i",
                                     gpu=1) == 1
                        and metric_value(s, "stepwatch_collector_nodes") == 2
                        and metric_value(s, "stepwatch_gpu_utilization_ratio", node="node-i",
                                         gpu=1) is not None)

            wait_until(idle_found, timeout=30, message="an idle_gpu finding on node-i GPU 1")
            text = http_get(collector.metrics_url)
            agent_q = families(http_get(quiet_agent.metrics_url), "stepwatch_agent_")

        readings = families(text, "stepwatch_")
        for name in COLLECTOR_ONLY:
            readings.pop(name, None)
        places = set()
        for name, (_, _, _, series) in readings.items():
            for labels in series:
                labels = dict(labels)
                places.add((labels["node"], labels.get("gpu")))
        # The idle GPU and its node's host readings; not node-i's busy GPU 0, nothing of node-q.
        self.assertEqual(places, {("node-i", "1"), ("node-i", None)})
        self.assertEqual(readings["gpu_utilization_ratio"][3],
                         {(("container", ""), ("gpu", "1"), ("namespace", ""), ("node", "node-i"),
                           ("pod", "")): 0.3})
        self.assertIn("host_cpus", readings)
        self.assertIsNone(metric_value(parse_metrics(text), "stepwatch_node_up", node="node-q"))
        # node-q's readings are on its agent's /metrics.
        self.assertEqual(set(agent_q["gpu_utilization_ratio"][3]),
                         {(("container", ""), ("gpu", str(i)), ("namespace", ""), ("node", "node-q"),
                           ("pod", "")) for i in (0, 1)})


if __name__ == "__main__":
    unittest.main()
