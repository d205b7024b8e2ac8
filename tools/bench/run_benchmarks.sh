#!/usr/bin/env bash
# Reproduces the tables of BENCHMARKS.md: sparsereduce against Gloo measured in the same run, on a testbed of
# network namespaces with 1 Gbit/s tbf-shaped links, plus loopback and kernel micro-benchmarks. Needs root and a
# Release build (make build) and the baselines (bash scripts/install-bench-deps.sh; cmake re-run picks up Gloo).
#
#   tools/bench/run_benchmarks.sh [all|targets|density|colocated|sizes|codecs|loopback|transports|torch|kernels]...
#
# Environment: BUILD_DIR (default build), OUT (results folder), ITERS (default 5), WARMUP (2), RATE (1gbit),
# SIZE (64M), SR_FLAGS (extra sparsereduce-perf flags, e.g. "--slots 16"), YIELD (1), ROUNDS (5, of `targets`). Results: $OUT/*.json and $OUT/tables.md. Every namespace is deleted on exit, also on failure/Ctrl-C.
# The testbed's hosts, and the loopback runs' processes, share this machine's cores, so every sparsereduce-perf run
# passes --yield-while-scanning $YIELD (the worker option for workers that share cores; BENCHMARKS.md, Method).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${BUILD_DIR:-$ROOT/build}" && pwd)
OUT=${OUT:-$ROOT/bench-results/$(date +%Y%m%d-%H%M%S)}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
RATE=${RATE:-1gbit}
SIZE=${SIZE:-64M}
YIELD=${YIELD:-1}
ROUNDS=${ROUNDS:-5}
AGG=$BUILD/aggregator/sparsereduce-aggregator
PERF=$BUILD/tools/sparsereduce-perf
GLOO=$BUILD/bench/gloo/sparsereduce-gloo-bench
KERNELS=$BUILD/bench/sparsereduce-kernels-bench
CODEC_BENCH=$BUILD/bench/sparsereduce-codec-bench
BW=$BUILD/tools/sparsereduce-bw
DENSITIES=${DENSITIES:-"1 0.5 0.2 0.1 0.05 0.02 0.01 0.001"}
PORT=19875
mkdir -p "$OUT"
for bin in "$AGG" "$PERF" "$GLOO"; do
  [[ -x $bin ]] || { echo "missing $bin (make build; bash scripts/install-bench-deps.sh)" >&2; exit 2; }
done

# shellcheck source=../testbed/testbed.sh
source "$ROOT/tools/testbed/testbed.sh"
NAME=srb$$
testbed_trap_cleanup "$NAME"
JOB=100

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# start_aggregators HOST... : one daemon per host on its testbed address.
start_aggregators() {
  AGG_LIST=""
  AGG_HOSTS=("$@")
  for h in "$@"; do
    local addr; addr=$(testbed_addr "$NAME" "$h")
    testbed_exec "$NAME" "$h" "$AGG" --listen "$addr:$PORT" --log-level warn --io-threads 2 &
    AGG_LIST+="${AGG_LIST:+,}$addr:$PORT"
  done
}

# Stops the daemons of start_aggregators by their namespaces, not by command line: pkill -f would also stop the
# daemons of another run on this machine (it sees every namespace).
stop_aggregators() {
  testbed_kill "$NAME" TERM "${AGG_HOSTS[@]}"
  wait 2>/dev/null || true
}

# sparse_run TAG DENSITY OVERLAP MINBYTES MAXBYTES WORKER_HOST... : one sparsereduce-perf job across the hosts.
sparse_run() {
  local tag=$1 density=$2 overlap=$3 minb=$4 maxb=$5; shift 5
  local hosts=("$@") world=${#hosts[@]} pids=() r=0
  JOB=$((JOB + 1))
  for h in "${hosts[@]}"; do
    local extra=()
    [[ $r == 0 ]] && extra=(--json "$OUT/$tag.json")
    testbed_exec "$NAME" "$h" timeout 600 "$PERF" --aggregators "$AGG_LIST" --job "$JOB" --rank "$r" \
      --world-size "$world" -b "$minb" -e "$maxb" -f 4 -n "$ITERS" -w "$WARMUP" -c 0 --density "$density" \
      --overlap "$overlap" --yield-while-scanning "$YIELD" ${SR_FLAGS:-} "${extra[@]}" > "$OUT/$tag.rank$r.txt" 2>&1 &
    pids+=($!)
    r=$((r + 1))
  done
  for p in "${pids[@]}"; do wait "$p" || { log "FAILED: $tag (see $OUT/$tag.rank*.txt)"; return 1; }; done
  tail -n +4 "$OUT/$tag.rank0.txt" >&2
}

# gloo_run TAG ALGORITHM MINBYTES MAXBYTES HOST... : Gloo allreduce across the hosts.
gloo_run() {
  local tag=$1 algorithm=$2 minb=$3 maxb=$4; shift 4
  local hosts=("$@") world=${#hosts[@]} pids=() r=0
  local store; store=$(mktemp -d)
  for h in "${hosts[@]}"; do
    local extra=() addr; addr=$(testbed_addr "$NAME" "$h")
    [[ $r == 0 ]] && extra=(--json "$OUT/$tag.json")
    testbed_exec "$NAME" "$h" timeout 900 "$GLOO" --rank "$r" --world-size "$world" --store-dir "$store" \
      --hostname "$addr" --algorithm "$algorithm" -b "$minb" -e "$maxb" -f 4 -n "$ITERS" -w "$WARMUP" -c 0 \
      "${extra[@]}" > "$OUT/$tag.rank$r.txt" 2>&1 &
    pids+=($!)
    r=$((r + 1))
  done
  for p in "${pids[@]}"; do wait "$p" || { log "FAILED: $tag"; rm -rf "$store"; return 1; }; done
  rm -rf "$store"
  tail -n +4 "$OUT/$tag.rank0.txt" >&2
}

# sweep TAG N AGGREGATOR_HOSTS WORKER_HOSTS: every density x overlap on an N-host testbed, Gloo on the worker hosts.
sweep() {
  local tag=$1 n=$2 aggs=$3 workers=$4
  # shellcheck disable=SC2086  # host lists are word-split on purpose
  {
    testbed_up "$NAME" "$n" --rate "$RATE" >/dev/null
    gloo_run "$tag.gloo.ring" ring "$SIZE" "$SIZE" $workers
    gloo_run "$tag.gloo.bcube" bcube "$SIZE" "$SIZE" $workers
    start_aggregators $aggs
    for overlap in random full; do
      for d in $DENSITIES; do sparse_run "$tag.$overlap.$d" "$d" "$overlap" "$SIZE" "$SIZE" $workers; done
    done
    stop_aggregators
    testbed_down "$NAME"
  }
}

density_sweep() {  # W=4 workers and A=4 aggregators, each on its own host
  log "density sweep: 8 hosts at $RATE (aggregators h1-h4, workers h5-h8), $SIZE"
  sweep separate 8 "1 2 3 4" "5 6 7 8"
}

colocated_sweep() {  # each of 4 hosts runs one worker and one aggregator
  log "colocated sweep: 4 hosts at $RATE, worker + aggregator on each, $SIZE"
  sweep colocated 4 "1 2 3 4" "1 2 3 4"
}

size_sweep() {
  log "size sweep 4K..256M: 8 hosts at $RATE"
  testbed_up "$NAME" 8 --rate "$RATE" >/dev/null
  gloo_run sizes.gloo.ring ring 4K 256M 5 6 7 8
  start_aggregators 1 2 3 4
  sparse_run sizes.dense 1 random 4K 256M 5 6 7 8
  sparse_run sizes.sparse 0.01 random 4K 256M 5 6 7 8
  stop_aggregators
  testbed_down "$NAME"
}

codec_sweep() {  # dense 64 MiB through each codec, separate layout: what compression buys on a 1 Gbit/s link
  log "codecs: 8 hosts at $RATE, dense $SIZE, each codec"
  testbed_up "$NAME" 8 --rate "$RATE" >/dev/null
  gloo_run codecs.gloo.ring ring "$SIZE" "$SIZE" 5 6 7 8
  start_aggregators 1 2 3 4
  local codec
  for codec in none fp16 bf16 3lc diana topk adaptive; do
    local flags=(--codec "$codec")
    [[ $codec == topk ]] && flags+=(--fraction 0.1)
    SR_FLAGS="${SR_FLAGS:-} ${flags[*]}" sparse_run "codecs.$codec" 1 random "$SIZE" "$SIZE" 5 6 7 8
  done
  stop_aggregators
  testbed_down "$NAME"
}

loopback() {  # CPU bound: no namespaces, no shaping
  log "loopback: 4 workers + 1 aggregator vs Gloo with 4 ranks; shared memory (chosen automatically) and TCP"
  "$GLOO" --spawn 4 -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 0 --json "$OUT/loopback.gloo.ring.json" >&2
  local d transport
  for transport in shm tcp; do
    for d in 1 0.1 0.01; do
      "$PERF" --spawn 4,1 --aggregator-bin "$AGG" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 0 \
        --transport "$transport" --density "$d" --yield-while-scanning "$YIELD" \
        --json "$OUT/loopback.$transport.$d.json" | tail -1 >&2
    done
  done
}

transports() {  # point to point, loopback: what each transport moves (sparsereduce-bw, ib_write_bw style)
  log "transports: sparsereduce-bw over tcp and shm on 127.0.0.1"
  local transport port=18600
  for transport in tcp shm; do
    port=$((port + 1))
    timeout 120 "$BW" -p "$port" >/dev/null 2>&1 &  # it serves one client: bounded if that one never comes
    local server=$!
    "$BW" -p "$port" --transport "$transport" -a -n 2000 --report_gbits 127.0.0.1 > "$OUT/bw.$transport.txt" || true
    wait "$server" || true
  done
}

torch_sparse() {  # PyTorch's gloo all_reduce of a sparse COO tensor (allgather-based), loopback
  [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null || {
    log "no torch for /usr/bin/python3 (bash scripts/install-bench-deps.sh)"; return 0; }
  log "torch sparse COO all_reduce, 4 ranks on loopback"
  /usr/bin/python3 "$ROOT/bench/torch_sparse_baseline.py" --spawn 4 --size "$SIZE" --density 0.01,0.1 \
    -n "$ITERS" -w "$WARMUP" --json "$OUT/loopback.torch_sparse.json" >&2
}

# The points of issue 3's targets, ROUNDS times, each round with a Gloo run of its own just before, so that every
# ratio compares runs of the same minutes (tables.py takes the median of the per-round ratios): separate layout,
# then loopback dense over shared memory against Gloo on loopback.
targets() {
  log "targets: $ROUNDS rounds of Gloo ring and 100 %, 10 % random, 10 % full, 1 % random (8 hosts at $RATE), then loopback"
  testbed_up "$NAME" 8 --rate "$RATE" >/dev/null
  start_aggregators 1 2 3 4
  local round point
  for round in $(seq 1 "$ROUNDS"); do
    gloo_run "targets.r$round.gloo" ring "$SIZE" "$SIZE" 5 6 7 8
    for point in 1:random 0.1:random 0.1:full 0.01:random; do
      sparse_run "targets.r$round.${point#*:}.${point%%:*}" "${point%%:*}" "${point#*:}" "$SIZE" "$SIZE" 5 6 7 8
    done
  done
  stop_aggregators
  testbed_down "$NAME"
  for round in $(seq 1 "$ROUNDS"); do
    "$GLOO" --spawn 4 -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 0 \
      --json "$OUT/targets.r$round.loopback.gloo.json" | tail -1 >&2
    "$PERF" --spawn 4,1 --aggregator-bin "$AGG" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w "$WARMUP" -c 0 --density 1 \
      --transport shm --yield-while-scanning "$YIELD" --json "$OUT/targets.r$round.loopback.shm.json" | tail -1 >&2
  done
}

kernels() {
  [[ -x $KERNELS && -x $CODEC_BENCH ]] || { log "no $KERNELS or $CODEC_BENCH (Google Benchmark missing)"; return 0; }
  log "kernels"
  "$KERNELS" --benchmark_min_time=0.2 --benchmark_format=json > "$OUT/kernels.json"
  "$CODEC_BENCH" --benchmark_min_time=0.2 --benchmark_format=json > "$OUT/codecs.throughput.json"
}

what=("$@")
[[ ${#what[@]} == 0 || ${what[0]} == all ]] && what=(targets density colocated sizes codecs loopback transports torch kernels)
for w in "${what[@]}"; do
  case $w in
    targets) targets ;;
    density) density_sweep ;;
    colocated) colocated_sweep ;;
    sizes) size_sweep ;;
    codecs) codec_sweep ;;
    transports) transports ;;
    loopback) loopback ;;
    torch) torch_sparse ;;
    kernels) kernels ;;
    *) echo "unknown part $w" >&2; exit 2 ;;
  esac
done
python3 "$ROOT/tools/bench/tables.py" "$OUT" --rate "$RATE" > "$OUT/tables.md"
log "tables: $OUT/tables.md"
cat "$OUT/tables.md"
