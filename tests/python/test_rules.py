"""The Python client's copy of the step-event rules against the published ones
(proto/step_event_rules.json, which a C++ test proves equal to the agent's), and its verdicts over
the shared table of edge cases (tests/data/step_event_cases.json), which the agent's parser test
runs too: the client sends exactly the events the agent accepts."""

import json
import logging
import os
import unittest

import stepwatch
from stepwatch import _rules
from sockets import FakeAgent

_SOURCE = os.environ.get(
    "STEPWATCH_SOURCE_DIR",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")),
)
_IDENTITY = ("job", "rank", "world_size", "local_rank", "gpu", "dp_rank", "pp_stage", "tp_rank")
_STEP = ("step", "step_s", "data_s", "compute_s", "comm_s", "samples", "sections")


def _load(relative):
    with open(os.path.join(_SOURCE, relative), encoding="utf-8") as f:
        return json.load(f)


def _value(raw, name=None):
    """A case value in the table's notation as a Python value."""
    if name == "sections":
        return {key: _value(v) for key, v in raw.items()}
    if isinstance(raw, dict):
        if "literal" in raw:
            return int(raw["literal"])
        return raw["repeat"] * raw["times"]
    if raw in ("nan", "inf", "-inf"):
        return float(raw)
    return raw


def _case_values(doc, case):
    values = dict(doc["base"])
    values.update(case["set"])
    return {name: _value(raw, name) for name, raw in values.items() if raw is not None}


class PublishedRulesTest(unittest.TestCase):
    def test_constants_equal_the_published_rules(self):
        rules = _load("proto/step_event_rules.json")
        self.assertEqual(_rules.VERSION, rules["version"])
        self.assertEqual(_rules.MAX_DATAGRAM_BYTES, rules["max_datagram_bytes"])
        self.assertEqual(_rules.MAX_JOB_BYTES, rules["job"]["max_bytes"])
        self.assertEqual(1, rules["job"]["min_bytes"])
        self.assertTrue(rules["rank_below_world_size"])
        self.assertEqual(list(_rules.FIELDS), [f["name"] for f in rules["fields"]])
        for field in rules["fields"]:
            alias, kind, required, low, high, exclusive, part = _rules.FIELDS[field["name"]]
            with self.subTest(field=field["name"]):
                self.assertEqual(alias, field["alias"])
                self.assertEqual(kind, field["type"])
                self.assertEqual(required, field["required"])
                self.assertEqual(part, field["part_of_step"])
                if kind != "string":
                    self.assertEqual(low, field["min"])
                    self.assertEqual(high, field["max"])
                if kind in ("number", "object"):
                    self.assertEqual(exclusive, field["min_exclusive"])
                if kind == "object":
                    self.assertEqual(field["name"], "sections")
                    self.assertEqual(_rules.MAX_SECTIONS, field["max_entries"])
                    self.assertEqual(1, field["name_min_bytes"])
                    self.assertEqual(_rules.MAX_SECTION_NAME_BYTES, field["name_max_bytes"])
                    self.assertEqual(list(_rules.RESERVED_SECTION_NAMES), field["reserved_names"])
                    chars, spec = set(), field["name_characters"]
                    i = 0
                    while i < len(spec):
                        if i + 2 < len(spec) and spec[i + 1] == "-":
                            chars.update(chr(c) for c in range(ord(spec[i]), ord(spec[i + 2]) + 1))
                            i += 3
                        else:
                            chars.add(spec[i])
                            i += 1
                    self.assertEqual(set(_rules.SECTION_NAME_CHARACTERS), chars)

    def test_the_client_sends_only_fields_of_the_rules(self):
        self.assertLessEqual(set(stepwatch._config.OPTIONAL_INT_FIELDS), set(_rules.FIELDS))
        self.assertLessEqual(set(_STEP), set(_rules.FIELDS))


class SharedCasesTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)

    def verdict(self, values):
        """(accepted, what arrived): a refused identity raises at construction, refused step
        values drop the event."""
        identity = {k: values.get(k) for k in _IDENTITY}
        try:
            rep = stepwatch.Reporter(socket_path=self.agent.path, env={}, **identity)
        except ValueError:
            return False, None
        self.addCleanup(rep.close)
        step = {k: values.get(k) for k in _STEP}
        with _quiet():
            sent = rep.send(**step)
        if not sent:
            self.assertIsNone(self.agent.recv(0.02))
            return False, None
        return True, self.agent.recv(2.0)

    def test_client_accepts_exactly_what_the_agent_accepts(self):
        doc = _load("tests/data/step_event_cases.json")
        self.assertGreaterEqual(len(doc["cases"]), 70)
        for case in doc["cases"]:
            values = _case_values(doc, case)
            with self.subTest(case=case["name"]):
                accepted, event = self.verdict(values)
                self.assertEqual(accepted, case["accept"])
                if accepted:
                    # Sent as given: the agent parses these values, not others.
                    self.assertEqual(event, values)

    def test_section_names_the_agent_refuses_raise_in_phase(self):
        """phase() with a name of the table's refused cases raises; with an accepted one, it
        times a section."""
        doc = _load("tests/data/step_event_cases.json")
        rep = stepwatch.Reporter(job="j", rank=0, world_size=1, socket_path=self.agent.path,
                                 env={})
        self.addCleanup(rep.close)
        checked = 0
        for case in doc["cases"]:
            sections = case["set"].get("sections")
            if not sections or len(sections) != 1:
                continue
            (name, value), = sections.items()
            name_ok = _rules.section_name_error(name) is None
            value_ok = isinstance(value, (int, float)) and 0 <= value <= _rules.MAX_SECONDS
            with self.subTest(case=case["name"]):
                self.assertEqual(name_ok and value_ok, case["accept"])
                if name in stepwatch.PHASES:
                    # Not a section name, but phase()'s own: the built-in phase.
                    self.assertIs(rep.phase(name), rep._phase_scopes[name])
                elif name_ok:
                    self.assertIsNotNone(rep.phase(name))
                else:
                    with self.assertRaises(ValueError):
                        rep.phase(name)
                    checked += 1
        self.assertGreaterEqual(checked, 7)

    def test_job_that_is_not_utf8_is_refused(self):
        accepted, _ = self.verdict({"job": "llm\udcff", "rank": 0, "world_size": 1,
                                    "step": 0, "step_s": 0.1})
        self.assertFalse(accepted)

    def test_step_scope_respects_the_limits(self):
        rep = stepwatch.Reporter(job="j", rank=0, world_size=1, socket_path=self.agent.path,
                                 env={})
        self.addCleanup(rep.close)
        with _quiet():
            with rep.step(step=_rules.MAX_INT64 + 1):
                pass
        self.assertEqual((rep.sent, rep.dropped), (0, 1))
        with rep.step(step=_rules.MAX_INT64):
            pass
        self.assertEqual(self.agent.recv(2.0)["step"], _rules.MAX_INT64)


class _quiet:
    """Silences the one warning a drop logs."""

    def __enter__(self):
        logging.getLogger("stepwatch").disabled = True

    def __exit__(self, *exc):
        logging.getLogger("stepwatch").disabled = False
        return False


if __name__ == "__main__":
    unittest.main()
