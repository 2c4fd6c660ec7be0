"""sim/traces/kineto_steps.py on a hand-built Kineto trace whose split is known."""

import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.environ.get("STEPWATCH_SOURCE_DIR", os.path.join(
    os.path.dirname(__file__), "..", "..")), "sim", "traces", "kineto_steps.py")


def kernel(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {}}


def trace(rank):
    # Two steps of 1000 us. Step 1: compute 0-400, nccl 300-700 (100 us hidden, 300 exposed),
    # data loader 700-900 with the GPU idle, idle 900-1000. Step 2: a kernel launched in step 1's
    # tail runs 1900-2100 and counts 100 us where it ran.
    return {
        "distributedInfo": {"rank": rank, "world_size": 8},
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 0, "dur": 1000},
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#8", "ts": 1000,
             "dur": 1000},
            kernel("gemm", 0, 400),
            kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 300, 400),
            {"ph": "X", "cat": "cpu_op",
             "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "ts": 700,
             "dur": 200},
            kernel("gemm", 1000, 500),
            kernel("elementwise", 1900, 200),
        ],
    }


class KinetoStepsTest(unittest.TestCase):
    def test_split_adds_up_to_the_step(self):
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for rank in (0, 3):
                path = os.path.join(tmp, "rank%d.json.gz" % rank)
                with gzip.open(path, "wt") as f:
                    json.dump(trace(rank), f)
                paths.append("job=" + path)
            out = subprocess.run([sys.executable, SCRIPT] + paths, check=True,
                                 capture_output=True, text=True).stdout.splitlines()
        self.assertEqual(out[0], "trace,rank,world_size,step,step_s,data_s,compute_s,comm_s,"
                                 "exposed_comm_s,other_s")
        rows = [line.split(",") for line in out[1:]]
        self.assertEqual(len(rows), 4)
        first = dict(zip(out[0].split(","), rows[0]))
        self.assertEqual((first["trace"], first["rank"], first["world_size"], first["step"]),
                         ("job", "0", "8", "7"))
        self.assertEqual(first["step_s"], "0.001000")
        self.assertEqual(first["compute_s"], "0.000400")
        self.assertEqual(first["comm_s"], "0.000400")
        self.assertEqual(first["exposed_comm_s"], "0.000300")
        self.assertEqual(first["data_s"], "0.000200")
        self.assertEqual(first["other_s"], "0.000100")
        second = dict(zip(out[0].split(","), rows[1]))
        self.assertEqual(second["step"], "8")
        self.assertEqual(second["compute_s"], "0.000600")  # 500 + the 100 us run in its window
        self.assertEqual(rows[2][1], "3")

    def test_usage(self):
        r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()
