#!/usr/bin/env python3
"""One simulated training job for the soak benchmark: every rank of the job, in one process.

Each rank has its own stepwatch.Reporter (the Python package, as a training process would use it)
connected to the agent of its node; ranks are spread evenly over the agents' sockets. The job runs
for --seconds at --steps-per-s, then exits: the agents see the sender's pid go away and the
collector finishes the job, so the collector's per-job state comes and goes. At exit (also on
SIGTERM) it writes {"job", "sent", "dropped", "steps", "late_steps"} to --result.

    soak_sender.py --job=NAME --world-size=W --steps-per-s=S --seconds=T --sockets=A,B,...
                   --result=PATH [--straggler] [--seed=N]
"""

import argparse
import json
import os
import random
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from stepwatch.reporter import Reporter  # noqa: E402

# A step's split (fractions of the step time); a straggler rank computes longer and waits less.
DATA_FRACTION = 0.05
COMPUTE_FRACTION = 0.55
STRAGGLER_COMPUTE_FRACTION = 0.75
NOISE_CV = 0.03
# When the sender falls behind by more than this (a loaded machine), it skips ahead instead of
# bursting to catch up.
MAX_LAG_S = 1.0


class _Stop(Exception):
    pass


def _raise_stop(_sig, _frame):
    raise _Stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--steps-per-s", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--sockets", required=True, help="agent sockets, comma separated")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--result", required=True)
    parser.add_argument("--straggler", action="store_true", help="rank 0 computes 36%% longer")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, _raise_stop)
    sockets = args.sockets.split(",")
    world = args.world_size
    reporters = []
    per_node = [0] * len(sockets)
    for rank in range(world):
        node = rank * len(sockets) // world
        local = per_node[node]
        per_node[node] += 1
        reporters.append(Reporter(job=args.job, rank=rank, world_size=world,
                                  socket_path=sockets[node], env={}, local_rank=local,
                                  gpu=local % max(args.gpus_per_node, 1)))
    rng = random.Random(args.seed)
    period = 1.0 / args.steps_per_s
    step = 0
    late = 0
    start = time.monotonic()
    next_step = start + period
    try:
        while True:
            now = time.monotonic()
            if now - start >= args.seconds:
                break
            if next_step > now:
                time.sleep(next_step - now)
            elif now - next_step > MAX_LAG_S:
                late += int((now - next_step) / period)
                next_step = now
            next_step += period
            step_s = period * (1 + rng.gauss(0, NOISE_CV) / 3)
            for rank, rep in enumerate(reporters):
                fraction = STRAGGLER_COMPUTE_FRACTION if args.straggler and rank == 0 \
                    else COMPUTE_FRACTION
                data_s = DATA_FRACTION * step_s
                compute_s = fraction * step_s * (1 + rng.gauss(0, NOISE_CV))
                comm_s = max(step_s - data_s - compute_s, 1e-4)
                rep.send(step, step_s, data_s, compute_s, comm_s, 32)
            step += 1
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        result = {"job": args.job, "sent": sum(r.sent for r in reporters),
                  "dropped": sum(r.dropped for r in reporters), "steps": step,
                  "late_steps": late,
                  "transport": sorted({r.transport or "none" for r in reporters})}
        for rep in reporters:
            rep.close()
        tmp = args.result + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, args.result)


if __name__ == "__main__":
    main()
