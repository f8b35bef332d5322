#!/usr/bin/env bash
# Runs the whole test suite: unit tests, fuzz-corpus replays, and integration tests against real
# MariaDB servers that the harness starts itself on loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
# sysbench (and a C compiler for its reconnect shim) drive the failover-under-load tests.
scripts/setup.sh sysbench gcc libc6-dev etcd-server
# Chromium, Node.js and playwright-core drive the web dashboard's browser test.
scripts/browser.sh >/dev/null
cargo test --workspace --locked "$@"
