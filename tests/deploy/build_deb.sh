#!/usr/bin/env bash
# Builds the Debian package as a packager does: cpack -G DEB from the build directory (dpkg-shlibdeps computes
# Depends). The package.* tests use the .deb it leaves in OUT_DIR.
# usage: build_deb.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=$1 out=$2
for tool in cpack dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || { echo "$tool not found: run scripts/install-deps.sh" >&2; exit 1; }
done
rm -rf "$out" && mkdir -p "$out"
(cd "$build" && timeout 300 cpack -G DEB -B "$out") > "$out/cpack.log" 2>&1 || { cat "$out/cpack.log"; exit 1; }
rm -rf "$out/_CPack_Packages"
debs=("$out"/sparsereduce_*.deb)
[[ ${#debs[@]} -eq 1 && -f ${debs[0]} ]] || { echo "expected one sparsereduce_*.deb in $out" >&2; exit 1; }
echo "built ${debs[0]}"
