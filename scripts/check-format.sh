#!/usr/bin/env bash
# Fails when a C++ source is not clang-formatted. With --fix, formats in place.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=(--dry-run -Werror)
[ "${1:-}" = "--fix" ] && mode=(-i)
# Tracked files moved or removed in the work tree but not yet committed are skipped.
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.cc' '*.h' | grep -v '^build' |
  while read -r f; do [ -e "$f" ] && printf '%s\n' "$f"; done)
[ "${#files[@]}" -eq 0 ] && exit 0
clang-format "${mode[@]}" "${files[@]}"
echo "check-format: ${#files[@]} files ok"
