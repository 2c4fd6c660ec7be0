"""An agent on a full spool disk (a 2 MiB tmpfs we fill), with real processes: it keeps accepting
and shipping from memory and says what is at risk; SIGKILLed there, it starts again on the still
full disk (the boot file is rewritten in place) and replays what the disk holds; once space is
freed the batches held in memory are spooled after all. Every event the agents counted as
accepted, less those they counted as held in memory only when one was killed, reaches the
collector exactly once. A --spool-dir that is not a directory fails the start and names the flag.

An event counts as accepted once an agent has put it into a batch
(stepwatch_agent_events_shipped_total), as in test_spool.py. The collector stays down until the
end, so nothing is acknowledged (and deleted) behind the test's back. Loopback only; every wait is
bounded.
"""

import os
import time
import subprocess
import tempfile
import unittest

from harness import Agent, Collector, metric_value, step_event, wait_until

RANKS = 4
STEPS_PER_ROUND = 10


def value(agent, name):
    return metric_value(agent.scrape(), name) or 0


def collector_steps(collector):
    return metric_value(collector.scrape(), "stepwatch_collector_steps_received_total") or 0


class Rounds:
    """Distinct (rank, step) events of one job; counts what the agents accepted."""

    def __init__(self):
        self.step = 0
        self.accepted = 0

    def send(self, agent):
        before = value(agent, "stepwatch_agent_events_shipped_total")
        sent = 0
        for _ in range(STEPS_PER_ROUND):
            for rank in range(RANKS):
                if agent.send(step_event("disk-job", rank, RANKS, self.step, 0.1)):
                    sent += 1
            self.step += 1
        wait_until(lambda: value(agent, "stepwatch_agent_events_shipped_total") == before + sent,
                   timeout=60, message=f"{sent} events batched by the agent")
        self.accepted += sent
        return sent


def fill(directory):
    """Fills the filesystem of `directory`; returns the filler's path."""
    path = os.path.join(directory, "filler")
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 4096, 512, 1):
            try:
                for _ in range(1 << 16):  # bounded: a 2 MiB tmpfs fills long before
                    f.write(chunk[:size])
            except OSError:
                continue
    return path


class AgentDiskTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-disk-")
        self.tmp = self._tmp.name
        self.spool_dir = os.path.join(self.tmp, "spool")
        os.makedirs(self.spool_dir)
        self.mounted = False

    def tearDown(self):
        if self.mounted:
            subprocess.run(["umount", "-l", self.spool_dir], check=False)
        self._tmp.cleanup()

    def mount_small_disk(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to mount a small tmpfs")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", self.spool_dir],
                              capture_output=True, text=True)
        if done.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs: {done.stderr.strip()}")
        self.mounted = True

    def agent(self, collector):
        return Agent(self.tmp, collector.grpc_addr, node="node-d", spool_dir=self.spool_dir,
                     interval=0.2)

    def test_full_disk_kill_restart_and_free_space(self):
        self.mount_small_disk()
        collector = Collector(self.tmp)  # started at the end: nothing is acknowledged before
        rounds = Rounds()
        agent = self.agent(collector).start()
        try:
            rounds.send(agent)  # spooled
            wait_until(lambda: value(agent, "stepwatch_agent_spool_batches") > 0, timeout=20,
                       message="batches in the spool")
            filler = fill(self.spool_dir)
            held = rounds.send(agent)  # the disk is full: held in memory only
            wait_until(lambda: value(agent, "stepwatch_agent_spool_unspooled_events") == held,
                       timeout=20, message="the events held in memory only to be counted")
            self.assertGreater(value(agent, "stepwatch_agent_spool_write_errors_total"), 0)
            lost = value(agent, "stepwatch_agent_spool_unspooled_events")
            agent.kill()

            # Restart on the still-full disk.
            agent = self.agent(collector).start()
            self.assertIn("is on a full disk: started by rewriting its boot file in place",
                          agent.log())
            self.assertGreater(value(agent, "stepwatch_agent_spool_batches_replayed_total"), 0)
            held = rounds.send(agent)
            wait_until(lambda: value(agent, "stepwatch_agent_spool_unspooled_events") == held,
                       timeout=20, message="the new events held in memory only")

            # Space is freed: the held batches are spooled on the next cuts, so a crash now
            # loses nothing.
            os.remove(filler)
            freed_at = time.monotonic()
            rounds.send(agent)
            wait_until(lambda: value(agent, "stepwatch_agent_spool_unspooled_batches") == 0,
                       timeout=20, message="the held batches to be spooled")
            respooled_s = time.monotonic() - freed_at
            self.assertGreater(value(agent, "stepwatch_agent_spool_batches_respooled_total"), 0)
            agent.kill()

            agent = self.agent(collector).start()
            rounds.send(agent)
            collector.start()
            collector_up_at = time.monotonic()
            expected = rounds.accepted - lost
            wait_until(lambda: collector_steps(collector) >= expected, timeout=60,
                       message=f"{expected} events at the collector")
            delivered_s = time.monotonic() - collector_up_at
            wait_until(lambda: value(agent, "stepwatch_agent_spool_batches") == 0, timeout=30,
                       message="the spool to drain")
            self.assertEqual(collector_steps(collector), expected,
                             "an event counted twice, or one not counted as lost arrived")
            print(f"full 2 MiB spool: {rounds.accepted} events accepted by 3 agent processes, "
                  f"{lost:.0f} counted as held in memory only when the first was SIGKILLed, "
                  f"{collector_steps(collector):.0f} at the collector, each once; held batches "
                  f"spooled {respooled_s:.1f} s after space was freed, all delivered "
                  f"{delivered_s:.1f} s after the collector started")
        finally:
            agent.stop()
            collector.stop()

    def test_first_start_on_a_full_disk_runs_from_memory(self):
        self.mount_small_disk()
        fill(self.spool_dir)
        with Collector(self.tmp) as collector:
            with self.agent(collector) as agent:
                self.assertIn("running WITHOUT a spool", agent.log())
                self.assertEqual(value(agent, "stepwatch_agent_collectors_without_spool"), 1)
                sent = Rounds().send(agent)
                wait_until(lambda: collector_steps(collector) == sent, timeout=30,
                           message=f"{sent} events at the collector")

    def test_a_spool_dir_that_is_not_a_directory_fails_the_start(self):
        path = os.path.join(self.tmp, "not-a-dir")
        with open(path, "w") as f:
            f.write("x")
        collector = Collector(self.tmp)
        agent = Agent(self.tmp, collector.grpc_addr, node="node-f", spool_dir=path)
        agent.process = None
        proc = subprocess.run(agent.command(), capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("--spool-dir", proc.stdout + proc.stderr)


if __name__ == "__main__":
    unittest.main()
