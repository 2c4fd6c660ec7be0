#!/usr/bin/env bash
# Quick start 1: installs what is missing, builds, and runs a local demo cluster monitored live
# (a collector, 8 agents with fake GPUs, and a simulated 8 nodes x 8 GPUs data-parallel job in
# which 2 nodes finish their compute late). Ctrl-C stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh build
scripts/build.sh build
exec scripts/demo-cluster.sh build "$@"
