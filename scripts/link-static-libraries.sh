#!/usr/bin/env bash
# A link launcher (CMake's RULE_LAUNCH_LINK) for stepwatch-agent: runs the link command it is
# given with every shared library of /usr/lib that has a static archive beside it replaced by that
# archive, plus --gc-sections. The agent runs on every training node, and the pages of gRPC,
# protobuf, Abseil and OpenSSL it maps as shared libraries are most of its memory (about 4 MiB
# less resident as one static binary). libc, libstdc++ and the libraries without an archive
# (prometheus-cpp-core in Debian) stay shared; none of the archives is also linked as a shared
# library, so no code exists twice.
set -euo pipefail
args=()
for arg in "$@"; do
  if [[ "$arg" =~ ^(/usr/lib/[^[:space:]]*/lib[A-Za-z0-9_+.-]+)\.so(\.[0-9.]+)?$ ]]; then
    archive="${BASH_REMATCH[1]}.a"
    if [ -f "$archive" ]; then
      args+=("$archive")
      continue
    fi
  fi
  args+=("$arg")
done
exec "${args[@]}" -Wl,--gc-sections
