"""The agent spool with real processes: agents SIGKILLed three times lose no acknowledged-to-them
event and the collector counts each event once.

An event counts as accepted by an agent once that agent has put it into a batch
(stepwatch_agent_events_shipped_total): from then on it is in the spool. The test waits for that
before each SIGKILL, and sums what every agent process accepted.
"""

import os
import tempfile
import time
import unittest

from harness import Agent, Collector, Process, metric_value, step_event, wait_until

RANKS = 4
# Larger rounds measure a larger replay (docs/reliability.md): STEPWATCH_SPOOL_EVENTS_PER_ROUND.
EVENTS_PER_ROUND = max(RANKS, int(os.environ.get("STEPWATCH_SPOOL_EVENTS_PER_ROUND", "120")))


def agent_value(agent, name):
    return metric_value(agent.scrape(), name) or 0


def collector_steps(collector):
    return metric_value(collector.scrape(), "stepwatch_collector_steps_received_total") or 0


class Sender:
    """Sends distinct (rank, step) events of one job; counts what each agent process accepted."""

    def __init__(self, job):
        self.job = job
        self.step = 0
        self.accepted = 0

    def send_round(self, agent):
        """Sends one round; waits until the agent has batched (so spooled) all of it."""
        before = agent_value(agent, "stepwatch_agent_events_shipped_total")
        sent = 0
        for _ in range(EVENTS_PER_ROUND // RANKS):
            for rank in range(RANKS):
                if agent.send(step_event(self.job, rank, RANKS, self.step, 0.1)):
                    sent += 1
            self.step += 1
        wait_until(lambda: agent_value(agent, "stepwatch_agent_events_shipped_total") ==
                   before + sent,
                   timeout=60, message=f"{sent} events batched by the agent")
        self.accepted += sent
        return sent


class SpoolTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-it-")
        self.tmp = self._tmp.name
        self.spool_dir = os.path.join(self.tmp, "spool")

    def tearDown(self):
        self._tmp.cleanup()

    def make_agent(self, collector):
        return Agent(self.tmp, collector.grpc_addr, node="node-s", interval=0.2,
                     spool_dir=self.spool_dir, reconnect_max_backoff=0.2)

    def assert_exactly(self, collector_total, accepted, agent):
        """The collector's count equals what the agents accepted, and stays there."""
        wait_until(lambda: agent_value(agent, "stepwatch_agent_spool_batches") == 0, timeout=30,
                   message="spool drained")
        # Nothing more may arrive later (a late duplicate would raise the count).
        time.sleep(1.0)
        self.assertEqual(collector_total(), accepted, "no event lost or counted twice")
        samples = agent.scrape()
        self.assertEqual(metric_value(samples, "stepwatch_agent_spool_batches_dropped_total"), 0)
        self.assertEqual(metric_value(samples, "stepwatch_agent_spool_corrupt_records_total"), 0)
        self.assertEqual(metric_value(samples, "stepwatch_agent_spool_write_errors_total"), 0)
        self.assertEqual(metric_value(samples, "stepwatch_agent_batches_dropped_total"), 0)

    def test_three_agent_kills_while_the_collector_is_down(self):
        collector = Collector(self.tmp)  # ports chosen, not started yet
        sender = Sender("job-spool-down")
        agent = self.make_agent(collector)
        replayed = []
        for round_ in range(4):
            agent.start()
            replayed.append(agent_value(agent, "stepwatch_agent_spool_batches_replayed_total"))
            sender.send_round(agent)
            self.assertGreater(agent_value(agent, "stepwatch_agent_spool_batches"), 0)
            if round_ < 3:
                agent.kill()
        # Every restart found more batches than the one before: nothing was acknowledged.
        self.assertEqual(replayed[0], 0)
        self.assertTrue(replayed[1] < replayed[2] < replayed[3], replayed)
        self.assertEqual(sender.accepted, 4 * (EVENTS_PER_ROUND // RANKS) * RANKS)

        collector.start()
        started = time.monotonic()  # the collector answers from here on
        try:
            wait_until(lambda: collector_steps(collector) >= sender.accepted, timeout=30,
                       message=f"{sender.accepted} events at the collector")
            replay_s = time.monotonic() - started
            self.assert_exactly(lambda: collector_steps(collector), sender.accepted, agent)
            samples = collector.scrape()
            self.assertEqual(metric_value(samples, "stepwatch_job_last_step", job="job-spool-down"),
                             sender.step - 1)
            print(f"spool, collector down: accepted {sender.accepted}, counted "
                  f"{collector_steps(collector)}, replayed batches {replayed}, "
                  f"all counted {replay_s:.2f}s after the collector was up")
        finally:
            agent.stop()
            collector.stop()

    def test_three_agent_kills_and_a_collector_kill_with_the_collector_up(self):
        collector = Collector(self.tmp)
        collector.start()
        sender = Sender("job-spool-up")
        agent = self.make_agent(collector)
        # Steps counted by collector processes that were killed since.
        earlier = 0
        try:
            # Round 0: killed right after batching, acknowledgements possibly in flight: what the
            # collector already has is replayed and must be recognised as a duplicate.
            agent.start()
            sender.send_round(agent)
            agent.kill()

            # Round 1: everything acknowledged, then the collector dies too; more events are
            # spooled while it is down, and the agent is killed again.
            agent.start()
            sender.send_round(agent)
            wait_until(lambda: collector_steps(collector) == sender.accepted, timeout=30,
                       message="rounds 0-1 at the collector")
            wait_until(lambda: agent_value(agent, "stepwatch_agent_spool_batches") == 0,
                       timeout=30, message="spool drained before the collector dies")
            earlier = collector_steps(collector)
            collector.kill()
            sender.send_round(agent)
            agent.kill()

            # Round 2: agent back first, then the collector; killed once more.
            agent.start()
            self.assertGreater(
                agent_value(agent, "stepwatch_agent_spool_batches_replayed_total"), 0)
            collector.start()
            sender.send_round(agent)
            agent.kill()

            # Round 3: the last agent process stays up.
            agent.start()
            sender.send_round(agent)
            self.assertEqual(sender.accepted, 5 * (EVENTS_PER_ROUND // RANKS) * RANKS)
            wait_until(lambda: earlier + collector_steps(collector) >= sender.accepted,
                       timeout=30, message="every event at the collector")
            self.assert_exactly(lambda: earlier + collector_steps(collector), sender.accepted,
                                agent)
            print(f"spool, collector up and killed once: accepted {sender.accepted}, counted "
                  f"{earlier + collector_steps(collector)} (duplicate batches ignored: "
                  f"{metric_value(collector.scrape(), 'stepwatch_collector_duplicate_batches_total')})")
        finally:
            agent.stop()
            collector.stop()

    @unittest.skipUnless(os.environ.get("STEPWATCH_SPOOL_MIDSTREAM_INTERVAL"),
                         "a measurement: set STEPWATCH_SPOOL_MIDSTREAM_INTERVAL=SECONDS")
    def test_mid_stream_kills_lose_only_unbatched_events(self):
        """1,000 events/s without pause; the agent is SIGKILLed 2 s after each of 3 starts."""
        interval = float(os.environ["STEPWATCH_SPOOL_MIDSTREAM_INTERVAL"])
        collector = Collector(self.tmp)
        collector.start()
        agent = Agent(self.tmp, collector.grpc_addr, node="node-m", interval=interval,
                      spool_dir=self.spool_dir, reconnect_max_backoff=0.2)
        sent = 0
        step = 0
        try:
            for round_ in range(4):
                agent.start()
                start = time.monotonic()
                for n in range(2000):
                    if agent.send(step_event("job-spool-mid", 0, 1, step, 0.1)):
                        sent += 1
                    step += 1
                    delay = start + (n + 1) / 1000 - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                if round_ < 3:
                    agent.kill()
            wait_until(lambda: agent_value(agent, "stepwatch_agent_spool_batches") == 0,
                       timeout=30, message="spool drained")
            time.sleep(1.0)
            counted = collector_steps(collector)
            self.assertLessEqual(counted, sent, "an event counted twice")
            self.assertGreater(counted, 0)
            print(f"mid-stream kills, interval {interval}s: sent {sent}, counted {counted:.0f}, "
                  f"lost {sent - counted:.0f}")
        finally:
            agent.stop()
            collector.stop()

    def test_full_spool_drops_oldest_and_counts_them(self):
        collector = Collector(self.tmp)  # never started: nothing is acknowledged
        agent = Agent(self.tmp, collector.grpc_addr, node="node-f", interval=0.2,
                      spool_dir=self.spool_dir, spool_max_mib=1)
        try:
            agent.start()
            # About 3 MiB of events over several batches (the job name is the longest allowed):
            # the spool must stay within 1 MiB (plus the newest batch, which is always kept).
            job = "job-spool-full-" + "x" * 230
            step = 0
            for _ in range(10):
                for _ in range(1000 // RANKS):
                    for rank in range(RANKS):
                        agent.send(step_event(job, rank, RANKS, step, 0.1))
                    step += 1
                time.sleep(0.25)
            wait_until(lambda: agent_value(agent, "stepwatch_agent_spool_batches_dropped_total") > 0,
                       timeout=30, message="oldest spooled batches dropped")
            def on_disk():
                # One subdirectory per collector (agent/README.md).
                return sum(os.path.getsize(os.path.join(root, f))
                           for root, _, files in os.walk(self.spool_dir)
                           for f in files if f.endswith(".swb"))

            # The agent may still be cutting its last batches: the gauge and the files agree once
            # it is done (each read between two batches).
            wait_until(lambda: on_disk() == agent_value(agent, "stepwatch_agent_spool_bytes"),
                       timeout=20, interval=0.5, message="spool gauge equal to the bytes on disk")
            samples = agent.scrape()
            spooled = metric_value(samples, "stepwatch_agent_spool_bytes")
            self.assertGreater(spooled, 0)
            self.assertLessEqual(spooled, (1 << 20) + 512 * 1024, "spool bounded")
            dropped = metric_value(samples, "stepwatch_agent_spool_batches_dropped_total")
            self.assertEqual(metric_value(samples, "stepwatch_agent_batches_dropped_total"), dropped)
            print(f"spool bound 1 MiB: {spooled:.0f} bytes held, {dropped:.0f} batches dropped")
        finally:
            agent.stop()

    def test_unusable_spool_dir_is_a_clear_startup_error(self):
        blocker = os.path.join(self.tmp, "a-file")
        with open(blocker, "w") as f:
            f.write("x")
        collector = Collector(self.tmp)
        agent = Agent(self.tmp, collector.grpc_addr, node="node-e",
                      spool_dir=os.path.join(blocker, "spool"))
        proc = Process(agent.name, agent.command(), agent.log_path).start()
        code = proc.proc.wait(timeout=30)
        self.assertEqual(code, 1)
        self.assertIn("cannot create spool directory", proc.log())


if __name__ == "__main__":
    unittest.main()
