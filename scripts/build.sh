#!/usr/bin/env bash
# Configures and builds stepwatch. Usage: scripts/build.sh [BUILD_DIR] [extra cmake arguments...]
# Environment: STEPWATCH_BUILD_TYPE (default Release), STEPWATCH_JOBS (default: number of CPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"
shift || true
jobs="${STEPWATCH_JOBS:-$(nproc)}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${STEPWATCH_BUILD_TYPE:-Release}" "$@"
cmake --build "$build_dir" -j "$jobs"
