#!/usr/bin/env bash
# testbed.sh — N emulated hosts on one machine: one network namespace per host, all joined by a Linux bridge that
# lives in its own namespace (nothing is added to the root namespace), with tbf rate shaping in both directions.
# See tools/testbed/README.md.
#
# CLI:
#   testbed.sh up NAME N [--rate 1gbit|0|none] [--burst 256kb] [--latency 50ms] [--subnet 10.99.X.0/24] [--force]
#   testbed.sh down NAME
#   testbed.sh addr NAME I
#   testbed.sh exec NAME I CMD...
#   testbed.sh check NAME
#   testbed.sh list NAME
# Library (source it; it changes no shell options):
#   testbed_up, testbed_down, testbed_addr, testbed_exec, testbed_check, testbed_hosts, testbed_kill,
#   testbed_trap_cleanup NAME
#
# Layout for NAME=x, N=2:
#   namespace x-br : bridge br0, ports p1 p2 (each with a tbf qdisc: bridge -> host direction)
#   namespace x-h1 : lo, eth0 = 10.99.X.1/24 (tbf qdisc: host -> bridge direction), peer of p1
#   namespace x-h2 : lo, eth0 = 10.99.X.2/24, peer of p2
# Interface names (br0, eth0, pI) never contain NAME, so they stay far below the 15-character limit.

TESTBED_MAX_HOSTS=${TESTBED_MAX_HOSTS:-253}

_tb_err() { echo "testbed: $*" >&2; }

# _tb_check_name NAME: NAME must be 1-32 characters of [A-Za-z0-9_]. No '-', so that "NAME-" never matches another
# testbed's namespaces (testbed "a" must not delete testbed "a-b").
_tb_check_name() {
  if [[ ! ${1-} =~ ^[A-Za-z0-9_]{1,32}$ ]]; then
    _tb_err "bad NAME '${1-}': use 1-32 characters from [A-Za-z0-9_] (no '-')"
    return 2
  fi
}

_tb_check_index() {
  if [[ ! ${1-} =~ ^[1-9][0-9]*$ ]]; then
    _tb_err "bad host index '${1-}': expected 1, 2, ..."
    return 2
  fi
}

# Existing namespaces of testbed NAME, one per line: the hosts in numeric order, then NAME-br.
_tb_namespaces() {
  local name=$1 ns rest hosts=() br=""
  while read -r ns rest; do
    if [[ $ns == "$name-br" ]]; then
      br=$ns
    elif [[ $ns =~ ^${name}-h([0-9]+)$ ]]; then
      hosts+=("${BASH_REMATCH[1]}")
    fi
  done < <(ip netns list 2>/dev/null)
  if ((${#hosts[@]})); then printf '%s\n' "${hosts[@]}" | sort -n | sed "s/^/$name-h/"; fi
  if [[ -n $br ]]; then echo "$br"; fi
}

# testbed_hosts NAME: prints the number of hosts (the highest I with an existing NAME-hI namespace).
testbed_hosts() {
  _tb_check_name "${1-}" || return
  local ns last=0
  while read -r ns; do
    [[ $ns =~ -h([0-9]+)$ ]] && ((BASH_REMATCH[1] > last)) && last=${BASH_REMATCH[1]}
  done < <(_tb_namespaces "$1")
  echo "$last"
}

# Kills every process still running inside namespace NS (they would keep the namespace, its veth and the bridge
# alive after "ip netns del"). Only processes inside the testbed's own namespaces are touched, never this shell.
_tb_kill_ns_pids() {
  local ns=$1 pids=() p i
  for p in $(ip netns pids "$ns" 2>/dev/null); do
    [[ $p == "$$" || $p == "${BASHPID:-$$}" ]] || pids+=("$p")
  done
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for i in 1 2 3 4 5 6 7 8 9 10; do
    kill -0 "${pids[@]}" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
  return 0
}

# testbed_kill NAME SIGNAL I...: sends SIGNAL to every process inside hosts I... of testbed NAME (what a script
# started there with testbed_exec), never to this shell. This is how a script stops its own daemons: `pkill -f` on a
# command line sees the processes of every namespace, so it also stopped the daemons of other runs that happened to
# use the same binary, address pattern or port. Returns 0 when nothing runs there.
testbed_kill() {
  _tb_check_name "${1-}" || return
  local name=$1 sig=${2-} h p pids=()
  if [[ -z $sig ]]; then
    _tb_err "usage: testbed_kill NAME SIGNAL I..."
    return 2
  fi
  shift 2
  for h in "$@"; do
    _tb_check_index "$h" || return
    for p in $(ip netns pids "$name-h$h" 2>/dev/null); do
      [[ $p == "$$" || $p == "${BASHPID:-$$}" ]] || pids+=("$p")
    done
  done
  ((${#pids[@]})) || return 0
  kill -s "$sig" "${pids[@]}" 2>/dev/null || true
}

# Deletes the given namespaces (killing what runs inside first). Never fails.
_tb_del_ns() {
  local ns
  for ns in "$@"; do
    _tb_kill_ns_pids "$ns"
    ip netns del "$ns" 2>/dev/null || true
  done
  return 0
}

# testbed_down NAME: deletes NAME-br and every NAME-hI. No error if nothing exists.
testbed_down() {
  _tb_check_name "${1-}" || return
  local nss
  mapfile -t nss < <(_tb_namespaces "$1")
  _tb_del_ns "${nss[@]}"
  if [[ -n $(_tb_namespaces "$1") ]]; then
    _tb_err "could not delete: $(_tb_namespaces "$1" | tr '\n' ' ')"
    return 1
  fi
  return 0
}

# Runs a setup command; on failure prints it with its error output and returns 1.
_tb_do() {
  local out
  if ! out=$(timeout 20 "$@" 2>&1); then
    _tb_err "failed: $* ${out:+-- $out}"
    return 1
  fi
}

# Third octet X of 10.99.X.0/24 derived from NAME (cksum mod 256), so different testbeds get different subnets.
_tb_subnet_from_name() {
  local sum
  sum=$(printf '%s' "$1" | cksum) || return
  echo "10.99.$(( ${sum%% *} % 256 ))"
}

# Accepts 10.99.X.0/24, 10.99.X.0 or 10.99.X; prints 10.99.X. Only 10.99.0.0/16 is allowed.
_tb_parse_subnet() {
  if [[ $1 =~ ^10\.99\.([0-9]{1,3})(\.0)?(/24)?$ ]] && ((BASH_REMATCH[1] <= 255)); then
    echo "10.99.$((10#${BASH_REMATCH[1]}))"
  else
    _tb_err "bad --subnet '$1': expected 10.99.X.0/24 with X in 0..255"
    return 2
  fi
}

_TB_MADE=()

# IPv6 off in namespace NS (all + default, so interfaces created later inherit it): no link-local addresses,
# router solicitations or MLD noise; the only addresses are the 10.99.X.I ones. Ignored without IPv6 support.
_tb_no_ipv6() {
  local f
  for f in all default; do
    # shellcheck disable=SC2016  # $1 expands in the inner shell
    ip netns exec "$1" sh -c '[ -e "$1" ] && echo 1 > "$1"; true' _ "/proc/sys/net/ipv6/conf/$f/disable_ipv6"
  done
}

_tb_up_steps() {
  local name=$1 n=$2 rate=$3 burst=$4 latency=$5 prefix=$6 br="$1-br" h i
  _tb_do ip netns add "$br" && _TB_MADE+=("$br") || return 1
  # IPv6 off everywhere: no link-local addresses, router solicitations or MLD noise; only 10.99.X.I exists.
  _tb_no_ipv6 "$br"
  _tb_do ip -n "$br" link set lo up || return 1
  _tb_do ip -n "$br" link add br0 type bridge || return 1
  _tb_do ip -n "$br" link set br0 up || return 1
  for ((i = 1; i <= n; i++)); do
    h="$name-h$i"
    _tb_do ip netns add "$h" && _TB_MADE+=("$h") || return 1
    _tb_no_ipv6 "$h"
    _tb_do ip -n "$h" link set lo up || return 1
    _tb_do ip -n "$h" link add eth0 type veth peer name "p$i" || return 1
    _tb_do ip -n "$h" link set "p$i" netns "$br" || return 1
    _tb_do ip -n "$br" link set "p$i" master br0 || return 1
    _tb_do ip -n "$br" link set "p$i" up || return 1
    _tb_do ip -n "$h" addr add "$prefix.$i/24" dev eth0 || return 1
    _tb_do ip -n "$h" link set eth0 up || return 1
    if [[ -n $rate ]]; then
      # host -> bridge (egress of the host's eth0) and bridge -> host (egress of the bridge port = host ingress)
      _tb_do ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency "$latency" || return 1
      _tb_do ip netns exec "$br" tc qdisc add dev "p$i" root tbf rate "$rate" burst "$burst" latency "$latency" || return 1
    fi
  done
}

# Signal during testbed_up: delete what was made, restore the caller's traps, re-raise the signal so the caller's
# handler (or the default action: terminate) runs.
_TB_SAVED_INT="" _TB_SAVED_TERM="" _TB_SAVED_HUP=""
_tb_up_abort() {
  local sig=$1
  _tb_err "interrupted (SIG$sig) while setting up; removing what was made: ${_TB_MADE[*]}"
  _tb_del_ns "${_TB_MADE[@]}"
  _TB_MADE=()
  trap - INT TERM HUP
  eval "$_TB_SAVED_INT"
  eval "$_TB_SAVED_TERM"
  eval "$_TB_SAVED_HUP"
  kill -s "$sig" "$BASHPID"
}

# testbed_up NAME N [--rate R] [--burst B] [--latency L] [--subnet 10.99.X.0/24] [--force]
# On any failure (or SIGINT/SIGTERM/SIGHUP during setup) it deletes every namespace it created and returns non-zero.
testbed_up() {
  local name="" n="" rate=1gbit burst=256kb latency=50ms subnet="" force=0 pos=() prefix
  while (($#)); do
    case $1 in
      --rate) rate=${2-}; shift 2 || { _tb_err "--rate needs a value"; return 2; } ;;
      --rate=*) rate=${1#*=}; shift ;;
      --burst) burst=${2-}; shift 2 || { _tb_err "--burst needs a value"; return 2; } ;;
      --burst=*) burst=${1#*=}; shift ;;
      --latency) latency=${2-}; shift 2 || { _tb_err "--latency needs a value"; return 2; } ;;
      --latency=*) latency=${1#*=}; shift ;;
      --subnet) subnet=${2-}; shift 2 || { _tb_err "--subnet needs a value"; return 2; } ;;
      --subnet=*) subnet=${1#*=}; shift ;;
      --force) force=1; shift ;;
      -*) _tb_err "up: unknown option '$1'"; return 2 ;;
      *) pos+=("$1"); shift ;;
    esac
  done
  if ((${#pos[@]} != 2)); then
    _tb_err "usage: testbed.sh up NAME N [--rate 1gbit|0|none] [--burst 256kb] [--latency 50ms] [--subnet 10.99.X.0/24] [--force]"
    return 2
  fi
  name=${pos[0]} n=${pos[1]}
  _tb_check_name "$name" || return
  if [[ ! $n =~ ^[1-9][0-9]*$ ]] || ((n > TESTBED_MAX_HOSTS)); then
    _tb_err "bad host count '$n': expected 1..$TESTBED_MAX_HOSTS"
    return 2
  fi
  case ${rate,,} in
    0 | none | off | unshaped | "") rate="" ;;
    *) if [[ ! $rate =~ ^[0-9]+(\.[0-9]+)?[A-Za-z]*$ ]]; then _tb_err "bad --rate '$rate'"; return 2; fi ;;
  esac
  if [[ -n $rate ]]; then
    [[ $burst =~ ^[0-9]+[A-Za-z]*$ ]] || { _tb_err "bad --burst '$burst'"; return 2; }
    [[ $latency =~ ^[0-9]+(\.[0-9]+)?[A-Za-z]*$ ]] || { _tb_err "bad --latency '$latency'"; return 2; }
  fi
  if [[ -n $subnet ]]; then
    prefix=$(_tb_parse_subnet "$subnet") || return
  else
    prefix=$(_tb_subnet_from_name "$name") || return
  fi
  if [[ $(id -u) -ne 0 ]]; then _tb_err "must run as root"; return 1; fi

  local existing
  existing=$(_tb_namespaces "$name")
  if [[ -n $existing ]]; then
    if ((force)); then
      testbed_down "$name" || return 1
    else
      _tb_err "namespaces of '$name' already exist: ${existing//$'\n'/ }; run 'testbed.sh down $name' or pass --force"
      return 1
    fi
  fi

  # While setting up, SIGINT/SIGTERM/SIGHUP remove what was made, then the caller's own handling (or the default) runs.
  local rc=0
  _TB_SAVED_INT=$(trap -p INT) _TB_SAVED_TERM=$(trap -p TERM) _TB_SAVED_HUP=$(trap -p HUP)
  _TB_MADE=()
  trap '_tb_up_abort INT' INT
  trap '_tb_up_abort TERM' TERM
  trap '_tb_up_abort HUP' HUP
  _tb_up_steps "$name" "$n" "$rate" "$burst" "$latency" "$prefix" || rc=1
  if ((rc)); then
    _tb_err "setting up '$name' failed; removing what was made: ${_TB_MADE[*]}"
    _tb_del_ns "${_TB_MADE[@]}"
  fi
  _TB_MADE=()
  trap - INT TERM HUP
  eval "$_TB_SAVED_INT"
  eval "$_TB_SAVED_TERM"
  eval "$_TB_SAVED_HUP"
  ((rc == 0)) || return 1
  echo "testbed $name: $n hosts $prefix.1-$prefix.$n/24, $( [[ -n $rate ]] && echo "tbf rate $rate burst $burst latency $latency both directions" || echo unshaped)"
}

# testbed_addr NAME I: prints host I's IPv4 address (read from the namespace itself).
testbed_addr() {
  _tb_check_name "${1-}" || return
  _tb_check_index "${2-}" || return
  local line
  line=$(ip -n "$1-h$2" -4 -o addr show dev eth0 2>/dev/null) || { _tb_err "no host $1-h$2"; return 1; }
  if [[ $line =~ inet\ ([0-9.]+)/ ]]; then
    echo "${BASH_REMATCH[1]}"
  else
    _tb_err "host $1-h$2 has no IPv4 address on eth0"
    return 1
  fi
}

# testbed_exec NAME I CMD...: runs CMD inside host I.
testbed_exec() {
  _tb_check_name "${1-}" || return
  _tb_check_index "${2-}" || return
  local ns="$1-h$2"
  shift 2
  (($#)) || { _tb_err "exec: no command"; return 2; }
  [[ -e /run/netns/$ns ]] || { _tb_err "no host $ns"; return 1; }
  ip netns exec "$ns" "$@"
}

# Installs Debian package PKG if command CMD is missing (bounded; apt-get update only if the first try fails).
_tb_ensure() {
  local cmd=$1 pkg=$2
  command -v "$cmd" >/dev/null 2>&1 && return 0
  [[ $(id -u) -eq 0 ]] || { _tb_err "$cmd is missing (apt-get install $pkg)"; return 1; }
  _tb_err "installing $pkg"
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1 ||
    { timeout 300 apt-get update -qq >/dev/null 2>&1 &&
      timeout 300 apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1; }
  command -v "$cmd" >/dev/null 2>&1 || { _tb_err "could not install $pkg"; return 1; }
}

# testbed_check NAME: one ping (ping -c1 -W1) for every pair of hosts; prints OK or each failing pair.
testbed_check() {
  _tb_check_name "${1-}" || return
  local name=$1 n i j fail=0 addrs=()
  n=$(testbed_hosts "$name")
  ((n > 0)) || { _tb_err "no testbed '$name'"; return 1; }
  _tb_ensure ping iputils-ping || return 1
  for ((i = 1; i <= n; i++)); do addrs[i]=$(testbed_addr "$name" "$i") || return 1; done
  for ((i = 1; i <= n; i++)); do
    for ((j = i + 1; j <= n; j++)); do
      if ! timeout 5 ip netns exec "$name-h$i" ping -c1 -W1 -q "${addrs[j]}" >/dev/null 2>&1; then
        echo "FAIL h$i (${addrs[i]}) -> h$j (${addrs[j]})"
        fail=1
      fi
    done
  done
  ((fail == 0)) && echo OK
  return $fail
}

# testbed_trap_cleanup NAME: on EXIT, INT, TERM or HUP (a closed terminal or ssh session) tear down NAME (and any
# other testbed registered this way). Replaces the shell's EXIT/INT/TERM/HUP traps; the exit status is kept (130
# after INT, 143 after TERM, 129 after HUP).
_TB_TRAP_NAMES=()
_tb_cleanup_registered() {
  local name
  for name in "${_TB_TRAP_NAMES[@]}"; do testbed_down "$name" || true; done
  _TB_TRAP_NAMES=()
}
testbed_trap_cleanup() {
  _tb_check_name "${1-}" || return
  local name
  for name in "${_TB_TRAP_NAMES[@]}"; do [[ $name == "$1" ]] && return 0; done
  _TB_TRAP_NAMES+=("$1")
  trap '_tb_cleanup_registered' EXIT
  trap '_tb_cleanup_registered; trap - INT; exit 130' INT
  trap '_tb_cleanup_registered; trap - TERM; exit 143' TERM
  trap '_tb_cleanup_registered; trap - HUP; exit 129' HUP
}

# For scripts with their own cleanup function: runs CMD on every exit, and makes Ctrl-C, kill and a closed terminal
# exit (130, 143, 129) so that it runs then too.
testbed_trap_exit() {
  [[ $# -eq 1 ]] || { echo "usage: testbed_trap_exit CMD" >&2; return 2; }
  trap "$1" EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

_tb_usage() {
  cat <<'EOF'
usage:
  testbed.sh up NAME N [--rate 1gbit|0|none] [--burst 256kb] [--latency 50ms] [--subnet 10.99.X.0/24] [--force]
  testbed.sh down NAME
  testbed.sh addr NAME I
  testbed.sh exec NAME I CMD...
  testbed.sh check NAME
  testbed.sh list NAME          # prints the testbed's namespaces
NAME: 1-32 characters [A-Za-z0-9_]. Hosts are namespaces NAME-h1..NAME-hN with eth0 = 10.99.X.I/24
(X from NAME unless --subnet), joined by bridge br0 in namespace NAME-br.
EOF
}

_tb_main() {
  local cmd=${1-}
  (($#)) && shift
  case $cmd in
    up) testbed_up "$@" ;;
    down) (($# == 1)) || { _tb_usage >&2; return 2; }; testbed_down "$1" ;;
    addr) (($# == 2)) || { _tb_usage >&2; return 2; }; testbed_addr "$1" "$2" ;;
    exec)
      (($# >= 3)) || { _tb_usage >&2; return 2; }
      _tb_check_name "$1" || return
      _tb_check_index "$2" || return
      [[ -e /run/netns/$1-h$2 ]] || { _tb_err "no host $1-h$2"; return 1; }
      exec ip netns exec "$1-h$2" "${@:3}"
      ;;
    check) (($# == 1)) || { _tb_usage >&2; return 2; }; testbed_check "$1" ;;
    list) (($# == 1)) || { _tb_usage >&2; return 2; }; _tb_check_name "$1" && _tb_namespaces "$1" ;;
    -h | --help | help) _tb_usage ;;
    *) _tb_usage >&2; return 2 ;;
  esac
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  _tb_main "$@"
  exit
fi
