#!/usr/bin/env bash
# Runs include-what-you-use (iwyu_tool) over the production .cc files of a configured build (not
# tests, benchmarks, fuzz targets or generated protobuf code) and fails when a file uses one of
# stepwatch's own headers without including it ("should add" a project header). Missing standard,
# Abseil, gRPC and protobuf headers are printed but do not fail: Debian 12's iwyu 0.18 has no
# mapping for Abseil and gRPC (it proposes their internal headers and <memory> for
# allocator_traits), so those suggestions are noise; "should remove" is not checked either,
# because it would remove headers that Abseil and gRPC re-export.
# Usage: scripts/iwyu.sh BUILD_DIR [JOBS]   (JOBS default 2)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:?usage: $0 BUILD_DIR [JOBS]}" && pwd)"
jobs="${2:-2}"
iwyu_tool="$(command -v iwyu_tool || command -v iwyu_tool.py)"
dirs='agent analysis collector common ctl gpu host http metrics security sim'
# Directories left out (none now; a name here skips its files).
skip=''
mapfile -t files < <(python3 - "$build/compile_commands.json" "$src" "$dirs" "$skip" <<'PY'
import json, os, sys
db, src, dirs, skip = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
for f in sorted({os.path.normpath(e["file"]) for e in json.load(open(db))}):
    rel = os.path.relpath(f, src)
    top = rel.split("/")[0]
    if top in dirs and top not in skip and rel.endswith(".cc") and os.path.exists(f):
        print(f)
PY
)
start=$(date +%s)
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
# iwyu's exit status is not a verdict (it is nonzero whenever it suggests anything); the parser
# below decides.
"$iwyu_tool" -j "$jobs" -p "$build" "${files[@]}" -- -Xiwyu --no_fwd_decls >"$out" 2>&1 || true
python3 - "$out" "$src" "$dirs" "${#files[@]}" <<'PY'
import re, sys
out, src, dirs, count = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
text = open(out, errors="replace").read()
project = re.compile(r'^#include "(%s)/[^"]+\.h"' % "|".join(dirs))
missing, other, current = [], 0, None
for line in text.splitlines():
    m = re.match(r"^(\S+) should add these lines:$", line)
    if m:
        current = m.group(1).replace(src + "/", "")
        continue
    if current and not line.strip() or line.endswith("should remove these lines:"):
        current = None
        continue
    if current and line.startswith("#include"):
        if project.match(line):
            missing.append(f"{current}: {line.split('  //')[0].strip()}")
        else:
            other += 1
errors = [l for l in text.splitlines() if re.search(r"\b(error|fatal error):|Segmentation|Stack dump", l)]
for e in errors:
    print(e)
for m in missing:
    print("missing:", m)
print(f"iwyu: {count} files, {len(missing)} missing project includes, {len(errors)} errors; "
      f"{other} standard/library suggestions not checked")
sys.exit(1 if missing or errors else 0)
PY
echo "iwyu: done in $(($(date +%s) - start)) s"
