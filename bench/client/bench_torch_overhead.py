#!/usr/bin/env python3
"""Overhead per step of stepwatch.torch.watch on a real DDP job (gloo, CPU).

Runs tests/integration/ddp_train.py (a tiny model, so that the fixed cost per step shows) with and
without watch(), alternating, several rounds; every rank reports to a real bound socket that a
separate process drains. Prints the median over rounds of the mean wall time per step (rank 0,
warm-up steps left out) for both, and the difference.

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


def run(world, steps, watched, socket_path):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), STEPWATCH_SOCKET=socket_path,
                   STEPWATCH_JOB="overhead", OMP_NUM_THREADS="1")
        args = [sys.executable, TRAIN, "--steps=%d" % steps, "--warmup=20"]
        if not watched:
            args.append("--no-watch")
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("a rank failed: %r" % outputs)
    return json.loads(outputs[0].strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="ranks")
    parser.add_argument("--steps", type=int, default=400, help="steps per run")
    parser.add_argument("--rounds", type=int, default=5, help="runs with and without watch()")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sw-overhead-") as tmp:
        path = os.path.join(tmp, "agent.sock")
        drain = subprocess.Popen([sys.executable, "-c", _DRAIN, path], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert drain.stdout.readline().strip() == "ready"
            plain, watched, sent, dropped = [], [], 0, 0
            for _ in range(args.rounds):
                plain.append(run(args.world, args.steps, False, path)["step_s"])
                result = run(args.world, args.steps, True, path)
                watched.append(result["step_s"])
                sent += result["sent"]
                dropped += result["dropped"]
        finally:
            drain.terminate()
            drain.wait(timeout=60)
    without_s = statistics.median(plain)
    with_s = statistics.median(watched)
    print(json.dumps({
        "world": args.world, "steps": args.steps, "rounds": args.rounds,
        "step_ms_without": round(without_s * 1e3, 4), "step_ms_with": round(with_s * 1e3, 4),
        "overhead_us_per_step": round((with_s - without_s) * 1e6, 1),
        "overhead_percent": round((with_s / without_s - 1) * 100, 2),
        "rank0_sent": sent, "rank0_dropped": dropped,
        "spread_ms_without": [round(x * 1e3, 3) for x in sorted(plain)],
        "spread_ms_with": [round(x * 1e3, 3) for x in sorted(watched)],
    }))


if __name__ == "__main__":
    main()
