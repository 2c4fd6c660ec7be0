"""The quick-start demo: a collector, 8 agents with fake GPUs and a simulated 8x8 job in which two
nodes finish their compute late. Runs the real demo script for a bounded time."""

import os
import re
import subprocess
import unittest

from harness import BUILD_DIR, SOURCE_DIR


class DemoTest(unittest.TestCase):
    def test_demo_flags_the_two_slow_nodes(self):
        env = dict(os.environ, STEPWATCH_DEMO_SECONDS="45", STEPWATCH_DEMO_SPEED="2")
        result = subprocess.run(
            [os.path.join(SOURCE_DIR, "scripts", "demo-cluster.sh"), BUILD_DIR],
            capture_output=True, text=True, timeout=240, env=env)
        out = result.stdout
        self.assertEqual(result.returncode, 0, out[-3000:] + result.stderr[-3000:])
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


if __name__ == "__main__":
    unittest.main()
