#!/usr/bin/env bash
# Installs what zsock needs to build and test on Debian 12 (run as root).
# Every package comes from Debian's archive; nothing is downloaded otherwise.
set -euo pipefail
packages=(
  bazel-bootstrap bazel-platforms g++ python3 iproute2
  libfabric-bin ucx-utils
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libfabric-dev libucx-dev libibverbs-dev librdmacm-dev
  # tools/fuzz.sh: libFuzzer
  clang-14 libclang-rt-14-dev
  # bench: plots (zsock_bench --plot) and the peers of bench/compare_peers.sh
  gnuplot-nox libfabric-bin ucx-utils
  # tools/package.sh (the Debian package) and the examples built against it
  dpkg-dev patchelf pkg-config cmake make
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ] || [ "${CI:-}" = "true" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install_deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${packages[@]}"
fi
