"""A job that ends is not a stall: real agent and collector, training ranks played by short-lived
child processes that send through the agent's socket. The agent sees the senders' processes exit
(SO_PASSCRED pids) and the collector forgets the finished job at once, while a job whose processes
stay alive and silent (a hang) is still reported as a stall."""

import json
import os
import subprocess
import tempfile
import time
import unittest

from harness import Agent, Collector, ctl_json, metric_value, wait_until

PYTHON = "/usr/bin/python3"

# argv: socket job world_size first_rank last_rank steps linger_seconds. Sends steps (step_s 1 s,
# so the stall limit is 2 x 1 s with --stall-multiple=2), then sleeps `linger` seconds and exits.
RANKS = r"""
import json, socket, sys, time
path, job = sys.argv[1], sys.argv[2]
world, first, last, steps = (int(a) for a in sys.argv[3:7])
linger = float(sys.argv[7])
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for step in range(steps):
        for rank in range(first, last + 1):
            event = {"job": job, "rank": rank, "world_size": world, "step": step, "step_s": 1.0}
            s.sendto(json.dumps(event).encode(), path)
print("sent", flush=True)
time.sleep(linger)
"""


def ranks_process(agent, job, world, first, last, steps=20, linger=0.0):
    return subprocess.Popen([PYTHON, "-c", RANKS, agent.socket_path, job, str(world), str(first),
                             str(last), str(steps), str(linger)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)


def jobs(collector):
    return {j["job"]: j for j in ctl_json(collector.grpc_addr, "status").get("jobs", [])}


def stalls(collector, job):
    return [f for f in ctl_json(collector.grpc_addr, "findings").get("findings", [])
            if f["kind"] == "stall" and f["job"] == job]


class JobEndTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-jobend-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name
        self.collector = Collector(self.tmp, stall_floor=1, stall_multiple=2, tick=0.2)
        self.collector.start()
        self.addCleanup(self.collector.stop)
        self.agent = Agent(self.tmp, self.collector.grpc_addr, node="node-0")
        self.agent.start()
        self.addCleanup(self.agent.stop)
        self.procs = []
        self.addCleanup(self._kill_children)

    def _kill_children(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
            if p.stdout:
                p.stdout.close()

    def start(self, *args, **kwargs):
        p = ranks_process(self.agent, *args, **kwargs)
        self.procs.append(p)
        # Wait for the sends so that the timing below starts from the last step.
        self.assertEqual(p.stdout.readline().strip(), "sent")
        return p

    def diagnostics(self):
        return "--- agent\n%s\n--- collector\n%s" % (self.agent.log()[-3000:],
                                                      self.collector.log()[-3000:])

    def test_finished_job_is_forgotten_without_a_stall(self):
        p = self.start("ended", 2, 0, 1)
        self.assertEqual(p.wait(timeout=30), 0)
        # The steps reached the collector (the job existed) ...
        wait_until(lambda: (metric_value(self.collector.scrape(),
                                         "stepwatch_collector_steps_received_total") or 0) >= 40,
                   timeout=10, message="the 40 steps at the collector")
        # ... and for 3x the 2 s stall limit nothing pages: the job is gone, not stalled.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            self.assertEqual(stalls(self.collector, "ended"), [], self.diagnostics())
            time.sleep(0.3)
        self.assertNotIn("ended", jobs(self.collector), self.diagnostics())
        self.assertIn("job ended finished: all 2 ranks exited", self.collector.log())
        samples = self.agent.scrape()
        self.assertEqual(metric_value(samples, "stepwatch_agent_rank_exits_total"), 2)
        samples = self.collector.scrape()
        self.assertEqual(metric_value(samples, "stepwatch_collector_jobs_finished_total"), 1)

    def test_silent_live_process_is_a_stall_that_names_exited_ranks(self):
        # Rank 1 stays alive and silent, as in a hang; rank 0 ends (crashed, say).
        hung = self.start("hang", 2, 1, 1, linger=120)
        crashed = self.start("hang", 2, 0, 0)
        self.assertEqual(crashed.wait(timeout=30), 0)
        found = wait_until(lambda: stalls(self.collector, "hang"), timeout=20, interval=0.3,
                           message="a stall finding for the hung job")
        self.assertEqual(found[0]["severity"], "critical")
        self.assertIn("rank 0 exited", found[0]["summary"])
        self.assertIn("hang", jobs(self.collector))
        self.assertTrue(hung.poll() is None, "the hung rank must still run")
        # Its last process ends too: now the job has finished and leaves with its stall.
        hung.kill()
        hung.wait(timeout=30)
        wait_until(lambda: "hang" not in jobs(self.collector), timeout=10,
                   message="the job to finish once its last process is gone")
        self.assertEqual(stalls(self.collector, "hang"), [])
        self.assertIn("job hang finished: all 2 ranks exited", self.collector.log())


if __name__ == "__main__":
    unittest.main()
