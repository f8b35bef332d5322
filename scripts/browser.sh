#!/usr/bin/env bash
# Installs what the dashboard's browser test needs: Debian's Chromium and Node.js, and
# playwright-core (from the npm registry) in target/browser/. Prints that directory.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh chromium nodejs >&2
command -v npm >/dev/null || scripts/setup.sh npm >&2
dir=target/browser
if [ ! -d "$dir/node_modules/playwright-core" ]; then
  mkdir -p "$dir"
  npm install --silent --prefix "$dir" --no-audit --no-fund --no-save playwright-core@1 >&2
fi
echo "$PWD/$dir"
