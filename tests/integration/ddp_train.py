"""A tiny real PyTorch DDP training job (gloo, CPU) instrumented with stepwatch.torch.watch.

Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment (the
stepwatch identity comes from there too: STEPWATCH_SOCKET, STEPWATCH_JOB). One rank can be made a
straggler with --slow-rank/--slow-s (it sleeps in its forward); --device-s makes every rank wait
in its forward as if for a device. With --no-watch the same loop runs
uninstrumented, which is how the overhead of watch() is measured. Rank 0 prints one JSON line with
the mean wall time per step of the measured steps.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


class Net(torch.nn.Module):
    def __init__(self, wait_s):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                        torch.nn.Linear(64, 4))
        self.wait_s = wait_s

    def forward(self, x):
        if self.wait_s > 0:
            time.sleep(self.wait_s)
        return self.body(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100, help="training steps to run")
    parser.add_argument("--batch", type=int, default=16, help="samples per step and rank")
    parser.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps in forward")
    parser.add_argument("--slow-s", type=float, default=0.03, help="seconds the slow rank sleeps")
    parser.add_argument("--device-s", type=float, default=0.0,
                        help="seconds every rank sleeps in forward, as if waiting for a device: "
                        "the step's busy time is then mostly steady waiting, as on a GPU, not "
                        "host CPU that ranks sharing a few cores take from each other")
    parser.add_argument("--no-watch", action="store_true", help="run without stepwatch")
    parser.add_argument("--no-comm-timing", action="store_true",
                        help="watch without the communication hook (time_comm=False)")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    model = DistributedDataParallel(
        Net(args.device_s + (args.slow_s if rank == args.slow_rank else 0.0)))
    data = torch.utils.data.TensorDataset(torch.randn(args.batch * 64, 32),
                                          torch.randn(args.batch * 64, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True)
    watch = None
    if not args.no_watch:
        import stepwatch.torch
        watch = stepwatch.torch.watch(model, loader, time_comm=not args.no_comm_timing)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    step = 0
    started = None
    while step < args.steps:
        for x, y in loader:
            if step == args.warmup:
                started = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
    elapsed = time.perf_counter() - started if started is not None else 0.0
    measured = max(args.steps - args.warmup, 0)
    if watch is not None:
        watch.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        result = {"steps": measured, "step_s": elapsed / measured if measured else 0.0,
                  "watched": watch is not None}
        if watch is not None:
            result.update(sent=watch.reporter.sent, dropped=watch.reporter.dropped)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
