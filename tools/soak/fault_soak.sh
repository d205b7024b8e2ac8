#!/usr/bin/env bash
# Fault-injection soak (not in CI): many jobs of collectives on loopback while workers and aggregators are killed
# at random points. Every trial is bounded; a worker must either finish all its collectives with bit-exact results,
# or fail with an error and its tensor restored, and only in a trial where something was killed. The daemons not
# killed must still run at the end of a trial and exit 0 on SIGTERM. Counts hangs and wrong results (both must be
# 0). SIGINT, SIGTERM or SIGHUP stop it; whatever it started is killed and reaped, and its temporary folder removed.
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
# Everything a trial starts is a child of this shell, so that it can be killed and reaped: the daemons (not started
# in a $(...) subshell, which would orphan them) and the `timeout` wrappers. Each wrapper runs in a process group of
# its own, which a Ctrl-C does not reach, so its worker is killed explicitly (before the wrapper, or it is orphaned).
agg_pids=() pids=()
stop_trial() {
  local p
  for p in "${pids[@]}"; do pkill -KILL -P "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  for p in "${agg_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${pids[@]}" "${agg_pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=() agg_pids=()
}
cleanup() { stop_trial; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
# A child that has exited (a zombie until `wait` reaps it) or is gone.
exited() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; s=${s##*) }; [[ ${s%% *} == Z ]]; }

trials=0 completed=0 failed_ok=0 hangs=0 wrong=0 unrestored=0 kills_worker=0 kills_agg=0 bad_errors=0
start_daemon() {  # $1 = index; sets $port
  local pf=$DIR/port$1
  rm -f "$pf"
  "$AGG" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --port-file "$pf" --log-level error --stall-timeout-ms 3000 > "$DIR/agg$1.log" 2>&1 &
  agg_pids[$1]=$!
  for _ in $(seq 1 500); do [[ -s $pf ]] && break; sleep 0.02; done
  [[ -s $pf ]] || { echo "trial $t: aggregator $1 did not start within 10 s: $(tail -2 "$DIR/agg$1.log")" >&2; exit 1; }
  port=$(<"$pf")
}

for ((t = 1; t <= TRIALS; t++)); do
  trials=$t
  A=$((1 + RANDOM % 2))
  W=$((2 + RANDOM % 3))
  aggs=""
  for ((a = 0; a < A; a++)); do start_daemon $a; aggs+="${aggs:+,}127.0.0.1:$port"; done
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
  worker_victim=-1 agg_victim=-1
  case $((RANDOM % 5)) in
    0) ;;
    1|2) victim=$((RANDOM % W))  # the worker is the child of its `timeout` wrapper
         pkill -KILL -P "${pids[$victim]}" 2>/dev/null && { kills_worker=$((kills_worker + 1)); worker_victim=$victim; } ;;
    *) victim=$((RANDOM % A))
       kill -KILL "${agg_pids[$victim]}" 2>/dev/null && { kills_agg=$((kills_agg + 1)); agg_victim=$victim; } ;;
  esac
  killed=$((worker_victim >= 0 || agg_victim >= 0))
  for ((r = 0; r < W; r++)); do
    wait "${pids[$r]}"
    rc=$?
    unset "pids[$r]"  # reaped: its pid may be reused
    out=$DIR/w$r.out
    if [[ $rc == 124 ]]; then hangs=$((hangs + 1)); echo "trial $t rank $r: HANG" >&2
    elif grep -q '^WRONG' "$out"; then wrong=$((wrong + 1)); echo "trial $t rank $r: WRONG RESULT" >&2
    elif [[ $rc == 0 ]]; then completed=$((completed + 1))
    elif [[ $rc == 137 && $r == "$worker_victim" ]]; then :
    elif [[ $rc == 3 && $killed == 0 ]]; then
      bad_errors=$((bad_errors + 1)); echo "trial $t rank $r: failed although nothing was killed: $(grep ERROR "$out")" >&2
    elif [[ $rc == 3 ]]; then
      failed_ok=$((failed_ok + 1))
      grep -q 'NOT_RESTORED' "$out" && { unrestored=$((unrestored + 1)); echo "trial $t rank $r: NOT RESTORED" >&2; }
      grep -qE '^ERROR [A-Z_]+ sparsereduce: job [0-9]+ rank [0-9]+: ' "$out" || {
        bad_errors=$((bad_errors + 1)); echo "trial $t rank $r: unexpected error text: $(grep ERROR "$out")" >&2; }
    else
      bad_errors=$((bad_errors + 1)); echo "trial $t rank $r: exit $rc: $(tail -2 "$out")" >&2
    fi
  done
  # The daemons that were not killed must still run, and exit 0 on SIGTERM (within 10 s).
  for ((a = 0; a < A; a++)); do
    p=${agg_pids[$a]}
    if [[ $a == "$agg_victim" ]]; then :
    elif exited "$p"; then
      wait "$p"; rc=$?
      bad_errors=$((bad_errors + 1)); echo "trial $t aggregator $a: died (exit $rc): $(tail -2 "$DIR/agg$a.log")" >&2
    else
      kill -TERM "$p"
      for _ in $(seq 1 500); do exited "$p" && break; sleep 0.02; done
      if ! exited "$p"; then
        kill -KILL "$p"
        bad_errors=$((bad_errors + 1)); echo "trial $t aggregator $a: still running 10 s after SIGTERM" >&2
      elif wait "$p"; rc=$?; [[ $rc != 0 ]]; then
        bad_errors=$((bad_errors + 1)); echo "trial $t aggregator $a: exit $rc after SIGTERM: $(tail -2 "$DIR/agg$a.log")" >&2
      fi
    fi
    wait "$p" 2>/dev/null
    unset "agg_pids[$a]"  # reaped: its pid may be reused
  done
done
echo "seed $SEED: trials $trials, worker kills $kills_worker, aggregator kills $kills_agg;"\
     "workers completed $completed, failed with an error $failed_ok (tensor not restored: $unrestored);"\
     "hangs $hangs, wrong results $wrong, unexpected exits/errors $bad_errors"
[[ $hangs == 0 && $wrong == 0 && $unrestored == 0 && $bad_errors == 0 ]]
