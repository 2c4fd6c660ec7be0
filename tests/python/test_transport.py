"""The reporter's transport: the agent's seqpacket socket when it has one, else datagrams; and the
"dropped" field with which a reporter tells the agent what it lost."""

import logging
import os
import tempfile
import unittest

import stepwatch
from sockets import FakeAgent, FakeSeqpacketAgent, wait_until


def make_reporter(test, agent, **kwargs):
    rep = stepwatch.Reporter(
        "job1", 1, 4, socket_path=agent.path, env={}, reconnect_interval=0.0, **kwargs
    )
    test.addCleanup(rep.close)
    return rep


class SeqpacketTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeSeqpacketAgent()
        self.addCleanup(self.agent.close)

    def test_connects_to_the_seqpacket_socket_when_present(self):
        rep = make_reporter(self, self.agent)
        self.assertIsNone(rep.transport)  # lazily
        self.assertTrue(rep.send(3, 0.5, samples=8))
        self.assertEqual(rep.transport, "seqpacket")
        self.assertEqual(self.agent.recv_raw(),
                         b'{"job":"job1","rank":1,"world_size":4,"step":3,"step_s":0.5,"samples":8}')
        self.assertIsNone(self.agent.recv_datagram(0.05))

    def test_each_event_is_one_packet(self):
        rep = make_reporter(self, self.agent)
        for i in range(50):
            self.assertTrue(rep.send(i, 0.5))
        self.assertEqual([e["step"] for e in self.agent.drain()], list(range(50)))

    def test_step_scope_goes_through_the_connection(self):
        rep = make_reporter(self, self.agent)
        with rep.step(samples=4):
            with rep.phase("data"):
                pass
            with rep.phase("compute"):
                pass
            with rep.phase("comm"):
                pass
        event = self.agent.recv()
        self.assertEqual((event["step"], event["samples"]), (0, 4))
        self.assertNotIn("dropped", event)

    def test_agent_restart_reconnects_and_reports_the_loss(self):
        rep = make_reporter(self, self.agent)
        self.assertTrue(rep.send(0, 0.5))
        self.assertEqual(self.agent.recv()["step"], 0)
        self.agent.stop_listening()
        with self.assertLogs("stepwatch", logging.WARNING):
            self.assertFalse(rep.send(1, 0.5))  # the connection is gone: dropped, counted
        self.assertEqual(rep.dropped, 1)
        self.agent.listen()
        self.assertTrue(rep.send(2, 0.5))
        self.assertEqual(rep.transport, "seqpacket")
        event = self.agent.recv()
        self.assertEqual((event["step"], event["dropped"]), (2, 1))
        self.assertTrue(rep.send(3, 0.5))
        self.assertNotIn("dropped", self.agent.recv())  # reported once

    def test_full_connection_never_blocks_and_the_drops_are_reported(self):
        rep = make_reporter(self, self.agent)
        self.assertTrue(rep.send(0, 0.5))
        self.assertEqual(self.agent.recv()["step"], 0)  # accepted; now the agent reads nothing
        with self.assertLogs("stepwatch", logging.WARNING) as logs:
            step = 1
            while rep.dropped < 50 and step < 200000:
                rep.send(step, 0.5, 0.1, 0.3, 0.1, 8)
                step += 1
        self.assertEqual(len(logs.records), 1)
        self.assertGreaterEqual(rep.dropped, 50)
        self.assertEqual(rep.sent + rep.dropped, step)
        queued = self.agent.drain()
        self.assertEqual(len(queued), rep.sent - 1)
        self.assertTrue(all("dropped" not in e for e in queued))
        # The step scope's own send path carries the field as well.
        with rep.step():
            with rep.phase("data"):
                pass
            with rep.phase("compute"):
                pass
            with rep.phase("comm"):
                pass
        event = self.agent.recv()
        self.assertEqual(event["dropped"], rep.dropped)
        self.assertTrue(rep.send(step + 1, 0.5))
        self.assertNotIn("dropped", self.agent.recv())


class DatagramFallbackTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)

    def test_older_agent_gets_datagrams(self):
        rep = make_reporter(self, self.agent)
        self.assertTrue(rep.send(4, 0.5))
        self.assertEqual(rep.transport, "datagram")
        self.assertEqual(self.agent.recv()["step"], 4)

    def test_drops_while_the_agent_was_absent_are_reported_when_it_appears(self):
        self.agent.unbind()
        rep = make_reporter(self, self.agent)
        with self.assertLogs("stepwatch", logging.WARNING):
            for i in range(7):
                self.assertFalse(rep.send(i, 0.5))
        self.agent.bind()
        self.assertTrue(wait_until(lambda: rep.send(7, 0.5)))
        event = self.agent.recv()
        self.assertEqual((event["step"], event["dropped"]), (7, rep.dropped))
        self.assertGreaterEqual(rep.dropped, 7)

    def test_a_seqpacket_socket_appearing_later_is_used_after_a_reconnect(self):
        rep = make_reporter(self, self.agent)
        self.assertTrue(rep.send(0, 0.5))
        self.assertEqual(rep.transport, "datagram")
        self.agent.recv()
        # The agent restarts as a newer one: the datagram socket is replaced, a seqpacket one added.
        self.agent.unbind()
        upgraded = FakeSeqpacketAgent(os.path.dirname(self.agent.path))
        self.addCleanup(upgraded.close)
        with self.assertLogs("stepwatch", logging.WARNING):
            self.assertTrue(wait_until(lambda: rep.send(1, 0.5)))
        self.assertEqual(rep.transport, "seqpacket")
        self.assertEqual(upgraded.recv()["step"], 1)

    def test_a_seqpacket_path_too_long_for_an_address_falls_back(self):
        with tempfile.TemporaryDirectory(prefix="sw-") as d:
            # The datagram path fits in an address, "<path>.seq" does not.
            long_dir = os.path.join(d, "x" * (105 - len(d) - 1 - len("/agent.sock")))
            os.mkdir(long_dir)
            agent = FakeAgent(long_dir)
            self.addCleanup(agent.close)
            self.assertEqual(len(agent.path), 105)
            rep = make_reporter(self, agent)
            self.assertTrue(rep.send(0, 0.5))
            self.assertEqual(rep.transport, "datagram")
            self.assertEqual(agent.recv()["step"], 0)


if __name__ == "__main__":
    unittest.main()
