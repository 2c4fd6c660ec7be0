"""stepwatch-agent and stepwatch-gpu-probe against the fake NVML emulating real driver variants
(docs/fake-nvml.md): process lists on R535, NVLink summed over links, GPM permission errors, a MIG
GPU, a driver without GPM, and the per-GPU metric availability the agent exports and logs."""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

import harness
from harness import Agent, metric_value, wait_until

PIDS = list(range(2000, 2060))  # more than 48: past a 64-entry buffer read with 24-byte entries
NO_V2 = ["nvmlDeviceGetComputeRunningProcesses_v2"]
GPM = ["nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet"]


def unused_collector():
    return f"127.0.0.1:{harness.free_port()}"


def state(gpus, driver="550.54.15", missing=()):
    return {"driver_version": driver, "missing_functions": list(missing), "gpus": gpus}


def available(samples, gpu, metric):
    """(value, reason) of stepwatch_agent_gpu_metric_available for one GPU and metric."""
    for name, labels, value in samples:
        if (name == "stepwatch_agent_gpu_metric_available" and labels.get("gpu") == str(gpu)
                and labels.get("metric") == metric):
            return value, labels.get("reason")
    return None


class ProbeTest(unittest.TestCase):
    """stepwatch-gpu-probe prints every pid it read, so wrong strides show as wrong pids."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="stepwatch-gpu-probe-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def probe_pids(self, nvml_state):
        path = os.path.join(self.tmp, "state.json")
        harness.write_json_atomic(path, nvml_state)
        result = subprocess.run(
            [harness.build_path("stepwatch-gpu-probe"), f"--nvml-library={harness.fake_nvml_path()}",
             "--samples=1"], capture_output=True, text=True, timeout=60,
            env=dict(os.environ, STEPWATCH_FAKE_NVML_STATE=path))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        return [int(p) for p in re.findall(r"^pids: (\d+)$", result.stdout, re.M)]

    def test_process_lists_of_each_driver_variant(self):
        variants = [("535.54.03", []), ("535.54.03", NO_V2), ("535.86.10", NO_V2),
                    ("535.98", NO_V2), ("535.104.05", NO_V2), ("550.54.15", [])]
        for driver, missing in variants:
            with self.subTest(driver=driver, missing=missing):
                gpus = [harness.fake_gpu(0, pids=PIDS), harness.fake_gpu(1, pids=[7, 8])]
                self.assertEqual(self.probe_pids(state(gpus, driver, missing)), PIDS + [7, 8])


class AgentGpuTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="stepwatch-agent-gpu-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_unavailable_metrics_are_exported_and_logged_once(self):
        gpus = [
            harness.fake_gpu(0, pids=PIDS, errors={"nvmlGpmSampleGet": 4,
                                                   "nvmlDeviceGetPowerUsage": 3}),
            harness.fake_gpu(1, mig_mode=1),
            harness.fake_gpu(2, nvlink_tx_kbps_per_link=[0, 1000000, 3000000],
                             nvlink_rx_kbps_per_link=[0, 500000, 500000]),
        ]
        with Agent(self.tmp, unused_collector(), node="gpu-node", interval=0.2,
                   fake_nvml_state=state(gpus, "535.54.03", NO_V2)) as agent:
            wait_until(lambda: metric_value(agent.scrape(),
                                            "stepwatch_agent_gpu_nvlink_transmit_bytes_per_second",
                                            gpu=2) is not None,
                       timeout=20, message="NVLink rate on GPU 2")
            # Let several samples pass: the log must still say each thing once.
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_batches_created_total")
                       >= 8, timeout=20, message="several sample intervals")
            samples = agent.scrape()
            self.assertEqual(available(samples, 0, "sm_activity"), (0, "no_permission"))
            self.assertEqual(available(samples, 0, "tensor_activity"), (0, "no_permission"))
            self.assertEqual(available(samples, 0, "power"), (0, "not_supported"))
            self.assertEqual(available(samples, 0, "temperature"), (1, "ok"))
            self.assertEqual(available(samples, 0, "processes"), (1, "ok"))
            self.assertEqual(metric_value(samples, "stepwatch_agent_gpu_processes", gpu=0),
                             len(PIDS))
            self.assertIsNone(metric_value(samples, "stepwatch_agent_gpu_power_watts", gpu=0))
            # MIG: device-wide readings stay, utilization and GPM are unavailable.
            self.assertEqual(available(samples, 1, "utilization"), (0, "mig_enabled"))
            self.assertEqual(available(samples, 1, "sm_activity"), (0, "mig_enabled"))
            self.assertIsNone(metric_value(samples, "stepwatch_agent_gpu_utilization_ratio", gpu=1))
            self.assertEqual(metric_value(samples, "stepwatch_agent_gpu_memory_total_bytes",
                                          gpu=1), 80 * 2**30)
            # GPU 2: the fake_gpu defaults are all available, NVLink is the sum over links.
            for metric in ["utilization", "memory", "power", "temperature", "nvlink",
                           "sm_activity", "dram_bandwidth", "tensor_activity"]:
                self.assertEqual(available(samples, 2, metric), (1, "ok"), metric)
            tx = metric_value(samples, "stepwatch_agent_gpu_nvlink_transmit_bytes_per_second",
                              gpu=2)
            rx = metric_value(samples, "stepwatch_agent_gpu_nvlink_receive_bytes_per_second",
                              gpu=2)
            self.assertAlmostEqual(tx / (4000000 * 1024), 1, delta=0.1)
            self.assertAlmostEqual(rx / (1000000 * 1024), 1, delta=0.1)
            log = agent.log()
            self.assertEqual(log.count("GPU 0: sm_activity unavailable (no_permission)"), 1, log)
            self.assertEqual(log.count("GPU 0: power unavailable (not_supported)"), 1, log)
            self.assertEqual(log.count("GPU 1: utilization unavailable (mig_enabled)"), 1, log)
            promtool = shutil.which("promtool")
            if promtool:
                result = subprocess.run([promtool, "check", "metrics"],
                                        input=harness.http_get(agent.metrics_url),
                                        capture_output=True, text=True, timeout=30)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_driver_without_gpm(self):
        gpus = [harness.fake_gpu(0)]
        with Agent(self.tmp, unused_collector(), node="old-driver",
                   fake_nvml_state=state(gpus, "515.65.01", GPM)) as agent:
            wait_until(lambda: available(agent.scrape(), 0, "sm_activity") is not None,
                       timeout=20, message="availability series")
            samples = agent.scrape()
            self.assertEqual(available(samples, 0, "sm_activity"), (0, "missing_entry_point"))
            self.assertEqual(available(samples, 0, "utilization"), (1, "ok"))
            self.assertIsNone(metric_value(samples, "stepwatch_agent_gpu_sm_activity_ratio"))

    def test_short_interval_keeps_gpm_at_100ms_and_says_so(self):
        gpus = [harness.fake_gpu(0, utilization=80)]
        with Agent(self.tmp, unused_collector(), node="fast", interval=0.02,
                   fake_nvml_state=state(gpus)) as agent:
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_gpu_sm_activity_ratio",
                                            gpu=0) is not None,
                       timeout=20, message="GPM values at a 20 ms interval")
            self.assertAlmostEqual(
                metric_value(agent.scrape(), "stepwatch_agent_gpu_sm_activity_ratio", gpu=0), 0.72)
            self.assertIn("below GPM's 100 ms minimum", agent.log())


if __name__ == "__main__":
    unittest.main()
