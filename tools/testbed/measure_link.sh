#!/usr/bin/env bash
# measure_link.sh NAME [--from I] [--to J] [--seconds S] [--mib M] [--tool auto|iperf3|tcp] [--port P]
#
# Measures the TCP throughput from host I (default 1) to host J (default 2) of testbed NAME and prints it on stdout
# as "<number> Gbit/s" (details go to stderr). Every step has a timeout; the whole run is bounded (< S + 25 s).
#   iperf3 (default when available; installed with apt-get if missing and apt has a candidate):
#       one S-second stream (default 3), the receiver's rate (end.sum_received).
#   tcp (fallback, or --tool tcp): M MiB (default 256) of zeros from dd over bash's /dev/tcp into a Perl sink in
#       host J, timed with date +%s%N from the connect until the sink has read the last byte (and exited).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=testbed.sh
source "$here/testbed.sh"

name="" from=1 to=2 seconds=3 mib=256 tool=auto port=5201
usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case $1 in
    --from) from=${2-}; shift 2 ;;
    --to) to=${2-}; shift 2 ;;
    --seconds) seconds=${2-}; shift 2 ;;
    --mib) mib=${2-}; shift 2 ;;
    --tool) tool=${2-}; shift 2 ;;
    --port) port=${2-}; shift 2 ;;
    -h | --help) usage ;;
    -*) echo "measure_link: unknown option '$1'" >&2; usage ;;
    *) [[ -z $name ]] || usage; name=$1; shift ;;
  esac
done
[[ -n $name ]] || usage
[[ $seconds =~ ^[1-9][0-9]?$ ]] || { echo "measure_link: --seconds must be 1..99" >&2; exit 2; }
[[ $mib =~ ^[1-9][0-9]{0,4}$ ]] || { echo "measure_link: --mib must be 1..99999" >&2; exit 2; }
[[ $port =~ ^[1-9][0-9]{0,4}$ ]] || { echo "measure_link: bad --port" >&2; exit 2; }
[[ $from != "$to" ]] || { echo "measure_link: --from and --to must differ" >&2; exit 2; }
src=$(testbed_addr "$name" "$from") || exit 1
dst=$(testbed_addr "$name" "$to") || exit 1
hsrc="$name-h$from" hdst="$name-h$to"

# Everything started here runs in the background and is waited for with "wait", so a signal is handled at once;
# the EXIT trap stops whatever is still running (only the processes this script started).
pids=()
tmp=$(mktemp -d)
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_listen NS PORT: until something listens on PORT in namespace NS (at most 5 s).
wait_listen() {
  local i
  for ((i = 0; i < 50; i++)); do
    if [[ -n $(timeout 2 ip netns exec "$1" ss -Htln "sport = :$2" 2>/dev/null) ]]; then return 0; fi
    sleep 0.1
  done
  echo "measure_link: nothing listens on port $2 in $1" >&2
  return 1
}

have_iperf3() {
  command -v iperf3 >/dev/null 2>&1 && return 0
  local cand
  cand=$(timeout 30 apt-cache policy iperf3 2>/dev/null | awk '/Candidate:/ {print $2}') || true
  [[ -n $cand && $cand != "(none)" ]] || return 1
  echo "measure_link: installing iperf3 $cand" >&2
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends iperf3 >/dev/null 2>&1 || return 1
  command -v iperf3 >/dev/null 2>&1
}

gbps() { awk -v b="$1" -v ns="$2" 'BEGIN { printf "%.3f", b * 8 / ns }'; }

run_iperf3() {
  ip netns exec "$hdst" timeout $((seconds + 20)) iperf3 -s -1 -B "$dst" -p "$port" >"$tmp/server" 2>&1 &
  pids+=("$!")
  wait_listen "$hdst" "$port" || return 1
  ip netns exec "$hsrc" timeout $((seconds + 15)) iperf3 -c "$dst" -B "$src" -p "$port" -t "$seconds" -J \
    --connect-timeout 3000 >"$tmp/client.json" 2>"$tmp/client.err" &
  local c=$!
  pids+=("$c")
  if ! wait $c; then
    echo "measure_link: iperf3 client failed: $(cat "$tmp/client.err" "$tmp/server" 2>/dev/null | head -5)" >&2
    return 1
  fi
  # end.sum_received.bits_per_second (the receiver's view, what got through both tbf qdiscs)
  local bps
  bps=$(awk '/"sum_received"/ { f = 1 } f && /"bits_per_second"/ { gsub(/[^0-9.eE+]/, "", $2); print $2; exit }' \
    FS=: "$tmp/client.json")
  [[ -n $bps ]] || { echo "measure_link: no sum_received in iperf3 output" >&2; return 1; }
  echo "measure_link: iperf3 $hsrc ($src) -> $hdst ($dst), ${seconds} s, 1 stream" >&2
  awk -v b="$bps" 'BEGIN { printf "%.3f Gbit/s\n", b / 1e9 }'
}

run_tcp() {
  local bytes=$((mib * 1048576)) t0 t1 got
  # shellcheck disable=SC2016  # Perl code
  ip netns exec "$hdst" timeout $((seconds + 20)) perl -MIO::Socket::INET -e '
    my $s = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => $ARGV[1], Listen => 1, ReuseAddr => 1)
      or die "listen: $!\n";
    my $c = $s->accept or die "accept: $!\n";
    my ($n, $buf, $r) = (0);
    $n += $r while ($r = sysread($c, $buf, 1 << 20));
    print "$n\n";' "$dst" "$port" >"$tmp/sink" 2>"$tmp/sink.err" &
  local sink=$!
  pids+=("$sink")
  wait_listen "$hdst" "$port" || return 1
  t0=$(date +%s%N)
  # shellcheck disable=SC2016  # $1..$3 expand in the inner bash
  ip netns exec "$hsrc" timeout $((seconds + 15)) bash -c \
    'dd if=/dev/zero bs=1M count="$1" status=none > "/dev/tcp/$2/$3"' _ "$mib" "$dst" "$port" 2>"$tmp/client.err" &
  local c=$!
  pids+=("$c")
  if ! wait $c; then
    echo "measure_link: sender failed: $(head -3 "$tmp/client.err")" >&2
    return 1
  fi
  wait $sink || { echo "measure_link: sink failed: $(head -3 "$tmp/sink.err")" >&2; return 1; }
  t1=$(date +%s%N)
  got=$(cat "$tmp/sink")
  [[ $got == "$bytes" ]] || { echo "measure_link: sink got ${got:-nothing} of $bytes bytes" >&2; return 1; }
  echo "measure_link: tcp $hsrc ($src) -> $hdst ($dst), $mib MiB in $(((t1 - t0) / 1000000)) ms" >&2
  echo "$(gbps "$bytes" $((t1 - t0))) Gbit/s"
}

# The tcp fallback must still end within the bound: about seconds+15 s.
case $tool in
  iperf3) have_iperf3 || { echo "measure_link: iperf3 unavailable" >&2; exit 1; }; run_iperf3 ;;
  tcp) run_tcp ;;
  auto) if have_iperf3; then run_iperf3; else echo "measure_link: no iperf3, using the tcp fallback" >&2; run_tcp; fi ;;
  *) echo "measure_link: --tool must be auto, iperf3 or tcp" >&2; exit 2 ;;
esac
