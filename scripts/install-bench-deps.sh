#!/usr/bin/env bash
# Installs, on top of the build dependencies, what the baseline benchmarks need:
#   libgloo-dev     Gloo (TCP transport), for bench/gloo (sparsereduce-gloo-bench)
#   python3-torch   PyTorch 1.13 with the gloo backend, for bench/torch_sparse_baseline.py (run it with
#                   /usr/bin/python3); the build dependencies already have it (the Python tests), listed here so
#                   that this script says everything the benchmarks use.
#   iperf3          link checks of the namespace testbed (tools/testbed/measure_link.sh)
#   tcpdump         packet timelines of testbed collectives (tools/bench/testbed_timeline.sh)
set -euo pipefail
exec bash "$(dirname "$0")/install-deps.sh" libgloo-dev python3-torch python3-numpy iperf3 tcpdump
