"""The agent's rules for step events (docs/step-event.md), copied so that the package stands alone.

tests/python/test_rules.py proves them equal to proto/step_event_rules.json, which the agent's own
rules are tested against. Values that break them are refused in the client, where the caller can
hear of it, instead of silently by the agent.
"""

VERSION = 1
MAX_DATAGRAM_BYTES = 64 * 1024
# Job ids: 1 to MAX_JOB_BYTES bytes of UTF-8 without control characters (U+0000..U+001F,
# U+007F..U+009F): they become label values and reach terminals.
MAX_JOB_BYTES = 256
# step_s, data_s, compute_s, comm_s: at most a day.
MAX_SECONDS = 86400.0
MAX_WORLD_SIZE = 1 << 20
MAX_GPU_INDEX = 1023
MAX_INT32 = (1 << 31) - 1
MAX_INT64 = (1 << 63) - 1
# "sections": at most MAX_SECTIONS named sections per event, each name 1 to MAX_SECTION_NAME_BYTES
# bytes of SECTION_NAME_CHARACTERS and none of RESERVED_SECTION_NAMES (the built-in phases); values
# 0 to MAX_SECONDS.
MAX_SECTIONS = 16
MAX_SECTION_NAME_BYTES = 64
SECTION_NAME_CHARACTERS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:/-"
)
RESERVED_SECTION_NAMES = ("data", "compute", "comm")

# name -> (alias, type, required, min, max, min_exclusive, part_of_step), in the datagram's order.
FIELDS = {
    "job": ("job", "string", True, None, None, False, True),
    "rank": ("rank", "integer", True, 0, MAX_WORLD_SIZE - 1, False, True),
    "world_size": ("worldSize", "integer", True, 1, MAX_WORLD_SIZE, False, True),
    "step": ("step", "integer", True, 0, MAX_INT64, False, True),
    "step_s": ("stepS", "number", True, 0.0, MAX_SECONDS, True, True),
    "data_s": ("dataS", "number", False, 0.0, MAX_SECONDS, False, True),
    "compute_s": ("computeS", "number", False, 0.0, MAX_SECONDS, False, True),
    "comm_s": ("commS", "number", False, 0.0, MAX_SECONDS, False, True),
    "samples": ("samples", "integer", False, 0, MAX_INT64, False, True),
    "local_rank": ("localRank", "integer", False, 0, MAX_GPU_INDEX, False, True),
    "gpu": ("gpu", "integer", False, 0, MAX_GPU_INDEX, False, True),
    "dp_rank": ("dpRank", "integer", False, 0, MAX_INT32, False, True),
    "pp_stage": ("ppStage", "integer", False, 0, MAX_INT32, False, True),
    "tp_rank": ("tpRank", "integer", False, 0, MAX_INT32, False, True),
    "sections": ("sections", "object", False, 0.0, MAX_SECONDS, False, True),
    "dropped": ("dropped", "integer", False, 0, MAX_INT64, False, False),
}


def job_error(job):
    """Why the agent would refuse `job` (None when it would not)."""
    if not isinstance(job, str) or not job:
        return "job must be a non-empty string, got %r" % (job,)
    try:
        size = len(job.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates: not UTF-8
        return "job %r is not valid UTF-8" % (job,)
    if size > MAX_JOB_BYTES:
        return "job id is %d bytes, over the agent's limit of %d" % (size, MAX_JOB_BYTES)
    for i, ch in enumerate(job):
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return "job %r contains a control character at index %d" % (job, i)
    return None


def int_error(name, value):
    """Why the agent would refuse `value` for the integer field `name` (None when it would not)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "%s must be an int, got %r" % (name, value)
    low, high = FIELDS[name][3], FIELDS[name][4]
    if value < low:
        return "%s must be >= %d, got %d" % (name, low, value)
    if value > high:
        return "%s must be <= %d, got %d" % (name, high, value)
    return None


def section_name_error(name):
    """Why the agent would refuse `name` as a section name (None when it would not)."""
    if not isinstance(name, str):
        return "a section name must be a str, got %r" % (name,)
    if not name:
        return "a section name must not be empty"
    if len(name) > MAX_SECTION_NAME_BYTES:
        return "section name %r is over %d bytes" % (name, MAX_SECTION_NAME_BYTES)
    for i, ch in enumerate(name):
        if ch not in SECTION_NAME_CHARACTERS:
            return "section name %r has %r at index %d: only A-Za-z0-9_.:/- are allowed" % (
                name, ch, i)
    if name in RESERVED_SECTION_NAMES:
        return "section name %r is a built-in phase (reported as %s_s), not a section" % (
            name, name)
    return None


def sections_error(sections):
    """Why the agent would refuse `sections`, a mapping of name -> seconds (None when it would
    not)."""
    try:
        items = list(sections.items())
    except Exception:
        return "sections must be a mapping of name -> seconds, got %r" % (sections,)
    if len(items) > MAX_SECTIONS:
        return "%d sections, the limit is %d" % (len(items), MAX_SECTIONS)
    for name, value in items:
        error = section_name_error(name)
        if error:
            return error
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "section %s: %r is not a number" % (name, value)
        if not 0.0 <= value <= MAX_SECONDS:
            return "section %s: %r must be >= 0 and at most %g" % (name, value, MAX_SECONDS)
    return None


def step_error(step, step_s, data_s, compute_s, comm_s, samples):
    """Why the agent would refuse these step values (None when it would not); rare path."""
    error = int_error("step", step)
    if error:
        return "invalid step event: " + error
    for name, value in (("step_s", step_s), ("data_s", data_s), ("compute_s", compute_s),
                        ("comm_s", comm_s)):
        if value is None and name != "step_s":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "invalid %s %r: not a number" % (name, value)
        if name == "step_s":
            if not 0.0 < value <= MAX_SECONDS:
                return "invalid step event: step_s %r must be > 0 and at most %g" % (
                    value, MAX_SECONDS)
        elif not 0.0 <= value <= MAX_SECONDS:
            return "invalid %s %r: must be >= 0 and at most %g" % (name, value, MAX_SECONDS)
    if samples is not None:
        error = int_error("samples", samples)
        if error:
            return "invalid samples: " + error
    return None
