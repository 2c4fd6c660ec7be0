"""InfiniBand/RoCE port health through a real agent and collector.

The agent reads a fake sysfs tree (nic_sysfs.FakeNicSysfs) under --host-root and exports each
port on its /metrics (stepwatch_agent_nic_*); the ports travel with the host sample and the
collector, with --export-node-metrics=all, shows the same series (stepwatch_nic_*). Each test
changes its own port: one goes down, one trains at a lower rate, one has rising symbol errors,
one keeps an old constant count, one has unreadable files.
"""

import os
import tempfile
import unittest

from harness import Agent, Collector, metric_value, wait_until
from nic_sysfs import FakeNicSysfs

NODE = "node-nic"
DOWN, DEGRADED, ERRORS, HEALTHY, GARBAGE = (f"mlx5_{d}:1" for d in range(5))


class NicHealthTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.sysfs = FakeNicSysfs(os.path.join(cls.tmp.name, "root"), devices=5)
        # Errors from before the agent started: history, constant.
        cls.sysfs.set_counter(HEALTHY, "symbol_error", 1000)
        cls.collector = Collector(cls.tmp.name, export_node_metrics="all").start()
        cls.agent = Agent(cls.tmp.name, cls.collector.grpc_addr, node=NODE,
                          host_root=cls.sysfs.root).start()

    @classmethod
    def tearDownClass(cls):
        cls.agent.stop()
        cls.collector.stop()
        cls.tmp.cleanup()

    def agent_value(self, name, **labels):
        return metric_value(self.agent.scrape(), "stepwatch_agent_" + name, node=NODE, **labels)

    def collector_value(self, name, **labels):
        return metric_value(self.collector.scrape(), "stepwatch_" + name, node=NODE, **labels)

    def wait_both(self, name, expected, **labels):
        """The agent's and then the collector's series reach `expected`."""
        wait_until(lambda: self.agent_value(name, **labels) == expected, timeout=20,
                   message=f"agent {name}{labels} == {expected}")
        wait_until(lambda: self.collector_value(name, **labels) == expected, timeout=20,
                   message=f"collector {name}{labels} == {expected}")

    def test_every_port_is_read_and_reaches_the_collector(self):
        wait_until(lambda: self.agent_value("nic_ports") == 5, timeout=20, message="5 ports")
        self.wait_both("nic_port_rate_bytes_per_second", 25e9, device=HEALTHY)
        self.wait_both("nic_port_link_width", 4, device=HEALTHY)
        self.wait_both("nic_port_up", 1, device=HEALTHY)
        self.wait_both("nic_port_info", 1, device=HEALTHY, link_layer="InfiniBand")
        self.wait_both("nic_port_errors_total", 1000, device=HEALTHY, counter="symbol_error")
        self.assertGreater(metric_value(self.collector.scrape(),
                                        "stepwatch_collector_host_samples_received_total"), 0)
        # Agent-only: the driver's counters and the bound.
        self.assertEqual(self.agent_value("nic_port_hw_counters_total", device=HEALTHY,
                                          counter="out_of_buffer"), 0)
        self.assertEqual(self.agent_value("nic_ports_omitted"), 0)
        self.assertIsNone(self.collector_value("nic_port_hw_counters_total", device=HEALTHY,
                                               counter="out_of_buffer"))

    def test_port_going_down(self):
        self.wait_both("nic_port_up", 1, device=DOWN)
        self.sysfs.set_state(DOWN, 1, 3)  # DOWN, Disabled
        self.sysfs.set_counter(DOWN, "link_downed", 1)
        self.wait_both("nic_port_up", 0, device=DOWN)
        self.wait_both("nic_port_state", 1, device=DOWN)
        self.wait_both("nic_port_physical_state", 3, device=DOWN)
        self.wait_both("nic_port_errors_total", 1, device=DOWN, counter="link_downed")
        # Logically ACTIVE while the physical link retrains is not up either.
        self.sysfs.set_state(DOWN, 4, 6)  # ACTIVE, LinkErrorRecovery
        self.wait_both("nic_port_physical_state", 6, device=DOWN)
        self.assertEqual(self.agent_value("nic_port_up", device=DOWN), 0)

    def test_degraded_rate(self):
        self.wait_both("nic_port_rate_bytes_per_second", 25e9, device=DEGRADED)
        self.sysfs.set_rate(DEGRADED, "100 Gb/sec (2X HDR)")
        self.wait_both("nic_port_rate_bytes_per_second", 12.5e9, device=DEGRADED)
        self.wait_both("nic_port_link_width", 2, device=DEGRADED)
        self.assertEqual(self.agent_value("nic_port_up", device=DEGRADED), 1)

    def test_rising_symbol_errors_and_traffic_in_bytes(self):
        self.wait_both("nic_port_errors_total", 0, device=ERRORS, counter="symbol_error")
        for count in (10, 250, 4000):
            self.sysfs.set_counter(ERRORS, "symbol_error", count)
            self.wait_both("nic_port_errors_total", count, device=ERRORS, counter="symbol_error")
        # port_rcv_data and port_xmit_data count 4-byte words.
        self.sysfs.set_counter(ERRORS, "port_rcv_data", 1000)
        self.sysfs.set_counter(ERRORS, "port_xmit_data", 3)
        self.wait_both("nic_port_received_bytes_total", 4000, device=ERRORS)
        self.wait_both("nic_port_transmitted_bytes_total", 12, device=ERRORS)

    def test_unreadable_files_are_unavailable_and_logged_once(self):
        self.wait_both("nic_port_up", 1, device=GARBAGE)
        self.sysfs.write(GARBAGE, "state", "\x00\xffnot a state\n")
        os.remove(os.path.join(self.sysfs.port_dir(GARBAGE), "counters", "port_rcv_errors"))
        wait_until(lambda: self.agent_value("nic_port_reading_unavailable", device=GARBAGE,
                                            reading="state") == 1,
                   timeout=20, message="state unavailable")
        self.assertEqual(self.agent_value("nic_port_reading_unavailable", device=GARBAGE,
                                          reading="counters/port_rcv_errors"), 1)
        # No made-up value: the series are gone, on the agent and on the collector.
        wait_until(lambda: self.collector_value("nic_port_up", device=GARBAGE) is None,
                   timeout=20, message="collector drops nic_port_up of the port")
        self.assertIsNone(self.agent_value("nic_port_state", device=GARBAGE))
        self.assertIsNone(self.agent_value("nic_port_errors_total", device=GARBAGE,
                                           counter="port_rcv_errors"))
        # The other readings of the port are still there, and the agent keeps running.
        self.assertEqual(self.agent_value("nic_port_physical_state", device=GARBAGE), 5)
        self.assertTrue(self.agent.process.alive())
        # Many samples later the failure was logged once.
        samples = self.agent_value("batches_created_total")
        wait_until(lambda: self.agent_value("batches_created_total") >= samples + 5, timeout=20,
                   message="five more batches")
        log = self.agent.log()
        self.assertEqual(log.count("NIC reading state unavailable"), 1, log[-2000:])
        self.sysfs.set_state(GARBAGE, 4, 5)
        self.wait_both("nic_port_up", 1, device=GARBAGE)


if __name__ == "__main__":
    unittest.main()
