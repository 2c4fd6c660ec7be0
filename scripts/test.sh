#!/usr/bin/env bash
# Installs what is missing, builds with GCC and warnings as errors and runs every test under ctest
# (unit, integration with real processes, promtool, Prometheus/Alertmanager end to end, PyTorch
# DDP); then builds again with clang, AddressSanitizer + UndefinedBehaviorSanitizer and
# -Wthread-safety (the ABSL_GUARDED_BY annotations, as errors) and reruns the tests that exercise
# C++ code; then runs every libFuzzer target (fuzz/), built by that same clang pass, for a bounded
# time under ASan + UBSan.
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
# Line tables only (-g1): file:line in every stack trace at about 20% less compile time than -g.
line_tables=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")

scripts/install-deps.sh all

echo "=== build (RelWithDebInfo, -Werror) and all tests ==="
STEPWATCH_BUILD_TYPE=RelWithDebInfo scripts/build.sh build-test -DSTEPWATCH_WERROR=ON "${line_tables[@]}"
(cd build-test && ctest --output-on-failure -j "$jobs" --timeout 600)

if [ "${STEPWATCH_SKIP_SANITIZE:-0}" != "1" ]; then
  echo "=== clang build with ASan + UBSan and -Wthread-safety; C++ and integration tests ==="
  # Debian's gRPC, protobuf and Abseil are built with GCC; clang links against them (libstdc++).
  # STEPWATCH_FUZZ adds coverage instrumentation (the tests run with it too) and the fuzz targets,
  # so that the fuzz pass below needs no build of its own.
  STEPWATCH_BUILD_TYPE=RelWithDebInfo scripts/build.sh build-clang -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DSTEPWATCH_WERROR=ON -DSTEPWATCH_SANITIZE=ON -DSTEPWATCH_FUZZ=ON \
    -DSTEPWATCH_BUILD_BENCHMARKS=OFF "${line_tables[@]}"
  # Python-only and static checks gain nothing from sanitizers; they ran above. The network and
  # process fault tests are timing-bound (a 60 s partition) and exercise no C++ path the other
  # integration tests miss; so are the demo (two minutes of the same agent and collector paths),
  # the header flood (gRPC's own parser; its memory bounds are asserted in the GCC pass only) and
  # the detection grid (the analysis library, whose unit tests run here). This keeps the whole
  # command near 30 minutes on a 2-core machine.
  (cd build-clang &&
    UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs" --timeout 900 \
      -E '^(python_|deploy_|format_check$|static_|integration_torch_ddp$|integration_faults_|integration_demo$|integration_header_flood$|analysis_detection_grid_quick$)')
fi

if [ "${STEPWATCH_SKIP_FUZZ:-0}" != "1" ]; then
  echo "=== fuzz targets (clang, libFuzzer + ASan + UBSan), bounded time each ==="
  fuzz_build=()
  if [ "${STEPWATCH_SKIP_SANITIZE:-0}" != "1" ]; then
    fuzz_build=(env STEPWATCH_FUZZ_BUILD_DIR=build-clang)
  fi
  "${fuzz_build[@]}" scripts/fuzz.sh "${STEPWATCH_FUZZ_SECONDS:-15}"
fi
