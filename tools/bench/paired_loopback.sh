#!/usr/bin/env bash
# Paired A/B runs on one host, no shaping (CPU bound): each pass runs every sparsereduce build in turn (4 workers
# and 1 aggregator over shared memory, sparsereduce-perf --spawn 4,1) and then Gloo's ring with 4 ranks, so the
# runs of one pass share the machine's speed of the moment. Prints each pass's median times, then per variant the
# median over passes and the median of the per-pass ratios to the first variant and to Gloo: the way BENCHMARKS.md
# judges a change on this noisy machine (single runs of the same build differ by tens of percent).
#
#   tools/bench/paired_loopback.sh PASSES VARIANT...
#
# A VARIANT is a build directory, optionally followed by "|" and extra sparsereduce-perf flags, e.g.
#   tools/bench/paired_loopback.sh 20 /tmp/old/build build
# Gloo comes from the first variant whose build has it (bench/gloo/sparsereduce-gloo-bench; scripts/install-bench-deps.sh).
# Environment: ITERS (7), WARMUP (2), SIZE (64M), DENSITY (1), TRANSPORT (shm), SPAWN (4,1).
set -euo pipefail
if (($# < 2)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
PASSES=$1
shift
VARIANTS=("$@")
ITERS=${ITERS:-7}
WARMUP=${WARMUP:-2}
SIZE=${SIZE:-64M}
DENSITY=${DENSITY:-1}
TRANSPORT=${TRANSPORT:-shm}
SPAWN=${SPAWN:-4,1}
gloo=""
for variant in "${VARIANTS[@]}"; do
  candidate=${variant%%|*}/bench/gloo/sparsereduce-gloo-bench
  if [[ -x $candidate ]]; then
    gloo=$candidate
    break
  fi
done
[[ -n $gloo ]] || { echo "paired_loopback: no build has the Gloo baseline (scripts/install-bench-deps.sh)" >&2; exit 2; }
ranks=${SPAWN%%,*}

# Median time of the slowest rank, in ms, from an nccl-tests style table.
median_ms() { grep -E '^ +[0-9]+' | tail -1 | awk '{printf "%.2f", $5 / 1000}'; }

OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for pass in $(seq 1 "$PASSES"); do
  line="$pass"
  for variant in "${VARIANTS[@]}"; do
    build=${variant%%|*}
    flags=""
    [[ $variant == *"|"* ]] && flags=${variant#*|}
    # shellcheck disable=SC2086
    t=$("$build/tools/sparsereduce-perf" --spawn "$SPAWN" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 0 \
      --density "$DENSITY" --transport "$TRANSPORT" --aggregator-bin "$build/aggregator/sparsereduce-aggregator" \
      $flags 2>&1 | median_ms)
    [[ -n $t ]] || { echo "paired_loopback: $variant failed" >&2; exit 1; }
    line+=" $t"
  done
  t=$("$gloo" --spawn "$ranks" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 0 2>&1 | median_ms)
  [[ -n $t ]] || { echo "paired_loopback: Gloo failed" >&2; exit 1; }
  echo "$line $t" | tee -a "$OUT" | awk '{printf "pass %s |", $1; for (i = 2; i <= NF; ++i) printf " %s", $i; print " ms"}'
done

names=$(printf '%s\n' "${VARIANTS[@]}" "gloo ring ($ranks ranks)")
/usr/bin/python3 - "$OUT" <<EOF
import statistics, sys
names = """$names""".splitlines()
rows = [list(map(float, line.split()[1:])) for line in open(sys.argv[1])]
cols = list(zip(*rows))
print(f"{len(rows)} passes; medians over passes, and medians of the per-pass ratios:")
for i, name in enumerate(names):
    vs_first = statistics.median(r[i] / r[0] for r in rows)
    vs_gloo = statistics.median(r[i] / r[-1] for r in rows)
    print(f"  {name}: {statistics.median(cols[i]):.1f} ms, x{vs_first:.3f} of {names[0]}, x{vs_gloo:.3f} of Gloo")
EOF
