#!/usr/bin/env bash
# Installs the validators' node modules (package-lock.json, exactly) into the build directory, not the source tree.
# The only network access of the deploy tests: the npm registry, here.
# usage: npm_ci.sh SOURCE_DIR NPM_DIR
set -euo pipefail
source=$1 dir=$2
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "$tool not found: run scripts/install-deps.sh" >&2; exit 1; }
done
mkdir -p "$dir"
cp "$source/package.json" "$source/package-lock.json" "$dir/"
cd "$dir"
# --ignore-scripts: none of these packages needs an install script, so none gets to run.
# npm ci takes about 6 s here, but once (cold cache, CI-like run) it stalled after its last download until killed:
# bound each attempt and try again from scratch, three times in all.
for attempt in 1 2 3; do
  if timeout 80 npm ci --ignore-scripts --no-audit --no-fund --fetch-timeout=30000 --loglevel=error; then
    break
  fi
  ((attempt < 3)) || { echo "npm ci failed 3 times" >&2; exit 1; }
  echo "npm ci attempt $attempt failed or stalled; retrying" >&2
  rm -rf node_modules
done
echo "node $(node --version), npm $(npm --version): $(ls node_modules | wc -l) modules in $dir/node_modules"
