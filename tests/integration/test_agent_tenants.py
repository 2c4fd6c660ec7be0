"""Tenants of a shared node at the agent, with real processes: one live process invents 65,536
(job, rank) pairs; it gets its --max-ranks-per-process share, the rest is refused (tenant_limit)
and counted under its uid, and another user's new job still reaches the collector whole. And an
agent in a pid namespace of its own (unshare --pid --fork) says at start what it cannot enforce
and counts the senders it sees with pid 0. Loopback only; every wait is bounded."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from harness import (Agent, Collector, assert_rss_at_most, metric_value, peak_rss_mib, step_event,
                     wait_until)

# Sends `count` events of distinct invented (job, rank) pairs as fast as it can, prints "sent",
# then stays alive (its bindings with it) until stdin closes.
FLOOD = textwrap.dedent("""
    import json, socket, sys
    path, count = sys.argv[1], int(sys.argv[2])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for i in range(count):
        s.sendto(json.dumps({"job": "flood-%d" % (i // 1024), "rank": i % 1024,
                             "world_size": 1024, "step": 0, "step_s": 0.1}).encode(), path)
    print("sent", flush=True)
    sys.stdin.readline()
""")

# One job of `ranks` ranks and `steps` steps; exits 3 on EACCES.
JOB = textwrap.dedent("""
    import json, socket, sys
    path, job, ranks, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for step in range(steps):
            for rank in range(ranks):
                s.sendto(json.dumps({"job": job, "rank": rank, "world_size": ranks,
                                     "step": step, "step_s": 0.1}).encode(), path)
    except PermissionError:
        sys.exit(3)
    print("sent", flush=True)
    sys.stdin.readline()
""")

NOBODY = 65534


def agent_value(agent, name, **labels):
    return metric_value(agent.scrape(), name, **labels) or 0


class AgentTenantsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-tenants-")
        self.tmp = self._tmp.name
        os.chmod(self.tmp, 0o755)  # the other user must reach the socket's directory

    def tearDown(self):
        self._tmp.cleanup()

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run a sender as another user")
    def test_one_flooding_process_does_not_lock_other_users_out(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-t", socket_mode="0666") as agent:
            flood = subprocess.Popen([sys.executable, "-c", FLOOD, agent.socket_path, "65536"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                started = time.monotonic()
                self.assertEqual(flood.stdout.readline().strip(), "sent")
                flood_s = time.monotonic() - started
                wait_until(lambda: agent_value(agent, "stepwatch_agent_datagrams_received_total")
                           >= 65536 or agent_value(agent, "stepwatch_agent_events_rejected_total",
                                                   reason="tenant_limit") >= 65536 - 4096,
                           timeout=60, message="the flood to be read")
                # The flooder holds its share; the victim's job is another user's and gets in.
                victim = subprocess.Popen(
                    ["/usr/bin/python3", "-c", JOB, agent.socket_path, "victim", "4", "10"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    preexec_fn=lambda: (os.setgid(NOBODY), os.setuid(NOBODY)))
                try:
                    self.assertEqual(victim.stdout.readline().strip(), "sent")
                    wait_until(lambda: metric_value(collector.scrape(), "stepwatch_job_last_step",
                                                    job="victim") == 9, timeout=30,
                               message="the other user's job at the collector")
                finally:
                    victim.communicate("\n", timeout=30)
                self.assertEqual(victim.returncode, 0)
            finally:
                flood.communicate("\n", timeout=30)
            samples = agent.scrape()
            refused = metric_value(samples, "stepwatch_agent_events_rejected_total",
                                   reason="tenant_limit")
            received = metric_value(samples, "stepwatch_agent_events_received_total")
            datagrams = metric_value(samples, "stepwatch_agent_datagrams_received_total")
            by_uid = metric_value(samples, "stepwatch_agent_tenant_refusals_total", uid="0")
            # Every datagram read is accepted or refused; the flooder got exactly its share.
            self.assertEqual(refused, by_uid)
            self.assertEqual(received, 4096 + 40)
            self.assertEqual(refused, datagrams - received)
            self.assertIsNone(metric_value(samples, "stepwatch_agent_tenant_refusals_total",
                                           uid=str(NOBODY)))
            self.assertEqual(metric_value(samples, "stepwatch_agent_events_rejected_total",
                                          reason="not_owner"), 0)
            self.assertEqual(agent.log().count("reached --max-ranks-per-process=4096"), 1)
            agent_mib = peak_rss_mib(agent.process.proc.pid)
            collector_mib = peak_rss_mib(collector.process.proc.pid)
            print(f"flood of 65536 invented ranks sent in {flood_s:.2f} s: {received - 40:.0f} "
                  f"accepted, {refused:.0f} refused (tenant_limit), {65536 + 40 - datagrams:.0f} lost "
                  f"in the socket queue; the other user's 40 events all arrived; VmHWM agent "
                  f"{agent_mib:.0f} MiB, collector {collector_mib:.0f} MiB")
            # The refused ranks take no table space: the agent stays near its idle size.
            assert_rss_at_most(self, agent_mib, 64, f"agent VmHWM {agent_mib:.0f} MiB")

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("unshare"),
                         "needs root and unshare for a pid namespace")
    def test_an_agent_in_its_own_pid_namespace_says_what_it_loses(self):
        with Collector(self.tmp) as collector:
            agent = Agent(self.tmp, collector.grpc_addr, node="node-ns")
            command = agent.command
            agent.command = lambda: ["unshare", "--pid", "--fork", "--kill-child"] + command()
            with agent:
                self.assertEqual(agent_value(agent, "stepwatch_agent_own_pid_namespace"), 1)
                self.assertIn("runs in a pid namespace of its own", agent.log())
                for step in range(3):
                    for rank in range(2):
                        self.assertTrue(agent.send(step_event("ns-job", rank, 2, step, 0.1)))
                wait_until(lambda: agent_value(agent, "stepwatch_agent_unknown_sender_events_total")
                           == 6, timeout=20, message="the pid-0 senders to be counted")
                # Still accepted and shipped: only the local checks are lost.
                wait_until(lambda: metric_value(collector.scrape(), "stepwatch_job_last_step",
                                                job="ns-job") == 2, timeout=20,
                           message="the job at the collector")
                self.assertEqual(agent.log().count("cannot name in the agent's pid namespace"), 1)


if __name__ == "__main__":
    unittest.main()
