"""Reporter: sends one JSON step event per message to the stepwatch agent.

Transport: a connection to the agent's SOCK_SEQPACKET socket (`<socket>.seq`, one JSON object per
packet) when the agent has one, else datagrams on `<socket>` (older agents). A connection queues
as many messages as its send buffer holds, while a datagram socket queues at most
net.unix.max_dgram_qlen (10 by default): with datagrams, a burst of ranks finishing a step at once
loses events. Every message that leaves carries "dropped": the events this reporter failed to send
since the previous one that left (left out when 0), so that the agent can count what clients lost.

The send path is built for the inside of a training loop (a few microseconds per event, most of
it the kernel's send()): the constant part of the JSON object is formatted once, a full event is
one %-format operation, the socket stays connected and non-blocking, and every failure (agent not
running, its queue full, anything else) drops the event, counts it and logs a single warning.
Nothing here raises into the caller once the Reporter exists, except phase() given a section name
the agent would refuse: a programming error, raised at its first use.

Named sections (phase("forward"), any valid name other than the three phases) go out in the
event's "sections" object. The step scope formats every step itself, whatever subset of phases
it has, in one operation (plus one per section).

Durations measured by step()/phase() are kept as integer nanoseconds (time.perf_counter_ns) and
written as JSON numbers with an exponent, `"compute_s":81234567e-9`: exact, and about three times
cheaper to format than repr() of a float. Durations given to send() are floats and are written with
repr(), which round-trips exactly.
"""

import errno
import json
import logging
import socket
import threading
import time

from . import _config, _rules

_LOG = logging.getLogger("stepwatch")

PHASES = ("data", "compute", "comm")

# Errors after which the socket is re-created and re-connected (the agent went away or restarted).
_RECONNECT_ERRNOS = frozenset(
    (
        errno.ECONNREFUSED,
        errno.ENOTCONN,
        errno.ENOENT,
        errno.EDESTADDRREQ,
        errno.EBADF,
        errno.EPIPE,
        errno.ECONNRESET,
    )
)
# Suffix of the agent's seqpacket socket path (agent/ingest_server.h, SeqpacketPathFor).
SEQPACKET_SUFFIX = ".seq"
# Longest path that fits in a Unix socket address.
_MAX_SOCKET_PATH = 107
# Requested send buffer of a connection: the messages it may hold while the agent is busy (the
# kernel caps it at net.core.wmem_max).
SEND_BUFFER_BYTES = 4 << 20
_BUSY = "the stepwatch agent is busy (its socket queue is full)"
# The agent's limits (stepwatch._rules), as module globals for the hot path.
_MAX_S = _rules.MAX_SECONDS
_MAX_NS = int(_rules.MAX_SECONDS) * 1000000000
_MAX_I64 = _rules.MAX_INT64
_MAX_SECTIONS = _rules.MAX_SECTIONS
# Section names send() has already checked (bounded: dynamic names are checked every time after).
_MAX_CHECKED_SECTION_NAMES = 1024
# The clocks, looked up as module globals on every use so that tests can replace them.
_perf_counter = time.perf_counter  # reconnect pacing
_perf_counter_ns = time.perf_counter_ns  # step and phase durations


class Reporter:
    """Sends step events for one training process (one rank).

    Identity comes from the arguments, else from the environment (see stepwatch._config.resolve).
    Invalid arguments raise ValueError here, at construction, never later: among them a job id
    the agent would refuse (docs/step-event.md), which would otherwise lose every event.
    While the agent is unreachable, a connection is retried at most every `reconnect_interval`
    seconds; events in between are dropped without a system call.

    Thread safety: send() may be called from several threads without a lock on its path. It reads
    the socket into a local once; the only shared mutations are `sent`/`dropped` (approximate
    under concurrent sends: `+=` is not atomic across threads) and `last_error`. A concurrent
    close() or reconnect makes a send on the old socket fail with EBADF, which drops that one event
    (socket.send never touches freed memory). Connecting and closing take a lock so that only one
    socket is ever live. step()/phase() scopes track one step at a time and belong to the training
    loop's thread.
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
        # Whole-event formats for the common case of every field present. They are bytes
        # (json.dumps escapes non-ASCII, so the prefix is ASCII) because formatting bytes is
        # cheaper than formatting a str and encoding it; '%' in the job id is escaped.
        escaped = prefix.replace("%", "%%").encode("ascii")
        self._fmt_full = (
            escaped + b',"step":%d,"step_s":%r,"data_s":%r,"compute_s":%r,"comm_s":%r,"samples":%d}'
        )
        self._fmt_head = escaped + b',"step":%d,"step_s":%r'
        # The step scope's formats by the phases present (bit 1 data, 2 compute, 4 comm), without
        # and with samples: every step is one format operation (sections and "dropped" add a tail).
        self._fmt_ns_by_phases = tuple(
            escaped
            + b',"step":%d,"step_s":%de-9'
            + b"".join(
                b',"%s_s":%%de-9' % name.encode() for i, name in enumerate(PHASES) if mask >> i & 1
            )
            + b"}"
            for mask in range(8)
        )
        self._fmt_ns_by_phases_samples = tuple(
            f[:-1] + b',"samples":%d}' for f in self._fmt_ns_by_phases
        )
        self._fmt_ns_head = escaped + b',"step":%d,"step_s":%de-9'
        self._log = logger or _LOG
        self._lock = threading.Lock()
        self._sock = None
        self._next_connect = 0.0
        self._reconnect_interval = float(reconnect_interval)
        self._warned = False
        self._closed = False
        self.sent = 0
        self.dropped = 0
        # Drops not yet reported to the agent (the "dropped" field of the next message that leaves).
        self._unreported = 0
        # "seqpacket" or "datagram" while connected, else None.
        self.transport = None
        self.last_error = None
        # Step/phase scopes: reused, so that entering one allocates nothing.
        self._step_scope = _StepScope(self)
        # phase() looks every name up here: the three phases, then each section once it was used.
        self._phase_scopes = dict(zip(PHASES, self._step_scope.phases))
        # New section names over the limit, timed as compute instead (phase()).
        self.sections_folded = 0
        self._section_count = 0
        self._checked_sections = set()
        self._nest_warned = False

    # ------------------------------------------------------------------ sending

    def send(self, step, step_s, data_s=None, compute_s=None, comm_s=None, samples=None,
             sections=None):
        """Sends one step event. Returns True when the datagram left, False when it was dropped.

        `sections`: a mapping of section name -> seconds (the event's "sections"), sent in its
        order. Values the agent would refuse (docs/step-event.md: step < 0, step_s <= 0, a
        negative, non-finite or over-a-day duration, more than 16 sections, a section name
        outside [A-Za-z0-9_.:/-]{1,64} or one of data/compute/comm, ...) drop the event.
        """
        sock = self._sock
        if sock is None:
            sock = self._connect()
            if sock is None:  # agent absent: drop before formatting anything
                if self._warned:
                    self.dropped += 1
                    self._unreported += 1
                    return False
                return self._drop(self.last_error)
        try:
            if (
                data_s is not None
                and compute_s is not None
                and comm_s is not None
                and samples is not None
            ):
                # Every field present (stepwatch.torch, most loops): one format operation.
                if not (
                    0.0 < step_s <= _MAX_S
                    and 0.0 <= data_s <= _MAX_S
                    and 0.0 <= compute_s <= _MAX_S
                    and 0.0 <= comm_s <= _MAX_S
                    and 0 <= step <= _MAX_I64
                    and 0 <= samples <= _MAX_I64
                ):
                    return self._drop(_invalid_reason(step, step_s, data_s, compute_s, comm_s,
                                                      samples))
                data = self._fmt_full % (
                    step, float(step_s), float(data_s), float(compute_s), float(comm_s), samples
                )
            else:
                if not 0.0 < step_s <= _MAX_S or not 0 <= step <= _MAX_I64:
                    return self._drop(_invalid_reason(step, step_s, data_s, compute_s, comm_s,
                                                      samples))
                data = self._fmt_head % (step, float(step_s))
                if data_s is not None:
                    if not 0.0 <= data_s <= _MAX_S:
                        return self._drop("invalid data_s %r" % (data_s,))
                    data += b',"data_s":%r' % float(data_s)
                if compute_s is not None:
                    if not 0.0 <= compute_s <= _MAX_S:
                        return self._drop("invalid compute_s %r" % (compute_s,))
                    data += b',"compute_s":%r' % float(compute_s)
                if comm_s is not None:
                    if not 0.0 <= comm_s <= _MAX_S:
                        return self._drop("invalid comm_s %r" % (comm_s,))
                    data += b',"comm_s":%r' % float(comm_s)
                if samples is not None:
                    if not 0 <= samples <= _MAX_I64:
                        return self._drop("invalid samples %r" % (samples,))
                    data += b',"samples":%d' % samples
                data += b"}"
            if sections is not None:
                encoded = self._encode_sections(sections)
                if encoded is None:
                    return self._drop("invalid sections: %s" % (
                        _rules.sections_error(sections) or "cannot format %r" % (sections,)))
                data = data[:-1] + encoded + b"}"
        except Exception as exc:  # a wrong type from the caller: never raise into the loop
            return self._drop("cannot format step event: %r" % (exc,))

        pending = self._unreported
        if pending:
            data = data[:-1] + b',"dropped":%d}' % pending
        try:
            sock.send(data)
        except BlockingIOError:
            return self._busy()
        except Exception as exc:
            return self._send_failed(sock, exc)
        self.sent += 1
        if pending:
            self._unreported -= pending
        return True

    def _encode_sections(self, sections):
        """`,"sections":{...}` for send(); None when the agent would refuse them."""
        try:
            if len(sections) > _MAX_SECTIONS:
                return None
            checked = self._checked_sections
            parts = []
            for name, value in sections.items():
                if name not in checked:
                    if _rules.section_name_error(name) is not None:
                        return None
                    if len(checked) < _MAX_CHECKED_SECTION_NAMES:
                        checked.add(name)
                if isinstance(value, bool) or not 0.0 <= value <= _MAX_S:
                    return None
                # A checked name is plain ASCII that needs no escaping.
                parts.append(b'"%s":%r' % (name.encode("ascii"), float(value)))
        except Exception:
            return None
        return b',"sections":{' + b",".join(parts) + b"}"

    def _send_ns(self, step, step_ns, data_ns, compute_ns, comm_ns, samples, sections=None):
        """send() for the step scope: durations in integer nanoseconds, 0 meaning absent;
        `sections` the already formatted members of "sections" (None: none)."""
        sock = self._sock
        if sock is None:
            sock = self._connect()
            if sock is None:
                if self._warned:
                    self.dropped += 1
                    self._unreported += 1
                    return False
                return self._drop(self.last_error)
        try:
            # The phases lie within the step: bounding the step bounds them.
            if not 0 < step_ns <= _MAX_NS or not 0 <= step <= _MAX_I64:
                return self._drop("invalid step event (step=%r, step_s=%re-9)" % (step, step_ns))
            data = self._fmt_ns_head % (step, step_ns)
            if data_ns:
                data += b',"data_s":%de-9' % data_ns
            if compute_ns:
                data += b',"compute_s":%de-9' % compute_ns
            if comm_ns:
                data += b',"comm_s":%de-9' % comm_ns
            if samples is not None:
                if not 0 <= samples <= _MAX_I64:
                    return self._drop("invalid samples %r" % (samples,))
                data += b',"samples":%d' % samples
            if sections is not None:
                data += b',"sections":{' + sections + b"}"
            data += b"}"
        except Exception as exc:
            return self._drop("cannot format step event: %r" % (exc,))
        pending = self._unreported
        if pending:
            data = data[:-1] + b',"dropped":%d}' % pending
        try:
            sock.send(data)
        except BlockingIOError:
            return self._busy()
        except Exception as exc:
            return self._send_failed(sock, exc)
        self.sent += 1
        if pending:
            self._unreported -= pending
        return True

    def _busy(self):
        # Agent busy (EAGAIN). Once warned, the drop formats nothing and keeps no exception (a
        # kept exception would hold its traceback, a reference cycle through this frame).
        if self._warned:
            self.dropped += 1
            self._unreported += 1
            self.last_error = _BUSY
            return False
        return self._drop("send to %s failed: %s" % (self.identity.socket_path, _BUSY))

    def _send_failed(self, sock, exc):
        if isinstance(exc, OSError):
            if exc.errno in _RECONNECT_ERRNOS:
                self._disconnect(sock)
            return self._drop("send to %s failed: %s" % (self.identity.socket_path, exc))
        return self._drop("send to %s failed: %r" % (self.identity.socket_path, exc))

    def _connect(self):
        """Connects a fresh non-blocking socket: the agent's seqpacket socket, else its datagram
        socket. None (last_error set) when the agent is absent."""
        with self._lock:
            if self._sock is not None:
                return self._sock
            now = _perf_counter()
            if self._closed or now < self._next_connect:
                if self._closed:
                    self.last_error = "reporter is closed"
                return None
            self._next_connect = now + self._reconnect_interval
            path = self.identity.socket_path
            sock = None
            seq_path = path + SEQPACKET_SUFFIX
            if len(seq_path.encode("utf-8", "surrogateescape")) <= _MAX_SOCKET_PATH:
                sock = _open(socket.SOCK_SEQPACKET, seq_path)
            if sock is not None:
                self.transport = "seqpacket"
            else:
                try:
                    sock = _open(socket.SOCK_DGRAM, path, raise_error=True)
                except OSError as exc:
                    self.last_error = "cannot reach the stepwatch agent at %s: %s" % (
                        path,
                        exc.strerror or exc,
                    )
                    return None
                self.transport = "datagram"
            self._sock = sock
            return sock

    def _disconnect(self, sock):
        with self._lock:
            if self._sock is sock:
                self._sock = None
                self.transport = None
                self._next_connect = 0.0  # retry at once: the agent may have just restarted
        try:
            sock.close()
        except OSError:
            pass

    def _drop(self, reason):
        self.dropped += 1
        self._unreported += 1
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
            self.transport = None
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
        the block are reported as data_s/compute_s/comm_s. Steps do not nest: a step() inside a
        step is ignored (with one warning) and its phases count toward the outer step.
        """
        scope = self._step_scope
        if scope._active:
            if not self._nest_warned:
                self._nest_warned = True
                self._log.warning("stepwatch: step() inside a step ignored: steps do not nest")
            return _NULL_SCOPE
        scope.samples = samples
        scope.step = step
        return scope

    def phase(self, name):
        """Context manager timing a phase ("data", "compute" or "comm") or a named section
        ("forward", "backward", "optimizer", ...) of the current step.

        Phases nest: time in an inner phase is not counted in the outer one. A phase outside any
        step (typically fetching the next batch) belongs to the next step, which then starts when
        that phase started.

        Any other name is a section, reported in the event's "sections": its time counts toward
        compute_s unless it is entered inside a data or comm phase (it is then that phase's time),
        and its own time leaves out the data and comm phases inside it; a section inside another
        counts in both; uses of one name in a step add up.

        Raises ValueError for a name the agent would refuse (1 to 64 characters of
        A-Za-z0-9_.:/-): a programming error, raised at its first use, never an event lost in
        silence. Nothing else here raises. A 17th section name on this reporter is timed as
        compute, with one warning, and counted in `sections_folded`.
        """
        try:
            return self._phase_scopes[name]
        except (KeyError, TypeError):
            return self._new_section(name)

    def _new_section(self, name):
        """The scope of section `name`, created on its first use (the slow path of phase())."""
        error = _rules.section_name_error(name)
        if error is not None:
            raise ValueError("stepwatch.phase(): " + error)
        if self._section_count >= _MAX_SECTIONS:
            # A name first used late in a run (a checkpoint section at step 10,000) must not stop
            # the job: its time is folded into compute, said once, and counted.
            self.sections_folded += 1
            if self.sections_folded == 1:
                self._log.warning(
                    "stepwatch.phase(%r): a reporter has at most %d section names (the agent's "
                    "limit per event, and the collector keeps %d per job); this and later new "
                    "names are timed as compute", name, _MAX_SECTIONS, _MAX_SECTIONS)
            scope = self._phase_scopes["compute"]
            self._phase_scopes[name] = scope
            return scope
        scope = _SectionScope(self._step_scope, name)
        self._section_count += 1
        self._phase_scopes[name] = scope
        return scope


def _open(kind, path, raise_error=False):
    """A non-blocking Unix socket of `kind` connected to `path`; None (or the error raised when
    `raise_error`) when that fails."""
    sock = None
    try:
        sock = socket.socket(socket.AF_UNIX, kind)
        if kind == socket.SOCK_SEQPACKET:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            except OSError:
                pass  # the default buffer still works, with less room for bursts
        sock.setblocking(False)
        sock.connect(path)
    except OSError:
        if sock is not None:
            sock.close()
        if raise_error:
            raise
        return None
    return sock


class _StepScope:
    """The step() context of one Reporter, reused for every step, and the state of its timeline.

    Times are integer nanoseconds. `cur` is the innermost open phase (None outside phases);
    `pending` is when the first phase entered outside a step began (the next step starts then),
    `waiting` whether such a phase would be the first.
    """

    __slots__ = (
        "_rep", "samples", "step", "_active", "_start", "_next", "phases", "cur", "waiting",
        "pending", "used", "open",
    )

    def __init__(self, rep):
        self._rep = rep
        self.samples = None
        self.step = None
        self._active = False
        self._start = 0
        self._next = 0
        self.phases = tuple(_PhaseScope(self) for _ in PHASES)
        self.cur = None
        self.waiting = True
        self.pending = None
        # Sections entered since the last step ended (in order of first use), and those open now.
        self.used = []
        self.open = []

    def __enter__(self):
        now = _perf_counter_ns()
        self._active = True
        self.waiting = False
        pending = self.pending
        if pending is None:
            self._start = now
        else:
            self._start = pending
            self.pending = None
        return self

    def __exit__(self, exc_type, exc, tb):
        end = _perf_counter_ns()
        self._active = False
        cur = self.cur
        if cur is None:
            self.waiting = True
        else:
            # A phase that encloses the step: its time so far is this step's, the rest the next's.
            cur.acc += end - cur.t0
            cur.t0 = self.pending = end
        # Before the phases restart from 0: open sections take their time from them.
        sections = self._take_sections() if self.used else None
        data, compute, comm = self.phases
        data_ns, compute_ns, comm_ns = data.acc, compute.acc, comm.acc
        data.acc = compute.acc = comm.acc = 0
        if exc_type is not None:
            return False  # a failed step is not reported; the exception propagates
        step = self.step
        if step is None:
            step = self._next
        samples = self.samples
        rep = self._rep
        step_ns = end - self._start
        sock = rep._sock
        # Every event is formatted and sent right here, whatever phases, samples and sections it
        # has: one format of the phases present (the formats are made once per reporter), one
        # tail, one send(); _send_ns only for what this path does not take (no socket yet, an
        # invalid value). step_s > 0 holds when a phase ran: a step contains its phases.
        try:
            self._next = step + 1
            if sock is None or not (0 <= step <= _MAX_I64 and 0 < step_ns <= _MAX_NS):
                data = None
            else:
                if data_ns:
                    if compute_ns:
                        if comm_ns:
                            mask, args = 7, (step, step_ns, data_ns, compute_ns, comm_ns)
                        else:
                            mask, args = 3, (step, step_ns, data_ns, compute_ns)
                    elif comm_ns:
                        mask, args = 5, (step, step_ns, data_ns, comm_ns)
                    else:
                        mask, args = 1, (step, step_ns, data_ns)
                elif compute_ns:
                    if comm_ns:
                        mask, args = 6, (step, step_ns, compute_ns, comm_ns)
                    else:
                        mask, args = 2, (step, step_ns, compute_ns)
                elif comm_ns:
                    mask, args = 4, (step, step_ns, comm_ns)
                else:
                    mask, args = 0, (step, step_ns)
                if samples is None:
                    data = rep._fmt_ns_by_phases[mask] % args
                elif 0 <= samples <= _MAX_I64:
                    data = rep._fmt_ns_by_phases_samples[mask] % (args + (samples,))
                else:
                    data = None
                pending = rep._unreported
                if data is not None and (sections is not None or pending):
                    data = self._tail(data, sections, pending)
        except Exception:
            data = None  # a step number or sample count that is not a number
        if data is None:
            # No socket yet, or an invalid value (_send_ns connects, or drops it and warns once).
            rep._send_ns(step, step_ns, data_ns, compute_ns, comm_ns, samples, sections)
            return False
        try:
            sock.send(data)
        except BlockingIOError:
            if rep._warned:  # agent busy, already warned: count it, no call, no formatting
                rep.dropped += 1
                rep._unreported += 1
                rep.last_error = _BUSY
            else:
                rep._busy()
            return False
        except Exception as err:
            rep._send_failed(sock, err)
            return False
        rep.sent += 1
        if pending:
            rep._unreported -= pending
        return False

    @staticmethod
    def _tail(data, sections, pending):
        """The event `data` with its sections and "dropped" (the drops not yet reported)."""
        data = data[:-1]
        if sections is not None:
            data += b',"sections":{' + sections + b"}"
        if pending:
            data += b',"dropped":%d' % pending
        return data + b"}"

    def _take_sections(self):
        """The members of this step's "sections" (bytes; None when none had any time), and a
        fresh start for the next step.

        A section still open at the end of the step (it encloses the step) gives this step its
        time so far and keeps the rest for the next one, as a phase does."""
        for section in self.open:
            section.acc += section.phase.acc - section.base
            section.base = 0  # the phases restart from 0
        parts = []
        for section in self.used:
            if section.acc:
                parts.append(section.key % section.acc)
            section.acc = 0
            section.listed = False
        for section in self.open:
            section.listed = True
        self.used = list(self.open)
        return b",".join(parts) if parts else None


class _SectionScope:
    """The phase() context of one section name of one Reporter, reused like a phase's.

    A section is not a phase of the step's split: it runs in the phase it was entered in (compute
    when entered outside any phase, which it then enters itself, so that phases inside it pause
    it), and its time is that phase's time while it is open. `acc` is its time in the current step,
    `phase` the phase it runs in, `base` that phase's `acc` when it was entered, `depth` how deep
    it is inside itself (only the outermost counts), `entered` whether it entered compute itself,
    `listed` whether it is in the step scope's `used`.
    """

    __slots__ = ("_st", "key", "acc", "base", "phase", "depth", "entered", "listed")

    def __init__(self, step_scope, name):
        self._st = step_scope
        # The member as a format: name:nanoseconds (a valid name needs no JSON escaping).
        self.key = b'"%s":%%de-9' % name.encode("ascii")
        self.acc = 0
        self.base = 0
        self.phase = None
        self.depth = 0
        self.entered = False
        self.listed = False

    def __enter__(self):
        if self.depth:
            self.depth += 1
            return self
        self.depth = 1
        st = self._st
        cur = st.cur
        if cur is None:
            cur = st.phases[1]  # compute
            cur.__enter__()
            self.entered = True
        else:
            now = _perf_counter_ns()
            cur.acc += now - cur.t0  # bring the phase's count up to now
            cur.t0 = now
            self.entered = False
        self.phase = cur
        self.base = cur.acc
        if not self.listed:
            self.listed = True
            st.used.append(self)
        st.open.append(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        self.depth -= 1
        if self.depth:
            return False
        st = self._st
        phase = self.phase
        if self.entered:
            phase.__exit__(None, None, None)
        elif st.cur is phase:
            now = _perf_counter_ns()
            phase.acc += now - phase.t0
            phase.t0 = now
        self.acc += phase.acc - self.base
        opened = st.open
        if opened and opened[-1] is self:
            opened.pop()
        else:
            opened.remove(self)
        return False


class _PhaseScope:
    """The phase() context of one phase name of one Reporter, reused: entering allocates nothing.

    `acc` is the phase's time in the current step so far, `t0` when it was entered or last
    resumed, `outer` the phase it interrupted (None: none). Entering a phase that is already open
    further out (compute > comm > compute) keeps its previous `outer` in `saved`.
    """

    __slots__ = ("_st", "acc", "t0", "outer", "saved")

    def __init__(self, step_scope):
        self._st = step_scope
        self.acc = 0
        self.t0 = 0
        self.outer = None
        self.saved = []

    def __enter__(self):
        now = _perf_counter_ns()
        st = self._st
        outer = st.cur
        if outer is not None:
            outer.acc += now - outer.t0  # pause the enclosing phase
            scope = outer
            for _ in PHASES:  # three hops reach every open phase (re-entry can close a cycle)
                if scope is self:
                    self.saved.append(self.outer)
                    break
                scope = scope.outer
                if scope is None:
                    break
        self.outer = outer
        st.cur = self
        self.t0 = now
        if st.waiting:  # the first phase outside a step: the next step starts here
            st.pending = now
            st.waiting = False
        return self

    def __exit__(self, exc_type, exc, tb):
        now = _perf_counter_ns()
        self.acc += now - self.t0
        outer = self.outer
        self._st.cur = outer
        if outer is not None:
            outer.t0 = now  # resume the enclosing phase
            if self.saved:
                self.outer = self.saved.pop()
        return False


class _NullScope:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_SCOPE = _NullScope()


def _invalid_reason(step, step_s, data_s, compute_s, comm_s, samples):
    """Why send() refused an event (only computed on that rare path)."""
    return _rules.step_error(step, step_s, data_s, compute_s, comm_s, samples) or (
        "invalid step event (step=%r, step_s=%r)" % (step, step_s)
    )
