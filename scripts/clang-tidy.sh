#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy at the root, every warning an error) over the production .cc files
# of a configured build: not tests, benchmarks, fuzz targets or generated protobuf code. Headers
# are checked through the files that include them. The build must have generated the protobuf
# headers (the test `static_clang_tidy` runs after the build).
# Usage: scripts/clang-tidy.sh BUILD_DIR [JOBS]   (JOBS default 2)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:?usage: $0 BUILD_DIR [JOBS]}" && pwd)"
jobs="${2:-2}"
tidy_driver="$(command -v run-clang-tidy-14 || command -v run-clang-tidy)"
dirs='(agent|analysis|collector|common|ctl|gpu|host|http|metrics|security|sim)'
esc="$(printf '%s' "$src" | sed 's/[][\.*^$+?(){}|]/\\&/g')"
start=$(date +%s)
# -quiet drops the per-file "N warnings generated" lines (those are in system headers, not shown).
"$tidy_driver" -quiet -j "$jobs" -p "$build" -header-filter="^$esc/$dirs/" \
  "^$esc/$dirs/.*\\.cc\$"
echo "clang-tidy: clean in $(($(date +%s) - start)) s"
