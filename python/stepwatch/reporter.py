"""Reporter: sends one JSON step event per datagram to the stepwatch agent.

The send path is built for the inside of a training loop: the constant part of the JSON object is
formatted once, the socket is non-blocking, and every failure (agent not running, its queue full,
anything else) drops the event, counts it and logs a single warning. Nothing here raises into the
caller once the Reporter exists.
"""

import errno
import json
import logging
import socket
import threading
import time

from . import _config

_LOG = logging.getLogger("stepwatch")

PHASES = ("data", "compute", "comm")

# Errors after which the socket is re-created and re-connected (the agent went away or restarted).
_RECONNECT_ERRNOS = frozenset(
    (errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOENT, errno.EDESTADDRREQ, errno.EBADF)
)
_INF = float("inf")
_perf_counter = time.perf_counter


class Reporter:
    """Sends step events for one training process (one rank).

    Identity comes from the arguments, else from the environment (see stepwatch._config.resolve).
    Invalid explicit arguments raise ValueError here, at construction, never later.
    While the agent is unreachable, a connection is retried at most every `reconnect_interval`
    seconds; events in between are dropped without a system call.

    Thread safety: send() may be called from several threads (sent/dropped are then approximate);
    step()/phase() scopes track one step at a time and belong to the training loop's thread.
    """

    def __init__(
        self,
        job=None,
        rank=None,
        world_size=None,
        *,
        socket_path=None,
        local_rank=None,
        gpu=None,
        dp_rank=None,
        pp_stage=None,
        tp_rank=None,
        env=None,
        logger=None,
        reconnect_interval=1.0,
    ):
        self.identity = _config.resolve(
            job=job,
            rank=rank,
            world_size=world_size,
            socket_path=socket_path,
            env=env,
            local_rank=local_rank,
            gpu=gpu,
            dp_rank=dp_rank,
            pp_stage=pp_stage,
            tp_rank=tp_rank,
        )
        ident = self.identity
        prefix = '{"job":%s,"rank":%d,"world_size":%d' % (
            json.dumps(ident.job),
            ident.rank,
            ident.world_size,
        )
        for name in _config.OPTIONAL_INT_FIELDS:
            value = getattr(ident, name)
            if value is not None:
                prefix += ',"%s":%d' % (name, value)
        self._prefix = prefix
        self._log = logger or _LOG
        self._lock = threading.Lock()
        self._sock = None
        self._next_connect = 0.0
        self._reconnect_interval = float(reconnect_interval)
        self._warned = False
        self._closed = False
        self.sent = 0
        self.dropped = 0
        self.last_error = None
        # Step/phase scope state (training-loop thread only).
        self._next_step = 0
        self._current = None
        self._pending = [0.0, 0.0, 0.0]
        self._pending_start = None
        self._pending_phase = None
        self._phase_warned = False

    # ------------------------------------------------------------------ sending

    def send(self, step, step_s, data_s=None, compute_s=None, comm_s=None, samples=None):
        """Sends one step event. Returns True when the datagram left, False when it was dropped.

        Invalid values (step < 0, step_s <= 0, a negative or non-finite duration) drop the event.
        """
        sock = self._sock
        if sock is None:
            sock = self._connect()
            if sock is None:  # agent absent: drop before formatting anything
                if self._warned:
                    self.dropped += 1
                    return False
                return self._drop(self.last_error)
        try:
            if not 0.0 < step_s < _INF or step < 0:
                return self._drop("invalid step event (step=%r, step_s=%r)" % (step, step_s))
            msg = '%s,"step":%d,"step_s":%r' % (self._prefix, step, float(step_s))
            if data_s is not None:
                if not 0.0 <= data_s < _INF:
                    return self._drop("invalid data_s %r" % (data_s,))
                msg += ',"data_s":%r' % float(data_s)
            if compute_s is not None:
                if not 0.0 <= compute_s < _INF:
                    return self._drop("invalid compute_s %r" % (compute_s,))
                msg += ',"compute_s":%r' % float(compute_s)
            if comm_s is not None:
                if not 0.0 <= comm_s < _INF:
                    return self._drop("invalid comm_s %r" % (comm_s,))
                msg += ',"comm_s":%r' % float(comm_s)
            if samples is not None:
                if samples < 0:
                    return self._drop("invalid samples %r" % (samples,))
                msg += ',"samples":%d' % samples
            data = (msg + "}").encode()
        except Exception as exc:  # a wrong type from the caller: never raise into the loop
            return self._drop("cannot format step event: %r" % (exc,))

        try:
            sock.send(data)
        except OSError as exc:
            if exc.errno in _RECONNECT_ERRNOS:
                self._disconnect(sock)
            elif self._warned:
                # Agent busy (EAGAIN): the hot drop path formats nothing.
                self.dropped += 1
                self.last_error = exc
                return False
            return self._drop("send to %s failed: %s" % (self.identity.socket_path, exc))
        except Exception as exc:
            return self._drop("send to %s failed: %r" % (self.identity.socket_path, exc))
        self.sent += 1
        return True

    def _connect(self):
        """Connects a fresh non-blocking socket; None (last_error set) when the agent is absent."""
        with self._lock:
            if self._sock is not None:
                return self._sock
            now = _perf_counter()
            if self._closed or now < self._next_connect:
                if self._closed:
                    self.last_error = "reporter is closed"
                return None
            self._next_connect = now + self._reconnect_interval
            sock = None
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
                sock.connect(self.identity.socket_path)
            except OSError as exc:
                if sock is not None:
                    sock.close()
                self.last_error = "cannot reach the stepwatch agent at %s: %s" % (
                    self.identity.socket_path,
                    exc.strerror or exc,
                )
                return None
            self._sock = sock
            return sock

    def _disconnect(self, sock):
        with self._lock:
            if self._sock is sock:
                self._sock = None
                self._next_connect = 0.0  # retry at once: the agent may have just restarted
        try:
            sock.close()
        except OSError:
            pass

    def _drop(self, reason):
        self.dropped += 1
        self.last_error = reason
        if not self._warned:
            self._warned = True
            try:
                self._log.warning(
                    "stepwatch: %s; step events are dropped (counted in Reporter.dropped) "
                    "until it works. This warning is not repeated.",
                    reason,
                )
            except Exception:
                pass
        return False

    def close(self):
        """Closes the socket; later events are dropped."""
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ scopes

    def step(self, samples=None, step=None):
        """Context manager timing one step; the event is sent when the block exits normally.

        `step` defaults to a counter starting at 0 (the previous step + 1). Phases entered inside
        the block are reported as data_s/compute_s/comm_s.
        """
        return _StepScope(self, samples, step)

    def phase(self, name):
        """Context manager timing a phase ("data", "compute" or "comm") of the current step.

        Phases nest: time in an inner phase is not counted in the outer one. A phase outside any
        step (typically fetching the next batch) belongs to the next step, which then starts when
        that phase started.
        """
        try:
            index = PHASES.index(name)
        except ValueError:
            if not self._phase_warned:
                self._phase_warned = True
                self._log.warning(
                    "stepwatch: unknown phase %r ignored (expected one of %s)", name, PHASES
                )
            return _NULL_SCOPE
        return _PhaseScope(self, index)


class _StepScope:
    __slots__ = ("_rep", "samples", "step", "_start", "times", "_active_phase")

    def __init__(self, rep, samples, step):
        self._rep = rep
        self.samples = samples
        self.step = step
        self.times = None
        self._active_phase = None

    def __enter__(self):
        rep = self._rep
        now = _perf_counter()
        if rep._pending_start is not None:
            self._start = rep._pending_start
            self.times = rep._pending
            rep._pending = [0.0, 0.0, 0.0]
            rep._pending_start = None
        else:
            self._start = now
            self.times = [0.0, 0.0, 0.0]
        if self.step is None:
            self.step = rep._next_step
        rep._current = self
        return self

    def __exit__(self, exc_type, exc, tb):
        end = _perf_counter()
        rep = self._rep
        rep._current = None
        if exc_type is not None:
            return False
        rep._next_step = self.step + 1
        times = self.times
        rep.send(
            self.step,
            end - self._start,
            times[0] if times[0] > 0.0 else None,
            times[1] if times[1] > 0.0 else None,
            times[2] if times[2] > 0.0 else None,
            self.samples,
        )
        return False


class _PhaseScope:
    __slots__ = ("_rep", "_index", "_start", "_parent", "_owner", "_times")

    def __init__(self, rep, index):
        self._rep = rep
        self._index = index

    def __enter__(self):
        rep = self._rep
        now = _perf_counter()
        owner = rep._current
        if owner is None:
            # Outside a step: the time belongs to the next step.
            if rep._pending_start is None:
                rep._pending_start = now
            times = rep._pending
            parent = rep._pending_phase
            rep._pending_phase = self
        else:
            times = owner.times
            parent = owner._active_phase
            owner._active_phase = self
        if parent is not None:
            # Pause the outer phase.
            parent._times[parent._index] += now - parent._start
        self._parent = parent
        self._owner = owner
        self._times = times
        self._start = now
        return self

    def __exit__(self, exc_type, exc, tb):
        now = _perf_counter()
        self._times[self._index] += now - self._start
        parent = self._parent
        if parent is not None:
            parent._start = now  # resume the outer phase
        if self._owner is not None:
            self._owner._active_phase = parent
        else:
            self._rep._pending_phase = parent
        return False


class _NullScope:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_SCOPE = _NullScope()
