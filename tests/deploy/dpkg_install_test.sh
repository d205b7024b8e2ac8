#!/usr/bin/env bash
# Installs, removes and purges the package with dpkg, so its maintainer scripts really run: the system user from
# sysusers.d, /etc/sparsereduce/secrets (root:sparsereduce 0750), the conffile, the ldconfig trigger. All of it
# happens in a throw-away overlay of / inside a private mount namespace: the machine itself is not changed.
# Needs root and overlayfs; exits 77 (skipped) without them.
# usage: dpkg_install_test.sh DEB_DIR
set -euo pipefail
debs=("$1"/sparsereduce_*.deb)
deb=$(realpath "${debs[0]}")
[[ -f $deb ]] || { echo "no .deb in $1 (package.build makes it)" >&2; exit 1; }
if [[ $(id -u) -ne 0 ]] || ! command -v unshare >/dev/null; then
  echo "skipped: needs root and unshare"
  exit 77
fi

# Runs in the new mount namespace; its mounts (and everything written below them) vanish with it.
sandbox() {
  set -euo pipefail
  local deb=$1 top=$2
  mount -t tmpfs tmpfs "$top"
  mkdir "$top/upper" "$top/work" "$top/root"
  if ! mount -t overlay overlay -o "lowerdir=/,upperdir=$top/upper,workdir=$top/work" "$top/root" 2>/dev/null ||
     [[ ! -x $top/root/usr/bin/dpkg ]]; then
    echo "skipped: cannot mount an overlay of / (with /usr on it)"
    exit 77
  fi
  mount --bind /proc "$top/root/proc"
  mount --bind /dev "$top/root/dev"
  cp "$deb" "$top/root/tmp/package.deb"
  chroot "$top/root" /bin/bash -euo pipefail -c '
    ! getent passwd sparsereduce >/dev/null ||
      { echo "user sparsereduce exists before install: cannot test" >&2; exit 77; }
    dpkg -i /tmp/package.deb
    getent passwd sparsereduce || { echo "FAIL: postinst created no user" >&2; exit 1; }
    [[ $(stat -c "%U:%G %a" /etc/sparsereduce/secrets) == "root:sparsereduce 750" ]] ||
      { echo "FAIL: secrets dir is $(stat -c "%U:%G %a" /etc/sparsereduce/secrets)" >&2; exit 1; }
    # grep without -q: with pipefail, -q exiting early would fail the pipeline through SIGPIPE.
    ldconfig -p | grep "libsparsereduce.so.0 " >/dev/null ||
      { echo "FAIL: ldconfig does not know libsparsereduce.so.0" >&2; exit 1; }
    dpkg-query -W -f="\${Conffiles}\n" sparsereduce | grep /etc/sparsereduce/aggregator.toml >/dev/null ||
      { echo "FAIL: aggregator.toml is not a registered conffile" >&2; exit 1; }
    dpkg -r sparsereduce
    [[ -f /etc/sparsereduce/aggregator.toml ]] || { echo "FAIL: remove (not purge) deleted the config" >&2; exit 1; }
    dpkg --purge sparsereduce
    [[ ! -e /etc/sparsereduce ]] ||
      { echo "FAIL: purge left /etc/sparsereduce: $(ls -A /etc/sparsereduce)" >&2; exit 1; }
    echo "ok: install, remove, purge"
  '
}
export -f sandbox
top=$(mktemp -d /tmp/sparsereduce-dpkg.XXXXXX)
trap 'rmdir "$top"' EXIT
timeout 300 unshare --mount --propagation private bash -c 'sandbox "$1" "$2"' _ "$deb" "$top"
