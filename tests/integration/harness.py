"""Test harness: starts the real stepwatch binaries on free loopback ports.

Standard library only. Every wait is bounded; processes are stopped with SIGTERM (then SIGKILL)
when a context manager exits, and their logs are kept in the test's temporary directory so that a
failure can show what the process said.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

BUILD_DIR = os.environ.get("STEPWATCH_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
SOURCE_DIR = os.environ.get("STEPWATCH_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))

_KNOWN_PATHS = {
    "stepwatch-agent": "agent/stepwatch-agent",
    "stepwatch-collector": "collector/stepwatch-collector",
    "stepwatchctl": "ctl/stepwatchctl",
    "stepwatch-sim": "sim/stepwatch-sim",
    "libnvidia-ml.so.1": "tests/gpu/fake_nvml/libnvidia-ml.so.1",
}


def build_path(name):
    """Absolute path of a file the build produced (a binary or the fake NVML library)."""
    known = _KNOWN_PATHS.get(name)
    if known and os.path.exists(os.path.join(BUILD_DIR, known)):
        return os.path.abspath(os.path.join(BUILD_DIR, known))
    for root, _dirs, files in os.walk(BUILD_DIR):
        if name in files:
            return os.path.abspath(os.path.join(root, name))
    raise FileNotFoundError(f"{name} not found under build dir {BUILD_DIR}")


def sanitized_build():
    """True when the binaries under test carry AddressSanitizer (the clang pass of the test
    command): its quarantine and shadow memory make RSS figures say nothing about stepwatch's own
    memory bounds, so RSS bounds are asserted by the GCC pass only."""
    try:
        with open(os.path.join(BUILD_DIR, "CMakeCache.txt"), encoding="utf-8") as f:
            cache = f.read().splitlines()
    except OSError:
        return False
    return "STEPWATCH_SANITIZE:BOOL=ON" in cache


def assert_rss_at_most(test, rss, bound, message=None):
    """test.assertLessEqual(rss, bound, message), except in a sanitized build (see above)."""
    if sanitized_build():
        return
    test.assertLessEqual(rss, bound, message)


def peak_rss_mib(pid):
    """Peak resident memory (VmHWM) of a live process, MiB."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def fake_nvml_path():
    return build_path("libnvidia-ml.so.1")


# Ports free_port handed out in this process: the kernel may give a port it just released to
# the next bind, and two servers told one port leave one of them unstarted.
_ports_given = set()


def free_port(host="127.0.0.1"):
    """A TCP port that was free a moment ago (the kernel picks it), never one this process was
    given before."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(50):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise RuntimeError("no new free port in 50 tries")


def wait_until(predicate, timeout=30.0, interval=0.1, message="condition"):
    """Polls predicate() until it returns a truthy value, which is returned; fails after timeout."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # the condition may not be checkable yet (server starting)
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {message}{detail}")
        time.sleep(interval)


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8")


def _parse_labels(text):
    labels = {}
    i = 0
    n = len(text)
    while i < n:
        eq = text.index("=", i)
        key = text[i:eq].strip().lstrip(",").strip()
        assert text[eq + 1] == '"', text
        j = eq + 2
        value = []
        while text[j] != '"':
            if text[j] == "\\":
                nxt = text[j + 1]
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, nxt))
                j += 2
            else:
                value.append(text[j])
                j += 1
        labels[key] = "".join(value)
        i = j + 1
        while i < n and text[i] in ", ":
            i += 1
    return labels


def parse_metrics(text):
    """Prometheus text format -> list of (name, labels dict, float value)."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            label_text, value_text = rest.rsplit("}", 1)
            labels = _parse_labels(label_text)
        else:
            name, value_text = line.split(None, 1)
            labels = {}
        value = value_text.split()[0]
        samples.append((name, labels, float(value)))
    return samples


def scrape(url):
    return parse_metrics(http_get(url))


def metric_values(samples, name, **labels):
    """Values of every sample of `name` whose labels include `labels`."""
    want = {k: str(v) for k, v in labels.items()}
    return [v for (n, l, v) in samples if n == name and all(l.get(k) == x for k, x in want.items())]


def metric_value(samples, name, **labels):
    """The first matching value, or None."""
    values = metric_values(samples, name, **labels)
    return values[0] if values else None


def metric_samples(samples, name):
    return [(l, v) for (n, l, v) in samples if n == name]


def send_step(socket_path, event):
    """Sends one datagram (a dict is JSON-encoded) to an agent's socket. Returns True if sent."""
    payload = event if isinstance(event, (bytes, bytearray)) else json.dumps(event).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(payload, socket_path)
            return True
        except OSError:
            return False


def write_json_atomic(path, value):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def fake_gpu(index, utilization=90, pids=(), **overrides):
    """One GPU entry of the fake NVML state (docs/fake-nvml.md)."""
    gpu = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-00000000-0000-0000-0000-{index:012d}",
        "utilization_gpu": utilization,
        "utilization_memory": 35,
        "memory_used_bytes": 40 * 2**30,
        "memory_total_bytes": 80 * 2**30,
        "sm_clock_mhz": 1980,
        "sm_clock_max_mhz": 1980,
        "power_mw": 500000,
        "power_limit_mw": 700000,
        "temperature_c": 60,
        "throttle_reasons": 0,
        "sm_activity": utilization / 100 * 0.9,
        "dram_bandwidth": 0.4,
        "tensor_activity": 0.5,
        "pids": list(pids),
    }
    gpu.update(overrides)
    return gpu


def fake_nvml_state(gpus, driver_version="550.54.15"):
    return {"driver_version": driver_version, "gpus": gpus}


class Process:
    """A started binary whose output goes to a log file; stopped on close()."""

    def __init__(self, name, args, log_path, env=None):
        self.name = name
        self.args = args
        self.log_path = log_path
        self.env = env
        self.proc = None

    def start(self):
        log = open(self.log_path, "ab")
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        log.close()
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout=15.0):
        """Stops the process; returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def kill(self):
        return self.stop(signal.SIGKILL)


class _Service:
    """Common lifecycle of the collector and agent wrappers."""

    ready_timeout = 30.0

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def _ready(self):
        raise NotImplementedError

    def _wait_ready(self):
        try:
            wait_until(lambda: self.process.alive() and self._ready(), timeout=self.ready_timeout,
                       message=f"{self.process.name} to become ready")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- {self.process.name} log ---\n{self.process.log()[-4000:]}")

    def start(self):
        self.process = Process(self.name, self.command(), self.log_path, self.env).start()
        self._wait_ready()
        return self

    def stop(self):
        return self.process.stop() if self.process else None

    def kill(self):
        return self.process.kill() if self.process else None

    def restart(self):
        self.stop()
        return self.start()

    def log(self):
        return self.process.log() if self.process else ""


def _flag_args(flags):
    args = []
    for key, value in flags.items():
        if value is None:
            continue
        args.append(f"--{key.replace('_', '-')}={value}")
    return args


class Collector(_Service):
    """stepwatch-collector on free loopback ports, with its state dir under tmpdir."""

    def __init__(self, tmpdir, name="collector", **flags):
        self.name = name
        self.tmpdir = tmpdir
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.grpc_addr = f"127.0.0.1:{self.grpc_port}"
        self.metrics_addr = f"127.0.0.1:{self.metrics_port}"
        self.metrics_url = f"http://{self.metrics_addr}/metrics"
        self.state_dir = os.path.join(tmpdir, f"{name}-state")
        os.makedirs(self.state_dir, exist_ok=True)
        self.log_path = os.path.join(tmpdir, f"{name}.log")
        self.flags = flags
        self.env = None
        self.process = None

    def command(self):
        flags = {"grpc_listen": self.grpc_addr, "metrics_listen": self.metrics_addr,
                 "state_dir": self.state_dir}
        flags.update(self.flags)
        return [build_path("stepwatch-collector")] + _flag_args(flags)

    def _ready(self):
        http_get(self.metrics_url, timeout=1)
        with socket.create_connection(("127.0.0.1", self.grpc_port), timeout=1):
            return True

    def scrape(self):
        return scrape(self.metrics_url)


class Agent(_Service):
    """stepwatch-agent with its own socket and metrics port; fake NVML when a state is given.

    Without fake_nvml_state the agent is pointed at a library that does not exist, so that tests
    behave the same on machines with real GPUs.
    """

    def __init__(self, tmpdir, collector_addr, node="node-0", fake_nvml_state=None, interval=0.2,
                 **flags):
        self.name = f"agent-{node}"
        self.tmpdir = tmpdir
        self.node = node
        self.collector_addr = collector_addr
        self.socket_path = os.path.join(tmpdir, f"{node}.sock")
        self.metrics_port = free_port()
        self.metrics_addr = f"127.0.0.1:{self.metrics_port}"
        self.metrics_url = f"http://{self.metrics_addr}/metrics"
        self.log_path = os.path.join(tmpdir, f"agent-{node}.log")
        self.interval = interval
        self.flags = flags
        self.state_path = None
        self.env = None
        if fake_nvml_state is not None:
            self.state_path = os.path.join(tmpdir, f"{node}-nvml.json")
            write_json_atomic(self.state_path, fake_nvml_state)
            self.env = {"STEPWATCH_FAKE_NVML_STATE": self.state_path}
        self.process = None

    def command(self):
        nvml = fake_nvml_path() if self.state_path else os.path.join(self.tmpdir, "no-nvml.so")
        flags = {"collector": self.collector_addr, "socket": self.socket_path, "node": self.node,
                 "interval": self.interval, "metrics_listen": self.metrics_addr,
                 "nvml_library": nvml}
        flags.update(self.flags)
        return [build_path("stepwatch-agent")] + _flag_args(flags)

    def _ready(self):
        if not os.path.exists(self.socket_path):
            return False
        http_get(self.metrics_url, timeout=1)
        return True

    def set_gpus(self, gpus):
        """Replaces the fake NVML state (the fake re-reads it while running)."""
        assert self.state_path, "agent was started without a fake NVML state"
        write_json_atomic(self.state_path, fake_nvml_state(gpus))

    def send(self, event):
        return send_step(self.socket_path, event)

    def scrape(self):
        return scrape(self.metrics_url)


def ctl(collector_addr, *args, timeout=30):
    """Runs stepwatchctl; returns the CompletedProcess (text mode)."""
    return subprocess.run([build_path("stepwatchctl"), f"--collector={collector_addr}", *args],
                          capture_output=True, text=True, timeout=timeout)


def ctl_json(collector_addr, *args):
    result = ctl(collector_addr, *args, "--json")
    if result.returncode != 0:
        raise AssertionError(f"stepwatchctl {' '.join(args)} failed: {result.stderr}")
    return json.loads(result.stdout)


def step_event(job, rank, world_size, step, step_s, **fields):
    event = {"job": job, "rank": rank, "world_size": world_size, "step": step, "step_s": step_s}
    event.update(fields)
    return event
