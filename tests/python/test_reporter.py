"""stepwatch.Reporter and the step()/phase() scopes, against a real bound Unix socket."""

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import stepwatch
from stepwatch import reporter as reporter_module
from sockets import FakeAgent, FakeClock, wait_until


def make_reporter(test, agent, **kwargs):
    kwargs.setdefault("job", "job1")
    kwargs.setdefault("rank", 1)
    kwargs.setdefault("world_size", 4)
    rep = stepwatch.Reporter(socket_path=agent.path, env={}, **kwargs)
    test.addCleanup(rep.close)
    return rep


class SendTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)

    def test_event_is_the_documented_json(self):
        rep = make_reporter(self, self.agent, job='a "quoted" job', local_rank=1, gpu=2, dp_rank=1,
                            pp_stage=0, tp_rank=3)
        self.assertTrue(rep.send(7, 0.25, data_s=0.01, compute_s=0.2, comm_s=0.04, samples=64))
        event = self.agent.recv()
        self.assertEqual(event, {
            "job": 'a "quoted" job', "rank": 1, "world_size": 4, "step": 7, "step_s": 0.25,
            "data_s": 0.01, "compute_s": 0.2, "comm_s": 0.04, "samples": 64, "local_rank": 1,
            "gpu": 2, "dp_rank": 1, "pp_stage": 0, "tp_rank": 3})
        self.assertEqual((rep.sent, rep.dropped), (1, 0))

    def test_sections_are_sent_in_their_order(self):
        rep = make_reporter(self, self.agent)
        self.assertTrue(rep.send(3, 0.5, compute_s=0.4,
                                 sections={"forward": 0.125, "backward": 0.25, "Data": 0}))
        self.assertEqual(
            self.agent.recv_raw(),
            b'{"job":"job1","rank":1,"world_size":4,"step":3,"step_s":0.5,"compute_s":0.4,'
            b'"sections":{"forward":0.125,"backward":0.25,"Data":0.0}}')
        self.assertTrue(rep.send(4, 0.5, 0.1, 0.3, 0.1, 8, sections={}))
        self.assertEqual(self.agent.recv()["sections"], {})

    def test_invalid_sections_drop_the_event(self):
        rep = make_reporter(self, self.agent)
        seventeen = {"s%d" % i: 0.01 for i in range(17)}
        bad = [seventeen, {"a b": 0.1}, {"comm": 0.1}, {"": 0.1}, {"x" * 65: 0.1},
               {"fwd": -1.0}, {"fwd": float("nan")}, {"fwd": 86400.5}, {"fwd": "0.1"},
               {"fwd": True}, {"fwd": None}, {3: 0.1}, ["fwd"], "fwd"]
        with self.assertLogs("stepwatch", logging.WARNING) as logs:
            for sections in bad:
                with self.subTest(sections=sections):
                    self.assertFalse(rep.send(1, 0.1, sections=sections))
        self.assertEqual(len(logs.records), 1)
        self.assertIn("sections", logs.output[0])
        self.assertEqual(rep.dropped, len(bad))
        self.assertIsNone(self.agent.recv(0.05))
        self.assertTrue(rep.send(1, 0.1, sections=dict(list(seventeen.items())[:16])))
        self.assertEqual(len(self.agent.recv()["sections"]), 16)

    def test_optional_fields_are_left_out(self):
        rep = make_reporter(self, self.agent)
        rep.send(0, 1e-05)
        self.assertEqual(self.agent.recv(),
                         {"job": "job1", "rank": 1, "world_size": 4, "step": 0, "step_s": 1e-05})

    def test_invalid_values_are_dropped_not_raised(self):
        rep = make_reporter(self, self.agent)
        with self.assertLogs("stepwatch", logging.WARNING) as logs:
            self.assertFalse(rep.send(1, 0.0))
            self.assertFalse(rep.send(1, float("nan")))
            self.assertFalse(rep.send(1, float("inf")))
            self.assertFalse(rep.send(-1, 0.1))
            self.assertFalse(rep.send(1, 0.1, data_s=-0.5))
            self.assertFalse(rep.send(1, 0.1, comm_s=float("nan")))
            self.assertFalse(rep.send(1, 0.1, samples=-3))
            self.assertFalse(rep.send("x", 0.1))
            self.assertFalse(rep.send(1, None))
        self.assertEqual(len(logs.records), 1, "only one warning")
        self.assertEqual((rep.sent, rep.dropped), (0, 9))
        self.assertIsNone(self.agent.recv(0.05))

    def test_job_id_the_agent_would_refuse_is_refused_at_construction(self):
        with self.assertRaisesRegex(ValueError, "300 bytes"):
            make_reporter(self, self.agent, job="j" * 300)
        with self.assertRaisesRegex(ValueError, "control character"):
            make_reporter(self, self.agent, job="llm\x1b[2J")
        with self.assertNoLogs("stepwatch", logging.WARNING):
            rep = make_reporter(self, self.agent, job="j" * 256)
        self.assertTrue(rep.send(0, 0.1))
        self.assertEqual(self.agent.recv(2.0)["job"], "j" * 256)

    def test_absent_agent_drops_counts_and_warns_once(self):
        self.agent.unbind()
        rep = make_reporter(self, self.agent, reconnect_interval=0.0)
        with self.assertLogs("stepwatch", logging.WARNING) as logs:
            for i in range(20):
                self.assertFalse(rep.send(i, 0.1))
        self.assertEqual(rep.dropped, 20)
        self.assertEqual(len(logs.records), 1)
        self.assertIn(self.agent.path, logs.output[0])

    def test_agent_appearing_later_is_found(self):
        self.agent.unbind()
        rep = make_reporter(self, self.agent, reconnect_interval=0.05)
        with self.assertLogs("stepwatch", logging.WARNING):
            self.assertFalse(rep.send(0, 0.1))
        self.agent.bind()
        self.assertTrue(wait_until(lambda: rep.send(1, 0.1), timeout=5.0))
        self.assertEqual(self.agent.recv()["step"], 1)

    def test_agent_restart_reconnects(self):
        rep = make_reporter(self, self.agent, reconnect_interval=0.05)
        self.assertTrue(rep.send(0, 0.1))
        self.assertEqual(self.agent.recv()["step"], 0)
        self.agent.unbind()
        self.agent.bind()
        with self.assertLogs("stepwatch", logging.WARNING):
            self.assertTrue(wait_until(lambda: rep.send(5, 0.1), timeout=5.0))
        self.assertEqual(self.agent.recv()["step"], 5)
        self.assertGreaterEqual(rep.dropped, 1)

    def test_full_queue_never_blocks(self):
        rep = make_reporter(self, self.agent)
        # The agent reads nothing: the socket's queue fills and sends fail with EAGAIN.
        with self.assertLogs("stepwatch", logging.WARNING) as logs:
            results = [rep.send(i, 0.1) for i in range(5000)]
        self.assertTrue(results[0])
        self.assertFalse(results[-1])
        self.assertEqual(rep.sent + rep.dropped, 5000)
        self.assertGreater(rep.dropped, 0)
        self.assertEqual(len(logs.records), 1)
        received = self.agent.drain()
        self.assertEqual(len(received), rep.sent)
        self.assertEqual([e["step"] for e in received], list(range(rep.sent)))

    def test_closed_reporter_drops(self):
        rep = make_reporter(self, self.agent)
        rep.close()
        with self.assertLogs("stepwatch", logging.WARNING):
            self.assertFalse(rep.send(0, 0.1))
        self.assertEqual(rep.dropped, 1)


class ScopeTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)
        self.clock = FakeClock()
        self.saved = reporter_module._perf_counter_ns
        reporter_module._perf_counter_ns = self.clock.ns
        self.addCleanup(setattr, reporter_module, "_perf_counter_ns", self.saved)
        self.rep = make_reporter(self, self.agent)

    def test_step_and_nested_phases(self):
        rep, clock = self.rep, self.clock
        with rep.step(samples=32):
            with rep.phase("data"):
                clock.advance(0.5)
            clock.advance(0.25)  # outside any phase: reported in step_s only
            with rep.phase("compute"):
                clock.advance(1.0)
                with rep.phase("comm"):  # paused compute
                    clock.advance(2.0)
                clock.advance(1.0)
        event = self.agent.recv()
        self.assertEqual(event["step"], 0)
        self.assertEqual(event["samples"], 32)
        self.assertAlmostEqual(event["step_s"], 4.75)
        self.assertAlmostEqual(event["data_s"], 0.5)
        self.assertAlmostEqual(event["compute_s"], 2.0)
        self.assertAlmostEqual(event["comm_s"], 2.0)

    def test_steps_are_numbered_and_can_be_given(self):
        rep, clock = self.rep, self.clock
        for _ in range(3):
            with rep.step():
                clock.advance(0.1)
        with rep.step(step=100):
            clock.advance(0.1)
        with rep.step():
            clock.advance(0.1)
        steps = [e["step"] for e in self.agent.drain()]
        self.assertEqual(steps, [0, 1, 2, 100, 101])

    def test_unused_phases_are_absent(self):
        with self.rep.step():
            self.clock.advance(0.1)
        event = self.agent.recv()
        for name in ("data_s", "compute_s", "comm_s", "samples"):
            self.assertNotIn(name, event)

    def test_every_subset_of_phases_with_samples_and_sections(self):
        # Each combination takes the step scope's own formatting: the event has exactly the
        # phases that ran, their durations, and samples and sections when given.
        rep, clock = self.rep, self.clock
        phases = stepwatch.PHASES
        for mask in range(8):
            for samples in (None, 7):
                for section in (None, "forward"):
                    ran = [p for i, p in enumerate(phases) if mask >> i & 1]
                    with rep.step(samples=samples):
                        for i, name in enumerate(ran):
                            with rep.phase(name):
                                clock.advance(0.5 + i)
                        if section:
                            with rep.phase(section):
                                clock.advance(0.25)
                        clock.advance(0.125)
                    event = self.agent.recv()
                    label = (ran, samples, section)
                    expected = {p + "_s": 0.5 + i for i, p in enumerate(ran)}
                    if section:  # a section outside a phase is compute time
                        expected["compute_s"] = expected.get("compute_s", 0) + 0.25
                    got = {k: v for k, v in event.items() if k.endswith("_s") and k != "step_s"}
                    self.assertEqual(got.keys(), expected.keys(), label)
                    for key, value in expected.items():
                        self.assertAlmostEqual(got[key], value, msg=label)
                    self.assertAlmostEqual(event["step_s"], sum(expected.values()) + 0.125,
                                           msg=label)
                    self.assertEqual(event.get("samples"), samples, label)
                    self.assertEqual(event.get("sections"),
                                     {"forward": 0.25} if section else None, label)
                    self.assertNotIn("dropped", event, label)
        self.assertEqual(rep.sent, 32)
        self.assertEqual(rep.dropped, 0)

    def test_drops_before_a_step_are_reported_with_it(self):
        rep, clock = self.rep, self.clock
        with rep.step(samples=-1):  # refused by the agent's rules: dropped, counted
            with rep.phase("compute"):
                clock.advance(0.5)
        self.assertEqual(rep.dropped, 1)
        with rep.step():
            with rep.phase("compute"):
                clock.advance(0.5)
        event = self.agent.recv()
        self.assertEqual(event["dropped"], 1)
        self.assertAlmostEqual(event["compute_s"], 0.5)
        with rep.step(samples=3):
            clock.advance(0.5)
        event = self.agent.recv()
        self.assertNotIn("dropped", event)
        self.assertEqual(event["samples"], 3)

    def test_phase_before_step_belongs_to_next_step(self):
        rep, clock = self.rep, self.clock
        with rep.phase("data"):
            clock.advance(0.3)
        clock.advance(0.1)
        with rep.step():
            with rep.phase("compute"):
                clock.advance(0.5)
        event = self.agent.recv()
        self.assertAlmostEqual(event["data_s"], 0.3)
        self.assertAlmostEqual(event["compute_s"], 0.5)
        self.assertAlmostEqual(event["step_s"], 0.9)
        with rep.step():
            clock.advance(0.2)
        event = self.agent.recv()
        self.assertNotIn("data_s", event)
        self.assertAlmostEqual(event["step_s"], 0.2)

    def test_failed_step_is_not_reported_and_error_propagates(self):
        rep, clock = self.rep, self.clock
        with self.assertRaises(KeyError):
            with rep.step():
                clock.advance(0.1)
                raise KeyError("boom")
        self.assertIsNone(self.agent.recv(0.05))
        with rep.step():
            clock.advance(0.1)
        self.assertEqual(self.agent.recv()["step"], 0)

    def test_any_other_valid_name_is_a_section_and_counts_as_compute(self):
        rep, clock = self.rep, self.clock
        with rep.step():
            with rep.phase("data"):
                clock.advance(0.5)
            with rep.phase("forward"):
                clock.advance(1.0)
            with rep.phase("backward"):
                clock.advance(2.0)
                with rep.phase("comm"):  # waiting for other ranks: comm, not backward
                    clock.advance(4.0)
                clock.advance(8.0)
            with rep.phase("optimizer"):
                clock.advance(16.0)
            with rep.phase("backward"):  # the same name again in the step: adds up
                clock.advance(32.0)
        raw = self.agent.recv_raw()
        event = json.loads(raw)
        self.assertEqual(event["sections"], {"forward": 1.0, "backward": 42.0, "optimizer": 16.0})
        # In order of first use, exact nanoseconds.
        self.assertIn(b'"sections":{"forward":1000000000e-9,"backward":42000000000e-9,'
                      b'"optimizer":16000000000e-9}}', raw)
        self.assertAlmostEqual(event["compute_s"], 1 + 2 + 8 + 16 + 32)
        self.assertAlmostEqual(event["comm_s"], 4.0)
        self.assertAlmostEqual(event["data_s"], 0.5)
        self.assertAlmostEqual(event["step_s"], 63.5)
        # The next step starts clean: no sections, and the fast path's exact bytes.
        with rep.step():
            with rep.phase("data"):
                clock.advance(0.25)
            with rep.phase("compute"):
                clock.advance(0.25)
            with rep.phase("comm"):
                clock.advance(0.25)
        self.assertEqual(
            self.agent.recv_raw(),
            b'{"job":"job1","rank":1,"world_size":4,"step":1,"step_s":750000000e-9,'
            b'"data_s":250000000e-9,"compute_s":250000000e-9,"comm_s":250000000e-9}')

    def test_a_section_inside_data_or_comm_is_that_phase(self):
        rep, clock = self.rep, self.clock
        with rep.step():
            with rep.phase("comm"):
                clock.advance(1.0)
                with rep.phase("allreduce"):
                    clock.advance(2.0)
            with rep.phase("data"):
                with rep.phase("decode"):
                    clock.advance(4.0)
        event = self.agent.recv()
        self.assertEqual(event["sections"], {"allreduce": 2.0, "decode": 4.0})
        self.assertEqual((event["comm_s"], event["data_s"]), (3.0, 4.0))
        self.assertNotIn("compute_s", event)

    def test_sections_nest_and_one_inside_itself_counts_once(self):
        rep, clock = self.rep, self.clock
        with rep.step():
            with rep.phase("forward"):
                clock.advance(1.0)
                with rep.phase("forward/attn"):
                    clock.advance(2.0)
                    with rep.phase("forward"):
                        clock.advance(4.0)
                with rep.phase("compute"):  # the built-in phase inside a section
                    clock.advance(8.0)
                with rep.phase("data"):  # not forward's
                    clock.advance(16.0)
        event = self.agent.recv()
        self.assertEqual(event["sections"], {"forward": 15.0, "forward/attn": 6.0})
        self.assertEqual((event["compute_s"], event["data_s"], event["step_s"]), (15.0, 16.0, 31.0))

    def test_a_section_outside_or_around_steps_follows_the_phase_rules(self):
        rep, clock = self.rep, self.clock
        with rep.phase("load"):  # before the step: belongs to the next one
            clock.advance(1.0)
        with rep.step():
            clock.advance(2.0)
        event = self.agent.recv()
        self.assertEqual((event["step_s"], event["compute_s"], event["sections"]),
                         (3.0, 1.0, {"load": 1.0}))
        with rep.phase("epoch"):
            clock.advance(1.0)
            with rep.step():
                clock.advance(2.0)
            clock.advance(4.0)
            with rep.step():
                clock.advance(8.0)
        first, second = self.agent.drain()
        self.assertEqual((first["compute_s"], first["sections"]), (3.0, {"epoch": 3.0}))
        self.assertEqual((second["compute_s"], second["sections"]), (12.0, {"epoch": 12.0}))
        with rep.step():  # the section closed at once after the last step: nothing of it here
            clock.advance(0.5)
        self.assertNotIn("sections", self.agent.recv())

    def test_a_failed_step_drops_its_sections(self):
        rep, clock = self.rep, self.clock
        with self.assertRaises(KeyError):
            with rep.step():
                with rep.phase("forward"):
                    clock.advance(1.0)
                raise KeyError("boom")
        with rep.step():
            clock.advance(0.1)
        self.assertNotIn("sections", self.agent.recv())

    def test_invalid_section_names_raise_at_the_call(self):
        rep = self.rep
        for bad in ("", "a b", "x" * 65, "r\u00e9seau", 'fwd"', "a\nb", None, 3, ["compute"]):
            with self.subTest(name=bad):
                with self.assertRaises(ValueError):
                    rep.phase(bad)
        for i in range(16):
            rep.phase("s%d" % i)
        # A 17th name is timed as compute, said once, counted: never an exception mid-run.
        with self.assertLogs(level="WARNING") as logs:
            folded = rep.phase("one-more")
        self.assertIn("at most 16", "\n".join(logs.output))
        self.assertIs(folded, rep.phase("compute"))
        self.assertIs(rep.phase("one-more"), folded)
        rep.phase("and-another")
        self.assertEqual(rep.sections_folded, 2)
        # The registered sections and the phases still work, and nothing was dropped.
        with rep.step():
            with rep.phase("s15"), rep.phase("compute"):
                self.clock.advance(0.5)
        event = self.agent.recv()
        self.assertEqual((event["sections"], event["compute_s"]), ({"s15": 0.5}, 0.5))
        self.assertEqual(rep.dropped, 0)

    def test_a_phase_entered_again_inside_itself_counts_once(self):
        rep, clock = self.rep, self.clock
        with rep.step():
            with rep.phase("compute"):
                clock.advance(1.0)
                with rep.phase("comm"):
                    clock.advance(2.0)
                    with rep.phase("compute"):  # a library timing its own compute
                        clock.advance(4.0)
                        with rep.phase("data"):
                            clock.advance(8.0)
                        with rep.phase("compute"):
                            clock.advance(16.0)
                        clock.advance(32.0)
                    clock.advance(64.0)
                clock.advance(128.0)
            with rep.phase("comm"):
                clock.advance(256.0)
        event = self.agent.recv()
        self.assertAlmostEqual(event["compute_s"], 1 + 4 + 16 + 32 + 128)
        self.assertAlmostEqual(event["comm_s"], 2 + 64 + 256)
        self.assertAlmostEqual(event["data_s"], 8)
        self.assertAlmostEqual(event["step_s"], 511)
        # Nothing is left open: the next step starts clean.
        with rep.step():
            with rep.phase("data"):
                clock.advance(0.5)
        event = self.agent.recv()
        self.assertEqual((event["data_s"], event["step_s"]), (0.5, 0.5))
        self.assertNotIn("compute_s", event)

    def test_a_phase_around_steps_splits_at_step_boundaries(self):
        rep, clock = self.rep, self.clock
        with rep.phase("compute"):
            clock.advance(1.0)
            with rep.step():
                clock.advance(2.0)
            clock.advance(4.0)
            with rep.step():
                clock.advance(8.0)
        first, second = self.agent.drain()
        self.assertEqual((first["compute_s"], first["step_s"]), (3.0, 3.0))
        self.assertEqual((second["compute_s"], second["step_s"]), (12.0, 12.0))

    def test_a_step_inside_a_step_is_ignored_with_one_warning(self):
        rep, clock = self.rep, self.clock
        with self.assertLogs("stepwatch", logging.WARNING) as logs:
            with rep.step(samples=4):
                with rep.step(samples=99):
                    with rep.phase("compute"):
                        clock.advance(1.0)
                with rep.step():
                    clock.advance(1.0)
        self.assertEqual(len(logs.records), 1)
        event = self.agent.recv()
        self.assertEqual((event["step"], event["samples"], event["compute_s"], event["step_s"]),
                         (0, 4, 1.0, 2.0))
        self.assertIsNone(self.agent.recv(0.05))

    def test_samples_can_be_set_inside_the_step(self):
        with self.rep.step() as step:
            self.clock.advance(0.1)
            step.samples = 12
        self.assertEqual(self.agent.recv()["samples"], 12)

    def test_busy_agent_keeps_no_exception(self):
        rep = self.rep
        with self.assertLogs("stepwatch", logging.WARNING):
            for i in range(5000):
                with rep.step():
                    self.clock.advance(0.001)
        self.assertGreater(rep.dropped, 0)
        # A kept exception would hold a traceback and, through it, a reference cycle per drop.
        self.assertIsInstance(rep.last_error, str)
        self.assertIn("busy", rep.last_error)
        self.assertEqual(len(self.agent.drain()), rep.sent)


class CommPhaseTest(unittest.TestCase):
    """comm_s from a comm phase is the time the step is blocked in it (exposed communication), not
    the duration of a collective that runs in the background while the step computes."""

    def setUp(self):
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)
        self.rep = make_reporter(self, self.agent)

    def step_with_background_collective(self, collective_s, compute_s):
        done = threading.Event()
        with self.rep.step():
            collective = threading.Timer(collective_s, done.set)  # an async all-reduce
            collective.start()
            with self.rep.phase("compute"):
                time.sleep(compute_s)
            with self.rep.phase("comm"):
                self.assertTrue(done.wait(10))
        collective.join(10)
        return self.agent.recv()

    def test_overlapped_collective_is_not_comm(self):
        e = self.step_with_background_collective(collective_s=0.2, compute_s=0.3)
        self.assertLess(e["comm_s"], 0.1, e)
        self.assertGreaterEqual(e["compute_s"], 0.3, e)

    def test_the_wait_for_a_collective_is_comm(self):
        e = self.step_with_background_collective(collective_s=0.3, compute_s=0.05)
        self.assertGreater(e["comm_s"], 0.2, e)
        self.assertLess(e["compute_s"], 0.2, e)


class ModuleApiTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)
        self.saved_env = dict(os.environ)
        self.addCleanup(self._restore)

    def _restore(self):
        os.environ.clear()
        os.environ.update(self.saved_env)
        with stepwatch._default_lock:
            if stepwatch._default is not None:
                stepwatch._default.close()
            stepwatch._default = None

    def test_module_step_uses_the_environment(self):
        os.environ.update({"STEPWATCH_SOCKET": self.agent.path, "RANK": "2", "WORLD_SIZE": "3",
                           "LOCAL_RANK": "0", "STEPWATCH_JOB": "envjob"})
        stepwatch._default = None
        with stepwatch.step(samples=8):
            with stepwatch.phase("compute"):
                pass
        event = self.agent.recv()
        self.assertEqual((event["job"], event["rank"], event["world_size"], event["local_rank"]),
                         ("envjob", 2, 3, 0))
        self.assertEqual(event["samples"], 8)
        self.assertIs(stepwatch.get_reporter(), stepwatch.get_reporter())

    def test_module_phase_takes_section_names(self):
        stepwatch.configure(job="cfg", rank=0, world_size=1, socket_path=self.agent.path)
        with stepwatch.step():
            with stepwatch.phase("forward"):
                pass
            with stepwatch.phase("compute"):
                pass
        event = self.agent.recv()
        self.assertIn("forward", event["sections"])
        self.assertIn("compute_s", event)
        with self.assertRaises(ValueError):
            stepwatch.phase("not a name")

    def test_configure_replaces_the_reporter(self):
        rep = stepwatch.configure(job="cfg", rank=0, world_size=1, socket_path=self.agent.path)
        self.assertIs(stepwatch.get_reporter(), rep)
        with stepwatch.step():
            pass
        self.assertEqual(self.agent.recv()["job"], "cfg")

    def test_unusable_environment_disables_without_raising(self):
        os.environ.update({"STEPWATCH_SOCKET": self.agent.path, "RANK": "x", "WORLD_SIZE": "2"})
        stepwatch._default = None
        with self.assertLogs("stepwatch", logging.WARNING) as logs:
            with stepwatch.step():
                pass
            with stepwatch.step():
                pass
        self.assertEqual(len(logs.records), 1)
        self.assertIn("RANK", logs.output[0])
        self.assertEqual(stepwatch.get_reporter().dropped, 2)
        self.assertIsNone(self.agent.recv(0.05))


class InstallTest(unittest.TestCase):
    def test_pip_installs_the_package(self):
        source = os.path.join(os.environ.get("STEPWATCH_SOURCE_DIR",
                                             os.path.join(os.path.dirname(__file__), "..", "..")),
                              "python")
        with tempfile.TemporaryDirectory(prefix="sw-pip-") as tmp:
            # Build from a copy: pip writes build files next to the sources.
            copy = os.path.join(tmp, "src")
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                        "__pycache__"))
            target = os.path.join(tmp, "site")
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                 "--no-build-isolation", "--no-index", "--target", target, copy],
                check=True, timeout=120, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            out = subprocess.run(
                [sys.executable, "-c",
                 "import stepwatch, stepwatch.reporter; print(stepwatch.__file__)"],
                check=True, timeout=60, stdout=subprocess.PIPE, text=True,
                env={"PYTHONPATH": target, "PATH": os.environ.get("PATH", "")}).stdout
            self.assertTrue(out.strip().startswith(target), out)
            self.assertTrue(os.path.exists(os.path.join(target, "stepwatch", "torch.py")))


if __name__ == "__main__":
    unittest.main()
