"""Test support: a real bound Unix datagram socket standing in for the stepwatch agent."""

import json
import os
import socket
import tempfile
import time


class FakeAgent:
    """Binds a Unix datagram socket in a fresh temporary directory and reads step events."""

    def __init__(self, directory=None):
        self._tmp = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sw-")
            directory = self._tmp.name
        self.path = os.path.join(directory, "agent.sock")
        self.sock = None
        self.bind()

    def bind(self):
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def unbind(self):
        self.sock.close()
        os.unlink(self.path)

    def recv_raw(self, timeout=5.0):
        """The next datagram's bytes; None when nothing arrives within `timeout` seconds."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(65536)
        except socket.timeout:
            return None

    def recv(self, timeout=5.0):
        raw = self.recv_raw(timeout)
        return None if raw is None else json.loads(raw.decode("utf-8"))

    def drain(self, quiet=0.05):
        """All datagrams queued now (stops after `quiet` seconds without one)."""
        events = []
        while True:
            event = self.recv(quiet)
            if event is None:
                return events
            events.append(event)

    def close(self):
        if self.sock is not None:
            self.sock.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class FakeSeqpacketAgent(FakeAgent):
    """A FakeAgent that also listens on `<path>.seq` (SOCK_SEQPACKET), as current agents do.

    recv()/recv_raw()/drain() read the seqpacket connection (accepted on first use);
    recv_datagram() reads the datagram socket.
    """

    def __init__(self, directory=None):
        self.listener = None
        self.conn = None
        super().__init__(directory)
        self.seq_path = self.path + ".seq"
        self.listen()

    def listen(self):
        if os.path.exists(self.seq_path):
            os.unlink(self.seq_path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.seq_path)
        self.listener.listen(16)

    def stop_listening(self):
        """As a restarting agent: the connection and the listening socket go away."""
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()
        self.conn = self.listener = None
        if os.path.exists(self.seq_path):
            os.unlink(self.seq_path)

    def recv_raw(self, timeout=5.0):
        if self.conn is None:
            self.listener.settimeout(timeout)
            try:
                self.conn, _ = self.listener.accept()
            except socket.timeout:
                return None
        self.conn.settimeout(timeout)
        try:
            data = self.conn.recv(65536)
        except socket.timeout:
            return None
        return data or None

    def recv_datagram(self, timeout=5.0):
        self.sock.settimeout(timeout)
        try:
            return json.loads(self.sock.recv(65536).decode("utf-8"))
        except socket.timeout:
            return None

    def close(self):
        self.stop_listening()
        super().close()


def wait_until(predicate, timeout=5.0, interval=0.01):
    """Polls `predicate` until it is true or `timeout` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


class FakeClock:
    """Replaces time.perf_counter / time.perf_counter_ns in a module; advance() moves it.

    Time is kept in integer nanoseconds, as perf_counter_ns counts it; calling the clock gives
    seconds like perf_counter, ns() gives nanoseconds.
    """

    def __init__(self, start=100.0):
        self.now_ns = round(start * 1e9)

    def __call__(self):
        return self.now_ns / 1e9

    def ns(self):
        return self.now_ns

    def advance(self, seconds):
        self.now_ns += round(seconds * 1e9)
