"""GPU health through a real agent (fake NVML) and a real collector.

Faults are injected by rewriting the fake NVML's state file (docs/fake-nvml.md): a PCIe link
trained down, uncorrectable ECC errors rising, a row remap pending, an NVLink down and an Xid 79.
Each shows on the agent's /metrics (stepwatch_agent_gpu_*). The collector re-exports the GPU
readings of every node with --export-node-metrics=all (stepwatch_gpu_*), which shows that the
health reached it in the GPU samples; the per-NVLink series are agent-only by design, so the link
that went down is asserted on the agent.
"""

import copy
import os
import tempfile
import time
import unittest

from harness import (BUILD_DIR, Agent, Collector, fake_gpu, fake_nvml_state, metric_value,
                     metric_values, wait_until)

HEALTH_READINGS = ("pcie_link", "pcie_replays", "ecc", "remapped_rows", "nvlink_state",
                   "nvlink_errors", "xid")


def healthy_gpu(index):
    """A busy SXM GPU at PCIe gen 5 x16 with 18 NVLinks up and old, constant error counts."""
    return fake_gpu(index, pids=[4000 + index],
                    pcie_link_gen=5, pcie_link_gen_max=5, pcie_link_width=16,
                    pcie_link_width_max=16, pcie_replays=3,
                    ecc_corrected_volatile=2, ecc_uncorrected_volatile=0,
                    ecc_corrected_aggregate=20, ecc_uncorrected_aggregate=1,
                    remapped_rows_corrected=1, remapped_rows_uncorrected=0,
                    remapped_rows_pending=0, remapped_rows_failure=0,
                    nvlink_up=[1] * 18, nvlink_replay_errors=[0] * 18,
                    nvlink_recovery_errors=[0] * 18, nvlink_crc_flit_errors=[0] * 18,
                    nvlink_crc_data_errors=[0] * 18, xids=[])


class GpuHealthTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-it-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_faults_show_on_the_agent_and_reach_the_collector(self):
        gpus = [healthy_gpu(0), healthy_gpu(1)]
        with Collector(self.tmp, export_node_metrics="all") as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-h",
                      fake_nvml_state=fake_nvml_state(gpus)) as agent:
            def healthy_everywhere():
                a, c = agent.scrape(), collector.scrape()
                return (metric_value(a, "stepwatch_agent_gpu_pcie_link_generation", gpu=1,
                                     kind="current") == 5
                        and metric_value(c, "stepwatch_gpu_pcie_link_generation", node="node-h",
                                         gpu=1, kind="current") == 5)

            wait_until(healthy_everywhere, timeout=30, message="health at agent and collector")
            a = agent.scrape()
            for reading in HEALTH_READINGS:
                self.assertEqual(metric_value(a, "stepwatch_agent_gpu_metric_available", gpu=1,
                                              metric=reading, reason="ok"), 1, reading)
            self.assertEqual(metric_values(a, "stepwatch_agent_gpu_nvlink_up", gpu=1), [1] * 18)
            self.assertEqual(metric_values(a, "stepwatch_agent_gpu_xid_events_total", gpu=1), [])
            self.assertEqual(metric_value(a, "stepwatch_agent_gpu_ecc_errors_total", gpu=1,
                                          type="corrected", counter="aggregate"), 20)
            received_before = metric_value(collector.scrape(),
                                           "stepwatch_collector_gpu_samples_received_total")

            # Faults on GPU 1: gen 3 x8, uncorrectable ECC errors, a pending remap, link 5 down,
            # an Xid 79 (the GPU fell off the bus).
            faulty = copy.deepcopy(gpus)
            faulty[1].update(pcie_link_gen=3, pcie_link_width=8, ecc_uncorrected_volatile=4,
                             ecc_uncorrected_aggregate=5, remapped_rows_pending=1, xids=[79])
            faulty[1]["nvlink_up"][5] = 0
            agent.set_gpus(faulty)

            def agent_sees_faults():
                s = agent.scrape()
                return (metric_value(s, "stepwatch_agent_gpu_nvlink_up", gpu=1, link=5) == 0
                        and metric_value(s, "stepwatch_agent_gpu_xid_events_total", gpu=1,
                                         xid=79) == 1
                        and metric_value(s, "stepwatch_agent_gpu_row_remap_pending", gpu=1) == 1)

            wait_until(agent_sees_faults, timeout=20, message="the faults on the agent's /metrics")
            s = agent.scrape()
            self.assertEqual(metric_value(s, "stepwatch_agent_gpu_pcie_link_generation", gpu=1,
                                          kind="current"), 3)
            self.assertEqual(metric_value(s, "stepwatch_agent_gpu_pcie_link_generation", gpu=1,
                                          kind="max"), 5)
            self.assertEqual(metric_value(s, "stepwatch_agent_gpu_pcie_link_width", gpu=1,
                                          kind="current"), 8)
            self.assertEqual(metric_value(s, "stepwatch_agent_gpu_ecc_errors_total", gpu=1,
                                          type="uncorrected", counter="volatile"), 4)
            self.assertEqual(metric_value(s, "stepwatch_agent_gpu_nvlink_up", gpu=1, link=4), 1)
            self.assertEqual(metric_values(s, "stepwatch_agent_gpu_nvlink_up", gpu=0), [1] * 18)
            self.assertEqual(metric_values(s, "stepwatch_agent_gpu_xid_events_total", gpu=0), [])
            self.assertGreater(metric_value(s, "stepwatch_agent_gpu_xid_last_event_timestamp_seconds",
                                            gpu=1, xid=79), time.time() - 120)

            def collector_sees_faults():
                c = collector.scrape()
                return (metric_value(c, "stepwatch_gpu_pcie_link_generation", node="node-h",
                                     gpu=1, kind="current") == 3
                        and metric_value(c, "stepwatch_gpu_xid_events_total", node="node-h",
                                         gpu=1, xid=79) == 1)

            wait_until(collector_sees_faults, timeout=20, message="the faults at the collector")

            # ECC keeps rising; the Xid, consumed once, is not counted again.
            faulty[1].update(ecc_uncorrected_volatile=9)
            agent.set_gpus(faulty)
            wait_until(lambda: metric_value(collector.scrape(), "stepwatch_gpu_ecc_errors_total",
                                            node="node-h", gpu=1, type="uncorrected",
                                            counter="volatile") == 9,
                       timeout=20, message="the rising ECC count at the collector")
            c = collector.scrape()
            self.assertEqual(metric_value(c, "stepwatch_gpu_pcie_link_width", node="node-h", gpu=1,
                                          kind="current"), 8)
            self.assertEqual(metric_value(c, "stepwatch_gpu_row_remap_pending", node="node-h",
                                          gpu=1), 1)
            self.assertEqual(metric_value(c, "stepwatch_gpu_xid_events_total", node="node-h",
                                          gpu=1, xid=79), 1)
            self.assertEqual(metric_value(agent.scrape(), "stepwatch_agent_gpu_xid_events_total",
                                          gpu=1, xid=79), 1)
            self.assertGreater(metric_value(c, "stepwatch_collector_gpu_samples_received_total"),
                               received_before)
            refused = [v for field in ("gpu_health_nvlinks", "gpu_health_xids")
                       for v in metric_values(c, "stepwatch_collector_fields_refused_total",
                                              field=field)]
            self.assertEqual(sum(refused), 0)
            # Per-link series stay on the agent.
            self.assertEqual(metric_values(c, "stepwatch_gpu_nvlink_up"), [])

    def test_driver_without_the_health_entry_points(self):
        minimal = os.path.abspath(os.path.join(BUILD_DIR, "tests/gpu/fake_nvml_minimal",
                                               "libnvidia-ml.so.1"))
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-m", nvml_library=minimal,
                      fake_nvml_state=fake_nvml_state([healthy_gpu(0)])) as agent:
            def unavailable():
                s = agent.scrape()
                return all(metric_value(s, "stepwatch_agent_gpu_metric_available", gpu=0,
                                        metric=r, reason="missing_entry_point") == 0
                           for r in HEALTH_READINGS)

            wait_until(unavailable, timeout=20, message="health readings marked unavailable")
            s = agent.scrape()
            self.assertEqual(metric_values(s, "stepwatch_agent_gpu_pcie_link_generation"), [])
            self.assertEqual(metric_values(s, "stepwatch_agent_gpu_nvlink_up"), [])
            # Said once per reading, not every interval.
            log = agent.log()
            self.assertEqual(log.count("GPU 0: xid unavailable"), 1, log[-3000:])


if __name__ == "__main__":
    unittest.main()
