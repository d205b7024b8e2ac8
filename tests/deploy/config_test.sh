#!/usr/bin/env bash
# The shipped configs must be accepted by the daemon's own parser, which exits 2 on an unknown key or a bad value:
# deploy/config/aggregator.toml and the TOML inside deploy/kubernetes/configmap.yaml. Each is loaded with the
# addresses moved to 127.0.0.1:0 and the secrets directory to a scratch one (flags override the file); it passes
# once the port file shows the daemon running and it exits 0 on SIGTERM. A copy with an unknown key must be
# refused with exit 2, so the check can fail. Every wait is bounded.
# usage: config_test.sh DAEMON_BINARY SOURCE_DIR WORK_DIR
set -euo pipefail
daemon=$1 source=$2 work=$3
pid=
cleanup() {
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
  rm -rf "$work"
}
trap cleanup EXIT
rm -rf "$work" && mkdir -p "$work/secrets"

alive() {
  [[ -r /proc/$1/stat ]] && [[ $(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) != Z ]]
}

# Kills the daemon that missed a deadline, so the next check starts alone and nothing is left behind.
give_up() {
  echo "$1" >&2
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
  return 1
}

# Starts the daemon on CONFIG; returns its exit status (0 after a clean SIGTERM).
run_with_config() {
  local config=$1 deadline status=0
  rm -f "$work/port"
  # env -i: no SPARSEREDUCE_* variable from the caller's environment may override the file.
  env -i PATH="$PATH" "$daemon" --config "$config" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --job-secrets-dir "$work/secrets" --allow-network 127.0.0.0/8 --port-file "$work/port" \
    > "$work/daemon.log" 2>&1 &
  pid=$!
  deadline=$((SECONDS + 15))
  until [[ -s $work/port ]] || ! alive "$pid"; do
    ((SECONDS < deadline)) || { give_up "no port file within 15 s"; return 1; }
    sleep 0.05
  done
  if [[ -s $work/port ]]; then
    kill -TERM "$pid"
    deadline=$((SECONDS + 30))
    while alive "$pid"; do
      ((SECONDS < deadline)) || { give_up "still running 30 s after SIGTERM"; return 1; }
      sleep 0.05
    done
  fi
  wait "$pid" || status=$?
  pid=
  return "$status"
}

failed=0
check() {  # NAME CONFIG EXPECTED_STATUS
  local status=0
  run_with_config "$2" || status=$?
  if ((status == $3)); then
    echo "ok: $1 (exit $status)"
  else
    echo "FAIL: $1: exit $status, expected $3" >&2
    sed 's/^/  | /' "$work/daemon.log" >&2
    failed=1
  fi
}

# The ConfigMap's file: the block scalar under "aggregator.toml: |", unindented.
awk '/^  aggregator.toml: \|$/ { on = 1; next }
     on && /^    / { sub(/^    /, ""); print; next }
     on && /^$/ { print; next }
     on { exit }' "$source/deploy/kubernetes/configmap.yaml" > "$work/configmap.toml"
[[ -s $work/configmap.toml ]] || { echo "no aggregator.toml in configmap.yaml" >&2; exit 1; }
{ cat "$source/deploy/config/aggregator.toml"; echo 'no-such-key = 1'; } > "$work/unknown-key.toml"

check "deploy/config/aggregator.toml accepted" "$source/deploy/config/aggregator.toml" 0
check "deploy/kubernetes/configmap.yaml's aggregator.toml accepted" "$work/configmap.toml" 0
check "a config with an unknown key refused" "$work/unknown-key.toml" 2
exit "$failed"
