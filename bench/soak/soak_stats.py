"""Small pieces of the soak benchmark: /proc readings, a least-squares slope, percentiles."""

import math
import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_rss_kib(pid):
    """(VmRSS, VmHWM) of a process in KiB; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values.get("VmRSS"), values.get("VmHWM")


def read_cpu_seconds(pid):
    """utime + stime of a process in seconds (/proc/PID/stat fields 14 and 15); None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def read_system_cpu():
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def read_loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def slope(xs, ys):
    """Least-squares slope of ys over xs and its standard error; (None, None) with < 3 points."""
    n = len(xs)
    if n < 3 or n != len(ys):
        return None, None
    mx = sum(xs) / n
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None, None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    b = sxy / sxx
    a = my - b * mx
    sse = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return b, math.sqrt(sse / (n - 2) / sxx)


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def mean(values):
    return sum(values) / len(values) if values else None
