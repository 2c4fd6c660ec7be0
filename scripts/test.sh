#!/usr/bin/env bash
# Installs what is missing, builds with warnings as errors and runs every test (unit, integration
# with real processes, promtool, Prometheus/Alertmanager end to end, PyTorch DDP) under ctest.
# Usage: scripts/test.sh [BUILD_DIR]   (default build-test)
# Environment: STEPWATCH_SANITIZE=1 builds with AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build-test}"
scripts/install-deps.sh all
extra=(-DSTEPWATCH_WERROR=ON)
if [ "${STEPWATCH_SANITIZE:-0}" = "1" ]; then
  extra+=(-DSTEPWATCH_SANITIZE=ON)
fi
STEPWATCH_BUILD_TYPE="${STEPWATCH_BUILD_TYPE:-RelWithDebInfo}" scripts/build.sh "$build_dir" "${extra[@]}"
cd "$build_dir"
ctest --output-on-failure -j "${STEPWATCH_TEST_JOBS:-2}" --timeout 600
