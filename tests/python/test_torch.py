"""stepwatch.torch.watch on real PyTorch modules (gloo on CPU), against a real bound socket."""

import logging
import os
import socket
import statistics
import subprocess
import sys
import time
import unittest

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import stepwatch
import stepwatch.torch
from sockets import FakeAgent

SOURCE_DIR = os.environ.get("STEPWATCH_SOURCE_DIR",
                            os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setUpModule():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0,
                            world_size=1)


def tearDownModule():
    dist.destroy_process_group()


class SlowDataset(torch.utils.data.Dataset):
    def __init__(self, n, delay_s=0.0):
        self.x = torch.randn(n, 8)
        self.y = torch.randn(n, 2)
        self.delay_s = delay_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i]


class SlowModel(torch.nn.Module):
    def __init__(self, delay_s=0.0):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)
        self.delay_s = delay_s

    def forward(self, x):
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.layer(x)


def train_step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


class WatchTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)

    def watch(self, model, loader=None, **kwargs):
        w = stepwatch.torch.watch(model, loader, socket_path=self.agent.path, job="t", **kwargs)
        self.addCleanup(w.close)
        self.addCleanup(w.reporter.close)
        return w

    def test_ddp_epochs_are_reported_step_by_step(self):
        model = DistributedDataParallel(SlowModel())
        loader = torch.utils.data.DataLoader(SlowDataset(18), batch_size=4)
        w = self.watch(model, loader)
        self.assertIs(w.dataloader, loader)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            for x, y in loader:
                train_step(model, opt, x, y)
        events = self.agent.drain()
        self.assertEqual([e["step"] for e in events], list(range(10)))
        self.assertEqual([e["samples"] for e in events], [4, 4, 4, 4, 2] * 2)
        for e in events:
            self.assertEqual((e["job"], e["rank"], e["world_size"]), ("t", 0, 1))
            self.assertGreater(e["comm_s"], 0.0)
            self.assertGreater(e["data_s"], 0.0)
            self.assertGreater(e["compute_s"], 0.0)
            self.assertAlmostEqual(e["data_s"] + e["compute_s"] + e["comm_s"], e["step_s"],
                                   places=9)
        self.assertEqual((w.reporter.sent, w.reporter.dropped), (10, 0))

        w.close()
        self.assertIs(type(loader), torch.utils.data.DataLoader)
        for x, y in loader:
            train_step(model, opt, x, y)
        self.assertEqual(self.agent.drain(), [])

    def test_data_wait_and_compute_are_told_apart(self):
        model = DistributedDataParallel(SlowModel(delay_s=0.03))
        loader = torch.utils.data.DataLoader(SlowDataset(4, delay_s=0.01), batch_size=1)
        self.watch(model, loader)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            train_step(model, opt, x, y)
        events = self.agent.drain()
        self.assertEqual(len(events), 4)
        for e in events:
            self.assertGreaterEqual(e["data_s"], 0.01)
            self.assertGreaterEqual(e["compute_s"], 0.03)
            self.assertGreaterEqual(e["step_s"], 0.04)

    def test_gradient_accumulation_makes_one_step(self):
        model = DistributedDataParallel(SlowModel())
        loader = torch.utils.data.DataLoader(SlowDataset(24), batch_size=4)
        self.watch(model, loader)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i, (x, y) in enumerate(loader):
            if i % 2 == 0:
                with model.no_sync():
                    torch.nn.functional.mse_loss(model(x), y).backward()
            else:
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
        events = self.agent.drain()
        self.assertEqual([e["step"] for e in events], [0, 1, 2])
        self.assertEqual([e["samples"] for e in events], [8, 8, 8])

    def test_evaluation_forwards_are_not_steps(self):
        model = DistributedDataParallel(SlowModel())
        self.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        for _ in range(3):
            train_step(model, opt, x, y)
        with torch.no_grad():
            model(x)
        model.eval()
        model(x)
        model.train()
        for _ in range(2):
            train_step(model, opt, x, y)
        events = self.agent.drain()
        # Steps 0-2 end at the next training forward or the evaluation; step 4 is still open.
        self.assertEqual([e["step"] for e in events], [0, 1, 2, 3])
        for e in events:
            self.assertNotIn("data_s", e)  # no loader watched
            self.assertIn("comm_s", e)

    def test_plain_module_reports_each_forward_without_comm(self):
        model = SlowModel()
        w = self.watch(model, samples=16)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        for _ in range(4):
            train_step(model, opt, x, y)
        events = self.agent.drain()
        self.assertEqual([e["step"] for e in events], [0, 1, 2])
        for e in events:
            self.assertNotIn("comm_s", e)
            self.assertEqual(e["samples"], 16)
        self.assertEqual(w.step, 3)

    def test_loader_without_replaceable_class_is_wrapped(self):
        model = DistributedDataParallel(SlowModel())
        batches = [(torch.randn(2, 8), torch.randn(2, 2)) for _ in range(3)]
        with self.assertLogs("stepwatch", logging.WARNING) as logs:
            w = self.watch(model, batches)
        self.assertIn("Watch.dataloader", logs.output[0])
        self.assertIsNot(w.dataloader, batches)
        self.assertEqual(len(w.dataloader), 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in w.dataloader:
            train_step(model, opt, x, y)
        events = self.agent.drain()
        self.assertEqual([e["step"] for e in events], [0, 1, 2])
        self.assertTrue(all("data_s" in e for e in events))

    def test_without_comm_timing_compute_is_not_guessed(self):
        model = DistributedDataParallel(SlowModel())
        loader = torch.utils.data.DataLoader(SlowDataset(12), batch_size=4)
        self.watch(model, loader, time_comm=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            train_step(model, opt, x, y)
        events = self.agent.drain()
        self.assertEqual([e["step"] for e in events], [0, 1, 2])
        for e in events:
            self.assertNotIn("comm_s", e)
            self.assertNotIn("compute_s", e)
            self.assertIn("data_s", e)
            self.assertGreater(e["step_s"], e["data_s"])

    def test_cuda_event_timings_wait_until_complete(self):
        # The CUDA path reads comm_s from CUDA events; fake events stand in for them here.
        class FakeEvent:
            def __init__(self, ms, done):
                self.ms = ms
                self.done = done

            def query(self):
                return self.done[0]

            def elapsed_time(self, end):
                return end.ms - self.ms

        model = DistributedDataParallel(SlowModel())
        w = self.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        done = [False]
        train_step(model, opt, x, y)  # step 0
        w._comm_events = [(FakeEvent(1.0, done), FakeEvent(8.0, done)),
                          (FakeEvent(10.0, done), FakeEvent(12.5, done))]
        train_step(model, opt, x, y)  # step 1 starts; step 0's events are not complete
        self.assertEqual(self.agent.drain(), [])
        done[0] = True
        train_step(model, opt, x, y)  # step 2 starts: steps 0 and 1 go out, in order
        events = self.agent.drain()
        self.assertEqual([e["step"] for e in events], [0, 1])
        self.assertAlmostEqual(events[0]["comm_s"], 0.0095)
        self.assertAlmostEqual(events[0]["compute_s"], max(0.0, events[0]["step_s"] - 0.0095))
        self.assertLess(events[1]["comm_s"], 0.0095)  # step 1 was timed on the host clock

    def test_gpu_index_follows_cuda_visible_devices(self):
        class FakeModel:
            def __init__(self, device):
                self.param = torch.nn.Parameter(torch.zeros(1))
                self.device = torch.device(device)

            def parameters(self):
                fake = type("P", (), {"device": self.device})
                return iter([fake])

        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.addCleanup(lambda: os.environ.__setitem__("CUDA_VISIBLE_DEVICES", saved)
                        if saved is not None else os.environ.pop("CUDA_VISIBLE_DEVICES", None))
        os.environ["CUDA_VISIBLE_DEVICES"] = "4,5"
        self.assertEqual(stepwatch.torch._gpu_index(FakeModel("cuda:1")), 5)
        os.environ["CUDA_VISIBLE_DEVICES"] = "GPU-1234,GPU-5678"
        self.assertIsNone(stepwatch.torch._gpu_index(FakeModel("cuda:0")))
        del os.environ["CUDA_VISIBLE_DEVICES"]
        self.assertEqual(stepwatch.torch._gpu_index(FakeModel("cuda:3")), 3)
        self.assertIsNone(stepwatch.torch._gpu_index(FakeModel("cpu")))

    def test_rank_comes_from_torch_distributed(self):
        model = DistributedDataParallel(SlowModel())
        w = self.watch(model)
        self.assertEqual((w.reporter.identity.rank, w.reporter.identity.world_size), (0, 1))
        self.assertIsNone(w.reporter.identity.gpu)

    def test_absent_agent_never_breaks_training(self):
        self.agent.unbind()
        model = DistributedDataParallel(SlowModel())
        loader = torch.utils.data.DataLoader(SlowDataset(8), batch_size=4)
        with self.assertLogs("stepwatch", logging.WARNING):
            w = self.watch(model, loader)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for x, y in loader:
                train_step(model, opt, x, y)
        self.assertEqual(w.reporter.dropped, 2)


class SleepInBackward(torch.autograd.Function):
    """Identity whose backward takes `delay_s`: computation that all-reduces can overlap with."""

    @staticmethod
    def forward(ctx, x, delay_s):
        ctx.delay_s = delay_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.delay_s)
        return grad, None


class TwoBucketModel(torch.nn.Module):
    """Two DDP buckets: `late` (over DDP's 1 MB first bucket) is ready first, then backward goes on
    through SleepInBackward before `early`'s gradients are ready."""

    def __init__(self, backward_delay_s):
        super().__init__()
        self.early = torch.nn.Linear(8, 600)
        self.late = torch.nn.Linear(600, 600)
        self.backward_delay_s = backward_delay_s

    def forward(self, x):
        return self.late(SleepInBackward.apply(self.early(x), self.backward_delay_s))


class SlowAllReduce:
    """Stands in for dist.all_reduce: reduces for real, then makes the n-th all-reduce of each
    backward take `delay_s` from its launch, as a slow network would."""

    class Work:
        def __init__(self, work, done_at):
            self._work = work
            self._done_at = done_at

        def wait(self, *args):
            self._work.wait()
            time.sleep(max(0.0, self._done_at - time.perf_counter()))
            return True

    def __init__(self, slow_index, delay_s):
        self.real = dist.all_reduce
        self.slow_index = slow_index
        self.delay_s = delay_s
        self.calls = 0

    def __call__(self, tensor, *args, **kwargs):
        work = self.real(tensor, *args, **kwargs)
        slow = self.calls % 2 == self.slow_index
        self.calls += 1
        return self.Work(work, time.perf_counter() + (self.delay_s if slow else 0.0))


class ExposedCommTest(unittest.TestCase):
    """comm_s is the time the step is blocked on the all-reduce, not the all-reduce's duration."""

    DELAY_S = 0.2

    def run_steps(self, slow_index, backward_delay_s, steps=4):
        agent = FakeAgent()
        self.addCleanup(agent.close)
        model = DistributedDataParallel(TwoBucketModel(backward_delay_s))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 8), torch.randn(4, 600)
        train_step(model, opt, x, y)  # DDP splits its buckets by size after the first step
        fake = SlowAllReduce(slow_index, self.DELAY_S)
        dist.all_reduce = fake
        self.addCleanup(setattr, dist, "all_reduce", fake.real)
        w = stepwatch.torch.watch(model, socket_path=agent.path, job="t")
        self.addCleanup(w.close)
        self.addCleanup(w.reporter.close)
        for _ in range(steps + 1):  # a step is reported when the next one starts
            train_step(model, opt, x, y)
        events = agent.drain()
        self.assertEqual(len(events), steps)
        self.assertEqual(fake.calls, 2 * (steps + 1), "the model must have two DDP buckets")
        return events

    def test_all_reduce_hidden_behind_backward_is_not_comm(self):
        # The first bucket's slow all-reduce runs while backward computes for longer.
        for e in self.run_steps(slow_index=0, backward_delay_s=1.5 * self.DELAY_S):
            self.assertLess(e["comm_s"], self.DELAY_S / 2, e)
            self.assertGreater(e["compute_s"], 1.5 * self.DELAY_S, e)

    def test_all_reduce_the_step_waits_for_is_comm(self):
        # The last bucket's slow all-reduce starts when backward has nothing left to compute.
        for e in self.run_steps(slow_index=1, backward_delay_s=0.0):
            self.assertGreater(e["comm_s"], 0.9 * self.DELAY_S, e)
            self.assertLess(e["comm_s"], e["step_s"], e)


class TwoRankTest(unittest.TestCase):
    """Two real DDP processes on gloo; rank 1 is slow in forward."""

    def test_slow_rank_has_the_short_wait(self):
        script = os.path.join(SOURCE_DIR, "tests", "integration", "ddp_train.py")
        with FakeAgent() as agent:
            port = free_port()
            procs = []
            for rank in range(2):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), STEPWATCH_SOCKET=agent.path,
                           STEPWATCH_JOB="two", OMP_NUM_THREADS="1")
                procs.append(subprocess.Popen(
                    [sys.executable, script, "--steps=30", "--slow-rank=1", "--slow-s=0.03"],
                    env=env))
            events = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (
                    any(p.poll() is None for p in procs) or len(events) < 58):
                event = agent.recv(0.1)
                if event is not None:
                    events.append(event)
                elif all(p.poll() is not None for p in procs):
                    break
            for p in procs:
                if p.poll() is None:
                    p.kill()
                self.assertEqual(p.wait(30), 0)
        by_rank = {r: [e for e in events if e["rank"] == r and e["step"] >= 3] for r in (0, 1)}
        self.assertGreaterEqual(len(by_rank[0]), 20)
        self.assertGreaterEqual(len(by_rank[1]), 20)

        def median(rank, field):
            return statistics.median(e[field] for e in by_rank[rank])

        # Both ranks take the same step time; the slow one computes longer and waits less.
        self.assertGreater(median(1, "compute_s"), median(0, "compute_s") + 0.02)
        self.assertGreater(median(0, "comm_s"), median(1, "comm_s") + 0.02)
        self.assertLess(abs(median(0, "step_s") - median(1, "step_s")), 0.01)


if __name__ == "__main__":
    unittest.main()
