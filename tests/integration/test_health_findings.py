"""Hardware health findings end to end: a real agent reads GPU faults from the fake NVML (and
network ports from a fake sysfs tree under --host-root), a real collector judges them, and the
findings reach stepwatchctl and /metrics with their cause; a straggler on a faulty GPU carries
the fault as its cause. A healthy node (old constant counts, an idle GPU trained down to gen 1, an
unused port) yields none."""

import copy
import os
import tempfile
import unittest

from harness import (Agent, Collector, ctl_json, fake_gpu, fake_nvml_state, metric_samples,
                     metric_value, step_event, wait_until)
from nic_sysfs import FakeNicSysfs


def gpu(index, **overrides):
    """A busy GPU at PCIe gen 5 x16 with 4 NVLinks up and old, constant error counts."""
    fields = dict(pcie_link_gen=5, pcie_link_gen_max=5, pcie_link_width=16,
                  pcie_link_width_max=16, pcie_replays=7,
                  ecc_corrected_volatile=3, ecc_uncorrected_volatile=2,
                  ecc_corrected_aggregate=30, ecc_uncorrected_aggregate=2,
                  remapped_rows_corrected=1, remapped_rows_uncorrected=0,
                  remapped_rows_pending=0, remapped_rows_failure=0,
                  nvlink_up=[1] * 4, nvlink_replay_errors=[5] * 4,
                  nvlink_recovery_errors=[0] * 4, nvlink_crc_flit_errors=[1] * 4,
                  nvlink_crc_data_errors=[0] * 4, xids=[])
    fields["pids"] = [4000 + index]
    fields.update(overrides)
    return fake_gpu(index, **fields)


def health_findings(collector, kind="gpu_health"):
    return sorted((f["node"], f["gpu"], f.get("device", ""), f["cause"], f["severity"])
                  for f in ctl_json(collector.grpc_addr, "findings").get("findings", [])
                  if f["kind"] == kind)


def finding_series(collector, kind):
    return sorted((l.get("node"), l.get("gpu"), l.get("device"), l.get("cause"))
                  for l, v in metric_samples(collector.scrape(), "stepwatch_finding")
                  if v == 1 and l.get("kind") == kind)


def wait_for_more_samples(collector, counter, more):
    """Waits until the collector has received `more` further samples (counted by `counter`)."""
    start = metric_value(collector.scrape(), counter) or 0
    wait_until(lambda: (metric_value(collector.scrape(), counter) or 0) >= start + more,
               timeout=30, message="%d more samples (%s)" % (more, counter))


class HealthFindingsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-health-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_each_gpu_fault_is_its_own_finding_and_a_healthy_node_has_none(self):
        # GPU 1 idles at gen 1 x16 (power saving, no fault); the others are busy and healthy.
        gpus = ([gpu(0), gpu(1, utilization=0, pids=[], pcie_link_gen=1)] +
                [gpu(i) for i in range(2, 8)])
        with Collector(self.tmp, export_node_metrics="all") as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-h",
                      fake_nvml_state=fake_nvml_state(gpus)) as agent:
            wait_until(lambda: metric_samples(collector.scrape(), "stepwatch_gpu_pcie_replays_total"),
                       timeout=30, message="the GPUs' health at the collector")
            # Several more readings of the healthy node judged: no health finding.
            wait_for_more_samples(collector, "stepwatch_collector_gpu_samples_received_total",
                                  5 * len(gpus))
            self.assertEqual(health_findings(collector), [])

            faulty = copy.deepcopy(gpus)
            faulty[0]["ecc_uncorrected_volatile"] = 5      # rose from 2
            faulty[2]["xids"] = [79]                        # fell off the bus
            faulty[3]["remapped_rows_failure"] = 1
            faulty[3]["remapped_rows_pending"] = 1
            faulty[4].update(pcie_link_gen=3, pcie_link_width=8)  # busy, trained down
            faulty[5]["pcie_replays"] = 7 + 150
            faulty[6]["nvlink_replay_errors"] = [5, 5, 5 + 12, 5]
            faulty[7]["remapped_rows_pending"] = 1
            agent.set_gpus(faulty)
            expected = [("node-h", 0, "", "ecc_uncorrected", "critical"),
                        ("node-h", 2, "", "xid", "critical"),
                        ("node-h", 3, "", "row_remap_failure", "critical"),
                        ("node-h", 4, "", "pcie_downgraded", "warning"),
                        ("node-h", 5, "", "pcie_replays", "warning"),
                        ("node-h", 6, "", "nvlink_errors", "warning"),
                        ("node-h", 7, "", "row_remap_pending", "warning")]
            wait_until(lambda: health_findings(collector) == expected, timeout=30,
                       message="one gpu_health finding per faulty GPU: %s" % expected)
            self.assertEqual(finding_series(collector, "gpu_health"),
                             [(n, str(g), d, c) for n, g, d, c, _ in expected])
            by_gpu = {f["gpu"]: f for f in ctl_json(collector.grpc_addr, "findings")["findings"]
                      if f["kind"] == "gpu_health"}
            self.assertIn("Xid 79 (GPU has fallen off the bus)", by_gpu[2]["summary"])
            self.assertIn("no job on the node", by_gpu[2]["summary"])
            self.assertEqual(by_gpu[3]["causes"], ["row_remap_failure", "row_remap_pending"])
            self.assertIn("replace", by_gpu[3]["action"])
            self.assertIn("PCIe gen 3 x8 of gen 5 x16 while busy", by_gpu[4]["summary"])
            self.assertIn("150 PCIe replays", by_gpu[5]["summary"])
            self.assertIn("12 NVLink errors", by_gpu[6]["summary"])
            self.assertIn("reset", by_gpu[7]["action"])

    def test_a_straggler_on_a_faulty_gpu_carries_the_fault_as_its_cause(self):
        gpus = [gpu(i) for i in range(4)]
        gpus[2]["nvlink_up"][3] = 1
        with Collector(self.tmp, export_node_metrics="all") as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-s",
                      fake_nvml_state=fake_nvml_state(gpus)) as agent:
            wait_until(lambda: metric_samples(collector.scrape(), "stepwatch_gpu_pcie_replays_total"),
                       timeout=30, message="the GPUs' health at the collector")
            faulty = copy.deepcopy(gpus)
            faulty[2]["nvlink_up"][3] = 0  # was up: down now
            agent.set_gpus(faulty)
            wait_until(lambda: health_findings(collector) ==
                       [("node-s", 2, "", "nvlink_down", "critical")],
                       timeout=30, message="the NVLink finding")

            def stragglers():
                return [f for f in ctl_json(collector.grpc_addr, "findings", "train")["findings"]
                        if f["kind"] == "straggler"]

            step = 0
            for _ in range(40):
                for rank in range(4):
                    busy = 0.14 * (1.3 if rank == 2 else 1.0)
                    agent.send(step_event("train", rank, 4, step, 0.2, data_s=0.0,
                                          compute_s=busy, comm_s=0.2 - busy, samples=32,
                                          local_rank=rank, gpu=rank))
                step += 1
            wait_until(lambda: [f["rank"] for f in stragglers()] == [2], timeout=30,
                       message="rank 2 flagged")
            f = stragglers()[0]
            self.assertEqual(f["cause"], "nvlink_down")
            self.assertIn("GPU fault: NVLink 3 down", f["summary"])
            self.assertIn("NVLinks", f["action"])
            # The GPU's health finding now names the job at risk.
            health = [h for h in ctl_json(collector.grpc_addr, "findings")["findings"]
                      if h["kind"] == "gpu_health"]
            self.assertEqual(len(health), 1)
            self.assertIn("jobs on the node: train", health[0]["summary"])

    def test_each_network_port_fault_is_its_own_finding(self):
        # Three HDR ports up and one that was never up (unused): no finding.
        sysfs = FakeNicSysfs(os.path.join(self.tmp, "host"), devices=4)
        sysfs.set_state("mlx5_3:1", 1, 3)
        sysfs.set_counter("mlx5_0:1", "symbol_error", 900)  # old errors: history
        with Collector(self.tmp, export_node_metrics="all") as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-n",
                      host_root=sysfs.root) as agent:
            wait_until(lambda: len(metric_samples(collector.scrape(),
                                                  "stepwatch_nic_port_up")) == 4,
                       timeout=30, message="the ports at the collector")
            wait_for_more_samples(collector, "stepwatch_collector_host_samples_received_total", 5)
            self.assertEqual(health_findings(collector, "nic_health"), [])

            sysfs.set_state("mlx5_1:1", 1, 3)                     # down
            sysfs.set_rate("mlx5_2:1", "100 Gb/sec (2X HDR)")     # trained at half the lanes
            sysfs.set_counter("mlx5_0:1", "symbol_error", 950)    # rising
            expected = [("node-n", -1, "mlx5_0:1", "nic_errors", "warning"),
                        ("node-n", -1, "mlx5_1:1", "nic_down", "critical"),
                        ("node-n", -1, "mlx5_2:1", "nic_degraded", "warning")]
            wait_until(lambda: health_findings(collector, "nic_health") == expected, timeout=30,
                       message="one nic_health finding per faulty port: %s" % expected)
            self.assertEqual(finding_series(collector, "nic_health"),
                             [("node-n", "", "mlx5_0:1", "nic_errors"),
                              ("node-n", "", "mlx5_1:1", "nic_down"),
                              ("node-n", "", "mlx5_2:1", "nic_degraded")])
            down = [f for f in ctl_json(collector.grpc_addr, "findings")["findings"]
                    if f["kind"] == "nic_health" and f.get("device") == "mlx5_1:1"][0]
            self.assertIn("port mlx5_1:1 down", down["summary"])
            self.assertIn("cable", down["action"])


if __name__ == "__main__":
    unittest.main()
