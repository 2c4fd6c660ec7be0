"""The collector's --state-dir under faults, with real processes.

- A full disk (a small tmpfs, filled): a job that finishes meanwhile keeps its report in memory,
  listed and shown as unsaved; once space returns it is written, and a restart still has it.
- A damaged deduplication journal (one byte flipped in its first record): only the batch of the
  damaged record is applied again when the agent resends every batch; the others are recognised.
- A collector restarted mid-job (SIGKILL, then a plain restart): the job's report keeps the
  history from before each restart and says what it missed (gaps).

Lines starting with [state-disk] are the figures in docs/reliability.md ("Full or damaged state
disk").
"""

import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import unittest

from harness import (Agent, Collector, build_path, ctl, ctl_json, metric_value, step_event,
                     wait_until)

PYTHON = "/usr/bin/python3"
# For the figures: seconds the disk stays full beyond the first retries, and the collector's
# --running-report-save-interval in the restart test.
FULL_S = float(os.environ.get("STEPWATCH_STATE_DISK_FULL_S", "0"))
SAVE_INTERVAL = float(os.environ.get("STEPWATCH_STATE_DISK_SAVE_INTERVAL", "0.5"))

# argv: socket job world steps slow_rank pause. Every rank computes 100 ms per step, the slow rank
# 160 ms; all share the step time of the slowest. Then the process exits (the job finishes).
RANKS = r"""
import json, socket, sys, time
path, job = sys.argv[1], sys.argv[2]
world, steps, slow = (int(a) for a in sys.argv[3:6])
pause = float(sys.argv[6])
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for step in range(steps):
        for rank in range(world):
            compute = 0.16 if rank == slow else 0.10
            event = {"job": job, "rank": rank, "world_size": world, "step": step, "step_s": 0.165,
                     "data_s": 0.0, "compute_s": compute, "comm_s": 0.165 - compute, "gpu": rank}
            s.sendto(json.dumps(event).encode(), path)
        time.sleep(pause)
"""


def value(samples, name):
    return metric_value(samples, name) or 0


def ranks_command(agent, job, world, steps, slow, pause):
    return [PYTHON, "-c", RANKS, agent.socket_path, job, str(world), str(steps), str(slow),
            str(pause)]


def report(collector, job):
    result = ctl(collector.grpc_addr, "report", job, "--json")
    if result.returncode != 0:
        raise AssertionError(f"stepwatchctl report {job}: {result.stderr}\n{collector.log()[-3000:]}")
    return json.loads(result.stdout)


# --- the wire formats the damage test reads (agent/spool.cc, collector/dedupe.cc)


def varint(data, pos):
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def steps_in_spooled_batch(path):
    """StepEvents (ReportBatch field 7) in a spool file: a 24-byte header, then the batch."""
    with open(path, "rb") as f:
        data = f.read()[24:]
    pos = count = 0
    while pos < len(data):
        key, pos = varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n, pos = varint(data, pos)
            pos += n
            count += field == 7
        else:
            raise AssertionError(f"unexpected wire type {wire} in {path}")
    return count


def journal_records(path):
    """(offset, seq, base_seq) of each record: "SWDEDUP2", then marker, u32 length, u32 CRC,
    payload (u16 + agent_id, u16 + boot_id, u64 seq, u64 base_seq)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"SWDEDUP2", data[:8]
    out = []
    pos = 8
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<I", data, pos + 4)
        p = pos + 12
        (agent_len,) = struct.unpack_from("<H", data, p)
        p += 2 + agent_len
        (boot_len,) = struct.unpack_from("<H", data, p)
        p += 2 + boot_len
        seq, base = struct.unpack_from("<QQ", data, p)
        out.append((pos, seq, base))
        pos += 12 + length
    return out


class StateDiskTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-state-disk-")
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name

    def start(self, service):
        service.start()
        self.addCleanup(service.stop)
        return service

    def test_report_finished_on_a_full_disk_is_kept_and_written_when_space_returns(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to mount a tmpfs")
        collector = Collector(self.tmp, tick=0.2, running_report_save_interval=0.5)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                  collector.state_dir], capture_output=True, text=True)
        if mounted.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
        # Runs after the collector has stopped (cleanups run last-in, first-out).
        self.addCleanup(subprocess.run, ["umount", "-l", collector.state_dir])
        self.start(collector)
        agent = self.start(Agent(self.tmp, collector.grpc_addr, node="node-0"))
        reports_dir = os.path.join(collector.state_dir, "reports")
        job = "full-disk/1"
        file_name = "full-disk%2F1.json"

        # Fill the disk.
        filler = os.path.join(collector.state_dir, "filler")
        with open(filler, "wb", buffering=0) as f:
            try:
                for _ in range(64):  # 4 MiB at most: more than the tmpfs holds
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        probe = os.path.join(collector.state_dir, "probe")
        with self.assertRaises(OSError):
            with open(probe, "wb", buffering=0) as f:
                f.write(b"\0" * 8192)
        os.unlink(probe)

        p = subprocess.run(ranks_command(agent, job, 4, 60, 2, 0.005), capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        wait_until(lambda: f"job {job} finished: all" in collector.log(), timeout=30,
                   message="the job to finish")
        finished_at = time.monotonic()
        # Finished, readable, said to be unsaved; not on disk.
        r = report(collector, job)
        self.assertEqual(r["state"], "finished")
        self.assertTrue(r["unsaved"], json.dumps(r, indent=1))
        self.assertEqual(r["last_step"], 59)
        findings = len(r["findings"])
        self.assertGreaterEqual(findings, 1, json.dumps(r, indent=1))
        listing = ctl_json(collector.grpc_addr, "report")["reports"]
        self.assertEqual([(x["job"], x["unsaved"]) for x in listing], [(job, True)])
        text = ctl(collector.grpc_addr, "report")
        self.assertIn("unsaved", text.stdout)
        text = ctl(collector.grpc_addr, "report", job)
        self.assertIn("Not saved yet", text.stdout)
        self.assertFalse(os.path.exists(os.path.join(reports_dir, file_name)))
        samples = collector.scrape()
        self.assertEqual(value(samples, "stepwatch_collector_reports_unsaved"), 1)
        self.assertGreater(value(samples, "stepwatch_collector_reports_unsaved_bytes"), 0)
        # Retried (the backoff starts at 1 s) and counted, logged once.
        wait_until(lambda: value(collector.scrape(),
                                 "stepwatch_collector_report_save_errors_total") >= 3,
                   timeout=30, message="the writes to be retried")
        time.sleep(FULL_S)
        self.assertEqual(collector.log().count("cannot save job reports"), 1, collector.log())

        # Space returns: written at the next try.
        os.unlink(filler)
        freed_at = time.monotonic()
        wait_until(lambda: os.path.exists(os.path.join(reports_dir, file_name)), timeout=60,
                   interval=0.05, message="the report to be written")
        written_after = time.monotonic() - freed_at
        print(f"[state-disk] full disk: report unsaved for {freed_at - finished_at:.1f} s, "
              f"written {written_after:.2f} s after space returned "
              f"({value(collector.scrape(), 'stepwatch_collector_report_save_errors_total'):.0f} "
              "failed writes counted)", flush=True)
        wait_until(lambda: not report(collector, job)["unsaved"], timeout=10,
                   message="the report to be marked saved")
        self.assertEqual(value(collector.scrape(), "stepwatch_collector_reports_unsaved"), 0)
        self.assertIn("job reports saved again", collector.log())

        collector.restart()
        r = report(collector, job)
        self.assertEqual(r["state"], "finished")
        self.assertFalse(r["unsaved"])
        self.assertEqual(r["last_step"], 59)
        self.assertEqual(len(r["findings"]), findings)

    def test_damaged_first_journal_record_costs_only_its_batch(self):
        collector = Collector(self.tmp, tick=0.2)  # not started: the agent spools
        spool = os.path.join(self.tmp, "spool")
        spool_copy = os.path.join(self.tmp, "spool-copy")

        def agent_on(spool_dir):
            return Agent(self.tmp, collector.grpc_addr, node="node-d", spool_dir=spool_dir,
                         reconnect_max_backoff=0.2)

        agent = agent_on(spool)
        agent.start()
        self.addCleanup(agent.stop)
        sent = 0
        for round_ in range(4):
            for step in range(round_ * 10, round_ * 10 + 10):
                for rank in range(2):
                    self.assertTrue(agent.send(step_event("dedupe-job", rank, 2, step, 0.1)))
                    sent += 1
            wait_until(lambda: value(agent.scrape(), "stepwatch_agent_events_shipped_total") ==
                       sent, timeout=30, message="events batched")
            time.sleep(0.3)
        agent.stop()
        shutil.copytree(spool, spool_copy)
        batches = {}  # seq -> steps; the spool has one subdirectory per collector address
        for root, _, names in os.walk(spool_copy):
            for name in names:
                if name.startswith("batch-") and name.endswith(".swb"):
                    batches[int(name[6:-4])] = steps_in_spooled_batch(os.path.join(root, name))
        self.assertEqual(sum(batches.values()), sent)
        self.assertGreater(len(batches), 2)

        # The first collector applies every batch and journals it.
        self.start(collector)
        agent.start()
        wait_until(lambda: value(collector.scrape(), "stepwatch_collector_steps_received_total")
                   == sent, timeout=30, message="every batch applied")
        wait_until(lambda: value(agent.scrape(), "stepwatch_agent_spool_batches") == 0,
                   timeout=30, message="spool drained")
        agent.stop()
        collector.stop()

        # One byte flipped in the first record (and in the first one with steps, should the
        # first batch have none).
        journal = os.path.join(collector.state_dir, "dedupe.journal")
        every = journal_records(journal)
        records = [r for r in every if r[1] in batches]
        self.assertEqual(len(records), len(batches))
        damaged = {records[0]}
        damaged.add(next(r for r in records if batches[r[1]] > 0))
        with open(journal, "r+b") as f:
            for offset, _, _ in damaged:
                f.seek(offset + 14)  # the first byte of agent_id
                b = f.read(1)
                f.seek(offset + 14)
                f.write(bytes([b[0] ^ 0x5A]))
        # A damaged record's batch is applied again unless an intact record's base_seq (the
        # lowest seq its agent still held) is above it: the agent will never resend it then.
        intact = [r for r in every if r not in damaged]
        expected_again = sum(batches[seq] for _, seq, _ in damaged
                             if not any(base > seq for _, _, base in intact))

        # The next collector skips only the damaged records; the agent resends every batch.
        started = time.monotonic()
        collector.start()
        ready_s = time.monotonic() - started
        self.assertEqual(value(collector.scrape(),
                               "stepwatch_collector_journal_damaged_records_total"), len(damaged))
        self.assertIn(f"{len(damaged)} damaged records", collector.log())
        resender = agent_on(spool_copy)
        self.start(resender)
        wait_until(lambda: value(resender.scrape(), "stepwatch_agent_spool_batches") == 0,
                   timeout=30, message="copied spool drained")
        time.sleep(1.0)  # a late duplicate would show
        samples = collector.scrape()
        again = value(samples, "stepwatch_collector_steps_received_total")
        duplicates = value(samples, "stepwatch_collector_duplicate_batches_total")
        print(f"[state-disk] journal: {len(damaged)} damaged of {len(records)} records; "
              f"{len(batches)} batches ({sent} steps) resent: {duplicates:.0f} recognised, "
              f"{again:.0f} steps applied again (expected {expected_again}); the collector was "
              f"ready {ready_s:.2f} s after its start", flush=True)
        self.assertEqual(again, expected_again)
        self.assertLess(again, sent)

    def test_job_report_survives_collector_restarts_mid_job_and_says_what_it_missed(self):
        collector = self.start(Collector(self.tmp, tick=0.2,
                                         running_report_save_interval=SAVE_INTERVAL))
        agent = self.start(Agent(self.tmp, collector.grpc_addr, node="node-0",
                                 reconnect_max_backoff=0.2))
        job = "restarted-job"
        steps = 360 + int(SAVE_INTERVAL * 30)
        ranks = subprocess.Popen(ranks_command(agent, job, 4, steps, 2, 0.03),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: ranks.poll() is None and ranks.kill())

        def last_step():
            return value(collector.scrape(), "stepwatch_job_last_step")

        wait_until(lambda: metric_value(collector.scrape(), "stepwatch_straggler", rank="2") == 1,
                   timeout=60, message="the straggler flagged before the kill")
        flagged_at = last_step()
        flagged_time = time.time()
        # Saved at least once since: the finding is in the running report on disk.
        running = os.path.join(collector.state_dir, "reports", "running", f"{job}.json")
        wait_until(lambda: os.path.exists(running) and os.path.getmtime(running) > flagged_time,
                   timeout=30, message="the running report saved after the flag")
        killed_at = last_step()
        collector.kill()
        time.sleep(1.0)
        collector.start()
        wait_until(lambda: last_step() >= killed_at + 80, timeout=60, message="steps after")
        stopped_at = last_step()
        collector.restart()  # SIGTERM, then start
        _, err = ranks.communicate(timeout=120)
        self.assertEqual(ranks.returncode, 0, err)
        wait_until(lambda: collector.log().count(f"job {job} finished: all") == 1, timeout=30,
                   message="the job to finish")
        r = report(collector, job)
        print("[state-disk] restarts mid-job (SIGKILL near step %d, SIGTERM near step %d): %s"
              % (killed_at, stopped_at,
                 json.dumps([{k: g[k] for k in ("after_step", "before_step", "missing_steps")}
                             for g in r["gaps"]])), flush=True)
        self.assertEqual(r["state"], "finished")
        self.assertEqual(r["end_reason"], "exited")
        self.assertEqual(r["first_step"], 0, "the history from before the restarts is kept")
        self.assertEqual(r["last_step"], steps - 1)
        self.assertTrue(r["partial"])
        self.assertEqual(len(r["gaps"]), 2, json.dumps(r["gaps"]))
        for g in r["gaps"]:
            self.assertEqual(g["cause"], "collector_restart")
            self.assertGreater(g["before_step"], g["after_step"])
            self.assertGreaterEqual(g["missing_steps"], 0)
            self.assertIsNotNone(g["from_time"])
            self.assertIsNotNone(g["to_time"])
        # The SIGKILL gap begins before the kill; the plain restart saved up to its stop.
        self.assertLessEqual(r["gaps"][0]["after_step"], killed_at + 40)
        self.assertGreaterEqual(r["gaps"][1]["after_step"], stopped_at)
        stragglers = [f for f in r["findings"] if f["kind"] == "straggler" and f["rank"] == 2]
        self.assertGreaterEqual(len(stragglers), 1, json.dumps(r, indent=1))
        self.assertLessEqual(stragglers[0]["since_step"], flagged_at, "found before the kill, kept")
        text = ctl(collector.grpc_addr, "report", job).stdout
        self.assertIn("Partial: the collector restarted", text)
        listing = ctl_json(collector.grpc_addr, "report")["reports"]
        self.assertEqual([(x["job"], x["partial"]) for x in listing], [(job, True)])

    def test_negative_save_interval_is_refused_naming_the_flag(self):
        result = subprocess.run([build_path("stepwatch-collector"), "--grpc-listen=127.0.0.1:0",
                                 "--metrics-listen=127.0.0.1:0",
                                 "--running-report-save-interval=-1"],
                                capture_output=True, text=True, timeout=30)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--running-report-save-interval", result.stderr)


if __name__ == "__main__":
    unittest.main()
