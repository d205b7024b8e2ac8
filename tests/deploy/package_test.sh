#!/usr/bin/env bash
# Checks the Debian package made by build_deb.sh: control data, conffiles, maintainer scripts and the file list;
# then extracts it into a scratch root and runs what it installed: the daemon (port file, a TCP connection,
# /healthz, /readyz and /metrics, exit 0 on SIGTERM), the demo, and a CMake project built with
# find_package(sparsereduce) doing an allreduce through the daemon. Every wait is bounded.
# usage: package_test.sh DEB_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
deb_dir=$1 source=$(realpath "$2") work=$3
root=$work/root
daemon_pid=

cleanup() {
  if [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; then kill -KILL "$daemon_pid"; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  [[ -f $work/daemon.log ]] && { echo "--- daemon log" >&2; cat "$work/daemon.log" >&2; }
  exit 1
}
# Polls CONDITION (a shell command) every 50 ms until it holds or TIMEOUT seconds pass.
wait_until() {
  local condition=$2 deadline=$((SECONDS + $1))
  until eval "$condition"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}
# Whether PID runs (an exited child stays a zombie until waited for, and kill -0 still succeeds on it).
alive() {
  [[ -r /proc/$1/stat ]] && [[ $(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) != Z ]]
}

for tool in dpkg-deb nm cmake; do
  command -v "$tool" >/dev/null || fail "$tool not found: run scripts/install-deps.sh"
done
rm -rf "$work" && mkdir -p "$work"
debs=("$deb_dir"/sparsereduce_*.deb)
[[ ${#debs[@]} -eq 1 && -f ${debs[0]} ]] || fail "expected one sparsereduce_*.deb in $deb_dir (package.build makes it)"
deb=${debs[0]}
echo "=== $(basename "$deb")"
dpkg-deb --field "$deb" Package Version Architecture Section Priority Maintainer Depends

# --- Control data -------------------------------------------------------------------------------------------
[[ $(dpkg-deb --field "$deb" Package) == sparsereduce ]] || fail "Package is not sparsereduce"
[[ $(dpkg-deb --field "$deb" Section) == net ]] || fail "Section is not net"
depends=$(dpkg-deb --field "$deb" Depends)
# Computed by dpkg-shlibdeps: every C++ binary needs at least these.
[[ $depends == *libc6* && $depends == *libstdc++6* ]] || fail "Depends was not computed from the binaries: '$depends'"
# The Python module under /usr/lib/python3.X loads into that interpreter only.
if dpkg-deb --contents "$deb" | grep -q '/dist-packages/sparsereduce/'; then
  recommends=$(dpkg-deb --field "$deb" Recommends)
  [[ $recommends =~ python3\ \(\>=\ 3\.[0-9]+\),\ python3\ \(\<\<\ 3\.[0-9]+\) ]] ||
    fail "the package ships a Python module but does not recommend its interpreter: Recommends '$recommends'"
fi
dpkg-deb --control "$deb" "$work/control"
grep -qx /etc/sparsereduce/aggregator.toml "$work/control/conffiles" || fail "the config is not a conffile"
grep -qx 'activate-noawait ldconfig' "$work/control/triggers" || fail "no ldconfig trigger for libsparsereduce.so"
for script in postinst prerm postrm; do
  [[ -x $work/control/$script ]] || fail "$script missing or not executable"
  sh -n "$work/control/$script" || fail "$script: syntax error"
done

# --- Files --------------------------------------------------------------------------------------------------
dpkg-deb --extract "$deb" "$root"
echo "=== files"
(cd "$root" && find . -type f -o -type l | sort)
expected=(
  usr/bin/sparsereduce-aggregator usr/bin/sparsereduce-perf usr/bin/sparsereduce-bw usr/bin/sparsereduce-demo
  usr/lib/libsparsereduce.so usr/include/sparsereduce/worker.h
  usr/lib/cmake/sparsereduce/sparsereduceConfig.cmake usr/lib/cmake/sparsereduce/sparsereduceConfigVersion.cmake
  usr/lib/cmake/sparsereduce/sparsereduceTargets.cmake
  usr/lib/systemd/system/sparsereduce-aggregator.service usr/lib/sysusers.d/sparsereduce.conf
  etc/sparsereduce/aggregator.toml usr/share/doc/sparsereduce/README.md usr/share/doc/sparsereduce/OPERATIONS.md
)
for f in "${expected[@]}"; do
  [[ -e $root/$f ]] || fail "/$f is not in the package"
done
# Nothing outside /usr and /etc (e.g. /usr/local or an absolute build path leaking into an install rule).
stray=$(cd "$root" && find . -mindepth 1 -maxdepth 1 ! -name usr ! -name etc)
[[ -z $stray ]] || fail "files outside /usr and /etc: $stray"
cmp -s "$root/usr/lib/systemd/system/sparsereduce-aggregator.service" \
  "$source/deploy/systemd/sparsereduce-aggregator.service" || fail "packaged unit differs from deploy/systemd"
# The library exports the worker API only (cmake/libsparsereduce.map), not the libraries linked into it.
leaked=$(nm -DC --defined-only "$root/usr/lib/libsparsereduce.so" | grep -E ' (google|boost|spdlog|fmt)::' || true)
[[ -z $leaked ]] || fail "libsparsereduce.so exports internals: $leaked"
# Every member function the packaged worker.h declares in class Worker (up to `private:`; comments, deleted,
# defaulted and inline ones left out) is exported, by name: one added to the header without its line in the map
# fails here. The consumer below calls each of them, so a missing overload fails its link too.
declared=$(sed -n '/^class Worker {/,/^ private:/p' "$root/usr/include/sparsereduce/worker.h" | sed 's://.*::' |
  grep -vE '= *(delete|default)|\{' | grep -oE '~?[A-Za-z_][A-Za-z0-9_]*\(' | tr -d '(' | sort -u || true)
[[ -n $declared ]] || fail "found no member function of class Worker in the packaged worker.h"
exported=$(nm -DC --defined-only "$root/usr/lib/libsparsereduce.so")
for name in $declared; do
  grep -qE "sparsereduce::Worker::$name(\[abi:[a-z0-9]+\])*\(" <<<"$exported" ||  # e.g. transports[abi:cxx11]()
    fail "libsparsereduce.so does not export sparsereduce::Worker::$name (cmake/libsparsereduce.map)"
done
echo "=== exported: every member function of Worker ($(echo $declared))"

# --- Run the installed daemon -------------------------------------------------------------------------------
daemon=$root/usr/bin/sparsereduce-aggregator
# Loopback and port 0 for the metrics endpoint too, never its default 0.0.0.0:19876. `env -i` here and below: no
# SPARSEREDUCE_* variable of the caller may change what runs.
args=(--listen 127.0.0.1:0 --port-file "$work/port"
  --metrics-listen 127.0.0.1:0 --metrics-port-file "$work/metrics-port")
env -i PATH="$PATH" "$daemon" "${args[@]}" > "$work/daemon.log" 2>&1 &
daemon_pid=$!
wait_until 15 '[[ -s $work/port ]] || ! alive $daemon_pid' || fail "no port file within 15 s"
alive "$daemon_pid" || fail "the installed daemon exited at start"
port=$(<"$work/port")
[[ $port =~ ^[0-9]+$ ]] && ((port > 0)) || fail "port file holds '$port'"
echo "=== daemon listening on 127.0.0.1:$port"
(exec 3<>"/dev/tcp/127.0.0.1/$port") || fail "cannot connect to 127.0.0.1:$port"

# Status code of GET PATH on the metrics port (bash's /dev/tcp: no curl in a minimal image); 5 s at most.
http_status() {
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$metrics_port" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$1" >&3
  IFS= read -r -t 5 line <&3 || true
  exec 3<&-
  awk '{ print $2 }' <<<"$line"
}
wait_until 15 '[[ -s $work/metrics-port ]]' || fail "no metrics port file within 15 s"
metrics_port=$(<"$work/metrics-port")
for path in /healthz /readyz /metrics; do
  code=$(http_status "$path")
  [[ $code == 200 ]] || fail "GET $path on 127.0.0.1:$metrics_port: status '$code', expected 200"
done
echo "=== /healthz, /readyz and /metrics answer 200 on 127.0.0.1:$metrics_port"

# A user's project against the extracted package: find_package(sparsereduce) -> sparsereduce::worker.
timeout 120 cmake -S "$source/tests/deploy/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$root/usr" > "$work/consumer.log" 2>&1 &&
  timeout 300 cmake --build "$work/consumer" >> "$work/consumer.log" 2>&1 || {
  cat "$work/consumer.log"
  fail "building a project with find_package(sparsereduce)"
}
grep -qx "sparsereduce_DIR:PATH=$root/usr/lib/cmake/sparsereduce" "$work/consumer/CMakeCache.txt" ||
  fail "find_package(sparsereduce) found $(grep sparsereduce_DIR "$work/consumer/CMakeCache.txt"), not the package's"
env -i PATH="$PATH" LD_LIBRARY_PATH="$root/usr/lib" timeout 60 "$work/consumer/consumer" "127.0.0.1:$port" ||
  fail "consumer allreduce"

# The demo starts its own aggregator, found next to itself in the extracted /usr/bin.
env -i PATH="$PATH" timeout 120 "$root/usr/bin/sparsereduce-demo" --workers 2 --size-mib 1 --densities 0.1 \
  --iterations 1 ||
  fail "sparsereduce-demo from the package"

kill -TERM "$daemon_pid"
wait_until 30 '! alive $daemon_pid' || fail "daemon still running 30 s after SIGTERM"
status=0
wait "$daemon_pid" || status=$?
daemon_pid=
((status == 0)) || fail "daemon exited with status $status on SIGTERM"
echo "ok: package built, contents checked, daemon ran from it and exited 0 on SIGTERM"
