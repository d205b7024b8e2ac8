#!/usr/bin/env bash
# A network partition on the namespace testbed: while 2 workers run collectives through an aggregator on a third
# host, one worker's link goes down. Both workers must fail (no hang), each naming the other side.
#
#   partition_test.sh AGGREGATOR WORKER [deadlines|liveness]
#
# deadlines (the default): short application deadlines end it. The cut-off worker fails at its 5 s collective
# deadline with DEADLINE_EXCEEDED naming the aggregator, the other at the aggregator's 2 s stall abort naming the
# cut-off rank.
# liveness: every deadline is 120 s, so only TCP's own liveness checks can end it (TCP_USER_TIMEOUT, 10 s, on the
# unacknowledged data; keepalive, 2 s idle + 3 probes 1 s apart, on an idle connection): the cut-off worker fails
# with UNAVAILABLE naming the aggregator, the other with PEER_LEFT naming the cut-off rank, within 30 s.
# Skips (exit 77) without root or network namespaces.
set -euo pipefail
AGG=$1
WORKER=$2
MODE=${3:-deadlines}
case $MODE in
  deadlines) stall_ms=2000 collective_ms=5000 limit_ms=15000 ;;
  liveness) stall_ms=120000 collective_ms=120000 limit_ms=30000 ;;
  *) echo "partition_test: unknown mode '$MODE' (deadlines, liveness)" >&2; exit 2 ;;
esac
# shellcheck source=test_setup.sh
source "$(dirname "$0")/test_setup.sh" srpt
testbed_up "$NAME" 3 --rate 1gbit >/dev/null
agg_addr=$(testbed_addr "$NAME" 1)
# Inner deadlines below ctest's 120 s: a hang ends here, with the FAIL lines and the teardown, instead of in a bare
# ctest timeout that kills the script before its EXIT trap runs.
testbed_exec "$NAME" 1 timeout 90 "$AGG" --listen "$agg_addr:19875" --stall-timeout-ms $stall_ms --begin-timeout-ms $stall_ms --log-level warn &
for r in 0 1; do
  testbed_exec "$NAME" $((r + 2)) timeout 60 "$WORKER" --aggregators "$agg_addr:19875" --job 1 --rank $r \
    --world-size 2 --elements 4000000 --density 0.5 --collectives 100000 --timeout-ms $collective_ms \
    > "$OUT/rank$r.txt" 2>&1 &
  eval "pid$r=$!"
done
# Partition once both workers have completed a few collectives.
for _ in $(seq 1 200); do
  [[ $(grep -c '^OK' "$OUT/rank1.txt" 2>/dev/null || true) -ge 3 ]] && break
  sleep 0.05
done
grep -q '^OK' "$OUT/rank1.txt" || { echo "FAIL: workers made no progress"; cat "$OUT"/rank*.txt; exit 1; }
start=$(date +%s%N)
ip -n "$NAME-br" link set p3 down   # host 3 runs rank 1
status=0
for r in 0 1; do
  pid_var=pid$r
  if wait "${!pid_var}"; then
    echo "FAIL: rank $r exited 0 after the partition"; status=1
  fi
done
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "both workers failed ${elapsed_ms} ms after the partition"
cat "$OUT/rank0.txt" | tail -1
cat "$OUT/rank1.txt" | tail -1
if [[ $MODE == deadlines ]]; then
  tail -1 "$OUT/rank1.txt" | grep -q 'ERROR DEADLINE_EXCEEDED.*aggregator 0' || { echo "FAIL: rank 1 error"; status=1; }
  tail -1 "$OUT/rank0.txt" | grep -q 'ERROR DEADLINE_EXCEEDED .*rank(s) 1' || { echo "FAIL: rank 0 error does not name rank 1"; status=1; }
else
  tail -1 "$OUT/rank1.txt" | grep -q 'ERROR UNAVAILABLE.*aggregator 0' || { echo "FAIL: rank 1 error"; status=1; }
  tail -1 "$OUT/rank0.txt" | grep -q 'ERROR PEER_LEFT.*rank 1' || { echo "FAIL: rank 0 error does not name rank 1"; status=1; }
fi
(( elapsed_ms < limit_ms )) || { echo "FAIL: took ${elapsed_ms} ms (limit ${limit_ms})"; status=1; }
exit $status
