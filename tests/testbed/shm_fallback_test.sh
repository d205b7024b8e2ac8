#!/usr/bin/env bash
# Transport choice across hosts of the namespace testbed: with transport "auto", a worker on the aggregator's host
# moves to shared memory and a worker on another host stays on TCP, in the same job, with bit-exact results; a
# worker on another host that requires "shm" fails with an error saying why. Skips (exit 77) without root.
set -euo pipefail
AGG=$1
WORKER=$2
# shellcheck source=test_setup.sh
source "$(dirname "$0")/test_setup.sh" srsf
testbed_up "$NAME" 2 --rate 0 >/dev/null
agg=$(testbed_addr "$NAME" 1):19875
testbed_exec "$NAME" 1 "$AGG" --listen "$agg" --metrics-listen '' --log-level warn &
common=(--aggregators "$agg" --world-size 2 --elements 300000 --density 0.2 --collectives 3
        --print-transports)
status=0

# Same job: rank 0 beside the aggregator (host 1), rank 1 on host 2.
testbed_exec "$NAME" 1 timeout 60 "$WORKER" "${common[@]}" --job 1 --rank 0 --transport auto --timeout-ms 10000 > "$OUT/r0" 2>&1 &
p0=$!
testbed_exec "$NAME" 2 timeout 60 "$WORKER" "${common[@]}" --job 1 --rank 1 --transport auto --timeout-ms 10000 > "$OUT/r1" 2>&1 &
p1=$!
wait $p0 || { echo "FAIL: rank 0 exited non-zero"; status=1; }
wait $p1 || { echo "FAIL: rank 1 exited non-zero"; status=1; }
cat "$OUT/r0" "$OUT/r1"
grep -qx 'TRANSPORTS shm' "$OUT/r0" || { echo "FAIL: rank 0 (aggregator's host) is not on shm"; status=1; }
grep -qx 'TRANSPORTS tcp' "$OUT/r1" || { echo "FAIL: rank 1 (other host) is not on tcp"; status=1; }
[[ $(grep -c '^OK' "$OUT/r0") == 3 && $(grep -c '^OK' "$OUT/r1") == 3 ]] || { echo "FAIL: not 3 bit-exact results each"; status=1; }

# Requiring shm from another host fails, naming the reason.
testbed_exec "$NAME" 2 timeout 60 "$WORKER" "${common[@]}" --job 2 --rank 1 --transport shm --timeout-ms 3000 \
  > "$OUT/r2" 2>&1 && { echo "FAIL: shm required from another host succeeded"; status=1; }
cat "$OUT/r2"
grep -q '^ERROR UNAVAILABLE .*aggregator 0.*shared memory.*another host' "$OUT/r2" ||
  { echo "FAIL: the error does not say why shm is unavailable"; status=1; }
exit $status
