"""Faults injected into real stepwatch processes; every class asserts exactly-once delivery.

The collector runs in one network namespace, the agents in another, joined by a veth pair with
private addresses; network faults are tc netem on that pair (delay, loss, a partition). Kernels
built without sch_netem get two tun devices instead, joined by a forwarder thread here that
delays and drops packets the same way. Process faults are signals (SIGSTOP/SIGCONT and SIGKILL of
the collector, SIGKILL of an agent). Clients send a known number of step events throughout. Each
test asserts:

- every event sent was accepted by an agent (stepwatch_agent_events_shipped_total of every agent
  process), and the collector counted exactly that many (stepwatch_collector_steps_received_total,
  summed over collector processes): nothing lost, nothing counted twice; the count is checked
  again a second after the spools are empty, so a late duplicate would show;
- detection resumes: a straggler sent after the fault healed is flagged by the collector.

Needs root, `ip` and `tc` (iproute2), and netem or /dev/net/tun; skipped otherwise. Namespaces are named swf-<pid>-<random>;
leftovers of runs whose process is gone are removed first. Figures printed with "fault:" are the
table in docs/reliability.md.
"""

import concurrent.futures
import ctypes
import fcntl
import heapq
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest

from harness import (Agent, Collector, http_get, metric_samples, metric_value, peak_rss_mib, scrape,
                     step_event, wait_until)

PREFIX = "swf-"
CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
RANKS_PER_AGENT = 4
STEPS_PER_SECOND = 10  # per rank: 40 events/s per agent


def _skip_reason():
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (iproute2)"
    if not os.path.exists("/dev/net/tun") and not kernel_has_netem():
        return "the kernel has neither sch_netem nor /dev/net/tun"
    return None


def _run(*args, check=True):
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}")
    return result


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_leftover_namespaces():
    """Deletes swf-<pid>-* namespaces whose creating process no longer exists."""
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if name.startswith(PREFIX) and len(parts) >= 3 and parts[1].isdigit():
            if not _pid_alive(int(parts[1])):
                _run("ip", "netns", "del", name, check=False)


_NETEM = {}


def kernel_has_netem():
    """Whether tc netem works here (some VM kernels are built without sch_netem)."""
    if "ok" not in _NETEM:
        probe = f"{PREFIX}{os.getpid()}-probe"
        _run("ip", "netns", "add", probe)
        try:
            _NETEM["ok"] = _run("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem",
                                "delay", "1ms", check=False).returncode == 0
        finally:
            _run("ip", "netns", "del", probe, check=False)
    return _NETEM["ok"]


class Wire:
    """A userspace link between two tun devices, for kernels without netem: packets are copied
    from one namespace's tun to the other's after `delay` seconds, each dropped with probability
    `loss`, per direction (keyed by the sending side)."""

    def __init__(self, fds):
        self.fds = fds  # side -> tun fd
        self.delay = {"c": 0.0, "a": 0.0}
        self.loss = {"c": 0.0, "a": 0.0}
        self.packets = {"c": 0, "a": 0}
        self.dropped = {"c": 0, "a": 0}
        self._lock = threading.Lock()
        self._stop = False
        self._rng = random.Random()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def set(self, side, delay=None, loss=None):
        with self._lock:
            if delay is not None:
                self.delay[side] = delay
            if loss is not None:
                self.loss[side] = loss

    def close(self):
        self._stop = True
        self._thread.join(timeout=5)
        for fd in self.fds.values():
            os.close(fd)

    def _run(self):
        queue = []  # (due, n, out fd, packet)
        n = 0
        side_of = {fd: side for side, fd in self.fds.items()}
        other = {"c": self.fds["a"], "a": self.fds["c"]}
        while not self._stop:
            now = time.monotonic()
            while queue and queue[0][0] <= now:
                _, _, out, packet = heapq.heappop(queue)
                try:
                    os.write(out, packet)
                except OSError:
                    pass  # the device is going away
            wait = min(0.05, queue[0][0] - now) if queue else 0.05
            ready, _, _ = select.select(list(side_of), [], [], max(0.0, wait))
            for fd in ready:
                side = side_of[fd]
                try:
                    packet = os.read(fd, 65536)
                except OSError:
                    continue
                with self._lock:
                    delay, loss = self.delay[side], self.loss[side]
                self.packets[side] += 1
                if loss and self._rng.random() < loss:
                    self.dropped[side] += 1
                    continue
                n += 1
                heapq.heappush(queue, (time.monotonic() + delay, n, other[side], packet))


def _open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


class Net:
    """Two namespaces, collector side "c" and agent side "a", joined by a veth pair with tc netem
    for the faults, or (kernel without netem) by two tun devices and a Wire."""

    def __init__(self):
        tag = f"{os.getpid()}-{random.randrange(16 ** 6):06x}"
        self.ns = {"c": f"{PREFIX}{tag}-c", "a": f"{PREFIX}{tag}-a"}
        self.dev = {"c": "swfc" + tag[-6:], "a": "swfa" + tag[-6:]}
        octet = random.randrange(256)
        self.ip = {"c": f"10.231.{octet}.1", "a": f"10.231.{octet}.2"}
        self.mode = "netem" if kernel_has_netem() else "tun"
        self.wire = None
        self._pools = {}

    def up(self):
        remove_leftover_namespaces()
        for side in "ca":
            _run("ip", "netns", "add", self.ns[side])
        try:
            if self.mode == "netem":
                # Created inside the namespaces: nothing of the host's network is touched.
                _run("ip", "-n", self.ns["c"], "link", "add", self.dev["c"], "type", "veth",
                     "peer", "name", self.dev["a"], "netns", self.ns["a"])
            for side in "ca":
                ns, dev = self.ns[side], self.dev[side]
                peer = self.ip["a" if side == "c" else "c"]
                if self.mode == "netem":
                    _run("ip", "-n", ns, "addr", "add", f"{self.ip[side]}/24", "dev", dev)
                else:
                    _run("ip", "-n", ns, "tuntap", "add", "dev", dev, "mode", "tun")
                    _run("ip", "-n", ns, "addr", "add", self.ip[side], "peer", peer, "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            if self.mode == "tun":
                self.wire = Wire({side: self.call(side, _open_tun, self.dev[side])
                                  for side in "ca"})
        except Exception:
            self.down()
            raise
        return self

    def down(self):
        if self.wire:
            self.wire.close()
            self.wire = None
        for pool in self._pools.values():
            pool.shutdown(wait=False)
        self._pools.clear()
        for ns in self.ns.values():
            _run("ip", "netns", "del", ns, check=False)

    def netem(self, kind, amount, sides="ca"):
        """Delay ("delay", "200ms") or loss ("loss", "20%") on what `sides` send."""
        for side in sides:
            if self.mode == "netem":
                _run("tc", "-n", self.ns[side], "qdisc", "replace", "dev", self.dev[side], "root",
                     "netem", kind, amount)
            elif kind == "delay":
                self.wire.set(side, delay=float(amount.rstrip("ms")) / 1000)
            else:
                self.wire.set(side, loss=float(amount.rstrip("%")) / 100)

    def heal(self, sides="ca"):
        for side in sides:
            if self.mode == "netem":
                _run("tc", "-n", self.ns[side], "qdisc", "del", "dev", self.dev[side], "root",
                     check=False)
            else:
                self.wire.set(side, delay=0.0, loss=0.0)

    def tcp_sockets(self, side, port):
        """TCP sockets on local `port` in namespace `side` that may hold data (ss lines)."""
        out = _run("ip", "netns", "exec", self.ns[side], "ss", "-Htan", f"sport = :{port}").stdout
        return [line for line in out.splitlines()
                if line.split() and line.split()[0] not in ("LISTEN", "TIME-WAIT")]

    def call(self, side, fn, *args, timeout=10):
        """Runs fn(*args) on a thread that lives in namespace `side` (its sockets are there)."""
        pool = self._pools.get(side)
        if pool is None:
            path = f"/run/netns/{self.ns[side]}"
            pool = concurrent.futures.ThreadPoolExecutor(1, initializer=_enter_netns,
                                                         initargs=(path,))
            self._pools[side] = pool
        return pool.submit(fn, *args).result(timeout=timeout)


SKIP_REASON = _skip_reason()


def _enter_netns(path):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def _http_and_tcp_ready(url, host, port):
    http_get(url, timeout=1)
    with socket.create_connection((host, port), timeout=1):
        return True


class NsCollector(Collector):
    """The collector in the collector-side namespace, on fixed ports (the namespace is ours)."""

    def __init__(self, tmpdir, net, **flags):
        super().__init__(tmpdir, **flags)
        self.net = net
        self.grpc_port = 7070
        self.grpc_addr = f"{net.ip['c']}:7070"
        self.metrics_addr = "127.0.0.1:9464"
        self.metrics_url = f"http://{self.metrics_addr}/metrics"

    def command(self):
        return ["ip", "netns", "exec", self.net.ns["c"]] + super().command()

    def _ready(self):
        return self.net.call("c", _http_and_tcp_ready, self.metrics_url, self.net.ip["c"], 7070)

    def scrape(self):
        return self.net.call("c", scrape, self.metrics_url)


class NsAgent(Agent):
    """An agent in the agent-side namespace; its socket is a file, reachable from the host."""

    def __init__(self, tmpdir, net, collector, index, **flags):
        super().__init__(tmpdir, collector.grpc_addr, node=f"node-{index}", interval=0.2,
                         reconnect_max_backoff=0.2,
                         spool_dir=os.path.join(tmpdir, f"spool-{index}"), **flags)
        self.net = net
        self.metrics_addr = f"127.0.0.1:{9100 + index}"
        self.metrics_url = f"http://{self.metrics_addr}/metrics"

    def command(self):
        return ["ip", "netns", "exec", self.net.ns["a"]] + super().command()

    def _ready(self):
        if not os.path.exists(self.socket_path):
            return False
        return self.net.call("a", http_get, self.metrics_url)

    def scrape(self):
        return self.net.call("a", scrape, self.metrics_url)


class Load:
    """Sends steps of one job from every agent's ranks at a steady rate on a thread; counts
    what was sent to each agent."""

    def __init__(self, agents, job):
        self.agents = agents
        self.job = job
        self.world = RANKS_PER_AGENT * len(agents)
        self.step = 0
        self.sent = [0] * len(agents)
        self._stop = threading.Event()
        self._thread = None

    def send_step(self):
        for i, agent in enumerate(self.agents):
            for r in range(RANKS_PER_AGENT):
                rank = i * RANKS_PER_AGENT + r
                if agent.send(step_event(self.job, rank, self.world, self.step, 0.1,
                                         compute_s=0.07, comm_s=0.03)):
                    self.sent[i] += 1
        self.step += 1

    def start(self):
        def loop():
            start = time.monotonic()
            n = 0
            while not self._stop.is_set():
                self.send_step()
                n += 1
                self._stop.wait(max(0.0, start + n / STEPS_PER_SECOND - time.monotonic()))

        self._stop.clear()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def run_for(self, seconds):
        self.start()
        time.sleep(seconds)
        self.stop()


def send_straggler(agent, job, steps=80, slow_rank=5):
    """8 ranks of `job` through one agent, rank `slow_rank` 30% slower; returns events sent."""
    sent = 0
    for step in range(steps):
        for rank in range(8):
            busy = 0.2 * 0.7 * (1.3 if rank == slow_rank else 1.0)
            if agent.send(step_event(job, rank, 8, step, 0.2, data_s=0.0, compute_s=busy,
                                     comm_s=0.2 - busy, samples=32, local_rank=rank, gpu=rank)):
                sent += 1
    return sent


def value(samples, name, **labels):
    return metric_value(samples, name, **labels) or 0


@unittest.skipIf(SKIP_REASON, SKIP_REASON)
class FaultTestBase(unittest.TestCase):
    """Collector + two agents (spooled) across namespaces; bookkeeping for exactly-once."""

    agents_n = 2

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-faults-")
        self.tmp = self._tmp.name
        self.net = Net().up()
        self.addCleanup(self._tmp.cleanup)
        self.addCleanup(self.net.down)
        # STEPWATCH_FAULTS_NO_STATE_DIR=1: no --state-dir, so no deduplication journal (measures
        # what a collector killed with acknowledgements in flight costs without it).
        no_state = os.environ.get("STEPWATCH_FAULTS_NO_STATE_DIR") == "1"
        self.collector = NsCollector(self.tmp, self.net, **({"state_dir": ""} if no_state else {}))
        self.agents = [NsAgent(self.tmp, self.net, self.collector, i) for i in range(self.agents_n)]
        self.addCleanup(self._stop_all)
        self.earlier_counted = 0  # steps counted by collector processes killed since
        self.earlier_duplicates = 0  # duplicate batches they recognised
        self.earlier_accepted = 0  # events accepted by agent processes killed since
        self.earlier_accepted_by = [0] * self.agents_n  # the same, per agent
        self.hwm = {"collector": 0, "agent": 0}

    def _stop_all(self):
        for agent in self.agents:
            agent.stop()
        self.collector.stop()

    def note_memory(self):
        self.hwm["collector"] = max(self.hwm["collector"],
                                    peak_rss_mib(self.collector.process.proc.pid))
        for agent in self.agents:
            if agent.process and agent.process.alive():
                self.hwm["agent"] = max(self.hwm["agent"], peak_rss_mib(agent.process.proc.pid))

    def start_all(self):
        self.collector.start()
        for agent in self.agents:
            agent.start()
        # `ip netns exec` execs the binary: signals and /proc reach it, not a wrapper.
        exe = os.readlink(f"/proc/{self.collector.process.proc.pid}/exe")
        self.assertTrue(exe.endswith("stepwatch-collector"), exe)

    def counted(self):
        return self.earlier_counted + value(self.collector.scrape(),
                                            "stepwatch_collector_steps_received_total")

    def shipped(self, agent):
        return value(agent.scrape(), "stepwatch_agent_events_shipped_total")

    def accepted(self):
        return self.earlier_accepted + sum(self.shipped(a) for a in self.agents)

    def wait_batched(self, load_sent):
        """Every event sent is in a batch (so in a spool): nothing waits in an agent's memory."""
        for i, agent in enumerate(self.agents):
            wait_until(lambda: self.earlier_accepted_by[i] + self.shipped(agent) >= load_sent[i],
                       timeout=30, message=f"agent {i} batched all {load_sent[i]} events")

    def finish(self, fault, sent, healed_at, timeout=120):
        """Asserts exactly-once and resumed detection; prints the figures for the docs."""
        accepted = self.accepted()
        self.assertEqual(accepted, sent, "every event sent was accepted by an agent")
        wait_until(lambda: self.counted() >= accepted, timeout=timeout,
                   message=f"{accepted} events at the collector")
        recovery = time.monotonic() - healed_at
        for agent in self.agents:
            wait_until(lambda: value(agent.scrape(), "stepwatch_agent_spool_batches") == 0,
                       timeout=30, message="spools drained")
        time.sleep(1.0)  # a late duplicate would raise the count
        self.note_memory()
        counted = self.counted()
        duplicates_ignored = self.earlier_duplicates + value(
            self.collector.scrape(), "stepwatch_collector_duplicate_batches_total")
        print(f"fault: {fault}: counted {counted} of {accepted} accepted", flush=True)
        self.assertEqual(counted, accepted, "every accepted event counted exactly once")
        for agent in self.agents:
            samples = agent.scrape()
            for name in ("stepwatch_agent_spool_batches_dropped_total",
                         "stepwatch_agent_batches_dropped_total",
                         "stepwatch_agent_events_dropped_total",
                         "stepwatch_agent_spool_corrupt_records_total"):
                self.assertEqual(value(samples, name), 0, name)
        # Detection resumes: a straggler sent now is flagged.
        job = f"strag-{random.randrange(1 << 30)}"
        strag_sent = send_straggler(self.agents[0], job)
        self.assertEqual(strag_sent, 640)
        wait_until(lambda: value(self.collector.scrape(), "stepwatch_straggler", job=job,
                                 rank=5) == 1, timeout=30, message="the straggler flagged")
        flagged = [l["rank"] for l, v in metric_samples(self.collector.scrape(),
                                                        "stepwatch_straggler")
                   if v == 1 and l.get("job") == job]
        self.assertEqual(flagged, ["5"])
        wait_until(lambda: self.counted() >= accepted + strag_sent, timeout=30,
                   message="the straggler's steps counted")
        self.assertEqual(self.counted(), self.accepted(), "straggler steps counted once")
        print(f"fault: {fault} [{self.net.mode}]: sent {sent}, accepted {accepted}, "
              f"counted {counted}, "
              f"lost {sent - counted}, duplicates counted {counted - accepted}, "
              f"duplicate batches ignored {duplicates_ignored:.0f}, peak VmHWM collector "
              f"{self.hwm['collector']:.1f} MiB agent {self.hwm['agent']:.1f} MiB, "
              f"recovery {recovery:.2f} s", flush=True)


class NetworkFault(FaultTestBase):
    """Load before, during and after a netem fault on both directions of the veth pair."""

    def run_network_fault(self, name, spec, fault_s):
        self.start_all()
        load = Load(self.agents, f"job-{name.split()[0]}")
        load.run_for(2.0)
        wait_until(lambda: self.counted() > 0, timeout=20, message="events flowing before")
        self.net.netem(*spec)
        load.start()
        time.sleep(min(5.0, fault_s / 2))
        during = self.counted()
        time.sleep(fault_s - min(5.0, fault_s / 2))
        load.stop()
        self.note_memory()
        at_heal = self.counted()
        if spec == ["loss", "100%"]:
            # The partition held: nothing arrived after its first seconds.
            self.assertEqual(at_heal, during, "events crossed the partition")
        self.net.heal()
        healed = time.monotonic()
        self.wait_batched(load.sent)
        print(f"fault: {name}: {self.accepted() - at_heal:.0f} events not yet counted when it "
              f"healed")
        self.finish(name, sum(load.sent), healed)


class DelayTest(NetworkFault):
    def test_200ms_delay(self):
        self.run_network_fault("delay 200 ms each way, 8 s", ["delay", "200ms"], 8.0)


class LossTest(NetworkFault):
    def test_20_percent_loss(self):
        self.run_network_fault("loss 20% each way, 8 s", ["loss", "20%"], 8.0)


class PartitionTest(NetworkFault):
    def test_60s_partition(self):
        seconds = float(os.environ.get("STEPWATCH_FAULTS_PARTITION_S", "60"))
        self.run_network_fault(f"partition (loss 100%) {seconds:.0f} s", ["loss", "100%"],
                               seconds)


class CollectorFreezeTest(FaultTestBase):
    def test_five_sigstop_sigcont_of_3s(self):
        self.start_all()
        load = Load(self.agents, "job-freeze").start()
        try:
            pid = self.collector.process.proc.pid
            for _ in range(5):
                time.sleep(1.0)
                os.kill(pid, signal.SIGSTOP)
                time.sleep(3.0)
                os.kill(pid, signal.SIGCONT)
        finally:
            load.stop()
        healed = time.monotonic()
        self.wait_batched(load.sent)
        self.finish("collector SIGSTOP 3 s / SIGCONT x5", sum(load.sent), healed)


class CollectorKillTest(FaultTestBase):
    def test_six_collector_sigkills_with_acks_in_flight(self):
        """Each kill lands with acknowledgements in flight: the collector's replies are dropped
        (loss 100% on its side) while it applies batches, then the agents' side is cut too so
        that its count is final, and it is SIGKILLed. Without a durable deduplication record
        every one of those batches would be counted again by the next collector process."""
        self.start_all()
        load = Load(self.agents, "job-ckill").start()
        unacked = []
        orphan_s = []  # how long the killed process's sockets lived on
        try:
            for _ in range(6):
                time.sleep(0.5)
                acked_before = sum(value(a.scrape(), "stepwatch_agent_batches_acknowledged_total")
                                   for a in self.agents)
                batches_before = value(self.collector.scrape(),
                                       "stepwatch_collector_batches_received_total")
                self.net.netem("loss", "100%", sides="c")  # acknowledgements lost
                time.sleep(0.6)
                self.net.netem("loss", "100%", sides="a")  # nothing more arrives
                stable = []

                def settled():
                    stable.append(self.counted())
                    return len(stable) >= 3 and stable[-1] == stable[-3]

                wait_until(settled, timeout=10, interval=0.2, message="collector count settled")
                samples = self.collector.scrape()
                unacked.append(value(samples, "stepwatch_collector_batches_received_total") -
                               batches_before)
                self.note_memory()
                self.earlier_counted += value(samples, "stepwatch_collector_steps_received_total")
                self.earlier_duplicates += value(samples,
                                                 "stepwatch_collector_duplicate_batches_total")
                self.collector.kill()
                # The killed process's sockets outlive it: the kernel would still deliver the
                # acknowledgements it wrote once the link heals. Destroyed (ss -K), they are lost
                # as in a crash of the machine; where the kernel cannot, they time out.
                t = time.monotonic()
                _run("ip", "netns", "exec", self.net.ns["c"], "ss", "-K", "-tan", "sport = :7070",
                     check=False)
                wait_until(lambda: not self.net.tcp_sockets("c", 7070), timeout=60,
                           message="the killed collector's sockets gone")
                orphan_s.append(round(time.monotonic() - t, 1))
                self.net.heal()
                self.collector.start()
                # The agents are back (their streams broke on the kill) before the next round.
                wait_until(lambda: value(self.collector.scrape(),
                                         "stepwatch_collector_batches_received_total") >=
                           len(self.agents), timeout=15, message="agents reconnected")
                acked_after = sum(value(a.scrape(), "stepwatch_agent_batches_acknowledged_total")
                                  for a in self.agents)
                self.assertGreaterEqual(acked_after, acked_before)
        finally:
            load.stop()
        healed = time.monotonic()
        # Each killed process applied batches whose acknowledgements never left.
        self.assertGreater(sum(unacked), 0, unacked)
        self.wait_batched(load.sent)
        print(f"fault: collector SIGKILL x6: batches applied with the ack lost per kill: "
              f"{unacked}, "
              f"orphaned sockets gone after {orphan_s} s")
        self.finish("collector SIGKILL x6, acks in flight", sum(load.sent), healed)


class AgentKillTest(FaultTestBase):
    agents_n = 1

    def test_three_agent_sigkills_with_a_spool(self):
        """Load runs in bursts; before each SIGKILL the agent has batched (spooled) every event
        of the burst, with the link delayed 200 ms so that batches are unacknowledged when it
        dies. What each agent process accepted is summed."""
        self.start_all()
        agent = self.agents[0]
        self.net.netem("delay", "200ms")
        load = Load(self.agents, "job-akill")
        replayed = []
        for _ in range(3):
            load.run_for(1.5)
            self.wait_batched(load.sent)
            self.note_memory()
            shipped = self.shipped(agent)
            self.earlier_accepted += shipped
            self.earlier_accepted_by[0] += shipped
            agent.kill()
            agent.start()
            replayed.append(value(agent.scrape(), "stepwatch_agent_spool_batches_replayed_total"))
        load.run_for(1.5)
        self.net.heal()
        healed = time.monotonic()
        self.wait_batched(load.sent)
        # Killed with unacknowledged batches: restarts resent them from the spool.
        self.assertGreater(sum(replayed), 0, replayed)
        print(f"fault: agent SIGKILL x3: batches replayed per restart: {replayed}")
        self.finish("agent SIGKILL x3 with a spool, 200 ms delay", sum(load.sent), healed)


if __name__ == "__main__":
    unittest.main()
