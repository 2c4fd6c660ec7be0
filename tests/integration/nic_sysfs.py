"""A fake sysfs tree of InfiniBand/RoCE ports for an agent's --host-root.

It lays out <root>/sys/class/infiniband/<device>/ports/<port>/ as the kernel does (state,
phys_state, rate, link_layer, counters/*, hw_counters/*), with <root>/proc a link to the real /proc
(the host sampler needs /proc/stat). Tests change states, rates and counters while the agent runs;
each file is replaced atomically, so the agent never reads half a write.
"""

import os
import sys

STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining",
               5: "LinkUp", 6: "LinkErrorRecovery", 7: "PhyTest"}
COUNTERS = ("symbol_error", "port_rcv_errors", "link_downed", "port_xmit_discards",
            "port_xmit_wait", "port_rcv_data", "port_xmit_data")


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class FakeNicSysfs:
    """`devices` HDR ports (mlx5_0:1, mlx5_1:1, ...), every one ACTIVE/LinkUp at 200 Gb/sec."""

    def __init__(self, root, devices=2, ports_per_device=1, hw_counters=("out_of_buffer",)):
        self.root = root
        os.makedirs(root, exist_ok=True)
        proc = os.path.join(root, "proc")
        if not os.path.lexists(proc):
            os.symlink("/proc", proc)
        self.ports = []
        for d in range(devices):
            for p in range(1, ports_per_device + 1):
                device = f"mlx5_{d}:{p}"
                self.ports.append(device)
                self.set_state(device, 4, 5)
                self.set_rate(device, "200 Gb/sec (4X HDR)")
                self.write(device, "link_layer", "InfiniBand\n")
                for counter in COUNTERS:
                    self.set_counter(device, counter, 0)
                for name in hw_counters:
                    self.write(device, f"hw_counters/{name}", "0\n")

    def port_dir(self, device):
        name, port = device.split(":")
        return os.path.join(self.root, "sys", "class", "infiniband", name, "ports", port)

    def write(self, device, relative, text):
        """Writes one file of the port (`relative` to its directory), e.g. garbage into `state`."""
        _write(os.path.join(self.port_dir(device), relative), text)

    def set_state(self, device, state, phys_state):
        self.write(device, "state", f"{state}: {STATES.get(state, 'UNKNOWN')}\n")
        name = PHYS_STATES.get(phys_state, "Unknown")
        self.write(device, "phys_state", f"{phys_state}: {name}\n")

    def set_rate(self, device, rate):
        self.write(device, "rate", rate + "\n")

    def set_counter(self, device, counter, value):
        """`counter` is a file of counters/ (port_rcv_data and port_xmit_data in 4-byte words)."""
        self.write(device, f"counters/{counter}", f"{value}\n")


if __name__ == "__main__":
    # nic_sysfs.py ROOT [DEVICES]: a tree for benchmarks (bench/agent/measure_agent_overhead.sh).
    FakeNicSysfs(sys.argv[1], devices=int(sys.argv[2]) if len(sys.argv) > 2 else 8,
                 hw_counters=("out_of_buffer", "local_ack_timeout_err", "rx_write_requests"))
