"""An agent whose wall clock steps back an hour, then forward again, mid-run (libfaketime with a
timestamp file re-read at runtime; the monotonic clock is left alone, as NTP or `date -s` would
leave it): every event it accepted reaches the collector, its node is never shown down, and the
job is still judged (the injected straggler is flagged). Loopback only; every wait is bounded."""

import os
import tempfile
import time
import unittest

from harness import Agent, Collector, metric_value, wait_until
from test_diagnosis import send_job_steps
from test_hostile_input import FAKETIME_LIB, clang_asan_build, flagged_ranks

JOB = "clock-job"
RANKS = 4
SLOW_RANK = 1


def value(samples, name, **labels):
    return metric_value(samples, name, **labels) or 0


class AgentClockStepTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-clock-")
        self.tmp = self._tmp.name
        self.offset_file = os.path.join(self.tmp, "faketime-offset")

    def tearDown(self):
        self._tmp.cleanup()

    def set_offset(self, offset):
        # Written whole and renamed: the agent re-reads it on every clock read (NO_CACHE).
        tmp = self.offset_file + ".tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(offset + "\n")
        os.replace(tmp, self.offset_file)

    def send_and_wait(self, agent, collector, steps, sent_before):
        send_job_steps(agent, JOB, RANKS, steps, step_s=0.2, slow_rank=SLOW_RANK)
        sent = sent_before + RANKS * len(steps)
        # Every event the agent accepted arrives, within a few intervals of real time.
        wait_until(lambda: value(collector.scrape(), "stepwatch_collector_steps_received_total")
                   >= sent, timeout=30, message=f"{sent} events at the collector")
        return sent

    @unittest.skipUnless(os.path.exists(FAKETIME_LIB), "libfaketime is not installed")
    def test_wall_clock_steps_stop_nothing(self):
        if clang_asan_build():
            self.skipTest("clang's ASan runtime can hang under libfaketime; the GCC pass runs this")
        self.set_offset("+0")
        asan = os.environ.get("ASAN_OPTIONS", "")
        with Collector(self.tmp, node_down_after=5, export_node_metrics="all") as collector:
            agent = Agent(self.tmp, collector.grpc_addr, node="node-step", interval=0.2)
            agent.env = {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME_TIMESTAMP_FILE": self.offset_file,
                         "FAKETIME_NO_CACHE": "1",
                         # Only the wall clock steps (both spellings of libfaketime's switch).
                         "FAKETIME_DONT_FAKE_MONOTONIC": "1", "DONT_FAKE_MONOTONIC": "1",
                         "ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}
            with agent:
                sent = self.send_and_wait(agent, collector, range(0, 20), 0)
                up_checks = []

                def node_up():
                    up = metric_value(collector.scrape(), "stepwatch_node_up", node="node-step")
                    up_checks.append(up)
                    return up

                wait_until(lambda: node_up() == 1, timeout=20, message="the node to be up")
                up_checks.clear()
                # Back an hour: before the fix the agent's ticker waited an hour for its next cut.
                self.set_offset("-1h")
                stepped_back = time.monotonic()
                for first in range(20, 60, 10):
                    sent = self.send_and_wait(agent, collector, range(first, first + 10), sent)
                    self.assertEqual(node_up(), 1)
                # Stay past --node-down-after (5 s) with only the node's samples flowing.
                deadline = time.monotonic() + 6
                while time.monotonic() < deadline:
                    self.assertEqual(node_up(), 1, "node shown down after the step back")
                    time.sleep(0.5)
                back_for = time.monotonic() - stepped_back
                # Forward again (an hour at once).
                self.set_offset("+0")
                for first in range(60, 100, 10):
                    sent = self.send_and_wait(agent, collector, range(first, first + 10), sent)
                    self.assertEqual(node_up(), 1)
                wait_until(lambda: flagged_ranks(collector, JOB) == [SLOW_RANK], timeout=30,
                           message="the straggler to be flagged after the clock steps")
                samples = agent.scrape()
                accepted = value(samples, "stepwatch_agent_events_received_total")
                if accepted == 0:
                    accepted = value(samples, "stepwatch_agent_events_shipped_total")
                self.assertEqual(value(samples, "stepwatch_agent_events_dropped_total"), 0)
                received = value(collector.scrape(), "stepwatch_collector_steps_received_total")
                self.assertEqual(received, RANKS * 100)
                self.assertEqual(value(samples, "stepwatch_agent_events_shipped_total"),
                                 RANKS * 100)
                wait_until(lambda: value(collector.scrape(), "stepwatch_job_last_step", job=JOB)
                           == 99, timeout=20, message="the job's last step to be 99")
                print(f"wall clock back 1 h for {back_for:.1f} s of real time: {received} of "
                      f"{RANKS * 100} events at the collector, node up at all {len(up_checks)} "
                      f"checks")


if __name__ == "__main__":
    unittest.main()
