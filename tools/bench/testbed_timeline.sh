#!/usr/bin/env bash
# When each worker's data reaches an aggregator, and when the aggregator's RESULTs leave, collective by collective
# (W = A = 4, each on its own namespace "host"): captures the packet headers on aggregator h1's eth0 (tcpdump)
# during one job and prints, per collective, relative to the first worker data that reached h1:
#   first-in per worker   when each worker's first data arrived (the latest one is the straggler the aggregator
#                         waits for: a column's block is summed only once every worker has announced the column)
#   first-out             when h1 sent its first RESULT data
#   last-in, last-out     when the last worker data arrived and the last RESULT data left
# then the medians over the collectives. "Data" is a TCP segment with at least MIN_BYTES of payload, so the
# sparsereduce-perf barriers (one-element allreduces) between iterations do not count; a collective is a run of
# data with no gap longer than GAP_MS. Needs root and tcpdump; the namespaces are deleted on exit.
#
#   tools/bench/testbed_timeline.sh DENSITY:OVERLAP [BUILD] [-- EXTRA sparsereduce-perf FLAGS]
#   tools/bench/testbed_timeline.sh 0.01:random build
#
# Environment: RATE (1gbit), ITERS (7), WARMUP (2), SIZE (64M), GAP_MS (12), MIN_BYTES (2000), PCAP (keep the
# capture in this file).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if (($# < 1)); then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
POINT=$1
BUILD=${2:-$ROOT/build}
shift $(($# >= 2 ? 2 : 1))
[[ ${1-} == "--" ]] && shift
EXTRA=("$@")
RATE=${RATE:-1gbit}
ITERS=${ITERS:-7}
WARMUP=${WARMUP:-2}
SIZE=${SIZE:-64M}
GAP_MS=${GAP_MS:-12}
MIN_BYTES=${MIN_BYTES:-2000}
command -v tcpdump >/dev/null || { echo "testbed_timeline: tcpdump not found (scripts/install-bench-deps.sh)" >&2; exit 2; }
agg=$BUILD/aggregator/sparsereduce-aggregator
perf_tool=$BUILD/tools/sparsereduce-perf
[[ -x $agg && -x $perf_tool ]] || { echo "testbed_timeline: no sparsereduce build in $BUILD" >&2; exit 2; }
density=${POINT%%:*}
overlap=${POINT##*:}

# shellcheck source=../testbed/testbed.sh
source "$ROOT/tools/testbed/testbed.sh"
NAME=srtl$$
OUT=$(mktemp -d)
chmod 777 "$OUT"  # tcpdump drops its privileges before it writes the capture
cleanup() {
  [[ -n ${capture-} ]] && pkill -TERM -f -- "-w $OUT/h1.pcap" || true
  testbed_down "$NAME" >/dev/null 2>&1 || true
  rm -rf "$OUT"
}
testbed_trap_exit cleanup
testbed_up "$NAME" 8 --rate "$RATE" >/dev/null

PORT=19960
list=""
agg_pids=()
for h in 1 2 3 4; do
  addr=$(testbed_addr "$NAME" "$h")
  testbed_exec "$NAME" "$h" "$agg" --listen "$addr:$PORT" --log-level warn --io-threads 2 &
  agg_pids+=($!)
  list+="${list:+,}$addr:$PORT"
done
testbed_exec "$NAME" 1 tcpdump -i eth0 -s 128 -B 65536 -w "$OUT/h1.pcap" >"$OUT/tcpdump.log" 2>&1 &
capture=$!
# tcpdump says "listening on" once the capture runs.
for _ in $(seq 100); do grep -q "listening on" "$OUT/tcpdump.log" 2>/dev/null && break; sleep 0.1; done
pids=()
for r in 0 1 2 3; do
  testbed_exec "$NAME" $((r + 5)) timeout 600 "$perf_tool" --aggregators "$list" --job 1 --rank "$r" \
    --world-size 4 -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 0 --density "$density" \
    --overlap "$overlap" "${EXTRA[@]}" >"$OUT/rank$r.txt" 2>&1 &
  pids+=($!)
done
for r in "${!pids[@]}"; do
  wait "${pids[$r]}" || { echo "testbed_timeline: rank $r failed:" >&2; cat "$OUT/rank$r.txt" >&2; exit 1; }
done
# $! is the subshell of testbed_exec, which ignores SIGINT as a background job: signal tcpdump itself (it flushes
# the capture on SIGTERM).
pkill -TERM -f -- "-w $OUT/h1.pcap" || true
wait "$capture" || true
capture=""
# The daemons in their namespaces (tcpdump, also on h1, has exited): pkill -f on the command line would also stop
# another run's daemons.
testbed_kill "$NAME" TERM 1 2 3 4
wait "${agg_pids[@]}" 2>/dev/null || true
[[ -n ${PCAP-} ]] && cp "$OUT/h1.pcap" "$PCAP"

echo "# $POINT, $SIZE, W = A = 4 on their own namespaces, rate $RATE, ${EXTRA[*]:-default flags}"
grep -E '^ +[0-9]+' "$OUT/rank0.txt" | tail -1 | awk -v n="$ITERS" '{printf "# sparsereduce-perf: median of %d iterations %.1f ms\n", n, $5 / 1000}'
/usr/bin/python3 - "$OUT/h1.pcap" "$(testbed_addr "$NAME" 1)" "$GAP_MS" "$MIN_BYTES" "$((ITERS + WARMUP))" <<'EOF'
import statistics, struct, sys

path, me, gap, min_bytes = sys.argv[1], sys.argv[2], float(sys.argv[3]) / 1000, int(sys.argv[4])
expected = int(sys.argv[5])
me = bytes(int(x) for x in me.split("."))
data = []  # (time, "in" or "out", worker address)
with open(path, "rb") as f:
    magic = struct.unpack("<I", f.read(24)[:4])[0]
    scale = 1e9 if magic == 0xA1B23C4D else 1e6  # nanosecond or microsecond pcap
    while len(header := f.read(16)) == 16:
        seconds, fraction, captured, _ = struct.unpack("<IIII", header)
        frame = f.read(captured)
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:  # IPv4, TCP
            continue
        ip_header = (frame[14] & 15) * 4
        if len(frame) < 14 + ip_header + 13:
            continue
        payload = struct.unpack(">H", frame[16:18])[0] - ip_header - (frame[14 + ip_header + 12] >> 4) * 4
        if payload < min_bytes:
            continue
        src, dst = frame[26:30], frame[30:34]
        t = seconds + fraction / scale
        if dst == me:
            data.append((t, "in", ".".join(map(str, src))))
        elif src == me:
            data.append((t, "out", ".".join(map(str, dst))))

collectives, current = [], []
for d in data:
    if current and d[0] - current[-1][0] > gap:
        collectives.append(current)
        current = []
    current.append(d)
if current:
    collectives.append(current)
workers = sorted({w for c in collectives for _, _, w in c}, key=lambda a: tuple(map(int, a.split("."))))
if not collectives or not workers:
    sys.exit("testbed_timeline: no data packets captured")

rows = []
for c in collectives:
    t0 = c[0][0]
    first_in = {w: min((t for t, d, s in c if d == "in" and s == w), default=None) for w in workers}
    if None in first_in.values() or not any(d == "out" for _, d, _ in c):
        continue  # a piece of a collective cut by a gap: raise GAP_MS if this happens often
    ms = lambda t: (t - t0) * 1000
    rows.append([ms(first_in[w]) for w in workers] + [
        ms(min(t for t, d, _ in c if d == "out")), ms(max(t for t, d, _ in c if d == "in")),
        ms(max(t for t, d, _ in c if d == "out"))])

names = [f"first-in .{w.split('.')[-1]}" for w in workers] + ["first-out", "last-in", "last-out"]
print(f"# aggregator {'.'.join(map(str, me))}, ms from the first worker data of each collective "
      f"({len(rows)} of the {expected} collectives, warm-ups included)")
if len(rows) != expected:
    print(f"# warning: {len(collectives)} runs of data for {expected} collectives; a gap inside a collective or "
          f"none between two: try another GAP_MS")
print("  " + " ".join(f"{n:>13}" for n in names))
for r in rows:
    print("  " + " ".join(f"{x:13.1f}" for x in r))
if rows:
    print("  " + " ".join(f"{statistics.median(col):13.1f}" for col in zip(*rows)) + "   (median)")
    stragglers = [max(r[:len(workers)]) for r in rows]
    print(f"# the last worker's first data: median {statistics.median(stragglers):.1f} ms after the first's; "
          f"the first RESULT left {statistics.median(r[len(workers)] for r in rows):.1f} ms after it")
EOF
