#!/usr/bin/env python3
"""Overhead per step of stepwatch.torch.watch on a real DDP job (gloo, CPU).

Two measurements, both with a tiny model so that the fixed cost per step shows, and a real bound
socket that a separate process drains:
1. in this process, DDP with world size 1: the same loop over two identical models, one watched,
   alternating epochs, so that both see the same machine load; the median per-step wall and CPU
   time of each and the difference.
2. --world ranks of tests/integration/ddp_train.py without watch(), with it, and with
   watch(time_comm=False), alternating runs; the median over runs of rank 0's mean wall time per
   step (warm-up steps left out). On a busy machine this one is noisy: the spread is printed.

    /usr/bin/python3 bench/client/bench_torch_overhead.py [--world 2] [--steps 400] [--rounds 5]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "tests", "integration", "ddp_train.py")

_DRAIN = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print("ready", flush=True)
while True:  # until terminated by the benchmark
    s.recv(65536)
"""


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world, steps, mode, socket_path):
    """mode: "without", "with" or "without_comm_hook" (watch(time_comm=False))."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), STEPWATCH_SOCKET=socket_path,
                   STEPWATCH_JOB="overhead", OMP_NUM_THREADS="1")
        args = [sys.executable, TRAIN, "--steps=%d" % steps, "--warmup=20"]
        if mode == "without":
            args.append("--no-watch")
        elif mode == "without_comm_hook":
            args.append("--no-comm-timing")
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("a rank failed: %r" % outputs)
    return json.loads(outputs[0].strip().splitlines()[-1])


def in_process(socket_path, epochs):
    """Measurement 1; returns a dict of results."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import stepwatch.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0,
                            world_size=1)
    setups = {}
    for name in ("without", "with"):
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
        data = torch.utils.data.TensorDataset(torch.randn(1024, 32), torch.randn(1024, 4))
        loader = torch.utils.data.DataLoader(data, batch_size=16, drop_last=True)
        watch = None
        if name == "with":
            watch = stepwatch.torch.watch(model, loader, socket_path=socket_path, job="overhead")
        setups[name] = (model, loader, torch.optim.SGD(model.parameters(), lr=0.01), watch)
    wall = {name: [] for name in setups}
    cpu = {name: [] for name in setups}
    for epoch in range(epochs + 1):
        for name, (model, loader, opt, _) in setups.items():
            start, start_cpu = time.perf_counter(), time.thread_time()
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if epoch == 0:
                continue  # warm-up
            wall[name].append((time.perf_counter() - start) / len(loader))
            cpu[name].append((time.thread_time() - start_cpu) / len(loader))
    watch = setups["with"][3]
    dist.destroy_process_group()
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "case": "in_process_world_1", "epochs": epochs,
        "step_us_without": round(med["without"] * 1e6, 1),
        "step_us_with": round(med["with"] * 1e6, 1),
        "overhead_us_per_step": round((med["with"] - med["without"]) * 1e6, 1),
        "cpu_step_us_without": round(med_cpu["without"] * 1e6, 1),
        "cpu_step_us_with": round(med_cpu["with"] * 1e6, 1),
        "cpu_overhead_us_per_step": round((med_cpu["with"] - med_cpu["without"]) * 1e6, 1),
        "sent": watch.reporter.sent, "dropped": watch.reporter.dropped,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="ranks")
    parser.add_argument("--steps", type=int, default=400, help="steps per run")
    parser.add_argument("--rounds", type=int, default=5, help="runs with and without watch()")
    parser.add_argument("--epochs", type=int, default=20, help="epochs of the in-process case")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sw-overhead-") as tmp:
        path = os.path.join(tmp, "agent.sock")
        drain = subprocess.Popen([sys.executable, "-c", _DRAIN, path], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert drain.stdout.readline().strip() == "ready"
            print(json.dumps(in_process(path, args.epochs)), flush=True)
            plain, watched, nohook, sent, dropped = [], [], [], 0, 0
            for _ in range(args.rounds):
                plain.append(run(args.world, args.steps, "without", path)["step_s"])
                result = run(args.world, args.steps, "with", path)
                watched.append(result["step_s"])
                sent += result["sent"]
                dropped += result["dropped"]
                nohook.append(run(args.world, args.steps, "without_comm_hook", path)["step_s"])
        finally:
            drain.terminate()
            drain.wait(timeout=60)
    without_s = statistics.median(plain)
    with_s = statistics.median(watched)
    nohook_s = statistics.median(nohook)
    print(json.dumps({
        "case": "processes", "world": args.world, "steps": args.steps, "rounds": args.rounds,
        "step_ms_without": round(without_s * 1e3, 4), "step_ms_with": round(with_s * 1e3, 4),
        "overhead_us_per_step": round((with_s - without_s) * 1e6, 1),
        "overhead_percent": round((with_s / without_s - 1) * 100, 2),
        "step_ms_with_time_comm_false": round(nohook_s * 1e3, 4),
        "overhead_us_per_step_time_comm_false": round((nohook_s - without_s) * 1e6, 1),
        "rank0_sent": sent, "rank0_dropped": dropped,
        "spread_ms_without": [round(x * 1e3, 3) for x in sorted(plain)],
        "spread_ms_with": [round(x * 1e3, 3) for x in sorted(watched)],
        "spread_ms_with_time_comm_false": [round(x * 1e3, 3) for x in sorted(nohook)],
    }))


if __name__ == "__main__":
    main()
