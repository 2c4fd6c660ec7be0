"""The datagrams of stepwatch.Reporter: exactly the documented JSON for every field combination.

send() must produce the very bytes that json.dumps gives for the StepEvent (compact separators,
non-ASCII escaped), whatever the job id holds. step()/phase() write their integer-nanosecond
durations as `NNNe-9`; those must parse to the exact durations. The real agent (when built) must
accept both.
"""

import itertools
import json
import os
import tempfile
import time
import unittest

import stepwatch
from stepwatch import reporter as reporter_module
from sockets import FakeClock

JOBS = [
    "job1",
    'a "quoted" job',
    "back\\slash/and/slash",
    "nbsp\u00a0soft\u00adhyphen",  # next to the C1 controls, yet allowed
    "naïve-日本-🚀",
    "100%done %d %s %% %(x)s",
    "x" * 250,  # the agent takes job ids of up to 256 bytes
]
IDENTITIES = [
    {},
    {"local_rank": 1, "gpu": 2},
    {"local_rank": 0, "gpu": 0, "dp_rank": 3, "pp_stage": 1, "tp_rank": 7},
]
OPTIONAL = ("local_rank", "gpu", "dp_rank", "pp_stage", "tp_rank")


class CaptureSocket:
    """Stands in for the connected socket: keeps every datagram."""

    def __init__(self):
        self.datagrams = []

    def send(self, data):
        self.datagrams.append(bytes(data))
        return len(data)

    def close(self):
        pass


def expected_event(job, rank, world_size, identity, step, **fields):
    """The StepEvent as an ordered dict, in the order stepwatch has always written it."""
    event = {"job": job, "rank": rank, "world_size": world_size}
    for name in OPTIONAL:
        if name in identity:
            event[name] = identity[name]
    event["step"] = step
    for name in ("step_s", "data_s", "compute_s", "comm_s"):
        if fields.get(name) is not None:
            event[name] = float(fields[name])
    if fields.get("samples") is not None:
        event["samples"] = fields["samples"]
    return event


def reporter(job, identity, rank=3, world_size=8):
    rep = stepwatch.Reporter(job=job, rank=rank, world_size=world_size, socket_path="/nonexistent",
                             env={}, **identity)
    rep._sock = CaptureSocket()
    return rep


class SendEncodingTest(unittest.TestCase):
    def test_send_writes_exactly_the_json_dumps_bytes(self):
        steps = (0, 7, 2**40)
        step_values = (1e-05, 0.25, 1, 12345.678901234567)
        durations = (None, 0.0, 1e-07, 0.1234567890123, 3)
        samples_values = (None, 0, 256)
        checked = 0
        for job, identity in itertools.product(JOBS, IDENTITIES):
            rep = reporter(job, identity)
            capture = rep._sock
            for step, step_s, data_s, compute_s, comm_s, samples in itertools.product(
                    steps, step_values, durations, durations, durations, samples_values):
                self.assertTrue(rep.send(step, step_s, data_s, compute_s, comm_s, samples))
                raw = capture.datagrams.pop()
                want = expected_event(job, 3, 8, identity, step, step_s=step_s, data_s=data_s,
                                      compute_s=compute_s, comm_s=comm_s, samples=samples)
                self.assertEqual(raw, json.dumps(want, separators=(",", ":")).encode("ascii"))
                checked += 1
            self.assertEqual(rep.dropped, 0)
        self.assertEqual(checked, len(JOBS) * len(IDENTITIES) * 3 * 4 * 5 * 5 * 5 * 3)

    def test_parsed_values_round_trip_exactly(self):
        rep = reporter("job1", {})
        # Up to a day (86400 s), the agent's limit.
        values = [0.1, 1 / 3, 2.0**-30, 5e-324, 86400.0, 12345.67890123456]
        for value in values:
            rep.send(1, value, value, value, value, 1)
            event = json.loads(rep._sock.datagrams.pop())
            for name in ("step_s", "data_s", "compute_s", "comm_s"):
                self.assertEqual(event[name], value)
                self.assertIs(type(event[name]), float)

    def test_types_that_convert_like_before(self):
        rep = reporter("job1", {})
        # Ints for durations become floats; a bool step is 1, a float count is truncated.
        self.assertTrue(rep.send(True, 2, 1, 0, 1, 3.9))
        event = json.loads(rep._sock.datagrams.pop())
        self.assertEqual((event["step"], event["step_s"], event["samples"]), (1, 2.0, 3))
        self.assertIs(type(event["step_s"]), float)

    def test_invalid_full_events_are_dropped_with_the_reason(self):
        rep = reporter("job1", {})
        rep._warned = True  # the warning itself is tested elsewhere
        cases = [
            ((-1, 0.1, 0.1, 0.1, 0.1, 1), "invalid step event"),
            ((1, 0.0, 0.1, 0.1, 0.1, 1), "invalid step event"),
            ((1, 0.1, float("nan"), 0.1, 0.1, 1), "invalid data_s"),
            ((1, 0.1, 0.1, -1.0, 0.1, 1), "invalid compute_s"),
            ((1, 0.1, 0.1, 0.1, float("inf"), 1), "invalid comm_s"),
            ((1, 0.1, 0.1, 0.1, 0.1, -2), "invalid samples"),
            ((1, 0.1, 0.1, 0.1, 0.1, "many"), "cannot format"),
        ]
        for args, reason in cases:
            self.assertFalse(rep.send(*args))
            self.assertIn(reason, rep.last_error)
        self.assertEqual(rep._sock.datagrams, [])
        self.assertEqual(rep.dropped, len(cases))


class ScopeEncodingTest(unittest.TestCase):
    def setUp(self):
        self.clock = FakeClock()
        saved = reporter_module._perf_counter_ns
        reporter_module._perf_counter_ns = self.clock.ns
        self.addCleanup(setattr, reporter_module, "_perf_counter_ns", saved)

    def test_every_phase_combination_parses_to_the_exact_durations(self):
        clock = self.clock
        durations = {"data": 0.001234567, "compute": 0.098765432, "comm": 2.5}
        for job, identity in itertools.product(JOBS, IDENTITIES):
            rep = reporter(job, identity)
            step = 0
            for used in itertools.product((False, True), repeat=3):
                for samples in (None, 0, 32):
                    names = [name for name, on in zip(stepwatch.PHASES, used) if on]
                    with rep.step(samples=samples):
                        clock.advance(0.000000321)  # outside any phase: step_s only
                        for name in names:
                            with rep.phase(name):
                                clock.advance(durations[name])
                    raw = rep._sock.datagrams.pop()
                    event = json.loads(raw)
                    step_ns = 321 + sum(round(durations[n] * 1e9) for n in names)
                    fields = {"%s_s" % n: round(durations[n] * 1e9) / 1e9 for n in names}
                    want = expected_event(job, 3, 8, identity, step, step_s=step_ns / 1e9,
                                          samples=samples, **fields)
                    self.assertEqual(event, want, raw)
                    self.assertEqual(list(event), list(want), "field order")
                    for name in want:
                        self.assertIs(type(event[name]), type(want[name]), name)
                    self.assertIn(b'"step_s":%de-9' % step_ns, raw)
                    step += 1
            self.assertEqual(rep.dropped, 0)

    def test_invalid_scope_values_are_dropped_not_raised(self):
        rep = reporter("job1", {})
        rep._warned = True
        with rep.step(samples=-1):
            with rep.phase("data"), rep.phase("compute"), rep.phase("comm"):
                self.clock.advance(0.1)
        with rep.step(samples="x"):
            self.clock.advance(0.1)
        with rep.step(step=-5):
            self.clock.advance(0.1)
        with rep.step(step="seven"):
            self.clock.advance(0.1)
        self.assertEqual(rep._sock.datagrams, [])
        self.assertEqual(rep.dropped, 4)
        with rep.step(step=3):
            self.clock.advance(0.1)
        self.assertEqual(json.loads(rep._sock.datagrams.pop())["step"], 3)


def _agent_binary():
    build = os.environ.get("STEPWATCH_BUILD_DIR")
    if not build:
        return None
    path = os.path.join(build, "agent", "stepwatch-agent")
    return path if os.access(path, os.X_OK) else None


@unittest.skipUnless(_agent_binary(), "stepwatch-agent is not built")
class RealAgentTest(unittest.TestCase):
    """The real agent's parser accepts what send() and the scopes write, job ids with escapes,
    and rejects nothing: job ids with control characters, which the agent refuses (they would
    reach terminals and label values), are refused by the client itself."""

    def test_agent_accepts_every_encoding(self):
        import harness  # tests/integration, on PYTHONPATH under ctest

        with tempfile.TemporaryDirectory(prefix="sw-enc-") as tmp:
            # No collector is needed for ingestion: the agent buffers what it cannot ship.
            with harness.Agent(tmp, "127.0.0.1:%d" % harness.free_port()) as agent:
                sent = 0
                for job, identity in zip(JOBS, itertools.cycle(IDENTITIES)):
                    rep = stepwatch.Reporter(job=job, rank=1, world_size=2,
                                             socket_path=agent.socket_path, env={}, **identity)
                    try:
                        self.assertTrue(rep.send(sent, 0.25, 0.01, 0.2, 0.04, 64))
                        self.assertTrue(rep.send(sent + 1, 1e-05))
                        with rep.step(step=sent + 2, samples=8):
                            with rep.phase("data"):
                                time.sleep(0.001)
                            with rep.phase("compute"):
                                with rep.phase("comm"):
                                    time.sleep(0.001)
                        with rep.step(step=sent + 3):
                            pass
                        self.assertEqual((rep.sent, rep.dropped), (4, 0))
                    finally:
                        rep.close()
                    sent += 4

                def received():
                    samples = harness.scrape(agent.metrics_url)
                    return harness.metric_value(samples, "stepwatch_agent_events_received_total")

                with self.assertRaisesRegex(ValueError, "control character"):
                    stepwatch.Reporter(job="tab\tnew\nline\r\x01\x1f", rank=1, world_size=2,
                                       socket_path=agent.socket_path, env={})
                harness.wait_until(lambda: received() == sent, timeout=20,
                                   message="the agent to receive %d events" % sent)
                samples = harness.scrape(agent.metrics_url)
                rejected = harness.metric_values(samples, "stepwatch_agent_events_rejected_total")
                self.assertEqual(sum(rejected), 0, rejected)


if __name__ == "__main__":
    unittest.main()
