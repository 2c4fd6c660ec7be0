#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan, build dir build-fuzz) and runs each
# for a bounded time, starting from a copy of its seed corpus in fuzz/corpus/<target>/ (the
# repository's corpus is left unchanged). Fails on any crash, leak, timeout or sanitizer report;
# the input that caused it is kept under build-fuzz/artifacts/<target>/.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 20)
# Environment: STEPWATCH_JOBS (build parallelism, default: number of CPUs),
#              STEPWATCH_FUZZ_TARGETS (space-separated subset of the targets below),
#              STEPWATCH_FUZZ_BUILD_DIR (a clang build dir already configured with STEPWATCH_FUZZ=ON,
#                used as it is instead of build-fuzz: scripts/test.sh passes its sanitizer build).
set -euo pipefail
cd "$(dirname "$0")/.."
per_target="${1:-20}"
jobs="${STEPWATCH_JOBS:-$(nproc)}"
all_targets=(fuzz_step_event fuzz_json fuzz_collector_apply fuzz_report_file fuzz_scaling_history
  fuzz_scenario)
read -r -a targets <<<"${STEPWATCH_FUZZ_TARGETS:-${all_targets[*]}}"
build="${STEPWATCH_FUZZ_BUILD_DIR:-build-fuzz}"

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
echo "fuzz: building ${targets[*]} in $build"
if [ -n "${STEPWATCH_FUZZ_BUILD_DIR:-}" ]; then
  if ! grep -q '^STEPWATCH_FUZZ:BOOL=ON$' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "fuzz: $build is not configured with -DSTEPWATCH_FUZZ=ON" >&2
    exit 2
  fi
else
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEPWATCH_FUZZ=ON \
    -DSTEPWATCH_BUILD_TESTS=OFF -DSTEPWATCH_BUILD_BENCHMARKS=OFF "${launcher[@]}" >/dev/null
fi
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

work="$(mktemp -d /tmp/stepwatch-fuzz.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=()
for t in "${targets[@]}"; do
  corpus="$work/$t"
  artifacts="$build/artifacts/$t"
  log="$build/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  cp fuzz/corpus/"$t"/* "$corpus"/
  seeds="$(find "$corpus" -type f | wc -l)"
  # -timeout: one input taking this long is a finding too (a hang). -close_fd_mask: the code's own
  # logging is not written (sanitizer and libFuzzer reports still are).
  if "$build/fuzz/$t" -max_total_time="$per_target" -timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1; then
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
    echo "fuzz: $t ok: $execs execs in ${per_target} s ($rate/s), corpus $seeds -> $(find "$corpus" -type f | wc -l)"
  else
    echo "fuzz: $t FAILED (log $log); last lines:"
    tail -n 60 "$log"
    echo "fuzz: reproduce with $build/fuzz/$t $artifacts/<file>"
    failed+=("$t")
  fi
done
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, no findings"
