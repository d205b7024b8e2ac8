#!/usr/bin/env bash
# Where the CPU of one collective goes on the testbed (W = A = 4, each on its own namespace "host", all sharing this
# machine's cores): runs the same job twice, with SHORT and LONG timed iterations, each whole run under
# `perf record -a` at 1000 Hz, and divides the difference of the two profiles by LONG - SHORT. Startup, tensor
# generation and teardown cancel out; what remains is one iteration: the collective plus sparsereduce-perf's own
# copy of the input between iterations (libc memmove in sparsereduce-perf, outside the timed window). One sample is
# 1 ms of one core. Needs root and perf; the namespaces are deleted on exit.
#
#   tools/bench/testbed_cpu.sh DENSITY:OVERLAP [BUILD] [-- EXTRA sparsereduce-perf FLAGS]
#   tools/bench/testbed_cpu.sh 0.1:full build
#   RATE=40gbit tools/bench/testbed_cpu.sh 0.1:full build          # the same without a link limit
#
# Environment: RATE (1gbit), SHORT (30), LONG (90), WARMUP (2), SIZE (64M), TOP (25 symbols).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if (($# < 1)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
POINT=$1
BUILD=${2:-$ROOT/build}
shift $(($# >= 2 ? 2 : 1))
[[ ${1-} == "--" ]] && shift
EXTRA=("$@")
RATE=${RATE:-1gbit}
SHORT=${SHORT:-30}
LONG=${LONG:-90}
WARMUP=${WARMUP:-2}
SIZE=${SIZE:-64M}
TOP=${TOP:-25}
((LONG > SHORT)) || { echo "testbed_cpu: LONG must exceed SHORT" >&2; exit 2; }
command -v perf >/dev/null || { echo "testbed_cpu: perf not found (apt install linux-perf)" >&2; exit 2; }
agg=$BUILD/aggregator/sparsereduce-aggregator
perf_tool=$BUILD/tools/sparsereduce-perf
[[ -x $agg && -x $perf_tool ]] || { echo "testbed_cpu: no sparsereduce build in $BUILD" >&2; exit 2; }
density=${POINT%%:*}
overlap=${POINT##*:}

# shellcheck source=../testbed/testbed.sh
source "$ROOT/tools/testbed/testbed.sh"
NAME=srcpu$$
OUT=$(mktemp -d)
cleanup() {
  [[ -n ${recorder-} ]] && kill -INT "$recorder" 2>/dev/null || true
  testbed_down "$NAME" >/dev/null 2>&1 || true
  rm -rf "$OUT"
}
testbed_trap_exit cleanup
testbed_up "$NAME" 8 --rate "$RATE" >/dev/null

PORT=19950
JOB=700
# run ITERS: one job under perf record -a; its aggregators are started and stopped with it.
run() {
  local iters=$1 data=$2 list="" h r pids=() agg_pids=()
  PORT=$((PORT + 1))
  JOB=$((JOB + 1))
  for h in 1 2 3 4; do
    local addr
    addr=$(testbed_addr "$NAME" "$h")
    testbed_exec "$NAME" "$h" "$agg" --listen "$addr:$PORT" --log-level warn --io-threads 2 &
    agg_pids+=($!)
    list+="${list:+,}$addr:$PORT"
  done
  perf record -a -F 1000 -o "$data" >"$OUT/perf-record.log" 2>&1 &
  recorder=$!
  for r in 0 1 2 3; do
    testbed_exec "$NAME" $((r + 5)) timeout 600 "$perf_tool" --aggregators "$list" --job "$JOB" --rank "$r" \
      --world-size 4 -b "$SIZE" -e "$SIZE" -n "$iters" -w "$WARMUP" -c 0 --density "$density" \
      --overlap "$overlap" "${EXTRA[@]}" >"$OUT/rank$r.txt" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}" || { echo "testbed_cpu: rank $r failed:" >&2; cat "$OUT/rank$r.txt" >&2; exit 1; }
  done
  kill -INT "$recorder"
  wait "$recorder" || true
  recorder=""
  # $! of a backgrounded testbed_exec is its subshell, not the daemon: stop the daemons in their namespaces
  # (pkill -f on the command line would also stop another run's daemons).
  testbed_kill "$NAME" TERM 1 2 3 4
  wait "${agg_pids[@]}" 2>/dev/null || true
  grep -E '^ +[0-9]+' "$OUT/rank0.txt" | tail -1 | awk -v n="$iters" '{printf "  %d iterations: median %.1f ms\n", n, $5 / 1000}'
}

echo "# $POINT, $SIZE, W = A = 4 on their own namespaces, rate $RATE, ${EXTRA[*]:-default flags}"
run "$SHORT" "$OUT/short.data"
run "$LONG" "$OUT/long.data"
for f in short long; do
  perf report -i "$OUT/$f.data" --no-children --sort comm,dso,sym --stdio -g none -F sample,comm,dso,sym \
    >"$OUT/$f.txt" 2>/dev/null
done
/usr/bin/python3 - "$OUT/short.txt" "$OUT/long.txt" "$((LONG - SHORT))" "$TOP" <<'EOF'
import collections, sys

def load(path):
    samples = collections.Counter()
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split(None, 3)
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        samples[(parts[1], parts[2], parts[3].strip())] += int(parts[0])
    return samples

short, long_, iterations, top = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
per = {k: (long_[k] - short[k]) / iterations for k in set(short) | set(long_)}
kind = {"sparsereduce-pe": "workers", "sparsereduce-ag": "aggregators", "swapper": "idle"}
groups = collections.Counter()
for (comm, dso, _), ms in per.items():
    groups[(kind.get(comm, "other"), "kernel" if "kernel" in dso else "user")] += ms
print(f"CPU per iteration (ms of one core; samples at 1000 Hz, {iterations} iterations): {sum(per.values()):.1f}")
for (who, where), ms in sorted(groups.items(), key=lambda kv: -kv[1]):
    print(f"  {who:12} {where:7} {ms:7.1f}")
print(f"top {top} symbols (ms per iteration):")
for (comm, dso, sym), ms in sorted(per.items(), key=lambda kv: -kv[1])[:top]:
    print(f"  {ms:7.2f}  {comm:16} {sym[:70]}")
EOF
