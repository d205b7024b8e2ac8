#!/usr/bin/env bash
# Installs, on top of the build and test dependencies (which include python3-torch), what the training examples
# in examples/ need:
#   dataset-fashion-mnist   the Fashion-MNIST files for examples/fashion_mlp_ddp.py
# (python3-sklearn, for its digits dataset, is not installable next to libboost1.81-dev: python3-scipy depends
# on python3-pythran, which depends on libboost1.74-dev.)
set -euo pipefail
exec bash "$(dirname "$0")/install-deps.sh" dataset-fashion-mnist
