# Sourced by the testbed tests after `set -euo pipefail`: skips (exit 77) without root and ip netns, sources the
# testbed library and sets NAME (a namespace prefix, "$1" plus the PID) and OUT (a scratch folder); both are
# removed on exit, also on failure or Ctrl-C.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[[ $(id -u) == 0 ]] && ip netns list >/dev/null 2>&1 || { echo "SKIP: needs root and ip netns"; exit 77; }
# shellcheck source=../../tools/testbed/testbed.sh
source "$ROOT/tools/testbed/testbed.sh"
NAME=$1$$
OUT=$(mktemp -d)
cleanup() { testbed_down "$NAME" || true; rm -rf "$OUT"; }
testbed_trap_exit cleanup
