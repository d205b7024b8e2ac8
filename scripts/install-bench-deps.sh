#!/usr/bin/env bash
# Installs the Debian bookworm packages the baseline benchmarks need, on top of scripts/install-deps.sh:
#   libgloo-dev     Gloo (TCP transport), for bench/gloo (sparsereduce-gloo-bench)
#   python3-torch   PyTorch 1.13 with the gloo backend, for bench/torch_sparse_baseline.py (run it with
#                   /usr/bin/python3); about 1 GB with its dependencies, hence a separate script.
# Idempotent: when every package is already present it only runs dpkg-query.
set -euo pipefail

packages=(
  libgloo-dev
  python3-torch python3-numpy
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-bench-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
