#!/usr/bin/env bash
# `cmake --install` of the python component under a scratch prefix gives a package that imports from there
# alone (no build or source tree on the path) and whose extension works.
# usage: install_test.sh BUILD_DIR PYTHON INSTALL_SUBDIR WORK_DIR
set -euo pipefail
build=$1 python=$2 subdir=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --component python --prefix "$work/prefix" > "$work/install.log"
site=$work/prefix/$subdir
for f in __init__.py torch.py process_group.py; do
  [[ -f $site/sparsereduce/$f ]] || { echo "FAIL: $site/sparsereduce/$f not installed" >&2; exit 1; }
done
cd "$work"
env -i PATH="$PATH" PYTHONPATH="$site" PYTHONDONTWRITEBYTECODE=1 "$python" - "$site" <<'EOF'
import sys
import sparsereduce
site = sys.argv[1]
for module in (sparsereduce, sparsereduce._sparsereduce):
    assert module.__file__.startswith(site), f"{module.__name__} imported from {module.__file__}, not {site}"
try:
    sparsereduce.Worker("127.0.0.1:1", 1, 5, 2)
except sparsereduce.Error as e:
    assert e.code == "INVALID_ARGUMENT", e
else:
    raise AssertionError("rank 5 of 2 was accepted")
try:
    import torch.distributed as dist
except ImportError:  # torch is optional for the package; the backend is checked where it is installed
    pass
else:
    import sparsereduce.process_group
    assert sparsereduce.process_group.__file__.startswith(site), sparsereduce.process_group.__file__
    assert dist.Backend("sparsereduce") == "sparsereduce"
print("installed package OK:", sparsereduce.__file__)
EOF
