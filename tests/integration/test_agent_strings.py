"""Strings the agent does not choose, through the real agent and collector: a (fake) NVML that
names its GPU with escape codes (an over-long name NVML itself refuses), a UUID with a terminal title sequence and
a driver version with a newline. What leaves the agent is printable and bounded, each change is
counted by field; the step-event datagram's own strings are refused by the parser. Loopback only;
every wait is bounded."""

import tempfile
import unittest

from harness import (Agent, Collector, fake_gpu, fake_nvml_state, metric_samples, metric_value,
                     step_event, wait_until)

HOSTILE_NAME = "H100\x1b[2J\x1b[31m\u009b31m"
HOSTILE_UUID = "GPU-\x1b]0;pwned\x07-0001"


def printable(text):
    return all(0x20 <= ord(c) < 0x7f or ord(c) >= 0xa0 for c in text)


class AgentStringsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-strings-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_nvml_strings_leave_the_agent_printable_and_bounded(self):
        state = fake_nvml_state([fake_gpu(0, name=HOSTILE_NAME, uuid=HOSTILE_UUID)],
                                driver_version="550.54\n15")
        with Collector(self.tmp, export_node_metrics="all") as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-s",
                      fake_nvml_state=state) as agent:
            def bounded(field):
                return metric_value(agent.scrape(), "stepwatch_agent_peer_strings_bounded_total",
                                    field=field) or 0

            wait_until(lambda: bounded("gpu_name") > 0 and bounded("gpu_uuid") > 0,
                       timeout=20, message="the GPU's strings to be bounded")
            self.assertGreater(bounded("driver_version"), 0)
            wait_until(lambda: metric_samples(collector.scrape(), "stepwatch_gpu_info"),
                       timeout=20, message="the GPU at the collector")
            for labels, _ in metric_samples(collector.scrape(), "stepwatch_gpu_info"):
                self.assertTrue(printable(labels["name"]), repr(labels["name"]))
                self.assertTrue(printable(labels["uuid"]), repr(labels["uuid"]))
                self.assertLessEqual(len(labels["name"].encode()), 96)
                self.assertTrue(labels["name"].startswith("H100?"), repr(labels["name"][:10]))
            # The datagram's strings: a job id over 256 bytes or with controls is refused.
            for job in ("j" * 257, "job\x1b[2J", "bad\x00"):
                agent.send(step_event(job, 0, 1, 0, 0.1))
            wait_until(lambda: metric_value(agent.scrape(), "stepwatch_agent_events_rejected_total",
                                            reason="out_of_range") == 3
                       or (metric_value(agent.scrape(), "stepwatch_agent_datagrams_received_total")
                           or 0) >= 3, timeout=20, message="the bad job ids to be read")
            self.assertEqual(metric_value(agent.scrape(), "stepwatch_agent_events_received_total"),
                             0)


if __name__ == "__main__":
    unittest.main()
