#!/usr/bin/env bash
# Shows that check_consistency.js catches drift: on a copy of deploy/ with a grace period and a stop timeout above
# the drain deadline (25 s) but within the 5 s close grace after it, and a misspelt config key, it must fail and
# name each of them.
# usage: consistency_drift_test.sh CHECK_SCRIPT NPM_DIR DEPLOY_DIR WORK_DIR
set -euo pipefail
check=$1 modules=$2 deploy=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cp -r "$deploy" "$work/deploy"
trap 'rm -rf "$work"' EXIT
sed -i 's/terminationGracePeriodSeconds: .*/terminationGracePeriodSeconds: 28/' \
  "$work/deploy/kubernetes/statefulset.yaml"
sed -i 's/^TimeoutStopSec=.*/TimeoutStopSec=29s/' "$work/deploy/systemd/sparsereduce-aggregator.service"
sed -i 's/^    max-jobs = /    max-jobz = /' "$work/deploy/kubernetes/configmap.yaml"

status=0
output=$(node "$check" --modules "$modules" "$work/deploy" 2>&1) || status=$?
printf '%s\n' "$output"
((status != 0)) || { echo "FAIL: the drifted copy passed" >&2; exit 1; }
for expected in 'terminationGracePeriodSeconds 28 s' 'TimeoutStopSec 29000 ms' 'ConfigMap key max-jobz'; do
  grep -qF "$expected" <<<"$output" || { echo "FAIL: no report of '$expected'" >&2; exit 1; }
done
echo "ok: all three drifts reported"
