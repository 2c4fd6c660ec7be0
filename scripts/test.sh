#!/usr/bin/env bash
# Installs what is missing, builds with GCC and warnings as errors and runs every test under ctest
# (unit, integration with real processes, promtool, Prometheus/Alertmanager end to end, PyTorch
# DDP); then builds again with clang, AddressSanitizer + UndefinedBehaviorSanitizer and
# -Wthread-safety (the ABSL_GUARDED_BY annotations, as errors) and reruns the tests that exercise
# C++ code; then runs every libFuzzer target (fuzz/), built by that same clang pass, for a bounded
# time under ASan + UBSan, and clang-tidy. The clang build runs beside the GCC pass's tests, the
# fuzzers and clang-tidy beside the clang pass's, at the lowest priority (their logs are printed
# when they end); the command fails if any part failed, and names it.
# Usage: scripts/test.sh
# Environment:
#   STEPWATCH_SKIP_SANITIZE=1   skip the clang sanitizer pass (quicker local runs; the fuzz pass
#                               then builds its own targets in build-fuzz)
#   STEPWATCH_SKIP_FUZZ=1       skip the fuzzing pass
#   STEPWATCH_FUZZ_SECONDS=N    seconds per fuzz target (default 15; six targets)
#   STEPWATCH_TEST_JOBS=N       tests run in parallel (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${STEPWATCH_TEST_JOBS:-2}"
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0)) s"; }  # since the command started: where the time goes
# Line tables only (-g1): file:line in every stack trace at about 20% less compile time than -g.
line_tables=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")

scripts/install-deps.sh all

echo "=== build (RelWithDebInfo, -Werror) and all tests ($(elapsed)) ==="
STEPWATCH_BUILD_TYPE=RelWithDebInfo scripts/build.sh build-test -DSTEPWATCH_WERROR=ON "${line_tables[@]}"

# Most integration tests wait on the processes they start: alone, the tests keep a 2-core machine
# about half busy. The CPU-bound work that does not depend on them (the static checks, the clang
# build, the fuzzers) runs beside them at the lowest priority (nice 19), so it takes only what the
# tests leave idle and a timing-bound test is not slowed. Its output is kept in a log, printed when
# it ends.
failed=()
run_logged() {  # NAME LOG COMMAND...: runs COMMAND at nice 19 with its output in LOG
  local name="$1" log="$2"
  shift 2
  local started=$SECONDS
  if ! nice -n 19 "$@" >"$log" 2>&1; then
    echo "FAILED: $name after $((SECONDS - started)) s" >>"$log"
    return 1
  fi
  echo "$name: done in $((SECONDS - started)) s, $(elapsed) after the command started" >>"$log"
}
report() {  # NAME LOG STATUS: prints LOG and records a failure
  echo "=== $1 (ran beside the tests; reported $(elapsed) in) ==="
  cat "$2"
  if [ "$3" != 0 ]; then failed+=("$1"); fi
}

sanitize=1
if [ "${STEPWATCH_SKIP_SANITIZE:-0}" = "1" ]; then sanitize=0; fi
logs="$(mktemp -d /tmp/stepwatch-test.XXXXXX)"
trap 'rm -rf "$logs"' EXIT
# clang-tidy over the GCC build's compile commands (the ctest test static_clang_tidy runs the
# same script; left out of the ctest runs below). It runs beside the clang pass's tests, or beside
# the GCC pass's when there is no clang pass: the clang build, which the clang pass waits for,
# takes the GCC pass's idle CPU first (clang-tidy first made the command about 4 minutes longer).
# include-what-you-use (static_iwyu, 4 minutes of both cores) is not part of this command: it
# only finds a stepwatch header used through another's include, which compiles either way; run it
# when you move includes (CONTRIBUTING.md).
run_static() {
  local status=0
  run_logged "static checks" "$logs/static" scripts/clang-tidy.sh build-test "$jobs" || status=1
  echo "$status" >"$logs/static.status"
}
static_pid=""
clang_pid=""
if [ "$sanitize" = 1 ]; then
  (
    # Debian's gRPC, protobuf and Abseil are built with GCC; clang links against them
    # (libstdc++). STEPWATCH_FUZZ adds coverage instrumentation (the tests run with it too) and
    # the fuzz targets, so that the fuzz pass needs no build of its own.
    status=0
    run_logged "clang build" "$logs/clang-build" env STEPWATCH_BUILD_TYPE=RelWithDebInfo \
      scripts/build.sh build-clang -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DSTEPWATCH_WERROR=ON -DSTEPWATCH_SANITIZE=ON -DSTEPWATCH_FUZZ=ON \
      -DSTEPWATCH_BUILD_BENCHMARKS=OFF "${line_tables[@]}" || status=1
    echo "$status" >"$logs/clang-build.status"
  ) &
  clang_pid=$!
else
  run_static &
  static_pid=$!
fi
gcc_status=0
echo "=== GCC build done ($(elapsed)); its tests ==="
(cd build-test && ctest --output-on-failure -j "$jobs" --timeout 600 -LE static) || gcc_status=$?
echo "=== GCC pass tests done ($(elapsed)) ==="
if [ "$gcc_status" != 0 ]; then failed+=("GCC pass tests"); fi
if [ -n "$clang_pid" ]; then wait "$clang_pid" || true; fi

fuzz_pid=""
if [ "$sanitize" = 1 ]; then
  report "clang build with ASan + UBSan and -Wthread-safety" "$logs/clang-build" \
    "$(cat "$logs/clang-build.status")"
  run_static &
  static_pid=$!
  if [ -f "$logs/clang-build.status" ] && [ "$(cat "$logs/clang-build.status")" = 0 ]; then
    if [ "${STEPWATCH_SKIP_FUZZ:-0}" != "1" ]; then
      # The fuzz targets (libFuzzer + ASan + UBSan, built by the clang build), bounded time each,
      # beside the clang pass's tests.
      (
        if run_logged "fuzz" "$logs/fuzz" env STEPWATCH_FUZZ_BUILD_DIR=build-clang \
          scripts/fuzz.sh "${STEPWATCH_FUZZ_SECONDS:-15}"; then
          echo 0 >"$logs/fuzz.status"
        else
          echo 1 >"$logs/fuzz.status"
        fi
      ) &
      fuzz_pid=$!
    fi
    echo "=== clang pass: C++ and integration tests under ASan + UBSan ($(elapsed)) ==="
    # Python-only and static checks gain nothing from sanitizers; they ran above. The network and
    # process fault tests are timing-bound (a 60 s partition) and exercise no C++ path the other
    # integration tests miss; so are the demo (two minutes of the same agent and collector
    # paths), the header flood (gRPC's own parser; its memory bounds are asserted in the GCC pass
    # only) and the detection grid (the analysis library, whose unit tests run here). This keeps
    # the whole command near 30 minutes on a 2-core machine.
    clang_status=0
    (cd build-clang &&
      UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs" --timeout 900 \
        -E '^(python_|deploy_|format_check$|static_|integration_torch_ddp$|integration_faults_|integration_demo$|integration_header_flood$|analysis_detection_grid_quick$)') ||
      clang_status=$?
    if [ "$clang_status" != 0 ]; then failed+=("clang pass tests"); fi
  fi
elif [ "${STEPWATCH_SKIP_FUZZ:-0}" != "1" ]; then
  echo "=== fuzz targets (clang, libFuzzer + ASan + UBSan), bounded time each ==="
  scripts/fuzz.sh "${STEPWATCH_FUZZ_SECONDS:-15}" || failed+=("fuzz")
fi
if [ -n "$static_pid" ]; then
  wait "$static_pid" || true
  report "static checks (clang-tidy)" "$logs/static" "$(cat "$logs/static.status")"
fi
if [ -n "$fuzz_pid" ]; then
  wait "$fuzz_pid" || true
  report "fuzz targets (libFuzzer + ASan + UBSan)" "$logs/fuzz" "$(cat "$logs/fuzz.status")"
fi

if [ "${#failed[@]}" -gt 0 ]; then
  # The failed tests' own words last, where a log cut to its end still shows them.
  if [ "$gcc_status" != 0 ]; then scripts/print-failed-tests.sh build-test; fi
  if [ "${clang_status:-0}" != 0 ]; then scripts/print-failed-tests.sh build-clang; fi
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  echo "scripts/test.sh: failed after $(elapsed)" >&2
  exit 1
fi
echo "scripts/test.sh: every pass succeeded in $(elapsed)"
