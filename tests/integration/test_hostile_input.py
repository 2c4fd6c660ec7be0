"""Hostile time and text, and forged ranks on a node, through the real agent and collector:
a node whose clock runs an hour fast (libfaketime) must not blind detection for any job; a
rank is bound to the process that reports it; other users cannot write to the agent's socket;
escape codes never reach a job name. Loopback only; every wait is bounded."""

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import unittest

from harness import (BUILD_DIR, Agent, Collector, ctl_json, metric_samples, metric_value,
                     step_event, wait_until)
from test_diagnosis import send_job_steps

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def clang_asan_build():
    """True for a clang AddressSanitizer build: its runtime, linked into each binary, can hang
    before main when libfaketime intercepts its first clock_gettime (GCC's shared libasan does
    not). Seen intermittently with the agent and every time with a two-line program."""
    try:
        with open(os.path.join(BUILD_DIR, "CMakeCache.txt"), encoding="utf-8") as f:
            cache = f.read().splitlines()
    except OSError:
        return False
    clang = any(line.startswith("CMAKE_CXX_COMPILER:") and "clang" in line for line in cache)
    asan = "STEPWATCH_SANITIZE:BOOL=ON" in cache or "STEPWATCH_FUZZ:BOOL=ON" in cache
    return clang and asan


def flagged_ranks(collector, job):
    return sorted(int(labels["rank"]) for labels, value in
                  metric_samples(collector.scrape(), "stepwatch_straggler")
                  if value == 1 and labels.get("job") == job)


def agent_rejected(agent, reason):
    return metric_value(agent.scrape(), "stepwatch_agent_events_rejected_total", reason=reason)


# A sender that reports steps of one (job, rank) from its own process and stays alive until told.
SENDER = textwrap.dedent("""
    import json, socket, sys
    path, job, rank, first, last, step_s = sys.argv[1:7]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for step in range(int(first), int(last)):
            s.sendto(json.dumps({"job": job, "rank": int(rank), "world_size": 2, "step": step,
                                 "step_s": float(step_s)}).encode(), path)
    except PermissionError:
        print("permission denied", flush=True)
        sys.exit(3)
    print("sent", flush=True)
    sys.stdin.readline()
""")


class HostileInputTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-hostile-")
        self.tmp = self._tmp.name
        os.chmod(self.tmp, 0o755)  # other users must reach the socket's directory

    def tearDown(self):
        self._tmp.cleanup()

    @unittest.skipUnless(os.path.exists(FAKETIME_LIB), "libfaketime is not installed")
    def test_a_node_an_hour_fast_blinds_no_job(self):
        if clang_asan_build():
            self.skipTest("clang's ASan runtime can hang under libfaketime; the GCC pass runs this")
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-ok") as good, \
                Agent(self.tmp, collector.grpc_addr, node="node-fast") as fast:
            fast.stop()
            # Only the wall clock runs fast: gRPC's timers use the monotonic clock.
            # (An AddressSanitizer build insists on coming first in the library list.)
            asan = os.environ.get("ASAN_OPTIONS", "")
            fast.env = {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": "+1h",
                        "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1",
                        "ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}
            fast.start()
            # The fast node's timestamps reach the collector first, then both jobs run.
            send_job_steps(fast, "fast-job", 4, range(0, 20), step_s=0.2, slow_rank=1)
            wait_until(lambda: metric_value(collector.scrape(), "stepwatch_job_last_step",
                                            job="fast-job") == 19, timeout=20,
                       message="the fast node's first steps")
            for first in range(20, 100, 10):
                send_job_steps(fast, "fast-job", 4, range(first, first + 10), step_s=0.2,
                               slow_rank=1)
                send_job_steps(good, "good-job", 4, range(first - 20, first - 10), step_s=0.2,
                               slow_rank=2)
            wait_until(lambda: flagged_ranks(collector, "good-job") == [2], timeout=30,
                       message="the other job's straggler to be flagged")
            wait_until(lambda: flagged_ranks(collector, "fast-job") == [1], timeout=30,
                       message="the fast node's own straggler to be flagged")
            self.assertGreater(
                metric_value(collector.scrape(), "stepwatch_collector_clock_skew_corrected_total"),
                0)
            self.assertIn("node-fast sent a timestamp +", collector.log())

    def test_a_rank_belongs_to_the_process_that_reports_it(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-p") as agent:
            owner = subprocess.Popen([sys.executable, "-c", SENDER, agent.socket_path, "owned", "0",
                                      "0", "5", "0.1"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
            try:
                self.assertEqual(owner.stdout.readline().strip(), "sent")
                # Another process of the same user forges the running rank: refused.
                forger = subprocess.run([sys.executable, "-c", SENDER, agent.socket_path, "owned",
                                         "0", "5", "10", "9.9"], input="\n", capture_output=True,
                                        text=True, timeout=30)
                self.assertEqual(forger.returncode, 0, forger.stderr)
                wait_until(lambda: agent_rejected(agent, "not_owner") == 5, timeout=20,
                           message="the forged events to be refused")
                wait_until(lambda: metric_value(collector.scrape(), "stepwatch_job_last_step",
                                                job="owned") == 4, timeout=20,
                           message="the owner's steps to arrive")
            finally:
                owner.communicate("\n", timeout=30)
            # The owner is gone: a restarted rank takes over.
            restarted = subprocess.Popen([sys.executable, "-c", SENDER, agent.socket_path,
                                          "owned", "0", "5", "10", "0.1"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                self.assertEqual(restarted.stdout.readline().strip(), "sent")
                wait_until(lambda: metric_value(collector.scrape(), "stepwatch_job_last_step",
                                                job="owned") == 9, timeout=20,
                           message="the restarted rank's steps to be accepted")
            finally:
                restarted.communicate("\n", timeout=30)
            self.assertEqual(agent_rejected(agent, "not_owner"), 5)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run a sender as another user")
    def test_other_users_cannot_write_to_the_socket(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-u") as agent:
            mode = os.stat(agent.socket_path).st_mode & 0o777
            self.assertEqual(mode, 0o660)

            def as_nobody():
                os.setgid(65534)
                os.setuid(65534)

            other = subprocess.run(["/usr/bin/python3", "-c", SENDER, agent.socket_path, "victim", "0",
                                    "0", "5", "9.9"], input="\n", capture_output=True, text=True,
                                   timeout=30, preexec_fn=as_nobody)
            self.assertEqual(other.returncode, 3, other.stdout + other.stderr)
            self.assertIn("permission denied", other.stdout)
            self.assertEqual(metric_value(agent.scrape(), "stepwatch_agent_datagrams_received_total"),
                             0)

    def test_escape_codes_never_become_a_job_name(self):
        with Collector(self.tmp) as collector, \
                Agent(self.tmp, collector.grpc_addr, node="node-e") as agent:
            for job in ("evil\x1b[2J\x1b[31m", "evil\x9b31m", "evil\x7f"):
                agent.send(step_event(job, 0, 1, 0, 0.1))
            agent.send(step_event("plain", 0, 1, 0, 0.1))
            wait_until(lambda: metric_value(collector.scrape(), "stepwatch_job_last_step",
                                            job="plain") == 0, timeout=20,
                       message="the valid step to arrive")
            self.assertEqual(agent_rejected(agent, "out_of_range"), 3)
            jobs = [j["job"] for j in ctl_json(collector.grpc_addr, "status")["jobs"]]
            self.assertEqual(jobs, ["plain"])


if __name__ == "__main__":
    unittest.main()
