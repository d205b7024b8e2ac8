#!/usr/bin/env bash
# Checks deploy/systemd/sparsereduce-aggregator.service with systemd-analyze:
#  - verify: syntax, unknown keys, bad values, and that ExecStart is executable. ExecStart names /usr/bin, which
#    holds no daemon on a build machine, so a copy pointing at the build tree's binary is verified;
#  - security --offline: the hardening must keep the exposure score at or below MAX_EXPOSURE (0-10 scale).
# Fails on a non-zero exit or on any message about the unit.
# usage: systemd_verify.sh UNIT_FILE DAEMON_BINARY WORK_DIR MAX_EXPOSURE
set -euo pipefail
unit=$1 binary=$2 work=$3 max_exposure=$4

if ! command -v systemd-analyze >/dev/null; then
  echo "systemd-analyze not found: run scripts/install-deps.sh (package systemd)" >&2
  exit 1
fi
[[ -x $binary ]] || { echo "daemon binary $binary missing: build first" >&2; exit 1; }

rm -rf "$work" && mkdir -p "$work"
name=$(basename "$unit")
copy=$work/$name
grep -q '^ExecStart=/usr/bin/sparsereduce-aggregator ' "$unit" || { echo "$unit: unexpected ExecStart" >&2; exit 1; }
sed "s#^ExecStart=/usr/bin/sparsereduce-aggregator #ExecStart=$binary #" "$unit" > "$copy"

status=0
# --recursive-errors=no: only this unit's own problems, not those of the system's units it pulls in.
output=$(cd "$work" && timeout 60 systemd-analyze verify --man=no --recursive-errors=no "$copy" 2>&1) || status=$?
echo "systemd-analyze verify: exit $status"
[[ -n $output ]] && printf '%s\n' "$output"
if ((status != 0)) || grep -q -e "$name" -e "$copy" <<<"$output"; then
  echo "FAIL: systemd-analyze verify reported problems with $name" >&2
  exit 1
fi

# The threshold is the score times 10.
threshold=$(awk -v m="$max_exposure" 'BEGIN { printf "%d", m * 10 }')
status=0
output=$(timeout 60 systemd-analyze security --offline=true --threshold="$threshold" --no-pager "$copy" 2>&1) ||
  status=$?
printf '%s\n' "$output" | tail -n 1
if ((status != 0)); then
  printf '%s\n' "$output" | grep '✗' || true
  echo "FAIL: exposure above $max_exposure, or systemd-analyze security failed (exit $status)" >&2
  exit 1
fi
echo "ok: $name verifies cleanly, exposure at most $max_exposure"
