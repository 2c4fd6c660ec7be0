#!/usr/bin/env bash
# Installs the Debian 12 packages stepwatch needs to build, test and run its demo.
# Idempotent: packages already present are skipped, so repeated runs are fast.
# Usage: scripts/install-deps.sh [build|test|all]   (default: all)
set -euo pipefail

profile="${1:-all}"

build_pkgs=(
  build-essential cmake pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # Only prometheus-cpp's core is linked; Debian ships no dev package without pull and push.
  prometheus-cpp-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang-format python3
)
test_pkgs=(
  prometheus prometheus-alertmanager python3-torch curl procps iproute2
  python3-pip python3-setuptools
  python3-yaml shellcheck
  openssl faketime socat
  # The clang pass of scripts/test.sh and scripts/fuzz.sh: clang and its runtimes
  # (libclang_rt.fuzzer, ASan, UBSan).
  clang libclang-rt-14-dev
  # The static checks (tests/static): clang-tidy (run-clang-tidy-14) and include-what-you-use.
  clang-tidy iwyu
  # The HTML report and the live view are checked in a real browser (headless).
  chromium fonts-dejavu-core
)
# kubectl checks the Kubernetes manifests offline; keep one that is already installed (some
# machines carry kubectl from another package that conflicts with Debian's).
if ! command -v kubectl >/dev/null 2>&1; then
  test_pkgs+=(kubernetes-client)
fi

case "$profile" in
  build) wanted=("${build_pkgs[@]}") ;;
  test | all) wanted=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  *)
    echo "usage: $0 [build|test|all]" >&2
    exit 2
    ;;
esac

missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#wanted[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
