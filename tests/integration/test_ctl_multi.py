"""stepwatchctl against three real collectors: jobs spread over them (one job on two), the answers
merged exactly, and a collector killed: the others' jobs still listed, the dead one warned about.

Each agent is pointed at ONE collector (--collector=HOST:PORT), so the test decides where each job
lives: job-a on A, job-b on B, job-c on C, job-ab on A and B (the same events through two agents
that share the node name, as two replicas of a job would see them).
"""

import json
import os
import tempfile
import unittest

from harness import Agent, Collector, ctl, ctl_json, step_event, wait_until

WORLD = 8


def send_job(agents, job, steps, slow_rank=None, step_s=0.2):
    """Every (rank, step) event of `job` to each agent in `agents`; returns how many were taken."""
    sent = 0
    for step in steps:
        for rank in range(WORLD):
            busy = step_s * 0.7 * (1.3 if rank == slow_rank else 1.0)
            event = step_event(job, rank, WORLD, step, step_s, data_s=0.0, compute_s=busy,
                               comm_s=max(step_s - busy, 0.0), samples=32, local_rank=rank,
                               gpu=rank)
            for agent in agents:
                sent += 1 if agent.send(event) else 0
    return sent


def identity(f):
    """What makes two findings the same one (ctl/merge.h), with proto3 JSON defaults."""
    return (f["kind"], f["job"], int(f["rank"]), f["node"], int(f["gpu"]), int(f["stage"]),
            f["cause"])


def quoted_integers(doc, path=""):
    """Paths of strings in `doc` that hold an integer (how proto3 JSON prints int64 fields). The
    test's job and node names are never bare numbers."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in quoted_integers(v, f"{path}.{k}")]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in quoted_integers(v, f"{path}[{i}]")]
    if isinstance(doc, str) and doc.lstrip("-").isdigit():
        return [f"{path}={doc!r}"]
    return []


def job_rows(status):
    return {j["job"]: j for j in status["jobs"]}


STABLE_JOB_FIELDS = ("job", "world_size", "ranks_reporting", "last_step", "finding_count")


class CtlMultiCollectorTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="stepwatch-ctl-multi-")
        self.tmp = self._tmp.name
        self.collectors = []
        self.agents = []

    def tearDown(self):
        for agent in self.agents:
            agent.stop()
        for collector in self.collectors:
            collector.stop()
        self._tmp.cleanup()

    def start(self):
        # The events are all sent at once: no stall finding may appear while the test reads.
        for name in ("a", "b", "c"):
            self.collectors.append(
                Collector(self.tmp, name=f"collector-{name}", stall_floor=3600).start())
        a, b, c = self.collectors
        # Agents in their own folders: the two replicas' agents share a node name. No host
        # readings (an empty --host-root): the two agents would sample the CPU at different
        # moments, and a busy machine would give the replicas different causes.
        no_host = os.path.join(self.tmp, "no-host")
        os.makedirs(no_host)
        for collector, node in ((a, "node-1"), (b, "node-1"), (c, "node-3")):
            folder = os.path.join(self.tmp, os.path.basename(collector.state_dir) + "-agent")
            os.makedirs(folder)
            self.agents.append(Agent(folder, collector.grpc_addr, node=node,
                                     host_root=no_host).start())
        agent_a, agent_b, agent_c = self.agents
        self.assertEqual(send_job([agent_a], "job-a", range(80), slow_rank=5), 80 * WORLD)
        self.assertEqual(send_job([agent_b], "job-b", range(40)), 40 * WORLD)
        self.assertEqual(send_job([agent_c], "job-c", range(80), slow_rank=2), 80 * WORLD)
        self.assertEqual(send_job([agent_a, agent_b], "job-ab", range(80), slow_rank=3),
                         2 * 80 * WORLD)
        expected = {a: {"job-a": 5, "job-ab": 3}, b: {"job-b": None, "job-ab": 3},
                    c: {"job-c": 2}}
        for collector, jobs in expected.items():
            for job, slow in jobs.items():
                last_step = 79 if slow is not None else 39

                def settled(collector=collector, job=job, slow=slow, last_step=last_step):
                    row = job_rows(ctl_json(collector.grpc_addr, "status")).get(job)
                    if not row or int(row["last_step"]) != last_step:
                        return False
                    if int(row["ranks_reporting"]) != WORLD:
                        return False
                    if slow is None:
                        return True
                    found = ctl_json(collector.grpc_addr, "findings", job)["findings"]
                    return any(f["kind"] == "straggler" and int(f["rank"]) == slow
                               for f in found)

                wait_until(settled, timeout=60, interval=0.3,
                           message=f"{job} settled on {collector.name}")
        return a, b, c

    def all_addrs(self):
        return ",".join(c.grpc_addr for c in self.collectors)

    def test_answers_of_three_collectors_are_merged_exactly(self):
        a, b, c = self.start()
        addrs = self.all_addrs()

        # status: the union of jobs, job-ab once; the union of nodes, node-1 once.
        per_collector = {x: ctl_json(x.grpc_addr, "status") for x in (a, b, c)}
        merged = ctl_json(addrs, "status")
        self.assertEqual([j["job"] for j in merged["jobs"]], ["job-a", "job-ab", "job-b", "job-c"])
        self.assertEqual([n["node"] for n in merged["nodes"]], ["node-1", "node-3"])
        for job, owner in (("job-a", a), ("job-b", b), ("job-c", c), ("job-ab", a)):
            want = job_rows(per_collector[owner])[job]
            got = job_rows(merged)[job]
            self.assertEqual({k: got.get(k) for k in STABLE_JOB_FIELDS},
                             {k: want.get(k) for k in STABLE_JOB_FIELDS}, job)
        text = ctl(addrs, "status")
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertEqual(text.stderr, "")
        for job in ("job-a", "job-ab", "job-b", "job-c"):
            self.assertEqual(sum(line.split()[0] == job for line in text.stdout.splitlines()
                                 if line.strip()), 1, text.stdout)
        self.assertIn(f"Collectors: answered {', '.join(x.grpc_addr for x in (a, b, c))}\n",
                      text.stdout)

        # dns:///NAME:PORT: every address of the name (here A alone; an address of localhost
        # where nothing listens, such as ::1, is only a warning).
        by_name = ctl(f"dns:///localhost:{a.grpc_port}", "status", "--json")
        self.assertEqual(by_name.returncode, 0, by_name.stderr)
        self.assertEqual([j["job"] for j in json.loads(by_name.stdout)["jobs"]],
                         ["job-a", "job-ab"])

        # status JOB: the job's row alone, from its owners.
        for job in ("job-ab", "job-c"):
            one = ctl_json(addrs, "status", job)
            self.assertEqual([j["job"] for j in one["jobs"]], [job])
            self.assertEqual(one["nodes"], [])
            job_text = ctl(addrs, "status", job)
            self.assertEqual(job_text.returncode, 0, job_text.stderr)
            self.assertIn(job, job_text.stdout)
            self.assertNotIn("NODE", job_text.stdout)

        # findings: the union, deduplicated by identity; job-ab's straggler once, not twice.
        union = {}
        for x in (a, b, c):
            for f in ctl_json(x.grpc_addr, "findings")["findings"]:
                union.setdefault(identity(f), f)
        a_ab = [f for f in ctl_json(a.grpc_addr, "findings", "job-ab")["findings"]]
        b_ab = [f for f in ctl_json(b.grpc_addr, "findings", "job-ab")["findings"]]
        self.assertTrue(set(map(identity, a_ab)) & set(map(identity, b_ab)),
                        "both replicas flag job-ab's straggler")
        merged_findings = ctl_json(addrs, "findings")["findings"]
        self.assertEqual(sorted(map(identity, merged_findings)), sorted(union))
        self.assertEqual(len(merged_findings), len(union))
        stragglers = {(f["job"], int(f["rank"])) for f in merged_findings
                      if f["kind"] == "straggler"}
        self.assertEqual(stragglers, {("job-a", 5), ("job-ab", 3), ("job-c", 2)})
        ab = ctl_json(addrs, "findings", "job-ab")["findings"]
        self.assertEqual(sorted(map(identity, ab)),
                         sorted(set(map(identity, a_ab)) | set(map(identity, b_ab))))
        healthy = ctl(addrs, "findings", "job-b")
        self.assertEqual(healthy.returncode, 0, healthy.stderr)
        self.assertIn("No active findings.", healthy.stdout)

        # explain: the owners' findings once each, the rank table of one replica.
        explain = ctl_json(addrs, "explain", "job-ab")
        self.assertEqual(explain["job"]["job"], "job-ab")
        self.assertEqual(int(explain["job"]["last_step"]), 79)
        self.assertEqual(len(explain["ranks"]), WORLD)
        self.assertEqual(sorted(map(identity, explain["findings"])),
                         sorted(set(map(identity, a_ab)) | set(map(identity, b_ab))))
        self.assertEqual(int(explain["job"]["finding_count"]), len(explain["findings"]))
        flagged = [int(r.get("rank", 0)) for r in explain["ranks"] if r.get("straggler")]
        self.assertEqual(flagged, [3])
        explain_c = ctl(addrs, "explain", "job-c")
        self.assertEqual(explain_c.returncode, 0, explain_c.stderr)
        self.assertIn("Job job-c: 8 ranks", explain_c.stdout)
        self.assertIn(f"Collectors: job-c from {c.grpc_addr}", explain_c.stdout)

        # report: the listing of every collector, one row per job; a job's report from its owners.
        listing = ctl_json(addrs, "report")
        self.assertEqual(sorted(r["job"] for r in listing["reports"]),
                         ["job-a", "job-ab", "job-b", "job-c"])
        report = ctl_json(addrs, "report", "job-ab")
        self.assertEqual(report["job"], "job-ab")
        report_identities = [(f["kind"], f["rank"], f["node"], f["gpu"], f["stage"], f["cause"])
                             for f in report["findings"]]
        self.assertEqual(report_identities,
                         [("straggler", 3, "node-1", 3, -1, f["cause"]) for f in ab])

        # A job nobody has: the error names every collector asked and how to ask all.
        for command in ("explain", "findings", "status"):
            unknown = ctl(addrs, command, "no-such-job")
            self.assertEqual(unknown.returncode, 1, command)
            self.assertTrue(unknown.stderr.startswith(
                'stepwatchctl: no job named "no-such-job" on the collectors asked ('), command)
            for x in (a, b, c):
                self.assertIn(x.grpc_addr, unknown.stderr, command)
            self.assertIn("--collector=HOST:PORT,HOST:PORT,...", unknown.stderr)
            self.assertIn("--collector=dns:///NAME:PORT", unknown.stderr)

        # One collector of three asked (a port-forward to one pod) for another's job: it says
        # which collector it asked and how to ask them all, not only "no job named".
        for command in ("explain", "findings", "status", "report"):
            one = ctl(a.grpc_addr, command, "job-c")
            self.assertEqual(one.returncode, 1, command)
            self.assertIn(f'"job-c" on the collector asked ({a.grpc_addr}); each job lives on '
                          "--replicas of the collectors", one.stderr, command)
            self.assertIn("--collector=dns:///NAME:PORT", one.stderr, command)
        # By name, every collector the name resolves to was asked: no such advice.
        by_name = ctl(f"dns:///localhost:{a.grpc_port}", "explain", "job-c")
        self.assertEqual(by_name.returncode, 1)
        self.assertNotIn("collectors asked", by_name.stderr)

        # Every --json answer prints integers as numbers (as report --json does), never strings.
        for args in (["status"], ["status", "job-ab"], ["findings"], ["findings", "job-ab"],
                     ["explain", "job-ab"], ["report"], ["report", "job-ab"]):
            doc = ctl_json(addrs, *args)
            self.assertEqual(quoted_integers(doc), [], args)
        status = ctl_json(addrs, "status")
        self.assertIsInstance(job_rows(status)["job-ab"]["last_step"], int)
        self.assertIsInstance(job_rows(status)["job-ab"]["last_seen_unix_nanos"], int)
        self.assertIsInstance(ctl_json(addrs, "findings")["findings"][0]["since_step"], int)
        self.assertIsInstance(ctl_json(addrs, "explain", "job-ab")["job"]["last_step"], int)

        # One collector killed: the others' jobs are still listed, the dead one is warned about.
        c.kill()
        after = ctl(addrs, "status", "--json")
        self.assertEqual(after.returncode, 0, after.stderr)
        self.assertEqual([j["job"] for j in json.loads(after.stdout)["jobs"]],
                         ["job-a", "job-ab", "job-b"])
        self.assertIn(f"warning: cannot reach collector at {c.grpc_addr}", after.stderr)
        text = ctl(addrs, "status")
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn(f"not answering: {c.grpc_addr}", text.stdout)
        found = ctl(addrs, "findings", "--json")
        self.assertEqual(found.returncode, 0, found.stderr)
        self.assertIn(f"cannot reach collector at {c.grpc_addr}", found.stderr)
        self.assertEqual({(f["job"], int(f["rank"])) for f in json.loads(found.stdout)["findings"]
                          if f["kind"] == "straggler"}, {("job-a", 5), ("job-ab", 3)})
        explain_a = ctl(addrs, "explain", "job-a")
        self.assertEqual(explain_a.returncode, 0, explain_a.stderr)
        self.assertIn("Job job-a: 8 ranks", explain_a.stdout)
        lost = ctl(addrs, "explain", "job-c")
        self.assertEqual(lost.returncode, 1)
        self.assertIn('no job named "job-c" on the collectors that answered', lost.stderr)
        self.assertIn(f"not answering: {c.grpc_addr}", lost.stderr)

        # None answers: a failure that names each.
        a.kill()
        b.kill()
        none = ctl(addrs, "status")
        self.assertEqual(none.returncode, 1)
        self.assertIn("no collector answered", none.stderr)
        for x in (a, b, c):
            self.assertIn(x.grpc_addr, none.stderr)
        self.assertEqual(none.stdout, "")


if __name__ == "__main__":
    unittest.main()
