#!/bin/sh
# Runs a test program with the process's clock an hour fast (libfaketime), so that a wait that
# measures elapsed time on the wall clock instead of the monotonic clock shows as a timeout.
# Usage: run_under_faketime.sh PROGRAM [ARGS...]. Extra environment (e.g.
# FAKETIME_DONT_FAKE_MONOTONIC=1) passes through. Exits 77, which ctest reports as skipped, when
# faketime is missing or STEPWATCH_FAKETIME_SKIP gives a reason not to run.
set -eu
if [ -n "${STEPWATCH_FAKETIME_SKIP:-}" ]; then
  echo "skipped: $STEPWATCH_FAKETIME_SKIP"
  exit 77
fi
if ! command -v faketime >/dev/null 2>&1; then
  echo "skipped: faketime is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi
# libfaketime is preloaded ahead of an AddressSanitizer runtime, which must be told to accept that.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
exec faketime -f +1h "$@"
