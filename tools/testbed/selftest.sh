#!/usr/bin/env bash
# selftest.sh — end-to-end test of testbed.sh and measure_link.sh (root; about 15-25 s, bounded by 60 s).
# Builds a 3-host testbed srtest$$ shaped at 1 Gbit/s, checks names, qdiscs, addresses and pings, measures the link
# (iperf3 or the tcp fallback, and the tcp fallback explicitly), re-creates it unshaped with --force and measures
# again, checks that a failing "up" and a signalled script leave nothing behind, tears everything down and checks
# that no srtest$$ namespace is left. Exits non-zero on any failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=testbed.sh
source "$here/testbed.sh"

NAME=srtest$$        # namespaces srtest<pid>-br, srtest<pid>-h1..3; interface names are br0, eth0, p1..p3
SHAPED_MIN=${SHAPED_MIN:-0.85} SHAPED_MAX=${SHAPED_MAX:-1.0} UNSHAPED_MIN=${UNSHAPED_MIN:-1.5}
start=$(date +%s)

# Watchdog: the whole test is bounded; on expiry this script gets SIGTERM and its trap tears everything down.
(
  trap 'kill $s 2>/dev/null; exit 0' TERM
  sleep 60 & s=$!
  wait $s && echo "selftest: FAIL: timed out after 60 s" >&2 && kill -TERM $$
) 2>/dev/null &
watchdog=$!

testbed_trap_cleanup "$NAME"
testbed_trap_cleanup "${NAME}_f"
testbed_trap_cleanup "${NAME}_t"
trap 'kill $watchdog 2>/dev/null || true; _tb_cleanup_registered' EXIT

fail() { echo "selftest: FAIL: $*" >&2; exit 1; }
step() { echo "selftest: [$(($(date +%s) - start)) s] $*"; }
leftovers() { ip netns list | awk '{print $1}' | grep -E "^${NAME}([-_]|$)" || true; }
between() { awk -v x="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(x >= lo && x <= hi) }'; }

# verify_layout N SHAPED: namespaces, interface names <= 15 characters, addresses, qdiscs.
verify_layout() {
  local n=$1 shaped=$2 ns ifname i q prefix
  [[ $(_tb_namespaces "$NAME" | wc -l) -eq $((n + 1)) ]] || fail "expected $((n + 1)) namespaces: $(_tb_namespaces "$NAME" | tr '\n' ' ')"
  [[ $(testbed_hosts "$NAME") -eq $n ]] || fail "testbed_hosts says $(testbed_hosts "$NAME"), expected $n"
  for ns in $(_tb_namespaces "$NAME"); do
    for ifname in $(ip -n "$ns" -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
      ((${#ifname} <= 15)) || fail "interface name '$ifname' in $ns is longer than 15 characters"
    done
  done
  prefix=$(_tb_subnet_from_name "$NAME")
  for ((i = 1; i <= n; i++)); do
    [[ $(testbed_addr "$NAME" "$i") == "$prefix.$i" ]] || fail "host $i has address $(testbed_addr "$NAME" "$i"), expected $prefix.$i"
    q=$(ip netns exec "$NAME-h$i" tc qdisc show dev eth0)
    if ((shaped)); then
      [[ $q == *"tbf"*"rate 1Gbit"* ]] || fail "no 1 Gbit/s tbf on $NAME-h$i eth0: $q"
      q=$(ip netns exec "$NAME-br" tc qdisc show dev "p$i")
      [[ $q == *"tbf"*"rate 1Gbit"* ]] || fail "no 1 Gbit/s tbf on $NAME-br p$i: $q"
    else
      [[ $q != *tbf* ]] || fail "unshaped testbed has a tbf on $NAME-h$i eth0"
    fi
  done
}

step "up $NAME 3 --rate 1gbit"
testbed_up "$NAME" 3 --rate 1gbit
verify_layout 3 1
echo "selftest: layout, names (<= 15 chars), addresses and tbf qdiscs OK"

step "check (ping every pair)"
out=$(testbed_check "$NAME") || fail "ping: $out"
echo "selftest: ping $out"

step "a second up of the same NAME must be refused"
if testbed_up "$NAME" 2 2>/dev/null; then fail "second up of $NAME was not refused"; fi
verify_layout 3 1

step "measure the 1gbit link (expect $SHAPED_MIN..$SHAPED_MAX Gbit/s)"
shaped=$("$here/measure_link.sh" "$NAME" --seconds 3 | awk '{print $1}')
between "$shaped" "$SHAPED_MIN" "$SHAPED_MAX" || fail "shaped throughput $shaped Gbit/s"
echo "selftest: shaped h1->h2: $shaped Gbit/s"
shaped_tcp=$("$here/measure_link.sh" "$NAME" --tool tcp --mib 256 --from 3 --to 1 | awk '{print $1}')
between "$shaped_tcp" "$SHAPED_MIN" "$SHAPED_MAX" || fail "shaped throughput (tcp fallback) $shaped_tcp Gbit/s"
echo "selftest: shaped h3->h1 (tcp fallback, 256 MiB): $shaped_tcp Gbit/s"

step "up --force $NAME 3 --rate none (replaces the shaped testbed)"
testbed_up "$NAME" 3 --rate none --force
verify_layout 3 0
out=$(testbed_check "$NAME") || fail "ping (unshaped): $out"
unshaped=$("$here/measure_link.sh" "$NAME" --seconds 3 | awk '{print $1}')
between "$unshaped" "$UNSHAPED_MIN" 1000 || fail "unshaped throughput $unshaped Gbit/s (expected > $UNSHAPED_MIN)"
echo "selftest: unshaped h1->h2: $unshaped Gbit/s"

step "a failing up removes what it made"
if testbed_up "${NAME}_f" 2 --rate 1qbit 2>/dev/null; then fail "up with rate 1qbit succeeded"; fi
[[ -z $(_tb_namespaces "${NAME}_f") ]] || fail "failed up left $(_tb_namespaces "${NAME}_f" | tr '\n' ' ')"

step "a script killed with SIGTERM tears its testbed down (testbed_trap_cleanup)"
rc=0
bash -c 'source "$1"; testbed_trap_cleanup "$2"; testbed_up "$2" 2 >/dev/null; testbed_exec "$2" 1 sleep 30 & sleep 0.3; kill -TERM $$; sleep 30' \
  _ "$here/testbed.sh" "${NAME}_t" 2>/dev/null || rc=$?
((rc == 143)) || fail "signalled script exited $rc, expected 143"
[[ -z $(_tb_namespaces "${NAME}_t") ]] || fail "signalled script left $(_tb_namespaces "${NAME}_t" | tr '\n' ' ')"

step "down $NAME"
testbed_down "$NAME"
testbed_down "$NAME"   # a second down is a no-op
left=$(leftovers)
[[ -z $left ]] || fail "namespaces left behind: $left"

step "PASS: shaped $shaped Gbit/s (iperf3/auto), $shaped_tcp Gbit/s (tcp fallback), unshaped $unshaped Gbit/s; no $NAME namespaces left"
