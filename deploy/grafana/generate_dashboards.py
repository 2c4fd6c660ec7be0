#!/usr/bin/env python3
"""Generates the stepwatch Grafana dashboards (deploy/grafana/dashboards/*.json).

The JSON files are committed; this script is their source. After editing it, run
`python3 deploy/grafana/generate_dashboards.py` and commit the result (a test checks that the
committed files match). Every query uses `=~"$job"` / `=~"$node"` so multi-value selection works.

Collector replicas: every job is analysed by R collectors that export the same series, differing
only in instance/pod. Every query reduces them with `max by (...)` over the labels that say what
(never instance) before it sums or counts, so a panel shows what one collector would, and a replica
that restarts or a job that moves leaves no gap. Per-collector health (refusals, connections) is
shown per instance.

GPU and host readings: the collector exports them only for GPUs and nodes in findings; every GPU's
readings are on the agents' /metrics (stepwatch_agent_gpu_*, stepwatch_agent_host_*). Node panels
read the agents' series, and the collector's where no agent is scraped (`node_reading`).
"""

import json
import os
import sys

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboards")

# NVML clocks-throttle-reasons bits, as the stepwatch_gpu_throttle_reasons value shows them.
THROTTLE_MAPPINGS = [
    {"type": "value", "options": {
        "0": {"text": "none", "color": "green", "index": 0},
        "1": {"text": "GPU idle", "color": "blue", "index": 1},
        "2": {"text": "application clocks", "color": "blue", "index": 2},
        "4": {"text": "SW power cap", "color": "orange", "index": 3},
        "8": {"text": "HW slowdown", "color": "red", "index": 4},
        "16": {"text": "sync boost", "color": "orange", "index": 5},
        "32": {"text": "SW thermal", "color": "red", "index": 6},
        "64": {"text": "HW thermal", "color": "red", "index": 7},
        "128": {"text": "HW power brake", "color": "red", "index": 8},
    }},
    {"type": "range", "options": {"from": 1, "to": 1e18,
                                  "result": {"text": "several reasons", "color": "red",
                                             "index": 9}}},
]


class Layout:
    """Places panels left to right on a 24-column grid, wrapping to a new row."""

    def __init__(self):
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1
        self.panels = []

    def add(self, panel, w, h):
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        panel["id"] = self.next_id
        self.next_id += 1
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(panel)

    def row(self, title):
        if self.x:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        self.panels.append({"id": self.next_id, "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.next_id += 1
        self.y += 1


def target(expr, legend="", ref="A", instant=False, fmt="time_series"):
    t = {"datasource": DATASOURCE, "refId": ref, "expr": expr, "legendFormat": legend,
         "format": fmt}
    if instant:
        t.update({"instant": True, "range": False})
    else:
        t.update({"instant": False, "range": True})
    return t


def field_config(unit=None, minimum=None, maximum=None, thresholds=None, mappings=None,
                 custom=None):
    defaults = {"custom": custom or {}}
    if unit:
        defaults["unit"] = unit
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    defaults["thresholds"] = {"mode": "absolute", "steps": thresholds or [
        {"color": "green", "value": None}]}
    if mappings:
        defaults["mappings"] = mappings
    return {"defaults": defaults, "overrides": []}


def timeseries(title, description, targets, unit=None, stacked=False, minimum=None, maximum=None):
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
              "spanNulls": False}
    if stacked:
        custom.update({"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60})
    return {"type": "timeseries", "title": title, "description": description,
            "datasource": DATASOURCE, "targets": targets,
            "fieldConfig": field_config(unit, minimum, maximum, custom=custom),
            "options": {"legend": {"displayMode": "table", "placement": "right",
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title, description, expr, unit=None, thresholds=None, decimals=None, legend="{{job}}"):
    panel = {"type": "stat", "title": title, "description": description,
             "datasource": DATASOURCE, "targets": [target(expr, legend, instant=True)],
             "fieldConfig": field_config(unit, thresholds=thresholds),
             "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                         "colorMode": "value", "graphMode": "none", "textMode": "auto",
                         "justifyMode": "auto", "orientation": "auto"}}
    if decimals is not None:
        panel["fieldConfig"]["defaults"]["decimals"] = decimals
    return panel


def table(title, description, targets, renames, unit_overrides=None, mappings=None):
    """An instant table: several queries merged on their common labels."""
    overrides = []
    for column, unit in (unit_overrides or {}).items():
        overrides.append({"matcher": {"id": "byName", "options": column},
                          "properties": [{"id": "unit", "value": unit}]})
    config = field_config(mappings=mappings)
    config["overrides"] = overrides
    transformations = []
    if len(targets) > 1:
        transformations.append({"id": "merge", "options": {}})
    transformations.append({"id": "organize", "options": {
        "excludeByName": {"Time": True, "__name__": True, "instance": True},
        "renameByName": renames}})
    return {"type": "table", "title": title, "description": description,
            "datasource": DATASOURCE, "targets": targets, "fieldConfig": config,
            "transformations": transformations,
            "options": {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}}


def bargauge(title, description, targets, unit=None, minimum=None, maximum=None,
             thresholds=None):
    return {"type": "bargauge", "title": title, "description": description,
            "datasource": DATASOURCE, "targets": targets,
            "fieldConfig": field_config(unit, minimum, maximum, thresholds=thresholds),
            "options": {"orientation": "horizontal", "displayMode": "gradient",
                        "showUnfilled": True,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                          "values": False}}}


def heatmap(title, description, targets, unit=None):
    return {"type": "heatmap", "title": title, "description": description,
            "datasource": DATASOURCE, "targets": targets,
            "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}},
                            "overrides": []},
            "options": {"calculate": False, "cellGap": 1,
                        "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64,
                                  "exponent": 0.5, "reverse": False},
                        "yAxis": {"axisPlacement": "left", "reverse": False,
                                  "axisLabel": "rank"},
                        "rowsFrame": {"layout": "auto"},
                        "cellValues": {"unit": unit or "s"},
                        "tooltip": {"show": True, "yHistogram": False},
                        "legend": {"show": True}}}


def datasource_variable():
    return {"name": "datasource", "label": "Prometheus", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
            "options": []}


def query_variable(name, label, query, multi=True):
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "definition": query, "query": {"query": query, "refId": f"{name}-values"},
            "refresh": 2, "sort": 1, "multi": multi, "includeAll": True, "allValue": ".*",
            "current": {}, "hide": 0, "options": [], "regex": ""}


def dashboard(uid, title, description, panels, variables, links):
    return {
        "uid": uid, "title": title, "description": description,
        "tags": ["stepwatch"], "editable": True, "graphTooltip": 1, "timezone": "browser",
        "schemaVersion": 38, "version": 1, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "templating": {"list": [datasource_variable()] + variables},
        "links": links, "panels": panels,
    }


def link(title, uid, keep_vars=True):
    return {"type": "link", "title": title, "url": f"/d/{uid}", "includeVars": keep_vars,
            "keepTime": True, "asDropdown": False, "icon": "dashboard", "tags": []}


def node_reading(metric, selector="", by="node, gpu", rate=False):
    """Every GPU's (or node's) reading `metric` (named without prefix, e.g. gpu_utilization_ratio):
    from the agents, else from the collectors (only GPUs in findings), one series per GPU; with
    `rate`, the per-second rate of a counter."""
    def one(name):
        series = f"{name}{selector}"
        return f"rate({series}[$__rate_interval])" if rate else series
    return (f"max by ({by}) ({one('stepwatch_agent_' + metric)}) or "
            f"max by ({by}) ({one('stepwatch_' + metric)})")


PCT_THRESHOLDS = [{"color": "red", "value": None}, {"color": "orange", "value": 0.5},
                  {"color": "green", "value": 0.8}]


def cluster_overview():
    L = Layout()
    L.row("Cluster")
    L.add(stat("Jobs", "Training jobs reporting to the collector.",
               "count(max by (job) (stepwatch_job_step_seconds))", legend=""), 4, 4)
    L.add(stat("Ranks reporting", "Ranks that reported recently, over all jobs.",
               "sum(max by (job) (stepwatch_job_ranks_reporting))", legend=""), 4, 4)
    L.add(stat("Nodes up", "Nodes whose agent has its streams to the collectors open (or, "
               "where agents are not scraped, that a collector reports up).",
               "count(max by (node) (stepwatch_agent_connected) == 1 or "
               "max by (node) (stepwatch_node_up) == 1)", legend=""), 4, 4)
    L.add(stat("GPUs", "GPUs seen on all nodes.",
               f"count({node_reading('gpu_utilization_ratio')})", legend=""), 4, 4)
    L.add(stat("Mean GPU utilization", "NVML utilization averaged over all GPUs.",
               f"avg({node_reading('gpu_utilization_ratio')})", "percentunit",
               PCT_THRESHOLDS, legend=""), 4, 4)
    L.add(stat("Active findings", "Stragglers, underutilized GPUs, stalls and more.",
               "sum(max by (job, kind, severity) (stepwatch_findings)) or vector(0)",
               thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}],
               legend=""), 4, 4)
    L.row("Jobs")
    L.add(table("Jobs", "One row per training job: recent median step time, efficiency "
                "(ideal / actual step time), throughput and active findings.", [
                    target("max by (job) (stepwatch_job_step_seconds)", ref="A", instant=True,
                           fmt="table"),
                    target("max by (job) (stepwatch_job_efficiency_ratio)", ref="B",
                           instant=True, fmt="table"),
                    target("max by (job) (stepwatch_job_steps_per_second)", ref="C",
                           instant=True, fmt="table"),
                    target("max by (job) (stepwatch_job_samples_per_second)", ref="D",
                           instant=True, fmt="table"),
                    target("max by (job) (stepwatch_job_world_size)", ref="E", instant=True,
                           fmt="table"),
                    target("max by (job) (stepwatch_job_last_step)", ref="F", instant=True,
                           fmt="table"),
                    target("sum by (job) (max by (job, kind, severity) (stepwatch_findings)) "
                           "or max by (job) (stepwatch_job_world_size) * 0", ref="G",
                           instant=True, fmt="table"),
                    target("count by (job) (max by (job, rank) (stepwatch_straggler)) or "
                           "max by (job) (stepwatch_job_world_size) * 0", ref="H", instant=True,
                           fmt="table"),
                ], {"job": "Job", "Value #A": "Step time", "Value #B": "Efficiency",
                    "Value #C": "Steps/s", "Value #D": "Samples/s", "Value #E": "World size",
                    "Value #F": "Last step", "Value #G": "Findings",
                    "Value #H": "Flagged ranks"},
                {"Step time": "s", "Efficiency": "percentunit", "Samples/s": "short"}), 24, 7)
    L.add(timeseries("Efficiency by job", "Ideal step time (median busy time) / actual step "
                     "time. Low: time goes to waiting for stragglers, communication or data.",
                     [target("max by (job) (stepwatch_job_efficiency_ratio)", "{{job}}")],
                     "percentunit", minimum=0, maximum=1), 12, 8)
    L.add(timeseries("Throughput by job", "Samples per second, summed over ranks.",
                     [target("max by (job) (stepwatch_job_samples_per_second)", "{{job}}")],
                     "short", minimum=0), 12, 8)
    L.row("Findings")
    L.add(table("Active findings", "One row per active finding: what (kind), where (job, "
                "rank, node, GPU, pipeline stage) and why (cause). A slow node or a slow stage "
                "is one row for all its ranks. Run `stepwatchctl explain JOB` for details.",
                [target("max by (kind, severity, job, rank, node, gpu, stage, cause) "
                        "(stepwatch_finding)", instant=True, fmt="table")],
                {"kind": "Kind", "severity": "Severity", "job": "Job", "rank": "Rank",
                 "node": "Node", "gpu": "GPU", "stage": "Stage", "cause": "Cause",
                 "Value": "Active"}), 14, 8)
    L.add(timeseries("Findings by kind", "Active findings over time, by kind.",
                     [target("sum by (kind) (max by (job, kind, severity) (stepwatch_findings))",
                             "{{kind}}")], "short",
                     stacked=True, minimum=0), 10, 8)
    L.row("GPUs")
    L.add(timeseries("GPU utilization by node", "Mean NVML utilization of each node's GPUs. "
                     "NVML counts a spinning communication kernel as busy: compare SM activity "
                     "in the node view.",
                     [target(f"avg by (node) ({node_reading('gpu_utilization_ratio')})",
                             "{{node}}")],
                     "percentunit", minimum=0, maximum=1), 12, 8)
    L.add(bargauge("Underutilized GPUs by job", "GPUs of each job flagged as underutilized.",
                   [target("count by (job) (max by (job, node, gpu) "
                           "(stepwatch_gpu_underutilized)) or "
                           "max by (job) (stepwatch_job_world_size) * 0", "{{job}}",
                           instant=True)], "short", minimum=0,
                   thresholds=[{"color": "green", "value": None},
                               {"color": "orange", "value": 1}]), 12, 8)
    L.row("Monitoring health")
    L.add(timeseries("Step events lost before analysis", "Step events that never reached the "
                     "analysis, per 10 minutes: refused sends counted by the training processes "
                     "themselves (client), dropped by agents (too many pending, buffer full) and "
                     "refused by each collector (invalid, over a limit; a job's R replicas each "
                     "count its refused steps). Should be 0.",
                     [target("sum by (job) (increase(stepwatch_agent_client_dropped_events_total"
                             "[10m]))", "client: {{job}}", ref="A"),
                      target("sum by (node) (increase(stepwatch_agent_events_dropped_total[10m]))",
                             "agent: {{node}}", ref="B"),
                      target("sum by (instance, reason) (increase("
                             "stepwatch_collector_steps_rejected_total[10m]))",
                             "collector {{instance}}: {{reason}}", ref="C")],
                     "short", minimum=0), 12, 8)
    L.add(timeseries("/metrics connections refused or evicted", "Connections the collector's "
                     "and agents' /metrics servers refused or evicted at their connection cap "
                     "(--metrics-max-connections), per 10 minutes. Non-zero: something holds "
                     "connections open.",
                     [target("sum by (instance) (increase("
                             "stepwatch_metrics_http_connections_refused_total[10m]))",
                             "refused: {{instance}}", ref="A"),
                      target("sum by (instance) (increase(stepwatch_metrics_http_connections_"
                             "closed_total{reason=\"evicted\"}[10m]))", "evicted: {{instance}}",
                             ref="B")],
                     "short", minimum=0), 12, 8)
    return dashboard("stepwatch-overview", "stepwatch / Cluster overview",
                     "Training jobs, their efficiency and findings, and GPU utilization.",
                     L.panels, [], [link("Job view", "stepwatch-job", False),
                                    link("Node view", "stepwatch-node", False)])


def job_view():
    J = '{job=~"$job"}'
    L = Layout()
    L.row("Job")
    L.add(stat("Step time", "Recent median step time.",
               f"max by (job) (stepwatch_job_step_seconds{J})", "s"), 4, 4)
    L.add(stat("Efficiency", "Ideal step time / actual step time.",
               f"max by (job) (stepwatch_job_efficiency_ratio{J})", "percentunit",
               PCT_THRESHOLDS), 4, 4)
    L.add(stat("Steps per second", "1 / median step time.",
               f"max by (job) (stepwatch_job_steps_per_second{J})", "short", decimals=2), 4, 4)
    L.add(stat("Samples per second", "Summed over ranks.",
               f"max by (job) (stepwatch_job_samples_per_second{J})", "short"), 4, 4)
    L.add(stat("Ranks reporting", "Ranks that reported recently / world size.",
               f"max by (job) (stepwatch_job_ranks_reporting{J})"), 4, 4)
    L.add(stat("Stragglers", "Ranks flagged now: alone, in a slow node or in the slowest "
               "stage of an imbalanced pipeline.",
               f"count by (job) (max by (job, rank) (stepwatch_straggler{J})) or "
               f"max by (job) (stepwatch_job_world_size{J}) * 0",
               thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]),
          4, 4)
    L.row("Step")
    L.add(timeseries("Step time", "Recent median step time. Every rank of a synchronous job "
                     "reports about the same step time; the breakdown shows where it goes.",
                     [target(f"max by (job) (stepwatch_job_step_seconds{J})", "{{job}}")], "s",
                     minimum=0), 12, 8)
    L.add(timeseries("Efficiency and scaling efficiency",
                     "Efficiency: ideal / actual step time. Scaling efficiency: per-GPU "
                     "throughput vs the best at a smaller world size.",
                     [target(f"max by (job) (stepwatch_job_efficiency_ratio{J})",
                             "efficiency {{job}}", "A"),
                      target(f"max by (job) (stepwatch_job_scaling_efficiency_ratio{J})",
                             "scaling {{job}}", "B")],
                     "percentunit", minimum=0, maximum=1), 12, 8)
    L.add(timeseries("Time breakdown", "Share of the step: compute, imbalance (waiting for the "
                     "slowest rank), exposed communication, data loading, other.",
                     [target(f"max by (job, component) (stepwatch_job_time_ratio{J})",
                             "{{component}} {{job}}")],
                     "percentunit", stacked=True, minimum=0, maximum=1), 12, 8)
    L.add(bargauge("What-if speed-ups", "Estimated speed-up if each cause were removed: "
                   "stragglers fixed, communication fully overlapped, no data stall.",
                   [target(f"max by (job, fix) (stepwatch_job_whatif_speedup_ratio{J})",
                           "{{fix}} ({{job}})", instant=True)], "x", minimum=1,
                   thresholds=[{"color": "green", "value": None},
                               {"color": "orange", "value": 1.1},
                               {"color": "red", "value": 1.25}]), 12, 8)
    L.row("Ranks")
    L.add(heatmap("Busy time per rank", "Median busy time (data + compute) of every flagged "
                  "rank and the job's slowest others (the collector's --top-ranks). A straggler "
                  "is the row that stays dark.",
                  [target(f"max by (rank) (stepwatch_rank_busy_seconds{J})", "{{rank}}")],
                  "s"), 14, 10)
    L.add(bargauge("Busy time vs peers", "Busy time of the flagged and slowest ranks relative "
                   "to their "
                   "peers' median: 1.3 means 30% slower than a typical rank.",
                   [target(f"max by (job, rank, node) (stepwatch_rank_busy_vs_median_ratio{J})",
                           "rank {{rank}} on {{node}} ({{job}})", instant=True)], "x",
                   minimum=1,
                   thresholds=[{"color": "green", "value": None},
                               {"color": "orange", "value": 1.06},
                               {"color": "red", "value": 1.15}]), 10, 10)
    L.add(table("Stragglers", "Every flagged rank (alone, in a slow node or in the slowest "
                "pipeline stage), with its node. Look at the node view for clocks, throttling "
                "and host CPU.",
                [target(f"max by (job, rank, node) (stepwatch_straggler{J})", instant=True,
                        fmt="table")],
                {"job": "Job", "rank": "Rank", "node": "Node", "Value": "Straggler"}), 8, 8)
    L.add(bargauge("Flagged ranks by node", "Flagged ranks on each node: a slow node shows "
                   "all its ranks.",
                   [target(f"count by (node) (max by (job, node, rank) (stepwatch_straggler{J}))",
                           "{{node}}", instant=True)], "short", minimum=0,
                   thresholds=[{"color": "green", "value": None},
                               {"color": "red", "value": 1}]), 6, 8)
    L.add(table("Findings", "Active findings of the job: what (kind), where (rank, node, GPU, "
                "pipeline stage) and why (cause). Slow nodes and slow pipeline stages are one "
                "row each.",
                [target(f"max by (kind, severity, rank, node, gpu, stage, cause) "
                        f"(stepwatch_finding{J})", instant=True, fmt="table")],
                {"kind": "Kind", "severity": "Severity", "rank": "Rank", "node": "Node",
                 "gpu": "GPU", "stage": "Stage", "cause": "Cause", "Value": "Active"}), 10, 8)
    L.add(timeseries("Progress", "Steps per second measured from the last reported step.",
                     [target(f"max by (job) (deriv(stepwatch_job_last_step{J}"
                             "[$__rate_interval]))", "{{job}}")], "short", minimum=0), 24, 6)
    return dashboard("stepwatch-job", "stepwatch / Job",
                     "One training job: step time, efficiency, time breakdown, what-if "
                     "speed-ups, per-rank busy time and stragglers.",
                     L.panels, [query_variable("job", "Job",
                                               "label_values(stepwatch_job_step_seconds, job)")],
                     [link("Cluster overview", "stepwatch-overview", False),
                      link("Node view", "stepwatch-node", False)])


def node_view():
    N = '{node=~"$node"}'
    L = Layout()
    L.row("GPUs")

    def gpu_series(title, description, metric, unit, minimum=None, maximum=None):
        L.add(timeseries(title, description,
                         [target(node_reading(metric, N), "{{node}} GPU {{gpu}}")],
                         unit, minimum=minimum, maximum=maximum), 12, 8)

    gpu_series("GPU utilization", "NVML utilization: fraction of time a kernel was running.",
               "gpu_utilization_ratio", "percentunit", 0, 1)
    gpu_series("SM activity", "Fraction of SMs busy (GPM). Lower than utilization means "
               "kernels that occupy few SMs, or spinning communication kernels.",
               "gpu_sm_activity_ratio", "percentunit", 0, 1)
    gpu_series("DRAM bandwidth", "Device memory bandwidth utilization (GPM).",
               "gpu_dram_bandwidth_ratio", "percentunit", 0, 1)
    L.add(timeseries("SM clock", "SM clock of each GPU and the maximum clock; a clock below "
                     "the maximum under load means throttling or power capping.",
                     [target(node_reading("gpu_sm_clock_hertz", N), "{{node}} GPU {{gpu}}",
                             "A"),
                      target(node_reading("gpu_sm_clock_max_hertz", N, by="node"),
                             "max {{node}}", "B")], "hertz", minimum=0), 12, 8)
    L.add(table("Throttle reasons", "NVML clocks-throttle-reasons per GPU (0: not throttled).",
                [target(node_reading("gpu_throttle_reasons", N), instant=True, fmt="table")],
                {"node": "Node", "gpu": "GPU", "Value": "Throttle reasons"},
                mappings=THROTTLE_MAPPINGS), 8, 8)
    gpu_series_small = [
        ("Power", "Power draw.", "gpu_power_watts", "watt"),
        ("Temperature", "GPU temperature.", "gpu_temperature_celsius", "celsius"),
    ]
    for title, description, metric, unit in gpu_series_small:
        L.add(timeseries(title, description,
                         [target(node_reading(metric, N), "{{node}} GPU {{gpu}}")],
                         unit), 8, 8)
    L.add(timeseries("GPU memory used", "Device memory in use.",
                     [target(node_reading("gpu_memory_used_bytes", N), "{{node}} GPU {{gpu}}")],
                     "bytes", minimum=0), 12, 8)
    L.add(table("Findings", "Active findings on these nodes, hardware faults among them "
                "(gpu_health: a GPU's Xid, ECC, row remap, NVLink or PCIe fault; nic_health: a "
                "network port, in Port).",
                [target(f"max by (kind, severity, job, rank, node, gpu, device, cause) "
                        f"(stepwatch_finding{N})", instant=True, fmt="table")],
                {"kind": "Kind", "severity": "Severity", "job": "Job", "rank": "Rank",
                 "node": "Node", "gpu": "GPU", "device": "Port", "cause": "Cause",
                 "Value": "Active"}), 12, 8)
    L.row("Hardware health")
    L.add(table("PCIe links", "Current and maximum PCIe generation and width per GPU; an idle "
                "GPU trains down to save power, a busy one under its maximum is a fault.",
                [target(node_reading("gpu_pcie_link_generation", N, by="node, gpu, kind"),
                        instant=True, fmt="table", ref="A"),
                 target(node_reading("gpu_pcie_link_width", N, by="node, gpu, kind"),
                        instant=True, fmt="table", ref="B")],
                {"node": "Node", "gpu": "GPU", "kind": "Kind", "Value #A": "Generation",
                 "Value #B": "Width"}), 12, 8)
    L.add(timeseries("ECC errors", "Corrected and uncorrected ECC errors per GPU, volatile "
                     "(since the driver loaded) and aggregate; any rise of uncorrected ones is a "
                     "fault.",
                     [target(node_reading("gpu_ecc_errors_total", N,
                                          by="node, gpu, type, counter"),
                             "{{node}} GPU {{gpu}} {{type}} {{counter}}")], "short", minimum=0),
          8, 8)
    L.add(timeseries("Xid events", "Xid errors from the driver per GPU and code (events per "
                     "minute).",
                     [target("(" + node_reading("gpu_xid_events_total", N, by="node, gpu, xid",
                                                rate=True) + ") * 60",
                             "{{node}} GPU {{gpu}} Xid {{xid}}")], "short", minimum=0), 8, 8)
    L.add(timeseries("Network ports up", "1 while an InfiniBand / RoCE port is ACTIVE and "
                     "LinkUp.",
                     [target(node_reading("nic_port_up", N, by="node, device"),
                             "{{node}} {{device}}")], "short", minimum=0, maximum=1), 8, 8)
    L.add(timeseries("Network port errors", "Symbol and receive errors and link-down events "
                     "per port (per minute).",
                     [target("(" + node_reading("nic_port_errors_total", N,
                                                by="node, device, counter", rate=True) + ") * 60",
                             "{{node}} {{device}} {{counter}}")], "short", minimum=0), 12, 8)
    L.row("Host")
    L.add(timeseries("Host CPU utilization", "Busy fraction of all CPUs. A saturated host CPU "
                     "starves the data loader and the GPUs.",
                     [target(node_reading("host_cpu_utilization_ratio", N, by="node"),
                             "{{node}}")], "percentunit", minimum=0, maximum=1), 8, 8)
    L.add(timeseries("Host memory bandwidth", "From resctrl (MBM) or perf uncore counters; "
                     "absent where the kernel exposes neither.",
                     [target(node_reading("host_memory_bandwidth_bytes_per_second", N,
                                          by="node"), "{{node}}")], "Bps", minimum=0), 8, 8)
    L.add(timeseries("Host memory used", "Total minus available memory.",
                     [target(f"({node_reading('host_memory_total_bytes', N, by='node')}) - "
                             f"({node_reading('host_memory_available_bytes', N, by='node')})",
                             "{{node}}")], "bytes", minimum=0), 8, 8)
    L.add(timeseries("Host network", "Bytes per second on non-loopback interfaces.",
                     [target(node_reading("host_network_receive_bytes_total", N, by="node",
                                          rate=True), "receive {{node}}", "A"),
                      target(node_reading("host_network_transmit_bytes_total", N, by="node",
                                          rate=True), "transmit {{node}}", "B")], "Bps",
                     minimum=0), 12, 8)
    L.add(timeseries("Node reporting", "Agent: 1 while the node's agent has its streams to "
                     "the collectors open. Collector: 1 while a collector hears from the node; "
                     "exported for nodes in findings and nodes gone quiet (0), which a collector "
                     "the node's samples moved away from also reports until it expires them.",
                     [target(f"max by (node) (stepwatch_agent_connected{N})", "agent {{node}}",
                             "A"),
                      target(f"max by (node) (stepwatch_node_up{N})", "collector {{node}}", "B")],
                     "short", minimum=0, maximum=1), 12, 8)
    return dashboard("stepwatch-node", "stepwatch / Node",
                     "One or more nodes: GPU utilization, SM activity, DRAM bandwidth, clocks "
                     "and throttling, hardware health (PCIe, ECC, Xid, network ports), host "
                     "CPU, memory and memory bandwidth.",
                     L.panels, [query_variable("node", "Node",
                                               "label_values(stepwatch_agent_nvml_available, "
                                               "node)")],
                     [link("Cluster overview", "stepwatch-overview", False),
                      link("Job view", "stepwatch-job", False)])


DASHBOARDS = {
    "stepwatch-overview.json": cluster_overview,
    "stepwatch-job.json": job_view,
    "stepwatch-node.json": node_view,
}


def render(builder):
    return json.dumps(builder(), indent=2) + "\n"


def main(argv):
    out_dir = argv[1] if len(argv) > 1 else OUT_DIR
    os.makedirs(out_dir, exist_ok=True)
    for name, builder in DASHBOARDS.items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(render(builder))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
