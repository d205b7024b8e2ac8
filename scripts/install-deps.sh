#!/usr/bin/env bash
# Installs the Debian bookworm packages sparsereduce needs to build and test.
# Idempotent: when every package is already present it only runs dpkg-query.
#   scripts/install-deps.sh [--build-only] [PACKAGE...]
# --build-only: what a Release build with -DBUILD_TESTING=OFF and its Debian package need (deploy/docker/Dockerfile),
# without the test and benchmark tools (GoogleTest, torch, node, ...). Extra package names given as arguments are
# installed the same way (scripts/install-bench-deps.sh uses that).
set -euo pipefail

build_only=false
if [[ ${1:-} == --build-only ]]; then
  build_only=true
  shift
fi

packages=(
  cmake make g++ pkg-config
  libboost1.81-dev            # Asio (header-only); conflicts with the 1.74 -dev packages
  libprotobuf-dev protobuf-compiler
  libibverbs-dev              # the RDMA transport (built without it, but then RDMA is off)
  libspdlog-dev libfmt-dev libcli11-dev
  libssl-dev                  # HMAC-SHA256 for job authentication
  libsystemd-dev              # sd_notify (Type=notify, watchdog)
  prometheus-cpp-dev          # /metrics
  pybind11-dev python3-dev    # the Python module (python/)
  dpkg-dev file               # cpack -G DEB (dpkg-shlibdeps)
)
if ! $build_only; then
  packages+=(
    libgtest-dev libgmock-dev libbenchmark-dev
    iproute2                    # ip netns + tc for the testbed partition test
    python3-numpy python3-pytest python3-torch  # the Python ctest tests (the DDP hook test needs torch, about 1 GB)
    systemd                     # tests/deploy: systemd-analyze verify
  )
  command -v npm >/dev/null || packages+=(nodejs npm)  # tests/deploy (node's npm, or one already on the PATH)
fi
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
