"""Kubernetes attribution end to end: a kubelet stand-in serves the PodResources v1 API on a unix
socket (tests/agent/fake_kubelet.cc), a real agent with the fake NVML maps its GPUs' UUIDs to pods,
and a real collector labels the straggler, its finding and its rank and GPU series with the
namespace, pod and container; stepwatchctl shows them. Without the socket the agent says so once
and works as before."""

import os
import tempfile
import unittest

from harness import (Agent, Collector, Process, build_path, ctl, ctl_json, fake_gpu,
                     fake_nvml_state, metric_samples, metric_value, step_event, wait_until)

JOB = "llm"
WORLD = 8
SLOW_RANK = 2  # GPU 2 of node-0: pod train-x of namespace team-y


def uuid(index):
    return fake_gpu(index)["uuid"]


def send_steps(agent, steps, step_s=0.2):
    for step in steps:
        for rank in range(WORLD):
            busy = step_s * 0.7 * (1.3 if rank == SLOW_RANK else 1.0)
            agent.send(step_event(JOB, rank, WORLD, step, step_s, data_s=0.0, compute_s=busy,
                                  comm_s=max(step_s - busy, 0.0), samples=32, local_rank=rank,
                                  gpu=rank))


class FakeKubelet:
    """stepwatch-fake-kubelet on a unix socket, answering from a pods file it re-reads."""

    def __init__(self, tmpdir, lines):
        self.socket_path = os.path.join(tmpdir, "pod-resources", "kubelet.sock")
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        self.pods_path = os.path.join(tmpdir, "pods.txt")
        self.set(lines)
        self.process = Process("fake-kubelet",
                               [build_path("stepwatch-fake-kubelet"), self.socket_path,
                                self.pods_path],
                               os.path.join(tmpdir, "fake-kubelet.log"))

    def set(self, lines):
        tmp = self.pods_path + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(tmp, self.pods_path)

    def __enter__(self):
        self.process.start()
        wait_until(lambda: os.path.exists(self.socket_path), timeout=10,
                   message="the fake kubelet's socket")
        return self

    def __exit__(self, *exc):
        self.process.stop()


class KubernetesAttributionTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-k8s-")
        self.tmp = self._tmp.name
        self.gpus = [fake_gpu(i) for i in range(WORLD)]

    def tearDown(self):
        self._tmp.cleanup()

    def test_slow_rank_in_a_pod_is_labelled_with_its_namespace_and_pod(self):
        pods = [
            "team-y train-x trainer nvidia.com/gpu " + ",".join(uuid(i) for i in range(4)),
            "team-y train-z trainer nvidia.com/gpu " + ",".join(uuid(i) for i in range(4, 8)),
            "team-y train-x sidecar example.com/nic mlx5_0",
        ]
        with FakeKubelet(self.tmp, pods) as kubelet, Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-0",
                      fake_nvml_state=fake_nvml_state(self.gpus),
                      kubelet_socket=kubelet.socket_path) as agent:
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_kubelet_gpus_attributed")
                       == WORLD, timeout=20, message="the agent to read the kubelet")
            # The agent attaches a step's pod from its last GPU samples: wait until they carry it.
            def gpus_with_pods():
                nodes = ctl_json(collector.grpc_addr, "status").get("nodes", [])
                return sum(1 for n in nodes for g in n.get("gpus", [])
                           if g.get("kubernetes_pod", {}).get("pod")) == WORLD

            wait_until(gpus_with_pods, timeout=20, message="the GPU samples to carry their pods")
            send_steps(agent, range(0, 80))

            def straggler_labels():
                for labels, value in metric_samples(collector.scrape(), "stepwatch_straggler"):
                    if value == 1 and labels.get("job") == JOB and labels.get("pod"):
                        return labels
                return None

            labels = wait_until(straggler_labels, timeout=30,
                                message="the straggler labelled with its pod")
            self.assertEqual(labels["rank"], str(SLOW_RANK))
            self.assertEqual(labels["namespace"], "team-y")
            self.assertEqual(labels["pod"], "train-x")
            self.assertEqual(labels["container"], "trainer")

            samples = collector.scrape()
            self.assertEqual(metric_value(samples, "stepwatch_finding", kind="straggler", job=JOB,
                                          rank=SLOW_RANK, namespace="team-y", pod="train-x",
                                          container="trainer"), 1)
            busy = {l["rank"]: l for l, _ in metric_samples(samples, "stepwatch_rank_busy_seconds")}
            self.assertEqual(busy[str(SLOW_RANK)]["pod"], "train-x")
            # The straggler's GPU is exported by the collector, with its pod.
            self.assertEqual(metric_value(samples, "stepwatch_gpu_utilization_ratio", node="node-0",
                                          gpu=SLOW_RANK, namespace="team-y", pod="train-x"), 0.9)

            # The node's raw view on the agent's /metrics carries the same pod labels.
            self.assertEqual(metric_value(agent.scrape(), "stepwatch_agent_gpu_utilization_ratio",
                                          gpu=SLOW_RANK, namespace="team-y", pod="train-x",
                                          container="trainer"), 0.9)

            found = [f for f in ctl_json(collector.grpc_addr, "findings").get("findings", [])
                     if f["kind"] == "straggler"]
            self.assertEqual(len(found), 1)
            self.assertEqual(found[0]["kubernetes_pod"],
                             {"namespace": "team-y", "pod": "train-x", "container": "trainer"})
            explain = ctl_json(collector.grpc_addr, "explain", JOB)
            rows = {r.get("rank", 0): r for r in explain["ranks"]}
            self.assertEqual(rows[SLOW_RANK]["kubernetes_pod"]["pod"], "train-x")
            self.assertEqual(rows[6]["kubernetes_pod"]["pod"], "train-z")
            table = ctl(collector.grpc_addr, "findings")
            self.assertEqual(table.returncode, 0, table.stderr)
            self.assertIn("POD", table.stdout)
            self.assertIn("team-y/train-x", table.stdout)
            report = ctl_json(collector.grpc_addr, "report", JOB)
            stragglers = [f for f in report["findings"] if f["kind"] == "straggler"]
            self.assertEqual([(f["namespace"], f["pod"], f["container"]) for f in stragglers],
                             [("team-y", "train-x", "trainer")])
            report_table = ctl(collector.grpc_addr, "report", JOB)
            self.assertIn("team-y/train-x", report_table.stdout)
            status = ctl_json(collector.grpc_addr, "status")
            node = [n for n in status["nodes"] if n["node"] == "node-0"][0]
            self.assertEqual({g["index"]: g["kubernetes_pod"]["pod"] for g in node["gpus"]
                              if g.get("index", 0) in (0, 7)}, {0: "train-x", 7: "train-z"})

            # A failing kubelet is counted; the last attribution stays.
            kubelet.set(["fail"])
            wait_until(lambda: (metric_value(agent.scrape(),
                                             "stepwatch_agent_kubelet_list_errors_total") or 0) >= 2,
                       timeout=20, message="failed List calls counted")
            self.assertEqual(metric_value(agent.scrape(), "stepwatch_agent_kubelet_gpus_attributed"),
                             WORLD)
            self.assertEqual(agent.log().count("PodResources List"), 1)  # rate-limited

    def test_without_the_socket_the_agent_says_so_once_and_works(self):
        absent = os.path.join(self.tmp, "no-kubelet", "kubelet.sock")
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-0",
                      fake_nvml_state=fake_nvml_state(self.gpus), kubelet_socket=absent) as agent:
            send_steps(agent, range(0, 80))
            wait_until(lambda: metric_value(collector.scrape(), "stepwatch_straggler", job=JOB,
                                            rank=SLOW_RANK) == 1, timeout=30,
                       message="the straggler flagged without attribution")
            samples = collector.scrape()
            self.assertEqual(metric_value(samples, "stepwatch_straggler", job=JOB, rank=SLOW_RANK,
                                          namespace="", pod="", container=""), 1)
            self.assertEqual(metric_value(agent.scrape(), "stepwatch_agent_kubelet_socket_present"),
                             0)
            self.assertEqual(metric_value(agent.scrape(), "stepwatch_agent_kubelet_list_errors_total"),
                             0)
            found = ctl_json(collector.grpc_addr, "findings").get("findings", [])
            self.assertTrue(found)
            self.assertFalse(any("kubernetes_pod" in f for f in found))
            log = agent.log()
            self.assertEqual(log.count("no kubelet pod-resources socket"), 1, log)


if __name__ == "__main__":
    unittest.main()
