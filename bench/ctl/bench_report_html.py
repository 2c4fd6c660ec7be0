#!/usr/bin/python3
"""How long headless Chromium takes to open and render the HTML report of a large job: writes the
synthetic report page of report_html_page (RANKS ranks, COLUMNS columns) and times
`chromium --headless=new --dump-dom` on it, best of N runs (the DOM is dumped after the page has
loaded and laid out, so the time covers parsing the page and building its SVG). The same is timed
for a 4-rank page in the same run: the difference is what the large page costs beyond starting
Chromium.

Usage: bench_report_html.py [--build BUILD_DIR] [--ranks 1024] [--columns 100] [--runs 3]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(here, "..", "..", "build"))
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--columns", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    generator = os.path.join(args.build, "bench", "ctl", "report_html_page")
    with tempfile.TemporaryDirectory(prefix="stepwatch-report-html-bench-") as tmp:
        results = {}
        for ranks in (args.ranks, 4):
            page = os.path.join(tmp, f"report-{ranks}.html")
            size = int(subprocess.run([generator, page, str(ranks), str(args.columns)],
                                      check=True, capture_output=True, text=True).stdout)
            times = []
            for run in range(args.runs):
                start = time.monotonic()
                result = subprocess.run(
                    [args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                     f"--user-data-dir={tmp}/profile", "--dump-dom", "file://" + page],
                    capture_output=True, text=True, timeout=300)
                times.append(time.monotonic() - start)
                if result.returncode != 0 or "</html>" not in result.stdout:
                    print(result.stderr[-2000:], file=sys.stderr)
                    return 1
                print(f"{ranks} ranks, run {run + 1}: {times[-1]:.2f} s", file=sys.stderr)
            results[ranks] = (size, min(times))
        size, best = results[args.ranks]
        print(f"ranks={args.ranks} columns={args.columns} page_bytes={size} "
              f"dump_dom_best_s={best:.2f} four_rank_best_s={results[4][1]:.2f} "
              f"beyond_startup_s={best - results[4][1]:.2f} runs={args.runs} "
              f"cpus={os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
