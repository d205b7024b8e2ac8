#!/usr/bin/env bash
# Fault-injection soak (not in CI): many jobs of collectives on loopback while workers and aggregators are killed
# at random points. Every trial is bounded; a worker must either finish all its collectives with bit-exact results,
# or fail with an error and its tensor restored. Counts hangs and wrong results (both must be 0).
#
#   tools/soak/fault_soak.sh [TRIALS=50] [BUILD_DIR=build]
set -uo pipefail
TRIALS=${1:-50}
BUILD=${2:-build}
AGG=$BUILD/aggregator/sparsereduce-aggregator
WORKER=$BUILD/tests/integration/sparsereduce-test-worker
[[ -x $AGG && -x $WORKER ]] || { echo "build first (make build)" >&2; exit 2; }
SEED=${SEED:-$RANDOM}
RANDOM=$SEED
DIR=$(mktemp -d)
cleanup() { pkill -KILL -P $$ 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

trials=0 completed=0 failed_ok=0 hangs=0 wrong=0 unrestored=0 kills_worker=0 kills_agg=0 bad_errors=0
start_daemon() {  # $1 = index; prints the port
  local pf=$DIR/port$1
  rm -f "$pf"
  "$AGG" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --port-file "$pf" --log-level error --stall-timeout-ms 3000 > "$DIR/agg$1.log" 2>&1 &
  echo $! > "$DIR/agg$1.pid"
  for _ in $(seq 1 200); do [[ -s $pf ]] && break; sleep 0.02; done
  cat "$pf"
}

for ((t = 1; t <= TRIALS; t++)); do
  trials=$t
  A=$((1 + RANDOM % 2))
  W=$((2 + RANDOM % 3))
  aggs=""
  for ((a = 0; a < A; a++)); do aggs+="${aggs:+,}127.0.0.1:$(start_daemon $a)"; done
  elements=$((10000 + RANDOM * 20))
  density=0.$((1 + RANDOM % 9))  # the same for every rank: each computes the reference from it
  pids=()
  for ((r = 0; r < W; r++)); do
    timeout 60 "$WORKER" --aggregators "$aggs" --job "$t" --rank $r --world-size $W --elements $elements \
      --density "$density" --collectives 300 --seed $t --timeout-ms 10000 --verify-restore \
      > "$DIR/w$r.out" 2>&1 &
    pids+=($!)
  done
  # Kill something at a random point (or nothing, one trial in five).
  sleep "$((RANDOM % 2)).$((RANDOM % 10))$((RANDOM % 10))"
  case $((RANDOM % 5)) in
    0) ;;
    1|2) victim=$((RANDOM % W))  # the worker is the child of its `timeout` wrapper
         pkill -KILL -P "${pids[$victim]}" 2>/dev/null && kills_worker=$((kills_worker + 1)) ;;
    *) victim=$((RANDOM % A)); kill -KILL "$(cat "$DIR/agg$victim.pid")" 2>/dev/null && kills_agg=$((kills_agg + 1)) ;;
  esac
  for ((r = 0; r < W; r++)); do
    wait "${pids[$r]}"
    rc=$?
    out=$DIR/w$r.out
    if [[ $rc == 124 ]]; then hangs=$((hangs + 1)); echo "trial $t rank $r: HANG" >&2
    elif grep -q '^WRONG' "$out"; then wrong=$((wrong + 1)); echo "trial $t rank $r: WRONG RESULT" >&2
    elif [[ $rc == 0 ]]; then completed=$((completed + 1))
    elif [[ $rc == 137 ]]; then :  # the victim
    elif [[ $rc == 3 ]]; then
      failed_ok=$((failed_ok + 1))
      grep -q 'NOT_RESTORED' "$out" && { unrestored=$((unrestored + 1)); echo "trial $t rank $r: NOT RESTORED" >&2; }
      grep -qE '^ERROR [A-Z_]+ sparsereduce: job [0-9]+ rank [0-9]+: ' "$out" || {
        bad_errors=$((bad_errors + 1)); echo "trial $t rank $r: unexpected error text: $(grep ERROR "$out")" >&2; }
    else
      bad_errors=$((bad_errors + 1)); echo "trial $t rank $r: exit $rc: $(tail -2 "$out")" >&2
    fi
  done
  for ((a = 0; a < A; a++)); do kill -TERM "$(cat "$DIR/agg$a.pid")" 2>/dev/null; wait "$(cat "$DIR/agg$a.pid")" 2>/dev/null; done
done
echo "seed $SEED: trials $trials, worker kills $kills_worker, aggregator kills $kills_agg;"\
     "workers completed $completed, failed with an error $failed_ok (tensor not restored: $unrestored);"\
     "hangs $hangs, wrong results $wrong, unexpected exits/errors $bad_errors"
[[ $hangs == 0 && $wrong == 0 && $unrestored == 0 && $bad_errors == 0 ]]
