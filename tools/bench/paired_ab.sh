#!/usr/bin/env bash
# Paired A/B runs of sparsereduce builds (or flag sets) on one testbed: the way BENCHMARKS.md judges a change on this
# noisy machine. Every pass runs each variant in turn, each with its own aggregators, on the same namespaces, so
# the variants of one pass share the host's speed of the moment. Prints one line per (pass, variant, point): the
# median time of the slowest rank over ITERS iterations. Needs root; the namespaces are deleted on exit.
#
#   tools/bench/paired_ab.sh PASSES "DENSITY:OVERLAP ..." VARIANT...
#
# A VARIANT is a build directory, optionally followed by "|" and extra sparsereduce-perf flags, e.g.
#   tools/bench/paired_ab.sh 3 "0.1:full 0.01:random 1:random" /tmp/old/build build "build|--window 2"
# W = A = 4: aggregators on h1-h4, workers on h5-h8. Environment: ITERS (7), WARMUP (2), RATE (1gbit), SIZE (64M).
# The workers run with the library's defaults plus the variant's flags: unlike run_benchmarks.sh, which passes
# --yield-while-scanning 1 (its YIELD), nothing here turns it on unless a variant does.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if (($# < 3)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
PASSES=$1
POINTS=$2
shift 2
VARIANTS=("$@")
ITERS=${ITERS:-7}
WARMUP=${WARMUP:-2}
RATE=${RATE:-1gbit}
SIZE=${SIZE:-64M}
PORT=19877

# shellcheck source=../testbed/testbed.sh
source "$ROOT/tools/testbed/testbed.sh"
NAME=srab$$
OUT=$(mktemp -d)
# The namespaces and the temporary folder go on every exit: success, failure, Ctrl-C, kill, a closed terminal.
cleanup() {
  testbed_down "$NAME" || true
  rm -rf "$OUT"
}
testbed_trap_exit cleanup
testbed_up "$NAME" 8 --rate "$RATE" >/dev/null
JOB=500

for pass in $(seq 1 "$PASSES"); do
  for variant in "${VARIANTS[@]}"; do
    build=${variant%%|*}
    flags=""
    [[ $variant == *"|"* ]] && flags=${variant#*|}
    agg=$build/aggregator/sparsereduce-aggregator
    perf=$build/tools/sparsereduce-perf
    [[ -x $agg && -x $perf ]] || { echo "paired_ab: no sparsereduce build in $build" >&2; exit 2; }
    # A fresh port per variant: the previous variant's daemons may still be draining.
    PORT=$((PORT + 1))
    list=""
    agg_pids=()
    for h in 1 2 3 4; do
      addr=$(testbed_addr "$NAME" "$h")
      testbed_exec "$NAME" "$h" "$agg" --listen "$addr:$PORT" --log-level warn --io-threads 2 &
      agg_pids+=($!)
      list+="${list:+,}$addr:$PORT"
    done
    for point in $POINTS; do
      density=${point%%:*}
      overlap=${point##*:}
      JOB=$((JOB + 1))
      pids=()
      for r in 0 1 2 3; do
        # The workers retry their connection until the aggregators listen (connect timeout), so no wait is needed.
        # shellcheck disable=SC2086
        testbed_exec "$NAME" $((r + 5)) timeout 300 "$perf" --aggregators "$list" --job "$JOB" --rank "$r" \
          --world-size 4 -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 0 --density "$density" \
          --overlap "$overlap" $flags >"$OUT/rank$r.txt" 2>&1 &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do
        wait "$pid" || { echo "paired_ab: $variant $point failed:" >&2; cat "$OUT"/rank*.txt >&2; exit 1; }
      done
      time_us=$(grep -E '^ +[0-9]+' "$OUT/rank0.txt" | tail -1 | awk '{print $5}')
      echo "pass $pass | $variant | $point | $(awk -v t="$time_us" 'BEGIN { printf "%.1f ms", t / 1000 }')"
    done
    # $! of a backgrounded testbed_exec is its subshell, not the daemon: stop the daemons in their namespaces
    # (pkill -f on the command line would also stop another run's daemons).
    testbed_kill "$NAME" TERM 1 2 3 4
    wait "${agg_pids[@]}" 2>/dev/null || true
  done
done
