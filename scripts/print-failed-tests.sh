#!/usr/bin/env bash
# Prints the end of each failed test's output from a build directory's last ctest run, so that a
# log cut to its last lines (a CI summary) still says why a test failed, not only which.
# Usage: scripts/print-failed-tests.sh BUILD_DIR [LINES]   (LINES per test, default 80)
set -euo pipefail
build_dir="${1:?usage: $0 BUILD_DIR [LINES]}"
lines="${2:-80}"
log="$build_dir/Testing/Temporary/LastTest.log"
if [ ! -f "$log" ]; then
  echo "print-failed-tests: no ctest log in $build_dir" >&2
  exit 0
fi
# LastTest.log holds, per test: "N/M Testing: NAME", the output between "Output:" plus a rule and
# "<end of output>", then a status line ("Test Passed.", "Test Failed.", ...).
awk -v keep="$lines" '
  /^[0-9]+\/[0-9]+ Testing: / { name = $3; n = 0; in_output = 0; after = 0; next }
  /^Output:$/ { in_output = 1; skip_rule = 1; next }
  in_output && skip_rule { skip_rule = 0; next }
  in_output && /^<end of output>$/ { in_output = 0; after = 1; next }
  in_output { buf[n++] = $0; next }
  after && /^Test / && !/^Test time/ {
    after = 0
    if ($0 != "Test Passed.") {
      printf "=== %s (%s) the last %d of its %d output lines ===\n", name, $0, (n < keep ? n : keep), n
      for (i = (n > keep ? n - keep : 0); i < n; i++) print buf[i]
    }
  }
' "$log"
