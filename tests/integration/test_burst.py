"""Bursts between training processes and a real agent: 64 client processes end their steps at the
same instant, round after round, over the agent's seqpacket socket; the agent's counters must show
every event received and no client drop. Also: the clients' "dropped" field reaches the agent's
per-job counter, and an old datagram client still works beside the connections. Loopback only;
every wait is bounded."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from harness import SOURCE_DIR, Agent, Collector, metric_value, step_event, wait_until

RANKS = 64
ROUNDS = 15
PER_ROUND = 4  # events each rank sends at each instant

# One rank: waits for the round's instant, sends PER_ROUND events back to back, and prints what
# its reporter counted.
RANK = textwrap.dedent("""
    import json, sys, time
    import stepwatch
    path, job, rank, ranks, start, rounds, per_round = sys.argv[1:8]
    rank, ranks, start = int(rank), int(ranks), float(start)
    rep = stepwatch.Reporter(job, rank, ranks, socket_path=path, env={})
    step = 0
    for r in range(int(rounds)):
        delay = start + 0.1 * r - time.time()
        if delay > 0:
            time.sleep(delay)
        for _ in range(int(per_round)):
            rep.send(step, 0.1, data_s=0.01, compute_s=0.08, comm_s=0.01, samples=8)
            step += 1
    print(json.dumps({"sent": rep.sent, "dropped": rep.dropped, "transport": rep.transport}))
""")


class BurstTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="sw-burst-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name
        self.collector = Collector(self.tmp).start()
        self.addCleanup(self.collector.stop)
        self.agent = Agent(self.tmp, self.collector.grpc_addr).start()
        self.addCleanup(self.agent.stop)

    def agent_metric(self, name, **labels):
        return metric_value(self.agent.scrape(), name, **labels)

    def test_simultaneous_steps_of_64_ranks_all_arrive(self):
        self.assertTrue(os.path.exists(self.agent.socket_path + ".seq"))
        env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE_DIR, "python"))
        # Every rank starts its first round at the same instant, after all have started.
        start = time.time() + 4.0
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RANK, self.agent.socket_path, "burst", str(r), str(RANKS),
                 repr(start), str(ROUNDS), str(PER_ROUND)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            for r in range(RANKS)
        ]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, err.decode(errors="replace"))
            results.append(json.loads(out))
        self.assertLess(time.time(), start + 0.1 * ROUNDS + 10, "the ranks ran far behind")
        total = RANKS * ROUNDS * PER_ROUND
        self.assertEqual({r["transport"] for r in results}, {"seqpacket"})
        self.assertEqual(sum(r["dropped"] for r in results), 0)
        self.assertEqual(sum(r["sent"] for r in results), total)
        wait_until(lambda: self.agent_metric("stepwatch_agent_events_received_total") == total,
                   timeout=10, message=f"the agent to count {total} events")
        self.assertEqual(self.agent_metric("stepwatch_agent_seqpacket_messages_received_total"),
                         total)
        self.assertEqual(self.agent_metric("stepwatch_agent_client_dropped_events_total",
                                           job="burst"), 0)
        self.assertEqual(self.agent_metric("stepwatch_agent_connections_accepted_total"), RANKS)
        self.assertEqual(self.agent_metric("stepwatch_agent_connections_refused_total"), 0)
        wait_until(lambda: self.agent_metric("stepwatch_agent_connections") == 0, timeout=10,
                   message="the connections of the exited ranks to close")

    def test_client_drops_and_old_datagram_clients_are_counted(self):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.addCleanup(conn.close)
        conn.connect(self.agent.socket_path + ".seq")
        for step, dropped in ((0, 3), (1, 0), (2, 4)):
            event = step_event("lossy", 0, 2, step, 0.5)
            if dropped:
                event["dropped"] = dropped
            conn.send(json.dumps(event).encode())
        # An old client: a datagram without the field.
        self.assertTrue(self.agent.send(step_event("lossy", 1, 2, 0, 0.5)))
        wait_until(lambda: self.agent_metric("stepwatch_agent_events_received_total") == 4,
                   timeout=10, message="4 events")
        self.assertEqual(self.agent_metric("stepwatch_agent_client_dropped_events_total",
                                           job="lossy"), 7)
        self.assertEqual(self.agent_metric("stepwatch_agent_datagrams_received_total"), 1)
        self.assertEqual(self.agent_metric("stepwatch_agent_seqpacket_messages_received_total"), 3)


if __name__ == "__main__":
    unittest.main()
