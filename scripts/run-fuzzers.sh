#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) and runs each one for a bounded time on a copy of
# its committed seed corpus (fuzz/corpus/<target>/ is never written). Exits non-zero if any target crashes, hits an
# invariant check, times out on an input or runs out of memory, and prints the path of the input that did it.
#
# Usage: scripts/run-fuzzers.sh [SECONDS_PER_TARGET]      (default 30)
#
# Environment (all optional):
#   BUILD_DIR        build tree (default: <repo>/build-fuzz)
#   FUZZ_CXX         clang++ to use (default: clang++); CXX is deliberately not used, CI often points it at g++
#   FUZZERS          space-separated subset of the targets (default: all six)
#   JOBS             build parallelism (default: nproc)
#   FUZZ_ARGS        extra libFuzzer flags for every target, e.g. "-jobs=2" or "-only_ascii=0"
set -euo pipefail

seconds=${1:-30}
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: $0 [SECONDS_PER_TARGET]  (a positive integer, default 30)" >&2
  exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-fuzz}
cxx=${FUZZ_CXX:-clang++}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
fuzzers=${FUZZERS:-frame_decoder_fuzzer control_message_fuzzer column_engine_fuzzer worker_collective_fuzzer wire_block_fuzzer ring_channel_fuzzer}
read -r -a extra_args <<<"${FUZZ_ARGS:-}"

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "run-fuzzers: $cxx not found; install clang and libclang-rt-dev (libFuzzer), or set FUZZ_CXX" >&2
  exit 2
fi

echo "run-fuzzers: configuring $build with $cxx"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSPARSEREDUCE_FUZZ=ON -DBUILD_TESTING=OFF >"$build/configure.log" 2>&1 || {
  cat "$build/configure.log" >&2
  exit 2
}
if [[ ! -d "$build/fuzz/CMakeFiles" ]]; then
  echo "run-fuzzers: SPARSEREDUCE_FUZZ did not add fuzz/; the top-level CMakeLists.txt needs" >&2
  echo "  if(SPARSEREDUCE_FUZZ) add_subdirectory(fuzz) endif()   (see fuzz/README.md)" >&2
  exit 2
fi
echo "run-fuzzers: building ($jobs jobs)"
if [[ -z ${FUZZERS:-} ]]; then
  cmake --build "$build" -j "$jobs" --target fuzzers
else
  # shellcheck disable=SC2086  # word splitting of the target list is intended
  cmake --build "$build" -j "$jobs" --target $fuzzers
fi

runs="$build/fuzz-run"
rm -rf "$runs"
mkdir -p "$runs"
failed=()
summary=()
for t in $fuzzers; do
  dir="$runs/$t"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  if [[ -d "$root/fuzz/corpus/$t" ]]; then cp -R "$root/fuzz/corpus/$t/." "$dir/corpus/"; fi
  echo "run-fuzzers: $t for ${seconds}s (log: $dir/log)"
  rc=0
  # -max_total_time bounds the run; the outer timeout only guards against a wedged process.
  timeout --kill-after=30 $((seconds + 300)) \
    "$build/fuzz/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" "${extra_args[@]}" "$dir/corpus" >"$dir/log" 2>&1 || rc=$?

  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$dir/log" | tail -1 || true)
  corpus=$(find "$dir/corpus" -type f | wc -l)
  mapfile -t artifacts < <(find "$dir/artifacts" -type f | sort)
  if ((rc != 0)) || ((${#artifacts[@]} > 0)); then
    failed+=("$t")
    summary+=("$(printf '%-26s FAILED (exit %s)' "$t" "$rc")")
    echo "run-fuzzers: $t FAILED (exit $rc); last lines of its log:" >&2
    grep -E 'FUZZ_CHECK|^  [^ ]|ERROR|SUMMARY|runtime error' "$dir/log" | head -20 >&2 || true
    tail -n 5 "$dir/log" >&2
    for a in "${artifacts[@]}"; do
      echo "run-fuzzers: crash input: $a" >&2
      echo "run-fuzzers:   reproduce: $build/fuzz/$t $a" >&2
      echo "run-fuzzers:   base64: $(base64 -w0 "$a" | head -c 4000)" >&2
    done
  else
    summary+=("$(printf '%-26s ok  execs=%s exec/s=%s %s corpus=%s' "$t" "${execs:-?}" "${rate:-?}" "${cov:-}" "$corpus")")
  fi
done

echo
echo "run-fuzzers: summary (${seconds}s per target)"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]} > 0)); then
  echo "run-fuzzers: FAILED: ${failed[*]} (artifacts under $runs/<target>/artifacts/)" >&2
  exit 1
fi
